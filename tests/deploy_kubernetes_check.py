#!/usr/bin/env python3
"""Offline check of deploy/kubernetes/ (no API server can run here).

    deploy_kubernetes_check.py DEPLOY_KUBERNETES_DIR BARGE_BINARY
    deploy_kubernetes_check.py --worker DEPLOY_KUBERNETES_DIR

The second form prints the worker container's argv (`args`), environment
(`env`) and the Job's `completions` as JSON, for a test that runs the same
command line against the built barge.

Reads every manifest with python3-yaml and checks, without a cluster:
- each object's apiVersion/kind is one this folder may hold, its name a
  DNS-1123 name, and every key one of the Kubernetes API's fields for that
  place (a typo such as `completionmode` is an error, as the API server's
  strict field validation would make it);
- the worker contract of docs/fleet.md: a CronJob with concurrencyPolicy
  Forbid whose Job is Indexed with completions == parallelism ==
  BARGE_SHARD_COUNT, retries (backoffLimit), restartPolicy Never, and a
  container that runs `barge run --policy P --shard auto`;
- the wiring: every volumeMount names a volume, every ConfigMap, Secret and
  PersistentVolumeClaim a volume uses is defined here, the policy is
  mounted with subPath from a key the ConfigMap has, the Secret's mode is
  0400 with no fsGroup (barge refuses group-readable keys), the claim is
  ReadWriteMany;
- the policy in the ConfigMap passes `barge policy check`, and its targets
  and TLS paths lie on the container's mounts;
- the kustomization lists every manifest.
Prints one line per problem and exits 1 if there are any.
"""
import json
import os
import re
import subprocess
import sys
import tempfile

import yaml

problems = []


def problem(where, what):
    problems.append(f"{where}: {what}")


# Allowed fields, by place: a dict maps a key to the schema of its value
# (None: any value; a dict: an object; [schema]: a list of them).
LABELS = None
META = {"name": None, "namespace": None, "labels": LABELS, "annotations": None}
SECURITY = {
    "runAsUser": None, "runAsGroup": None, "runAsNonRoot": None, "allowPrivilegeEscalation": None,
    "readOnlyRootFilesystem": None, "privileged": None,
    "capabilities": {"drop": None, "add": None}, "seccompProfile": {"type": None},
}
ENV = {"name": None, "value": None, "valueFrom": None}
MOUNT = {"name": None, "mountPath": None, "subPath": None, "readOnly": None}
CONTAINER = {
    "name": None, "image": None, "imagePullPolicy": None, "command": None, "args": None,
    "env": [ENV], "envFrom": None, "workingDir": None,
    "resources": {"requests": None, "limits": None},
    "securityContext": SECURITY, "volumeMounts": [MOUNT],
}
VOLUME = {
    "name": None,
    "configMap": {"name": None, "items": None, "defaultMode": None, "optional": None},
    "secret": {"secretName": None, "items": None, "defaultMode": None, "optional": None},
    "persistentVolumeClaim": {"claimName": None, "readOnly": None},
    "emptyDir": {"medium": None, "sizeLimit": None},
}
POD_SPEC = {
    "restartPolicy": None, "terminationGracePeriodSeconds": None, "serviceAccountName": None,
    "nodeSelector": None, "tolerations": None, "affinity": None, "priorityClassName": None,
    "topologySpreadConstraints": [{
        "maxSkew": None, "topologyKey": None, "whenUnsatisfiable": None,
        "labelSelector": {"matchLabels": None, "matchExpressions": None},
    }],
    "securityContext": {"runAsUser": None, "runAsGroup": None, "fsGroup": None, "seccompProfile": None},
    "initContainers": [CONTAINER], "containers": [CONTAINER], "volumes": [VOLUME],
}
JOB_SPEC = {
    "completionMode": None, "completions": None, "parallelism": None, "backoffLimit": None,
    "backoffLimitPerIndex": None, "maxFailedIndexes": None, "activeDeadlineSeconds": None,
    "ttlSecondsAfterFinished": None,
    "podFailurePolicy": {"rules": [{
        "action": None,
        "onExitCodes": {"containerName": None, "operator": None, "values": None},
        "onPodConditions": [{"type": None, "status": None}],
    }]},
    "template": {"metadata": META, "spec": POD_SPEC},
}
KINDS = {
    ("v1", "Namespace"): {"metadata": META},
    ("v1", "ConfigMap"): {"metadata": META, "data": None},
    ("v1", "Secret"): {"metadata": META, "type": None, "data": None, "stringData": None},
    ("v1", "PersistentVolumeClaim"): {"metadata": META, "spec": {
        "accessModes": None, "storageClassName": None, "volumeMode": None,
        "resources": {"requests": None}}},
    ("batch/v1", "CronJob"): {"metadata": META, "spec": {
        "schedule": None, "timeZone": None, "concurrencyPolicy": None, "startingDeadlineSeconds": None,
        "successfulJobsHistoryLimit": None, "failedJobsHistoryLimit": None, "suspend": None,
        "jobTemplate": {"metadata": META, "spec": JOB_SPEC}}},
    ("kustomize.config.k8s.io/v1beta1", "Kustomization"): {
        "namespace": None, "resources": None, "images": None, "labels": None},
}


