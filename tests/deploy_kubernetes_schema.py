"""The parts of the Kubernetes API that deploy/kubernetes/ relies on, kept by
hand for tests/deploy_kubernetes_check.py (no API server, and no OpenAPI
document, on the machines barge is built on).

A schema is one of: a type name (STRING, INTEGER, BOOLEAN, INT_OR_STRING,
QUANTITY, ANY); an Enum of the strings the API accepts; an Obj of the fields
allowed at that place (with those it requires); a MapOf values (labels,
annotations, data); or [schema], a list of them. check() reports every
unknown field, wrong type and missing required field, as the API server's
strict field validation (kubectl's default --validate=strict) and its type
checks would. Fields are those of batch/v1 and core/v1 as of Kubernetes
1.33, limited to what a backup worker may plausibly set; a field missing
here fails the check until it is added, deliberately.

pod_security() holds the Pod Security Standards' controls (baseline and
restricted, as the PodSecurity admission of Kubernetes 1.33 checks them).
"""
import re

STRING, INTEGER, BOOLEAN, INT_OR_STRING, QUANTITY, ANY = (
    "string", "integer", "boolean", "int-or-string", "quantity", "any")


class Enum:
    def __init__(self, *values):
        self.values = values


class MapOf:
    def __init__(self, value):
        self.value = value


class Obj:
    def __init__(self, required=(), **fields):
        self.fields = fields
        self.required = required


QUANTITY_RE = re.compile(r"^[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+|[KMGTPE]i?|[numkMGTPE])?$")


def _type_ok(value, kind):
    if kind == ANY:
        return True
    if kind == STRING:
        return isinstance(value, str)
    if kind == BOOLEAN:
        return isinstance(value, bool)
    if kind == INTEGER:
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == INT_OR_STRING:
        return isinstance(value, (int, str)) and not isinstance(value, bool)
    if kind == QUANTITY:
        if isinstance(value, bool):
            return False
        return isinstance(value, (int, float)) or (isinstance(value, str) and bool(QUANTITY_RE.match(value)))
    raise ValueError(kind)


def check(where, value, schema, problem):
    """Reports through problem(where, what) every way `value` is not `schema`."""
    if isinstance(schema, str):
        if not _type_ok(value, schema):
            problem(where, f"expected {schema}, got {type(value).__name__} {value!r}")
    elif isinstance(schema, Enum):
        if value not in schema.values:
            problem(where, f"{value!r} is not one of {', '.join(schema.values)}")
    elif isinstance(schema, list):
        if not isinstance(value, list):
            problem(where, f"expected a list, got {type(value).__name__}")
            return
        for i, item in enumerate(value):
            check(f"{where}[{i}]", item, schema[0], problem)
    elif isinstance(schema, MapOf):
        if not isinstance(value, dict):
            problem(where, f"expected an object, got {type(value).__name__}")
            return
        for k, v in value.items():
            if not isinstance(k, str):
                problem(where, f"key {k!r} is not a string")
            check(f"{where}.{k}", v, schema.value, problem)
    elif isinstance(schema, Obj):
        if not isinstance(value, dict):
            problem(where, f"expected an object, got {type(value).__name__}")
            return
        for key, sub in value.items():
            if key not in schema.fields:
                problem(where, f"unknown field '{key}' (known: {', '.join(sorted(schema.fields))})")
                continue
            check(f"{where}.{key}", sub, schema.fields[key], problem)
        for key in schema.required:
            if key not in value:
                problem(where, f"required field '{key}' is missing")
    else:
        raise ValueError(schema)


STRINGS = [STRING]
META = Obj(name=STRING, namespace=STRING, labels=MapOf(STRING), annotations=MapOf(STRING))
TEMPLATE_META = Obj(name=STRING, labels=MapOf(STRING), annotations=MapOf(STRING))
SECCOMP = Obj(required=("type",), type=Enum("RuntimeDefault", "Localhost", "Unconfined"), localhostProfile=STRING)
APPARMOR = Obj(required=("type",), type=Enum("RuntimeDefault", "Localhost", "Unconfined"), localhostProfile=STRING)
SELINUX = Obj(user=STRING, role=STRING, type=STRING, level=STRING)
WINDOWS = Obj(gmsaCredentialSpecName=STRING, gmsaCredentialSpec=STRING, runAsUserName=STRING, hostProcess=BOOLEAN)
CONTAINER_SECURITY = Obj(
    runAsUser=INTEGER, runAsGroup=INTEGER, runAsNonRoot=BOOLEAN, allowPrivilegeEscalation=BOOLEAN,
    readOnlyRootFilesystem=BOOLEAN, privileged=BOOLEAN, procMount=Enum("Default", "Unmasked"),
    capabilities=Obj(drop=STRINGS, add=STRINGS), seccompProfile=SECCOMP, appArmorProfile=APPARMOR,
    seLinuxOptions=SELINUX, windowsOptions=WINDOWS)
