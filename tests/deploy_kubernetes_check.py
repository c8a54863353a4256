#!/usr/bin/env python3
"""Offline check of deploy/kubernetes/ (no API server can run here).

    deploy_kubernetes_check.py DEPLOY_KUBERNETES_DIR BARGE_BINARY
    deploy_kubernetes_check.py --worker DEPLOY_KUBERNETES_DIR

The second form prints the worker container's argv (`args`), environment
(`env`) and the Job's `completions` as JSON, for a test that runs the same
command line against the built barge.

Renders the kustomization as `kubectl apply -k` would send it (its own
renderer of what kustomization.yaml may hold: resources, namespace,
images; anything else is refused), and where kubectl is installed compares
that with `kubectl kustomize`. Then checks the rendered objects, without a
cluster:
- the API, field by field (tests/deploy_kubernetes_schema.py): each
  apiVersion/kind one this folder may hold, its name a DNS-1123 label,
  every key a field of the API at its place with the right type or value
  (a typo such as `completionmode`, or `maxFailedIndexes: "3"`, is an
  error, as the API server's strict field validation makes it), required
  fields present; and the API server's own rules for a Job: per-index
  limits only on an Indexed Job, maxFailedIndexes only with
  backoffLimitPerIndex and at most completions, podFailurePolicy only with
  restartPolicy Never, FailIndex only with per-index limits, exit codes of
  a container the pod has;
- Pod Security: the namespace enforces a level (its
  pod-security.kubernetes.io/ labels well formed), the CronJob's pods meet
  it, and they meet restricted in everything but running as non-root (the
  one reason, namespace.yaml, the namespace enforces baseline);
- the worker contract of docs/fleet.md: a CronJob with concurrencyPolicy
  Forbid whose Job is Indexed with completions == parallelism ==
  BARGE_SHARD_COUNT, retries per index (backoffLimitPerIndex) that one
  failing shard cannot use up for the others (no backoffLimit below what
  every index may fail; maxFailedIndexes >= completions - 1),
  restartPolicy Never, and a container that runs
  `barge run --policy P --shard auto`;
- the wiring: every volumeMount names a volume, every ConfigMap and claim a
  volume uses is rendered here, the Secret is NOT (neither in the
  rendered objects nor in any file of the folder: applying would replace
  the real keys with these), the policy is mounted with subPath from a key
  the ConfigMap has, the Secret's mode is 0400 with no fsGroup (barge
  refuses group-readable keys), the claim is ReadWriteMany;
- the policy in the ConfigMap passes `barge policy check`, every source
  takes incrementals (changed_by is not full), and its targets and TLS
  paths lie on the container's mounts;
- the kustomization lists every manifest of the folder.
Prints one line per problem and exits 1 if there are any.
"""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

import yaml

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import deploy_kubernetes_schema as schema  # noqa: E402

problems = []


def problem(where, what):
    problems.append(f"{where}: {what}")


DNS1123 = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
CLUSTER_SCOPED = {"Namespace"}


def load_file(path, where):
    try:
        with open(path) as f:
            return [d for d in yaml.safe_load_all(f) if d is not None]
    except (OSError, yaml.YAMLError) as e:
        problem(where, f"not YAML: {e}")
        return []