def check_fields(where, value, schema):
    if schema is None:
        return
    if isinstance(schema, list):
        if not isinstance(value, list):
            problem(where, f"expected a list, got {type(value).__name__}")
            return
        for i, item in enumerate(value):
            check_fields(f"{where}[{i}]", item, schema[0])
        return
    if not isinstance(value, dict):
        problem(where, f"expected an object, got {type(value).__name__}")
        return
    for key, sub in value.items():
        if key not in schema:
            problem(where, f"unknown field '{key}' (known: {', '.join(sorted(schema))})")
            continue
        check_fields(f"{where}.{key}", sub, schema[key])


DNS1123 = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def load(folder):
    objects = []  # (file, object)
    for name in sorted(os.listdir(folder)):
        if not name.endswith((".yaml", ".yml")):
            continue
        path = os.path.join(folder, name)
        try:
            with open(path) as f:
                docs = [d for d in yaml.safe_load_all(f) if d is not None]
        except yaml.YAMLError as e:
            problem(name, f"not YAML: {e}")
            continue
        for doc in docs:
            objects.append((name, doc))
    return objects


def main():
    folder, barge = sys.argv[1], sys.argv[2]
    objects = load(folder)
    by_kind = {}
    files = set()
    for name, obj in objects:
        if not isinstance(obj, dict):
            problem(name, "a manifest is not an object")
            continue
        key = (obj.get("apiVersion"), obj.get("kind"))
        where = f"{name}: {key[1]}"
        if key not in KINDS:
            problem(name, f"unexpected apiVersion/kind {key}")
            continue
        check_fields(where, {k: v for k, v in obj.items() if k not in ("apiVersion", "kind")}, KINDS[key])
        if key[1] != "Kustomization":
            files.add(name)
            meta_name = (obj.get("metadata") or {}).get("name", "")
            if not DNS1123.match(meta_name or "") or len(meta_name) > 63:
                problem(where, f"metadata.name '{meta_name}' is not a DNS-1123 label")
        by_kind.setdefault(key[1], []).append((name, obj))

    def named(kind, name):
        return [o for _, o in by_kind.get(kind, []) if o["metadata"]["name"] == name]

    # The kustomization lists every manifest.
    for name, k in by_kind.get("Kustomization", []):
        listed = set(k.get("resources") or [])
        if listed != files:
            problem(name, f"resources {sorted(listed)} differ from the manifests {sorted(files)}")
    if not by_kind.get("Kustomization"):
        problem(folder, "no kustomization.yaml")

    cronjobs = by_kind.get("CronJob", [])
    if len(cronjobs) != 1:
        problem(folder, f"expected one CronJob, found {len(cronjobs)}")
        return
    name, cj = cronjobs[0]
    where = f"{name}: CronJob {cj['metadata']['name']}"
    spec = cj["spec"]
    fields = str(spec.get("schedule", "")).split()
    if len(fields) != 5:
        problem(where, f"schedule '{spec.get('schedule')}' is not five cron fields")
    if spec.get("concurrencyPolicy") != "Forbid":
        problem(where, "concurrencyPolicy must be Forbid (no second Job while one runs)")
    job = spec["jobTemplate"]["spec"]
    if job.get("completionMode") != "Indexed":
        problem(where, "the Job must be Indexed (completionMode: Indexed): JOB_COMPLETION_INDEX is the shard")
    n = job.get("completions")
    if not isinstance(n, int) or n < 1:
        problem(where, f"completions must be a count >= 1, is {n!r}")
    if job.get("parallelism") != n:
        problem(where, f"parallelism {job.get('parallelism')!r} differs from completions {n!r}")
    if not isinstance(job.get("backoffLimit"), int) or job["backoffLimit"] < 1:
        problem(where, "backoffLimit must allow retries (>= 1)")
    pod = job["template"]["spec"]
    if pod.get("restartPolicy") != "Never":
        problem(where, "restartPolicy must be Never (a failed pod is retried by the Job, counted by backoffLimit)")
    if "fsGroup" in (pod.get("securityContext") or {}):
        problem(where, "fsGroup makes the Secret's files group-readable (0440): barge refuses such key files")
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    mounts = {}
    for c in pod.get("initContainers", []) + pod.get("containers", []):
        for m in c.get("volumeMounts", []):
            if m["name"] not in volumes:
                problem(where, f"container {c['name']} mounts '{m['name']}', which is no volume")
    for vname, v in volumes.items():
        if "configMap" in v and not named("ConfigMap", v["configMap"]["name"]):
            problem(where, f"volume {vname}: ConfigMap {v['configMap']['name']} is not defined here")
        if "secret" in v:
            if not named("Secret", v["secret"]["secretName"]):
                problem(where, f"volume {vname}: Secret {v['secret']['secretName']} is not defined here")
            if v["secret"].get("defaultMode") != 0o400:
                problem(where, f"volume {vname}: the Secret's defaultMode must be 0400, is "
                        f"{oct(v['secret'].get('defaultMode') or 0)}")
        if "persistentVolumeClaim" in v:
            claims = named("PersistentVolumeClaim", v["persistentVolumeClaim"]["claimName"])
            if not claims:
                problem(where, f"volume {vname}: claim {v['persistentVolumeClaim']['claimName']} is not defined here")
            elif "ReadWriteMany" not in claims[0]["spec"].get("accessModes", []):
                problem(where, f"volume {vname}: the shards share the claim: it must be ReadWriteMany")

    workers = [c for c in pod.get("containers", []) if c.get("name") == "barge"]
    if len(workers) != 1:
        problem(where, "no container named barge")
        return
    c = workers[0]
    argv = list(c.get("command") or []) + list(c.get("args") or [])
    if argv[:1] != ["run"] or "--shard" not in argv or argv[argv.index("--shard") + 1] != "auto":
        problem(where, f"the worker must run `barge run ... --shard auto`, runs {argv}")
    env = {e["name"]: e.get("value") for e in c.get("env", [])}
    if "--shard-count" in argv:
        count = argv[argv.index("--shard-count") + 1]
    else:
        count = env.get("BARGE_SHARD_COUNT")
    if count != str(n):
        problem(where, f"the shard count ({count!r}: --shard-count or BARGE_SHARD_COUNT) differs from completions {n}")
    for m in c.get("volumeMounts", []):
        mounts[m["mountPath"]] = m
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
    cms = named("ConfigMap", cm_volume["name"]) if cm_volume else []
    if not cms or pm["subPath"] not in (cms[0].get("data") or {}):
        problem(where, f"the policy mount's subPath {pm['subPath']} is no key of the policy ConfigMap")
        return
    policy_text = cms[0]["data"][pm["subPath"]]

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
        result = [json.loads(l) for l in r.stdout.splitlines() if l.strip()][-1]
    for t in result.get("targets", []):
        t = t if isinstance(t, str) else t.get("path", "")
        if not on_mount(t):
            problem(where, f"policy target {t} is on no volume of the worker")
    for s in result.get("sources", []):
        for m in re.finditer(r"tls-(?:certificates|psk-file)=([^&]+)", s.get("location", "")):
            if not on_mount(m.group(1)):
                problem(where, f"source {s.get('name')}: {m.group(0)} is on no volume of the worker")
    catalog = argv[argv.index("--catalog") + 1] if "--catalog" in argv else None
    if catalog is None or not on_mount(catalog):
        problem(where, "--catalog (the records folder) must be on a volume the shards share")


def worker(folder):
    for _, obj in load(folder):
        if isinstance(obj, dict) and obj.get("kind") == "CronJob":
            job = obj["spec"]["jobTemplate"]["spec"]
            c = [c for c in job["template"]["spec"]["containers"] if c["name"] == "barge"][0]
            print(json.dumps({"args": list(c.get("command") or []) + list(c.get("args") or []),
                              "env": {e["name"]: e["value"] for e in c.get("env", []) if "value" in e},
                              "completions": job["completions"]}))
            return 0
    print("no CronJob", file=sys.stderr)
    return 1


if __name__ == "__main__":
    if sys.argv[1] == "--worker":
        sys.exit(worker(sys.argv[2]))
    main()
    for p in problems:
        print(p)
    sys.exit(1 if problems else 0)