POD_SECURITY = Obj(
    runAsUser=INTEGER, runAsGroup=INTEGER, runAsNonRoot=BOOLEAN, fsGroup=INTEGER,
    fsGroupChangePolicy=Enum("OnRootMismatch", "Always"), supplementalGroups=[INTEGER],
    supplementalGroupsPolicy=Enum("Merge", "Strict"), seccompProfile=SECCOMP, appArmorProfile=APPARMOR,
    seLinuxOptions=SELINUX, windowsOptions=WINDOWS,
    sysctls=[Obj(required=("name", "value"), name=STRING, value=STRING)])
KEY_SELECTOR = Obj(required=("key",), name=STRING, key=STRING, optional=BOOLEAN)
ENV = Obj(required=("name",), name=STRING, value=STRING, valueFrom=Obj(
    fieldRef=Obj(required=("fieldPath",), apiVersion=STRING, fieldPath=STRING),
    resourceFieldRef=Obj(required=("resource",), containerName=STRING, resource=STRING, divisor=QUANTITY),
    configMapKeyRef=KEY_SELECTOR, secretKeyRef=KEY_SELECTOR))
MOUNT = Obj(required=("name", "mountPath"), name=STRING, mountPath=STRING, subPath=STRING, subPathExpr=STRING,
            readOnly=BOOLEAN, mountPropagation=Enum("None", "HostToContainer", "Bidirectional"))
PORT = Obj(required=("containerPort",), name=STRING, containerPort=INTEGER, hostPort=INTEGER, hostIP=STRING,
           protocol=Enum("TCP", "UDP", "SCTP"))
CONTAINER = Obj(
    required=("name", "image"),
    name=STRING, image=STRING, imagePullPolicy=Enum("Always", "Never", "IfNotPresent"), command=STRINGS,
    args=STRINGS, env=[ENV], envFrom=[Obj(prefix=STRING, configMapRef=Obj(name=STRING, optional=BOOLEAN),
                                          secretRef=Obj(name=STRING, optional=BOOLEAN))],
    workingDir=STRING, ports=[PORT],
    resources=Obj(requests=MapOf(QUANTITY), limits=MapOf(QUANTITY)),
    securityContext=CONTAINER_SECURITY, volumeMounts=[MOUNT],
    terminationMessagePolicy=Enum("File", "FallbackToLogsOnError"))
KEY_TO_PATH = Obj(required=("key", "path"), key=STRING, path=STRING, mode=INTEGER)
VOLUME = Obj(
    required=("name",), name=STRING,
    configMap=Obj(name=STRING, items=[KEY_TO_PATH], defaultMode=INTEGER, optional=BOOLEAN),
    secret=Obj(secretName=STRING, items=[KEY_TO_PATH], defaultMode=INTEGER, optional=BOOLEAN),
    persistentVolumeClaim=Obj(required=("claimName",), claimName=STRING, readOnly=BOOLEAN),
    emptyDir=Obj(medium=Enum("", "Memory"), sizeLimit=QUANTITY),
    hostPath=Obj(required=("path",), path=STRING, type=STRING),
    nfs=Obj(required=("server", "path"), server=STRING, path=STRING, readOnly=BOOLEAN))
LABEL_SELECTOR = Obj(matchLabels=MapOf(STRING), matchExpressions=[Obj(
    required=("key", "operator"), key=STRING, operator=Enum("In", "NotIn", "Exists", "DoesNotExist"),
    values=STRINGS)])
POD_SPEC = Obj(
    required=("containers",),
    restartPolicy=Enum("Always", "OnFailure", "Never"), terminationGracePeriodSeconds=INTEGER,
    activeDeadlineSeconds=INTEGER, serviceAccountName=STRING, automountServiceAccountToken=BOOLEAN,
    nodeSelector=MapOf(STRING), priorityClassName=STRING, hostNetwork=BOOLEAN, hostPID=BOOLEAN, hostIPC=BOOLEAN,
    tolerations=[Obj(key=STRING, operator=Enum("Exists", "Equal"), value=STRING,
                     effect=Enum("NoSchedule", "PreferNoSchedule", "NoExecute"), tolerationSeconds=INTEGER)],
    affinity=ANY,
    topologySpreadConstraints=[Obj(
        required=("maxSkew", "topologyKey", "whenUnsatisfiable"),
        maxSkew=INTEGER, topologyKey=STRING, whenUnsatisfiable=Enum("DoNotSchedule", "ScheduleAnyway"),
        labelSelector=LABEL_SELECTOR, minDomains=INTEGER, matchLabelKeys=STRINGS)],
    securityContext=POD_SECURITY, initContainers=[CONTAINER], containers=[CONTAINER], volumes=[VOLUME])