def render(folder):
    """[(file, object)] as the kustomization in `folder` renders them."""
    kpath = os.path.join(folder, "kustomization.yaml")
    if not os.path.exists(kpath):
        problem(folder, "no kustomization.yaml")
        return []
    docs = load_file(kpath, "kustomization.yaml")
    if len(docs) != 1 or not isinstance(docs[0], dict):
        problem("kustomization.yaml", "not one object")
        return []
    k = dict(docs[0])
    if (k.pop("apiVersion", None), k.pop("kind", None)) != ("kustomize.config.k8s.io/v1beta1", "Kustomization"):
        problem("kustomization.yaml", "not a kustomize.config.k8s.io/v1beta1 Kustomization")
    for key in ("secretGenerator", "generators"):
        if key in k:
            problem("kustomization.yaml", f"{key}: a Secret generated here would replace the real one on every "
                    "apply; create the Secret outside the kustomization (kubectl create secret)")
            k.pop(key)
    schema.check("kustomization.yaml", k, schema.KUSTOMIZATION, problem)
    objects = []
    for res in k.get("resources") or []:
        path = os.path.join(folder, res)
        if os.path.isdir(path):
            objects += [(f"{res}/{f}", o) for f, o in render(path)]
            continue
        for obj in load_file(path, res):
            objects.append((res, obj))
    for _, obj in objects:
        if not isinstance(obj, dict):
            continue
        meta = obj.get("metadata")
        if k.get("namespace") and obj.get("kind") not in CLUSTER_SCOPED and isinstance(meta, dict):
            meta["namespace"] = k["namespace"]
        for image in k.get("images") or []:
            for c in containers_of(obj):
                name, tag = split_image(c.get("image", ""))
                if name == image["name"]:
                    new = image.get("newName", name)
                    if "digest" in image:
                        new += "@" + image["digest"]
                    elif "newTag" in image:
                        new += ":" + image["newTag"]
                    else:
                        new += tag
                    c["image"] = new
    return objects


def split_image(image):
    if "@" in image:
        at = image.index("@")
        return image[:at], image[at:]
    slash = image.rfind("/")
    colon = image.rfind(":")
    if colon > slash:
        return image[:colon], image[colon:]
    return image, ""


def pod_template(obj):
    """(metadata, spec) of the pods a workload object makes, else (None, None)."""
    spec = obj.get("spec") if isinstance(obj.get("spec"), dict) else {}
    if obj.get("kind") == "CronJob":
        spec = (spec.get("jobTemplate") or {}).get("spec") or {}
    elif obj.get("kind") != "Job":
        return None, None
    t = spec.get("template") or {}
    return t.get("metadata") or {}, t.get("spec") or {}


def containers_of(obj):
    _, pod = pod_template(obj)
    if not isinstance(pod, dict):
        return []
    return [c for c in (pod.get("initContainers") or []) + (pod.get("containers") or []) if isinstance(c, dict)]


def kubectl_render(folder):
    r = subprocess.run(["kubectl", "kustomize", folder], capture_output=True, text=True)
    if r.returncode != 0:
        problem(folder, f"`kubectl kustomize` fails: {r.stderr.strip()}")
        return None
    return [d for d in yaml.safe_load_all(r.stdout) if d is not None]


def key_of(obj):
    meta = obj.get("metadata") or {}
    return (obj.get("apiVersion"), obj.get("kind"), meta.get("namespace"), meta.get("name"))


def compare_with_kubectl(folder, objects):
    theirs = kubectl_render(folder)
    if theirs is None:
        return
    ours = {key_of(o): o for _, o in objects if isinstance(o, dict)}
    theirs = {key_of(o): o for o in theirs if isinstance(o, dict)}
    for key in sorted(set(ours) | set(theirs), key=str):
        if key not in theirs:
            problem(folder, f"{key}: rendered here, not by `kubectl kustomize`")
        elif key not in ours:
            problem(folder, f"{key}: rendered by `kubectl kustomize`, not here")
        elif ours[key] != theirs[key]:
            problem(folder, f"{key}: `kubectl kustomize` renders it otherwise: {difference(ours[key], theirs[key])}")


def difference(ours, theirs, path=""):
    """The first place where two rendered values differ, in words."""
    if isinstance(ours, dict) and isinstance(theirs, dict):
        for k in sorted(set(ours) | set(theirs), key=str):
            if ours.get(k, KeyError) != theirs.get(k, KeyError):
                return difference(ours.get(k, "(none)"), theirs.get(k, "(none)"), f"{path}.{k}")
    if isinstance(ours, list) and isinstance(theirs, list) and len(ours) == len(theirs):
        for i, (a, b) in enumerate(zip(ours, theirs)):
            if a != b:
                return difference(a, b, f"{path}[{i}]")
    return f"{path or '.'}: here {ours!r}, kubectl {theirs!r}"