POD_FAILURE_RULE = Obj(
    required=("action",),
    action=Enum("FailJob", "FailIndex", "Ignore", "Count"),
    onExitCodes=Obj(required=("operator", "values"), containerName=STRING, operator=Enum("In", "NotIn"),
                    values=[INTEGER]),
    onPodConditions=[Obj(required=("type",), type=STRING, status=Enum("True", "False", "Unknown"))])
JOB_SPEC = Obj(
    required=("template",),
    completionMode=Enum("NonIndexed", "Indexed"), completions=INTEGER, parallelism=INTEGER,
    backoffLimit=INTEGER, backoffLimitPerIndex=INTEGER, maxFailedIndexes=INTEGER,
    activeDeadlineSeconds=INTEGER, ttlSecondsAfterFinished=INTEGER, suspend=BOOLEAN,
    podReplacementPolicy=Enum("TerminatingOrFailed", "Failed"),
    podFailurePolicy=Obj(required=("rules",), rules=[POD_FAILURE_RULE]),
    template=Obj(required=("spec",), metadata=TEMPLATE_META, spec=POD_SPEC))
KINDS = {
    ("v1", "Namespace"): Obj(required=("metadata",), metadata=META),
    ("v1", "ConfigMap"): Obj(required=("metadata",), metadata=META, data=MapOf(STRING), immutable=BOOLEAN),
    ("v1", "Secret"): Obj(required=("metadata",), metadata=META, type=STRING, data=MapOf(STRING),
                          stringData=MapOf(STRING), immutable=BOOLEAN),
    ("v1", "PersistentVolumeClaim"): Obj(required=("metadata", "spec"), metadata=META, spec=Obj(
        accessModes=[Enum("ReadWriteOnce", "ReadOnlyMany", "ReadWriteMany", "ReadWriteOncePod")],
        storageClassName=STRING, volumeMode=Enum("Filesystem", "Block"), volumeName=STRING,
        resources=Obj(requests=MapOf(QUANTITY), limits=MapOf(QUANTITY)))),
    ("batch/v1", "Job"): Obj(required=("metadata", "spec"), metadata=META, spec=JOB_SPEC),
    ("batch/v1", "CronJob"): Obj(required=("metadata", "spec"), metadata=META, spec=Obj(
        required=("schedule", "jobTemplate"),
        schedule=STRING, timeZone=STRING, concurrencyPolicy=Enum("Allow", "Forbid", "Replace"),
        startingDeadlineSeconds=INTEGER, successfulJobsHistoryLimit=INTEGER, failedJobsHistoryLimit=INTEGER,
        suspend=BOOLEAN, jobTemplate=Obj(required=("spec",), metadata=TEMPLATE_META, spec=JOB_SPEC))),
}
# What the checker's own renderer reads of a kustomization (anything else
# is refused, not ignored).
KUSTOMIZATION = Obj(
    namespace=STRING, resources=STRINGS,
    images=[Obj(required=("name",), name=STRING, newName=STRING, newTag=STRING, digest=STRING)])

# The labels of Pod Security admission on a namespace.
PSA_LEVELS = ("privileged", "baseline", "restricted")
PSA_VERSION = re.compile(r"^(latest|v1\.(0|[1-9]\d*))$")

# Pod Security Standards (kubernetes.io/docs/concepts/security/pod-security-standards).
BASELINE_CAPABILITIES = {"AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD",
                         "NET_BIND_SERVICE", "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT"}
SAFE_SYSCTLS = {"kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range", "net.ipv4.ip_unprivileged_port_start",
                "net.ipv4.tcp_syncookies", "net.ipv4.ping_group_range", "net.ipv4.ip_local_reserved_ports",
                "net.ipv4.tcp_keepalive_time", "net.ipv4.tcp_fin_timeout", "net.ipv4.tcp_keepalive_intvl",
                "net.ipv4.tcp_keepalive_probes"}