def check_api(objects):
    """Field-level check of every object, and the API server's own rules."""
    for name, obj in objects:
        if not isinstance(obj, dict):
            problem(name, "a manifest is not an object")
            continue
        key = (obj.get("apiVersion"), obj.get("kind"))
        if key not in schema.KINDS:
            problem(name, f"unexpected apiVersion/kind {key}")
            continue
        where = f"{name}: {key[1]}"
        schema.check(where, {k: v for k, v in obj.items() if k not in ("apiVersion", "kind")},
                     schema.KINDS[key], problem)
        meta_name = (obj.get("metadata") or {}).get("name") or ""
        if not DNS1123.match(str(meta_name)) or len(str(meta_name)) > 63:
            problem(where, f"metadata.name '{meta_name}' is not a DNS-1123 label")
        for k, v in ((obj.get("metadata") or {}).get("labels") or {}).items():
            if not isinstance(v, str) or len(v) > 63 or not re.match(r"^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?$", v):
                problem(where, f"label {k}: {v!r} is no label value")
        if key[1] in ("Job", "CronJob"):
            spec = obj.get("spec") or {}
            job = (spec.get("jobTemplate") or {}).get("spec") or {} if key[1] == "CronJob" else spec
            if isinstance(job, dict):
                check_job_rules(where, job)


def check_job_rules(where, job):
    """batch/v1 Job validation of the API server (ValidateJobSpec)."""
    pod = (job.get("template") or {}).get("spec") or {}
    restart = pod.get("restartPolicy")
    if restart not in ("Never", "OnFailure"):
        problem(where, f"a Job's pods need restartPolicy Never or OnFailure, not {restart!r}")
    indexed = job.get("completionMode") == "Indexed"
    completions = job.get("completions")
    if indexed and completions is None:
        problem(where, "an Indexed Job needs completions")
    for f in ("completions", "parallelism", "backoffLimit", "backoffLimitPerIndex", "maxFailedIndexes",
              "activeDeadlineSeconds", "ttlSecondsAfterFinished"):
        if isinstance(job.get(f), int) and job[f] < 0:
            problem(where, f"{f} must not be negative")
    if "backoffLimitPerIndex" in job and not indexed:
        problem(where, "backoffLimitPerIndex requires completionMode: Indexed")
    if "maxFailedIndexes" in job:
        if "backoffLimitPerIndex" not in job:
            problem(where, "maxFailedIndexes requires backoffLimitPerIndex")
        elif isinstance(completions, int) and isinstance(job["maxFailedIndexes"], int) and \
                job["maxFailedIndexes"] > completions:
            problem(where, f"maxFailedIndexes {job['maxFailedIndexes']} exceeds completions {completions}")
    if "backoffLimitPerIndex" in job and restart != "Never":
        problem(where, "backoffLimitPerIndex requires restartPolicy Never")
    policy = job.get("podFailurePolicy")
    if not isinstance(policy, dict):
        return
    if restart != "Never":
        problem(where, "podFailurePolicy requires restartPolicy Never")
    names = {c.get("name") for c in (pod.get("containers") or []) + (pod.get("initContainers") or [])
             if isinstance(c, dict)}
    for i, rule in enumerate(policy.get("rules") or []):
        if not isinstance(rule, dict):
            continue
        at = f"{where}: podFailurePolicy.rules[{i}]"
        if ("onExitCodes" in rule) == ("onPodConditions" in rule):
            problem(at, "needs exactly one of onExitCodes, onPodConditions")
        if rule.get("action") == "FailIndex" and "backoffLimitPerIndex" not in job:
            problem(at, "FailIndex requires backoffLimitPerIndex")
        codes = rule.get("onExitCodes")
        if isinstance(codes, dict):
            if "containerName" in codes and codes["containerName"] not in names:
                problem(at, f"containerName {codes['containerName']!r} is no container of the pod")
            values = codes.get("values") or []
            if not values or len(values) > 255:
                problem(at, "onExitCodes.values: 1 to 255 exit codes")
            if values != sorted(set(values)):
                problem(at, "onExitCodes.values must be ordered and unique")
            if codes.get("operator") == "In" and 0 in values:
                problem(at, "onExitCodes In must not hold 0")


def check_pod_security(objects):
    namespaces = {o["metadata"]["name"]: o for _, o in objects
                  if isinstance(o, dict) and o.get("kind") == "Namespace" and isinstance(o.get("metadata"), dict)}
    for name, obj in objects:
        if not isinstance(obj, dict) or obj.get("kind") not in ("Job", "CronJob"):
            continue
        meta, pod = pod_template(obj)
        if not isinstance(pod, dict):
            continue
        where = f"{name}: {obj['kind']} {obj['metadata'].get('name')}"
        ns_name = obj["metadata"].get("namespace")
        ns = namespaces.get(ns_name)
        if ns is None:
            problem(where, f"its namespace {ns_name!r} is not rendered here: no Pod Security level is known")
            continue
        labels = ns["metadata"].get("labels") or {}
        for mode in ("enforce", "audit", "warn"):
            level = labels.get(f"pod-security.kubernetes.io/{mode}")
            version = labels.get(f"pod-security.kubernetes.io/{mode}-version")
            if level is not None and level not in schema.PSA_LEVELS:
                problem(f"Namespace {ns_name}", f"pod-security.kubernetes.io/{mode}: {level!r} is no level")
            if version is not None and not schema.PSA_VERSION.match(str(version)):
                problem(f"Namespace {ns_name}", f"pod-security.kubernetes.io/{mode}-version: {version!r}")
        enforce = labels.get("pod-security.kubernetes.io/enforce")
        if enforce not in ("baseline", "restricted"):
            problem(f"Namespace {ns_name}", "pod-security.kubernetes.io/enforce must be baseline or restricted "
                    f"(is {enforce!r}; without it the cluster's default decides whether the pods start)")
            continue
        broken = schema.pod_security(meta, pod)
        for level in ("baseline", "restricted") if enforce == "restricted" else ("baseline",):
            for control, detail in broken[level]:
                problem(where, f"Pod Security {enforce} (namespace {ns_name}) refuses the pods: {control}: {detail}")
        if enforce == "baseline":
            for control, detail in broken["restricted"]:
                if control not in ("runAsNonRoot", "runAsUser"):
                    problem(where, f"the pods must meet restricted in all but running as non-root: {control}: {detail}")