SELINUX_TYPES = {"", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"}
RESTRICTED_VOLUMES = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim",
                      "projected", "secret"}


def pod_security(meta, spec):
    """The controls the pod (template) breaks: {level: [(control, detail)]},
    level "baseline" or "restricted" (restricted's list holds only what it
    adds to baseline's)."""
    out = {"baseline": [], "restricted": []}

    def bad(level, control, detail):
        out[level].append((control, detail))

    containers = [("initContainers", c) for c in spec.get("initContainers") or []] + \
                 [("containers", c) for c in spec.get("containers") or []]
    psc = spec.get("securityContext") or {}
    # Baseline.
    if (psc.get("windowsOptions") or {}).get("hostProcess"):
        bad("baseline", "hostProcess", "spec.securityContext.windowsOptions.hostProcess")
    for ns in ("hostNetwork", "hostPID", "hostIPC"):
        if spec.get(ns):
            bad("baseline", "host namespaces", f"spec.{ns}")
    for v in spec.get("volumes") or []:
        if "hostPath" in v:
            bad("baseline", "hostPath volumes", f"volume {v.get('name')}")
    for key, value in ((meta or {}).get("annotations") or {}).items():
        if key.startswith("container.apparmor.security.beta.kubernetes.io/") and \
                value != "runtime/default" and not value.startswith("localhost/"):
            bad("baseline", "AppArmor", f"annotation {key}: {value}")
    for s in [sysctl.get("name") for sysctl in psc.get("sysctls") or []]:
        if s not in SAFE_SYSCTLS:
            bad("baseline", "sysctls", s)

    def common(where, sc):
        if (sc.get("appArmorProfile") or {}).get("type") == "Unconfined":
            bad("baseline", "AppArmor", f"{where}.appArmorProfile Unconfined")
        se = sc.get("seLinuxOptions") or {}
        if se.get("type", "") not in SELINUX_TYPES or se.get("user") or se.get("role"):
            bad("baseline", "SELinux", f"{where}.seLinuxOptions {se}")
        if (sc.get("seccompProfile") or {}).get("type") == "Unconfined":
            bad("baseline", "seccomp", f"{where}.seccompProfile Unconfined")
        if sc.get("runAsUser") == 0:
            bad("restricted", "runAsUser", f"{where}.runAsUser 0")

    common("spec.securityContext", psc)
    for field, c in containers:
        where = f"{field}[{c.get('name')}]"
        sc = c.get("securityContext") or {}
        common(f"{where}.securityContext", sc)
        if (sc.get("windowsOptions") or {}).get("hostProcess"):
            bad("baseline", "hostProcess", where)
        if sc.get("privileged"):
            bad("baseline", "privileged", where)
        added = set((sc.get("capabilities") or {}).get("add") or [])
        if added - BASELINE_CAPABILITIES:
            bad("baseline", "capabilities", f"{where} adds {sorted(added - BASELINE_CAPABILITIES)}")
        for p in c.get("ports") or []:
            if p.get("hostPort"):
                bad("baseline", "hostPorts", f"{where} hostPort {p['hostPort']}")
        if sc.get("procMount", "Default") != "Default":
            bad("baseline", "procMount", where)
        # Restricted.
        if sc.get("allowPrivilegeEscalation") is not False:
            bad("restricted", "allowPrivilegeEscalation", f"{where}: must be false")
        if added - {"NET_BIND_SERVICE"}:
            bad("restricted", "capabilities", f"{where} adds {sorted(added - {'NET_BIND_SERVICE'})}")
        if "ALL" not in ((sc.get("capabilities") or {}).get("drop") or []):
            bad("restricted", "capabilities", f"{where}: must drop ALL")
        if sc.get("runAsNonRoot") is False or (sc.get("runAsNonRoot") is None and psc.get("runAsNonRoot") is not True):
            bad("restricted", "runAsNonRoot", f"{where}: runAsNonRoot must be true (pod or container)")
        seccomp = (sc.get("seccompProfile") or psc.get("seccompProfile") or {}).get("type")
        if seccomp not in ("RuntimeDefault", "Localhost"):
            bad("restricted", "seccomp", f"{where}: seccompProfile must be RuntimeDefault or Localhost (pod or container)")
    for v in spec.get("volumes") or []:
        kinds = set(v) - {"name"}
        if kinds - RESTRICTED_VOLUMES:
            bad("restricted", "volume types", f"volume {v.get('name')}: {sorted(kinds - RESTRICTED_VOLUMES)}")
    return out