def main():
    folder, barge = sys.argv[1], sys.argv[2]
    objects = render(folder)
    if shutil.which("kubectl"):
        compare_with_kubectl(folder, objects)
    check_api(objects)
    check_pod_security(objects)
    objects = [(n, o) for n, o in objects if isinstance(o, dict) and isinstance(o.get("metadata"), dict)]
    by_kind = {}
    for name, obj in objects:
        by_kind.setdefault(obj.get("kind"), []).append((name, obj))

    def named(kind, name):
        return [o for _, o in by_kind.get(kind, []) if o["metadata"].get("name") == name]

    # The kustomization lists every manifest; no file holds a Secret.
    files = {n.split("/")[0] for n, _ in objects}
    for name in sorted(os.listdir(folder)):
        if not name.endswith((".yaml", ".yml")) or name == "kustomization.yaml":
            continue
        if name not in files:
            problem("kustomization.yaml", f"{name} is in the folder but not in resources")
        for doc in load_file(os.path.join(folder, name), name):
            if isinstance(doc, dict) and doc.get("kind") == "Secret":
                problem(name, "holds a Secret: `kubectl apply -f` of the folder would replace the real keys "
                        "with these (create it with kubectl create secret)")

    cronjobs = by_kind.get("CronJob", [])
    if len(cronjobs) != 1:
        problem(folder, f"expected one CronJob, found {len(cronjobs)}")
        return
    name, cj = cronjobs[0]
    where = f"{name}: CronJob {cj['metadata'].get('name')}"
    spec = cj.get("spec") or {}
    fields = str(spec.get("schedule", "")).split()
    if len(fields) != 5:
        problem(where, f"schedule '{spec.get('schedule')}' is not five cron fields")
    if spec.get("concurrencyPolicy") != "Forbid":
        problem(where, "concurrencyPolicy must be Forbid (no second Job while one runs)")
    job = (spec.get("jobTemplate") or {}).get("spec") or {}
    if job.get("completionMode") != "Indexed":
        problem(where, "the Job must be Indexed (completionMode: Indexed): JOB_COMPLETION_INDEX is the shard")
    n = job.get("completions")
    if not isinstance(n, int) or n < 1:
        problem(where, f"completions must be a count >= 1, is {n!r}")
        return
    if job.get("parallelism") != n:
        problem(where, f"parallelism {job.get('parallelism')!r} differs from completions {n!r}")
    per_index = job.get("backoffLimitPerIndex")
    if per_index is None:
        problem(where, "no backoffLimitPerIndex: backoffLimit alone counts the failures of all shards together, "
                "so one failing shard fails the Job and Kubernetes kills the others mid-backup")
        per_index = 0
    elif not isinstance(per_index, int) or per_index < 1:
        problem(where, "backoffLimitPerIndex must allow retries (>= 1): a shard's retries are its own")
        per_index = 0
    if "backoffLimit" in job and isinstance(job["backoffLimit"], int) and job["backoffLimit"] < n * (per_index + 1):
        problem(where, f"backoffLimit {job['backoffLimit']} counts the failures of all shards together: one "
                f"failing shard would fail the Job and kill the others (drop it, or >= {n * (per_index + 1)})")
    mfi = job.get("maxFailedIndexes")
    if isinstance(mfi, int) and mfi < n - 1:
        problem(where, f"maxFailedIndexes {mfi}: once {mfi + 1} shards failed, Kubernetes would stop the others "
                f"mid-backup (>= {n - 1})")
    pod = (job.get("template") or {}).get("spec") or {}
    if pod.get("restartPolicy") != "Never":
        problem(where, "restartPolicy must be Never (a failed pod is retried by the Job, counted per index)")
    if "fsGroup" in (pod.get("securityContext") or {}):
        problem(where, "fsGroup makes the Secret's files group-readable (0440): barge refuses such key files")
    volumes = {v.get("name"): v for v in pod.get("volumes") or []}
    mounts = {}
    for c in containers_of(cj):
        for m in c.get("volumeMounts") or []:
            if m.get("name") not in volumes:
                problem(where, f"container {c.get('name')} mounts '{m.get('name')}', which is no volume")
    for vname, v in volumes.items():
        if "configMap" in v and not named("ConfigMap", v["configMap"].get("name")):
            problem(where, f"volume {vname}: ConfigMap {v['configMap'].get('name')} is not defined here")
        if "secret" in v:
            if named("Secret", v["secret"].get("secretName")):
                problem(where, f"volume {vname}: Secret {v['secret'].get('secretName')} is rendered by the "
                        "kustomization: `kubectl apply -k` would replace the real keys with these")
            if v["secret"].get("defaultMode") != 0o400:
                problem(where, f"volume {vname}: the Secret's defaultMode must be 0400, is "
                        f"{oct(v['secret'].get('defaultMode') or 0)}")
        if "persistentVolumeClaim" in v:
            claims = named("PersistentVolumeClaim", v["persistentVolumeClaim"].get("claimName"))
            if not claims:
                problem(where, f"volume {vname}: claim {v['persistentVolumeClaim'].get('claimName')} is not defined here")
            elif "ReadWriteMany" not in (claims[0].get("spec") or {}).get("accessModes", []):
                problem(where, f"volume {vname}: the shards share the claim: it must be ReadWriteMany")

    workers = [c for c in pod.get("containers") or [] if c.get("name") == "barge"]
    if len(workers) != 1:
        problem(where, "no container named barge")
        return
    c = workers[0]
    argv = list(c.get("command") or []) + list(c.get("args") or [])
    if argv[:1] != ["run"] or "--shard" not in argv or argv[argv.index("--shard") + 1:][:1] != ["auto"]:
        problem(where, f"the worker must run `barge run ... --shard auto`, runs {argv}")
    env = {e.get("name"): e.get("value") for e in c.get("env") or []}
    if "--shard-count" in argv:
        count = argv[argv.index("--shard-count") + 1]
    else:
        count = env.get("BARGE_SHARD_COUNT")
    if count != str(n):
        problem(where, f"the shard count ({count!r}: --shard-count or BARGE_SHARD_COUNT) differs from completions {n}")
    for m in c.get("volumeMounts") or []:
        mounts[m.get("mountPath")] = m
    if "--policy" not in argv:
        problem(where, "no --policy")
        return
    policy_path = argv[argv.index("--policy") + 1]
    pm = mounts.get(policy_path)
    if pm is None or "subPath" not in pm:
        problem(where, f"the policy {policy_path} must be a subPath mount of the ConfigMap "
                "(a stable real path: TARGET/<name>/.barge-policy records it)")
        return
    cm_volume = volumes.get(pm["name"], {}).get("configMap")
    cms = named("ConfigMap", cm_volume.get("name")) if cm_volume else []
    if not cms or pm["subPath"] not in (cms[0].get("data") or {}):
        problem(where, f"the policy mount's subPath {pm['subPath']} is no key of the policy ConfigMap")
        return
    check_policy(where, barge, cms[0]["data"][pm["subPath"]], mounts, argv)


def check_policy(where, barge, policy_text, mounts, argv):
    def on_mount(path):
        return any(path == mp or path.startswith(mp.rstrip("/") + "/") for mp in mounts)

    with tempfile.TemporaryDirectory(prefix="barge-test-k8s-") as tmp:
        pfile = os.path.join(tmp, "policy.yaml")
        with open(pfile, "w") as f:
            f.write(policy_text)
        r = subprocess.run([barge, "policy", "check", "--json", pfile], capture_output=True, text=True)
        if r.returncode != 0:
            problem(where, f"the ConfigMap's policy fails `barge policy check` ({r.returncode}): {r.stderr.strip()}")
            return
        result = [json.loads(line) for line in r.stdout.splitlines() if line.strip()][-1]
    for t in result.get("targets", []):
        t = t if isinstance(t, str) else t.get("path", "")
        if not on_mount(t):
            problem(where, f"policy target {t} is on no volume of the worker")
    for s in result.get("sources", []):
        if s.get("changed_by") == "full":
            problem(where, f"source {s.get('name')}: every backup is a full (changed_by: full); the example's "
                    "sources must take incrementals (changed_by: digests, or a bitmap)")
        for m in re.finditer(r"tls-(?:certificates|psk-file)=([^&]+)", s.get("location", "")):
            if not on_mount(m.group(1)):
                problem(where, f"source {s.get('name')}: {m.group(0)} is on no volume of the worker")
    catalog = argv[argv.index("--catalog") + 1] if "--catalog" in argv else None
    if catalog is None or not on_mount(catalog):
        problem(where, "--catalog (the records folder) must be on a volume the shards share")


def worker(folder):
    for _, obj in render(folder):
        if isinstance(obj, dict) and obj.get("kind") == "CronJob":
            job = obj["spec"]["jobTemplate"]["spec"]
            c = [c for c in job["template"]["spec"]["containers"] if c["name"] == "barge"][0]
            print(json.dumps({"args": list(c.get("command") or []) + list(c.get("args") or []),
                              "env": {e["name"]: e["value"] for e in c.get("env", []) if "value" in e},
                              "completions": job["completions"]}))
            return 0
    print("no CronJob", *problems, sep="\n", file=sys.stderr)
    return 1


if __name__ == "__main__":
    if sys.argv[1] == "--worker":
        sys.exit(worker(sys.argv[2]))
    main()
    for p in problems:
        print(p)
    sys.exit(1 if problems else 0)
