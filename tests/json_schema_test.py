#!/usr/bin/env python3
"""Every barge command's --json output against the schemas in docs/json.md.

Runs each command (every leaf of `barge --help`) on small generated data,
on success and on error paths, and checks that stdout is pure NDJSON (one
object a line, each with "event" and "command"), that a run exiting 0 ends
with its one result, that a failed run ends with one error event whose
exit_code is the exit status, and that every object validates against its
schema. The libvirt commands run against libvirt's built-in test driver
(test:///default) where it can, and on their error paths otherwise.
Every command must also fail once other than by a usage error, but those
in NO_RUNTIME_FAILURE, which cannot.

  tests/json_schema_test.py BARGE            the test (ctest runs it); 77 = skipped
  tests/json_schema_test.py --check EXIT_CODE COMMAND... < STDOUT
                                             checks one run's stdout (exit 1 if
                                             it breaks the convention), e.g. from
                                             the libvirt tests' fixture
  tests/json_schema_test.py --schema         prints the merged schema

Importable (sys.path.insert(0, "tests")): load_schema(), check_run().
"""

import argparse
import importlib.util
import json
import os
import re
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOC = os.environ.get("BARGE_JSON_DOC") or os.path.join(ROOT, "docs", "json.md")
EVENTS = ("progress", "warning", "result", "error")
# Events that only a fault brings (docs/json.md, "reconnect": an NBD
# connection replaced after a drop): validated against their schema where
# they appear, never required to be seen (tests/nbd_reconnect_test.cc makes
# them; stale_upload: tests/s3_chain_test.cc).
OCCASIONAL_EVENTS = ("reconnect", "sequential_read", "bitmap_missed", "stale_upload")
# The documented extensions of the four, for the commands that run until
# stopped: `serve` also prints "ready" and "run" (docs/json.md, "serve's
# daemon events"), `export` "ready" (docs/json.md, "export"), and `vm
# instant-restore` "phase" (docs/json.md, "vm instant-restore"); no other
# command may.
DAEMON_EVENTS = {"serve": ("ready", "run"), "export": ("ready",), "vm instant-restore": ("phase",)}
# Commands whose verdict is their exit code: they end with their result,
# not an error event (docs/json.md, "How a run ends").
VERDICTS = {("check", 2), ("check", 3), ("compare", 1)}
# Commands with no failure but a usage error: they print text made from the
# command definitions alone (nothing they read can be missing or bad, and
# `completion zsh`, an unknown shell, is a usage error), so the test does
# not require them to fail otherwise. docs/json.md, "completion bash, man".
NO_RUNTIME_FAILURE = ("completion bash", "man")


def load_schema(doc=DOC):
    """The merged schema: every ```json block of docs/json.md holds named
    definitions; they become one draft 2020-12 schema's $defs."""
    with open(doc, encoding="utf-8") as f:
        text = f.read()
    defs = {}
    for block in re.findall(r"^```json\n(.*?)^```", text, re.S | re.M):
        try:
            part = json.loads(block)
        except json.JSONDecodeError as e:
            raise SystemExit(f"{doc}: a ```json block is not JSON ({e}):\n{block}")
        for name, schema in part.items():
            if name in defs:
                raise SystemExit(f"{doc}: '{name}' is defined twice")
            defs[name] = schema
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", "$defs": defs}


_schema = None


def _default_schema():
    global _schema
    if _schema is None:
        _schema = load_schema()
    return _schema


def result_def(command):
    return "result-" + command.replace(" ", "-")


def _validator(schema, name):
    import jsonschema

    root = {"$schema": schema["$schema"], "$defs": schema["$defs"], "$ref": "#/$defs/" + name}
    return jsonschema.Draft202012Validator(root, format_checker=jsonschema.FormatChecker())


_validators = {}


def _validate(schema, name, obj):
    """Problems (strings) of `obj` against definition `name`."""
    if name not in schema["$defs"]:
        return [f"no schema '{name}' in docs/json.md"]
    key = (id(schema), name)
    if key not in _validators:
        _validators[key] = _validator(schema, name)
    return [
        f"{name}: {'/'.join(str(p) for p in e.absolute_path) or '(top)'}: {e.message}"
        for e in _validators[key].iter_errors(obj)
    ]


def check_run(stdout, exit_code, command=None, schema=None):
    """Problems (strings) of one --json run: its stdout and exit status.
    `command`, if given, is the name every event must carry."""
    schema = schema or _default_schema()
    problems = []
    if stdout and not stdout.endswith("\n"):
        problems.append("stdout: the last line has no newline")
    events = []
    # Lines end at "\n" only (str.splitlines would also split at U+2028,
    # which JSON strings may hold unescaped).
    lines = stdout.split("\n")
    if lines[-1] == "":
        lines.pop()
    for n, line in enumerate(lines, 1):
        try:
            obj = json.loads(line)
        except json.JSONDecodeError:
            problems.append(f"line {n} is not JSON: {line!r}")
            continue
        if not isinstance(obj, dict):
            problems.append(f"line {n} is not an object: {line!r}")
            continue
        daemon = obj.get("command") if obj.get("command") in DAEMON_EVENTS else None
        for p in _validate(schema, f"envelope-{daemon.replace(' ', '-')}" if daemon else "envelope", obj):
            problems.append(f"line {n}: {p}")
        daemon_event = daemon is not None and obj.get("event") in DAEMON_EVENTS[daemon]
        if (obj.get("event") not in EVENTS + OCCASIONAL_EVENTS and not daemon_event) or \
                not isinstance(obj.get("command"), str):
            continue
        if command is not None and obj.get("command") != command:
            problems.append(f"line {n}: command {obj.get('command')!r}, expected {command!r}")
        if daemon_event:
            name = f"{daemon.replace(' ', '-')}-{obj['event']}"
        else:
            name = result_def(obj["command"]) if obj["event"] == "result" else obj["event"]
        for p in _validate(schema, name, obj):
            problems.append(f"line {n}: {p}")
        if not daemon_event and obj["event"] in EVENTS:  # how a run ends is told by the four
            events.append(obj)
    kinds = [e.get("event") for e in events]
    results, errors = kinds.count("result"), kinds.count("error")
    last = kinds[-1] if kinds else None
    if exit_code == 0:
        if results != 1 or errors != 0 or last != "result":
            problems.append(f"exit 0 needs one result, last, and no error; got {kinds}")
    elif last == "result" and (events[-1].get("command"), exit_code) in VERDICTS:
        if results != 1 or errors != 0:
            problems.append(f"a verdict (exit {exit_code}) is one result and no error; got {kinds}")
    else:
        if errors != 1 or last != "error":
            problems.append(f"exit {exit_code} needs one error event, last; got {kinds}")
        elif events[-1].get("exit_code") != exit_code:
            problems.append(f"the error's exit_code {events[-1].get('exit_code')} is not the exit status {exit_code}")
        if results > 1 or (results == 1 and errors == 1 and kinds.index("result") > kinds.index("error")):
            problems.append(f"at most one result, before the error; got {kinds}")
    return problems


# ---------------------------------------------------------------------------
# The test.


class Runner:
    def __init__(self, barge, tmp, schema, verbose):
        self.barge, self.tmp, self.schema, self.verbose = barge, tmp, schema, verbose
        self.failures = []
        self.ran_ok, self.ran_failing, self.ran_usage = set(), set(), set()
        self.seen = set()  # the kinds of events validated
        self.env = dict(os.environ)
        self.env.update(
            {
                "BARGE_CATALOG": self.path("state/catalog.db"),
                "XDG_STATE_HOME": self.path("state"),
                "HOME": self.path("home"),
                "BARGE_LIBVIRT_URI": "test:///default",
                "LC_ALL": "C",
            }
        )
        os.makedirs(self.path("home"), exist_ok=True)

    def path(self, name):
        return os.path.join(self.tmp, name)

    def sh(self, *argv):
        subprocess.run(argv, check=True, cwd=self.tmp, env=self.env, stdout=subprocess.DEVNULL)

    def run(self, command, args, expect=0, env=None, json_flag=True, name=None):
        """Runs `barge COMMAND ARGS [--json]`, checks the run; returns its
        events (the parsed lines) or [] when the run did not parse."""
        argv = [self.barge] + command.split() + list(args) + (["--json"] if json_flag else [])
        e = dict(self.env)
        e.update(env or {})
        p = subprocess.run(argv, cwd=self.tmp, env=e, capture_output=True, text=True, timeout=300)
        label = " ".join(argv[1:])
        problems = check_run(p.stdout, p.returncode, name or command, self.schema)
        if expect is not None and p.returncode != expect:
            problems.append(f"exit {p.returncode}, expected {expect}")
        # An error event is on stderr too (a verdict has none).
        if any(line.startswith('{"event":"error",') for line in p.stdout.splitlines()) and "barge: " not in p.stderr:
            problems.append("an error event without its 'barge: ' line on stderr")
        if problems:
            self.failures.append(f"{label}\n  " + "\n  ".join(problems) + f"\n  stdout: {p.stdout}\n  stderr: {p.stderr}")
        if self.verbose:
            print(f"$ barge {label}  -> {p.returncode}\n{p.stdout}", end="")
        {0: self.ran_ok, 64: self.ran_usage}.get(p.returncode, self.ran_failing).add(name or command)
        try:
            events = [json.loads(line) for line in p.stdout.split("\n") if line]
        except json.JSONDecodeError:
            return []
        self.seen.update(e.get("event") for e in events if isinstance(e, dict))
        return events


    def serve(self, args, command="serve"):
        """Runs `barge serve ARGS --json` (or `export`) until its first
        `ready` event, then stops it with SIGTERM, and checks the whole run.
        A daemon never exits 0: it succeeds when it served and, stopped,
        ends with its result and then a Cancelled error, exit 143
        (docs/json.md, "serve's daemon events"). Returns its events."""
        argv = [self.barge, command] + list(args) + ["--json"]
        label = " ".join(argv[1:])
        p = subprocess.Popen(argv, cwd=self.tmp, env=self.env, text=True,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        watchdog = threading.Timer(120, p.kill)  # a serve that never gets ready
        watchdog.start()
        head = []
        try:
            for line in p.stdout:
                head.append(line)
                if line.startswith('{"event":"ready",'):
                    p.send_signal(signal.SIGTERM)
                    break
            rest, err = p.communicate(timeout=120)
        finally:
            watchdog.cancel()
        stdout = "".join(head) + rest
        problems = check_run(stdout, p.returncode, command, self.schema)
        try:
            events = [json.loads(line) for line in stdout.split("\n") if line]
        except json.JSONDecodeError:
            events = []
        kinds = [e.get("event") for e in events if isinstance(e, dict)]
        last = events[-1] if events and isinstance(events[-1], dict) else {}
        if p.returncode != 143 or "ready" not in kinds or "result" not in kinds or last.get("code") != "Cancelled":
            problems.append(f"exit {p.returncode} with {kinds}: expected ready, a result and a Cancelled error, "
                            "exit 143")
        if problems:
            self.failures.append(f"{label}\n  " + "\n  ".join(problems) + f"\n  stdout: {stdout}\n  stderr: {err}")
        else:
            self.ran_ok.add(command)
        if self.verbose:
            print(f"$ barge {label}  -> {p.returncode}\n{stdout}", end="")
        self.seen.update(k for k in kinds if k in EVENTS)
        return events


def result_of(events):
    """The result object of a run's events, or {}."""
    return next((e for e in events if isinstance(e, dict) and e.get("event") == "result"), {})


def leaf_commands(barge):
    """Every command `barge --help` lists (recursively) that takes --json."""
    found = []

    def walk(path):
        text = subprocess.run([barge] + path + ["--help"], capture_output=True, text=True).stdout
        if path and "--json" in text:
            found.append(" ".join(path))
        subs = re.search(r"^Subcommands:\n((?:  \S.*\n)+)", text, re.M)
        for line in subs.group(1).splitlines() if subs else []:
            walk(path + [line.split()[0]])

    walk([])
    return found


def scenario(r):
    """Every command on success and on error paths."""
    t = r.path
    missing = t("no-such-file")
    # Disks: a generated raw disk, a qcow2 with a bitmap, a snapshot and a
    # backing file.
    r.run("bench generate", ["--size", "16M", "--seed", "3", t("disk.raw")])
    r.run("bench generate", ["--size", "1x", t("bad.raw")], expect=64)
    r.run("bench generate", ["--size", "1M", t("no-such-dir/d.raw")], expect=1)
    r.sh("qemu-img", "create", "-q", "-f", "qcow2", t("base.qcow2"), "4M")
    r.sh("qemu-io", "-f", "qcow2", "-c", "write -P 0x11 0 1M", t("base.qcow2"))
    r.sh("qemu-img", "create", "-q", "-f", "qcow2", "-b", "base.qcow2", "-F", "qcow2", t("top.qcow2"))
    r.sh("qemu-img", "bitmap", "--add", t("top.qcow2"), "b1")
    r.sh("qemu-io", "-f", "qcow2", "-c", "write -P 0x22 1M 512K", "-c", "write -z 3M 64K", t("top.qcow2"))
    r.sh("qemu-img", "snapshot", "-c", "s1", t("base.qcow2"))
    with open(t("text.txt"), "w") as f:
        f.write("not an image\n" * 100)

    r.run("info", [t("top.qcow2")])
    r.run("info", [t("disk.raw")])
    r.run("info", [missing], expect=1)
    r.run("map", [t("top.qcow2")])
    r.run("map", [missing], expect=1)
    r.run("check", [t("top.qcow2")])
    r.run("check", [missing], expect=1)
    r.run("check", [t("text.txt")], expect=None)  # not a qcow2 file: an error
    # Verdicts: the header cluster's refcount (16 bits) made 2 (a leak) or
    # 0 (corruption) in copies of base.qcow2.
    for refcount, verdict in ((2, 3), (0, 2)):
        name = t(f"refcount{refcount}.qcow2")
        shutil.copy(t("base.qcow2"), name)
        with open(name, "r+b") as f:
            f.seek(48)
            table = int.from_bytes(f.read(8), "big")
            f.seek(table)
            block = int.from_bytes(f.read(8), "big")
            f.seek(block)
            f.write(refcount.to_bytes(2, "big"))
        r.run("check", [name], expect=verdict)
    r.run("compare", [t("top.qcow2"), t("top.qcow2")])
    r.run("compare", [t("base.qcow2"), t("top.qcow2")], expect=1)
    r.run("compare", [t("top.qcow2"), missing], expect=2)
    # Sizes differ, the tail reads as zeros: identical, with a warning.
    shutil.copy(t("disk.raw"), t("longer.raw"))
    os.truncate(t("longer.raw"), 20 << 20)
    events = r.run("compare", [t("disk.raw"), t("longer.raw")])
    if "warning" not in [e.get("event") for e in events]:
        r.failures.append("compare of images of different sizes: no warning event")
    r.run("bitmap list", [t("top.qcow2")])
    r.run("bitmap list", [missing], expect=1)
    r.run("bitmap dump", [t("top.qcow2"), "b1"])
    r.run("bitmap dump", [t("top.qcow2"), "nope"], expect=1)
    # Bitmap edits, on an image of their own (top.qcow2's b1 feeds the
    # incremental backup below).
    edit = t("edit.qcow2")
    r.sh("qemu-img", "create", "-q", "-f", "qcow2", edit, "4M")
    r.run("bitmap add", [edit, "e1", "e2"])
    r.run("bitmap add", [edit, "e3", "--granularity", "1M", "--disabled"])
    r.run("bitmap add", [edit, "e1"], expect=1)  # exists
    r.run("bitmap add", [t("disk.raw"), "e1"], expect=1)  # raw: no bitmaps
    r.run("bitmap add", [edit, "e4", "--granularity", "3"], expect=64)
    r.sh("qemu-io", "-f", "qcow2", "-c", "write -P 0x44 0 128K", edit)
    r.run("bitmap clear", [edit, "e1"])
    r.run("bitmap clear", [edit, "nope"], expect=1)
    r.run("bitmap disable", [edit, "e1", "e2"])
    if result_of(r.run("bitmap disable", [edit, "e1"])).get("changed") is not False:
        r.failures.append("bitmap disable of a disabled bitmap: not a result with changed false")
    r.run("bitmap disable", [missing, "e1"], expect=1)
    r.run("bitmap enable", [edit, "e1", "e3"])
    r.run("bitmap enable", [edit, "nope"], expect=1)
    r.run("bitmap remove", [edit, "e2"])
    r.run("bitmap remove", [edit, "e2"], expect=1)  # gone
    r.run("overlay create", [t("overlay.qcow2"), "--data-file", t("disk.raw"), "--bitmap", "cbt0"])
    r.run("info", [t("overlay.qcow2")])  # a data file
    r.run("overlay create", ["--data-file", missing, t("overlay2.qcow2")], expect=1)

    # Copies: convert, replicate.
    r.run("convert", ["-O", "qcow2", "--compress", "zstd", t("top.qcow2"), t("flat.qcow2")])
    r.run("convert", [t("disk.raw"), t("flat.qcow2")], expect=1)  # exists: needs --force
    r.run("convert", [missing, t("x.raw")], expect=1)
    for d in ("r1", "r2", "r3"):
        os.makedirs(t(d))
    r.run("replicate", [t("disk.raw"), "--to", t("r1/disk.raw"), "--to", t("r2/disk.raw"), "--verify"])
    r.run("replicate", [t("disk.raw"), "--to", t("r3/disk.raw"), "--expected-sha512", "0" * 128], expect=2)
    r.run("replicate", [missing, "--to", t("r3/x")], expect=1)

    # Backups: a full and an incremental from the bitmap, verify, restore,
    # merge.
    # TARGET/<domain>/<disk>/, as vm backup lays it out, for catalog rebuild.
    target = t("backups/vm1")
    r.run("backup", ["--source", t("top.qcow2"), "--target", target, "--name", "vda"])
    r.sh("qemu-io", "-f", "qcow2", "-c", "write -P 0x33 2M 128K", t("top.qcow2"))
    r.run("backup", ["--source", t("top.qcow2"), "--target", target, "--name", "vda",
                     "--incremental", "--dirty-bitmap", "b1"])
    r.run("backup", ["--source", missing, "--target", target], expect=1)
    chain = t("backups/vm1/vda")
    r.run("verify", [chain, "--all"])
    r.run("verify", [t("backups/none")], expect=1)
    # sync: the chain into a new folder (both points copied), then again
    # (both skipped); a missing SRC.
    r.run("sync", [chain, t("offsite/vda")])
    r.run("sync", [t("backups/vm1"), t("offsite")])
    r.run("sync", [t("backups/none"), t("offsite/none")], expect=1)
    # list: the chain, verified; then copies (outside backups/, which
    # catalog rebuild reads) for its nullable fields: a failed verification
    # and a missing image; a broken link and a manifest without times.
    if [p.get("last_verification", {}).get("result") for p in result_of(r.run("list", [chain])).get("points", [])] \
            != ["ok", "ok"]:
        r.failures.append("list after verify --all: not two points verified ok")
    r.run("list", [t("backups/none")], expect=1)
    # A target: the chain folders below it.
    if [f.get("path") for f in result_of(r.run("list", [t("backups")])).get("chain_folders", [])] != [chain]:
        r.failures.append("list of a target: not its one chain folder")
    r.run("list", [t("text.txt")], expect=1)  # no chain folder, manifest or image
    # A chain over a base (issue 23): backup --base, and list of the base
    # (base_of) and of the clone (base). Outside backups/ (catalog rebuild).
    r.sh("qemu-img", "create", "-q", "-f", "raw", t("gold.raw"), "1M")
    r.sh("qemu-io", "-f", "raw", "-c", "write -P 0x21 0 1M", t("gold.raw"))
    r.sh("qemu-img", "create", "-q", "-f", "qcow2", "-b", "gold.raw", "-F", "raw", t("clone.qcow2"))
    r.sh("qemu-io", "-f", "qcow2", "-c", "write -P 0x22 64K 64K", t("clone.qcow2"))
    r.run("backup", ["--source", t("gold.raw"), "--target", t("basebk"), "--name", "golden"])
    based = result_of(r.run("backup", ["--source", t("clone.qcow2"), "--target", t("basebk"), "--name", "clone",
                                       "--base", "golden"]))
    if not str(based.get("base", "")).startswith("../golden@"):
        r.failures.append("backup --base: result's base is not ../golden@ID: %r" % based.get("base"))
    if [len(p.get("base_of", [])) for p in result_of(r.run("list", [t("basebk/golden")])).get("points", [])] != [1]:
        r.failures.append("list of a base: its point is not the base of one chain")
    r.run("list", [t("basebk/clone")])
    # export: served on a unix socket until its ready event, then SIGTERM
    # (needs nbdkit); a missing chain folder fails.
    if shutil.which("nbdkit"):
        r.serve([chain, "--socket", t("export.sock")], command="export")
    elif os.environ.get("BARGE_REQUIRE_TOOLS") == "1":
        r.failures.append("export: nbdkit is missing")
    else:
        r.ran_ok.add("export")  # nothing to serve with here
    r.run("export", [t("none"), "--socket", t("export.sock")], expect=1)
    # files ls | get: an ext4 image backed up (needs mkfs.ext4, nbdfuse,
    # debugfs, nbdkit and /dev/fuse).
    if all(shutil.which(x) for x in ("mkfs.ext4", "nbdfuse", "debugfs", "nbdkit")) and os.path.exists("/dev/fuse"):
        os.makedirs(t("fsroot/etc"), exist_ok=True)
        with open(t("fsroot/etc/motd"), "w") as f:
            f.write("hello\n")
        # A link (target), a line break and bytes that are not UTF-8
        # (name_bytes) in names.
        os.symlink("motd", t("fsroot/etc/link"))
        with open(os.path.join(os.fsencode(t("fsroot/etc")), b"new\nline \xff"), "w") as f:
            f.write("odd\n")
        subprocess.run(["mkfs.ext4", "-q", "-F", "-d", t("fsroot"), t("fs.img"), "8M"], check=True,
                       stdout=subprocess.DEVNULL)
        r.run("backup", ["--source", t("fs.img"), "--source-format", "raw", "--target", t("fsbk"), "--name", "fs"])
        r.run("files ls", [t("fsbk/fs"), "/etc"])
        r.run("files get", [t("fsbk/fs"), "/etc/motd", t("motd.out")])
    elif os.environ.get("BARGE_REQUIRE_TOOLS") == "1":
        r.failures.append("files: mkfs.ext4, nbdfuse, debugfs, nbdkit or /dev/fuse is missing")
    else:
        r.ran_ok.update(("files ls", "files get"))  # nothing to read with here
    r.run("files ls", [t("none"), "/"], expect=1)
    r.run("files get", [t("none"), "/etc/motd", t("motd2.out")], expect=1)
    points = sorted(os.listdir(chain))
    full_id, inc_id = [f[: -len(".json")] for f in points if f.endswith(".json")]
    damaged, broken = t("lists/damaged"), t("lists/broken")
    for copy in (damaged, broken):
        shutil.copytree(chain, copy)
    os.remove(os.path.join(damaged, full_id + ".digests"))
    r.run("verify", [damaged, "--at", "0"], expect=2)  # a broken chain: records the failure
    # --all: every point's outcome (the full failed, the incremental skipped), then the error.
    if [p.get("result") for p in result_of(r.run("verify", [damaged, "--all"], expect=2)).get("points", [])] \
            != ["failed", "skipped"]:
        r.failures.append("verify --all of a damaged chain: not a failed and a skipped point")
    os.remove(os.path.join(damaged, inc_id + ".qcow2"))
    listed = result_of(r.run("list", [damaged])).get("points", [])
    if [(p.get("last_verification") or {}).get("result") for p in listed] != ["failed", "ok"] \
            or [p.get("image_bytes") for p in listed][1:] != [None]:
        r.failures.append(f"list of a damaged chain: not a failed verification and a missing image: {listed}")
    os.remove(os.path.join(broken, full_id + ".json"))
    with open(os.path.join(broken, inc_id + ".json")) as f:
        manifest = json.load(f)
    del manifest["started_at"], manifest["finished_at"]
    with open(os.path.join(broken, inc_id + ".json"), "w") as f:
        json.dump(manifest, f)
    listed = result_of(r.run("list", [broken])).get("points", [])
    if [(p.get("chain"), p.get("started_at"), "broken" in p) for p in listed] != [(None, None, True)]:
        r.failures.append(f"list of a chain without its full: not one broken point without times: {listed}")
    # forget of a chain folder (a copy: catalog rebuild reads backups/).
    forgot = t("lists/forget")
    shutil.copytree(chain, forgot)
    r.run("forget", [forgot, "--keep-last", "1", "--keep-daily", "2", "--dry-run"])
    r.run("forget", [forgot, "--keep-within", "1h"])  # keeps both: nothing to do
    r.run("forget", [forgot, "--keep-last", "1"])  # the full is merged into the increment
    r.run("forget", [forgot], expect=64)  # no keep rule
    r.run("forget", [t("backups/none"), "--keep-last", "1"], expect=1)
    r.run("restore", [chain, "--to", t("restored.raw")])
    r.run("restore", [chain, "--to", t("restored.raw")], expect=1)  # exists: needs --force
    r.run("merge", [chain, "--through", "latest"])
    r.run("merge", [t("backups/none"), "--through", "latest"], expect=1)

    # The backing-image catalog.
    cat = ["--catalog", t("images.db")]
    r.run("image add", ["base", "--source", t("disk.raw"), "--disk", t("d0")] + cat)
    r.run("image add", ["bad", "--source", t("disk.raw"), "--disk", t("d0"),
                        "--expected-sha512", "a" * 128] + cat, expect=2)  # a checksum mismatch: corruption
    r.run("image sync", ["base", "--disks", t("d1") + "," + t("d2")] + cat)
    r.run("image sync", ["nope", "--disks", t("d3")] + cat, expect=1)
    r.run("image status", cat)
    r.run("image status", ["nope"] + cat, expect=1)
    r.run("image rescan", ["--disks", t("d1")] + cat)
    r.run("image rescan", ["--catalog", t("text.txt/images.db")], expect=1)
    r.run("image cleanup", ["--unused-for", "0"] + cat)
    r.run("image cleanup", ["--unused-for", "soon"] + cat, expect=64)
    r.run("image cleanup", ["--catalog", t("text.txt/images.db")], expect=1)

    # A VM's state folder.
    os.makedirs(t("state-old/tpm"))
    with open(t("state-old/tpm/permall"), "wb") as f:
        f.write(os.urandom(1000))
    r.run("state migrate", ["--no-libvirt", "--from", t("state-old"), "--to", t("state-new")])
    r.run("state migrate", ["--no-libvirt", "--from", missing, "--to", t("state-new2")], expect=1)

    # The backup catalog and libvirt, through libvirt's test driver (no
    # daemon): domain "test" exists there; its disks do not, so vm backup
    # and cbt enable/disable only fail.
    bcat = ["--catalog", t("backups.db")]
    r.run("catalog rebuild", ["--target", t("backups")] + bcat)
    r.run("catalog rebuild", ["--target", missing] + bcat, expect=1)
    r.run("vm backups", bcat)
    r.run("vm backups", ["--catalog", t("text.txt/b.db")], expect=1)
    r.run("tracker create", ["t1", "--domain", "test"] + bcat)
    r.run("tracker create", ["t2", "--domain", "nope"] + bcat, expect=1)
    r.run("tracker list", bcat)
    r.run("tracker list", ["--catalog", t("text.txt/b.db")], expect=1)
    r.run("tracker show", ["t1"] + bcat)
    r.run("tracker show", ["nope"] + bcat, expect=1)
    r.run("doctor", ["--domain", "test"] + bcat)
    r.run("doctor", ["--domain", "nope"] + bcat, expect=1)
    r.run("checkpoint redefine", ["--domain", "test"] + bcat)
    r.run("checkpoint redefine", ["--domain", "nope"] + bcat, expect=1)
    r.run("cbt status", ["--domain", "test"] + bcat)
    r.run("cbt status", ["--domain", "nope"] + bcat, expect=1)
    r.run("cbt enable", ["--domain", "nope", "--state-dir", t("cbt")] + bcat, expect=1)
    r.run("cbt disable", ["--domain", "nope"] + bcat, expect=1)
    r.run("vm backup", ["--domain", "nope", "--target", t("vmb")] + bcat, expect=1)
    r.run("vm instant-restore", [t("none"), "--domain", "nope", "--to", t("ir.raw")] + bcat, expect=1)
    r.run("vm backup", ["--domain", "test", "--target", t("vmb"), "--skip-quiesce"] + bcat, expect=1)
    r.run("vm backup", ["--domain", "test", "--target", t("backups"), "--scratch-dir", missing] + bcat, expect=1)
    # --dry-run: the plan, then, for a plan the run would refuse, the run's
    # error and exit code (here NoSpace: the test driver's disk is 1 TiB).
    r.run("vm backup", ["--domain", "test", "--target", t("backups"), "--dry-run"] + bcat, expect=1)
    # catalog list: the tracker and catalog rebuild's record. Only a
    # successful vm backup makes checkpoints, so a copy of the catalog gets
    # what one would have recorded (a checkpoint, the tracker at it) and a
    # run still going (finished_at null), for their schemas.
    r.run("catalog list", bcat)
    r.run("catalog list", ["--domain", "vm1"] + bcat)
    r.run("catalog list", ["--catalog", t("no-catalog.db")], expect=1)
    r.run("catalog list", ["--catalog", t("text.txt")], expect=1)  # not a database
    src, dst = sqlite3.connect(t("backups.db")), sqlite3.connect(t("listed.db"))
    with dst:
        src.backup(dst)
        dst.execute("INSERT INTO vm_checkpoints(name, tracker, domain, created_at, disks, xml) "
                    "VALUES ('t1-20261124T060549Z', 't1', 'test', '2026-11-24T06:05:49Z', '[\"vda\"]', '<x/>')")
        dst.execute("UPDATE vm_trackers SET latest_checkpoint='t1-20261124T060549Z', "
                    "checkpoint_created_at='2026-11-24T06:05:49Z', disks='{\"vda\": 4194304}' WHERE name='t1'")
        dst.execute("INSERT INTO vm_backups(domain, tracker, target, started_at, result) "
                    "VALUES ('test', 't1', 'vmb', '2026-11-24T06:06:00Z', 'running')")
    src.close()
    dst.close()
    listed = result_of(r.run("catalog list", ["--catalog", t("listed.db")]))
    if not (listed.get("checkpoints") and any(b.get("finished_at") is None for b in listed.get("backups", []))
            and any(tr.get("latest_checkpoint") for tr in listed.get("trackers", []))):
        r.failures.append("catalog list of the populated copy: no checkpoint, tracker at one or running backup: "
                          f"{listed}")
    # No libvirt at all: a bogus URI.
    no_libvirt = {"BARGE_LIBVIRT_URI": "qemu+unix:///system?socket=" + t("no-such-socket")}
    r.run("doctor", ["--domain", "vm1"] + bcat, expect=1, env=no_libvirt)
    r.run("vm backup", ["--domain", "vm1", "--target", t("vmb")] + bcat, expect=1, env=no_libvirt)
    r.run("tracker delete", ["t1"] + bcat)
    r.run("tracker delete", ["t1"] + bcat, expect=1)

    # Internal snapshots: every snapshot command on an image file, its
    # error paths (a missing snapshot, a missing image, a bad config), and
    # the readers at a snapshot.
    snap = t("snap.qcow2")
    r.sh("qemu-img", "create", "-q", "-f", "qcow2", snap, "4M")
    r.sh("qemu-io", "-f", "qcow2", "-c", "write -P 0x44 0 1M", snap)
    r.run("snapshot create", [snap, "--name", "a", "--pre-hook", "true", "--post-hook", "true"])
    r.run("snapshot create", [snap, "--name", "a"], expect=1)  # the name is taken
    r.run("snapshot create", [snap, "--name", "b", "--pre-hook", "exit 3"], expect=1)
    r.sh("qemu-io", "-f", "qcow2", "-c", "write -P 0x55 0 512K", snap)
    r.run("snapshot create", [snap, "--name", "two", "--uuid", "u-2"])
    r.run("snapshot list", [snap])
    r.run("snapshot list", [missing], expect=1)
    r.run("snapshot metrics", [snap])
    r.run("snapshot metrics", [snap, "--textfile", t("snap.prom")])
    r.run("snapshot metrics", [missing], expect=1)
    r.run("convert", ["--snapshot", "a", snap, t("snap-a.raw")])
    r.run("convert", ["--snapshot", "nope", snap, t("snap-nope.raw")], expect=1)
    r.run("map", ["--snapshot", "a", snap])
    r.run("compare", ["--snapshot", "a", snap, t("snap-a.raw")])
    r.run("backup", ["--source", snap, "--snapshot", "a", "--target", t("snapbk"), "--name", "snap",
                     "--pre-hook", "true", "--post-hook", "true"])
    r.run("backup", ["--source", snap, "--target", t("snapbk2"), "--pre-hook", "exit 1"], expect=1)
    r.run("snapshot rename", [snap, "a", "first"])
    r.run("snapshot rename", [snap, "nope", "x"], expect=1)
    r.run("snapshot rollback", [snap, "first", "--discard-newer"])
    r.run("snapshot rollback", [snap, "nope"], expect=1)
    r.run("snapshot delete", [snap, "first"])
    r.run("snapshot delete", [snap, "first"], expect=1)
    with open(t("snapcfg.json"), "w") as f:
        json.dump({"snapshots": [{"uuid": "u1", "display_name": "one"}, {"uuid": "u2"}]}, f)
    r.run("snapshot apply", [snap, "--config", t("snapcfg.json")])
    r.run("snapshot apply", [snap, "--config", t("text.txt")], expect=1)
    r.run("snapshot apply", [missing, "--config", t("snapcfg.json")], expect=1)
    r.run("snapshot list", [snap])

    # Policies: a tiny one over the raw disk into a temporary target; the
    # run records go to $BARGE_CATALOG.
    os.makedirs(t("policy-target"))
    policy, broken_policy, bad_policy = t("tiny.yaml"), t("broken.yaml"), t("bad.yaml")
    with open(policy, "w") as f:
        f.write(f"name: tiny\nsources:\n  - image: {t('disk.raw')}\n    disk_id: tiny-disk\nschedule: '@daily'\n"
                "retention_count: 3\n"
                f"targets: [{t('policy-target')}]\nfree_space_multiple: 0\n")
    with open(broken_policy, "w") as f:  # its image is missing
        f.write(f"name: broken\nsources:\n  - image: {missing}\ntargets: [{t('policy-target')}]\n"
                "free_space_multiple: 0\n")
    with open(bad_policy, "w") as f:  # a relative path, an unknown key, no targets
        f.write("name: bad\nsources:\n  - image: disk.raw\nretention: 3\n")
    r.run("policy check", [policy, "--from", "2026-11-24T12:00:00Z"])
    if len(result_of(r.run("policy check", [bad_policy], expect=1)).get("problems", [])) != 3:
        r.failures.append("policy check of a file with three problems: not three problems in its result")
    r.run("policy check", [missing], expect=1)
    if result_of(r.run("run", ["--policy", policy])).get("ran") != 1:
        r.failures.append("run of a policy never backed up: not one source ran")
    r.run("run", ["--policy", policy])  # nothing due until tomorrow
    r.run("run", ["--policy", broken_policy, "--force"], expect=1)  # a result, then the error
    r.run("run", ["--policy", missing], expect=1)
    r.run("runs list", [])
    r.run("runs list", ["--policy", policy, "--source", "disk", "--limit", "1"])
    r.run("runs list", ["--catalog", t("text.txt/runs.db")], expect=1)
    time.sleep(1.1)  # backup ids tell time to the second
    r.run("run", ["--policy", policy, "--force"])
    r.run("forget", ["--policy", policy, "--keep-last", "1", "--dry-run"])
    r.run("forget", ["--policy", policy, "--keep-last", "1"])
    r.run("forget", ["--policy", missing, "--keep-last", "1"], expect=1)
    r.run("runs list", ["--policy", policy])  # points removed by forget
    r.serve(["--policy", policy, "--listen", "127.0.0.1:0"])
    r.run("report", ["--policy", policy, "--html", t("report.html")])
    r.run("report", ["--policy", missing], expect=1)
    # Sharded: the records of each shard in a records folder, read as one.
    os.makedirs(t("records"))
    r.run("policy shards", [policy, "--shards", "2"])
    r.run("policy shards", [missing, "--shards", "2"], expect=1)
    for shard in ("0/2", "1/2"):
        r.run("run", ["--policy", policy, "--force", "--shard", shard, "--catalog", t("records")])
    r.run("run", ["--policy", policy, "--shard", "2/2"], expect=64)
    r.run("runs list", ["--catalog", t("records"), "--shard", "0/2"])
    r.run("serve", ["--policy", missing, "--listen", "127.0.0.1:0"], expect=1)

    # Generated documentation: success only (see NO_RUNTIME_FAILURE).
    if not result_of(r.run("completion bash", [])).get("script", "").startswith("# bash completion for barge"):
        r.failures.append("completion bash: the result has no script")
    if ".TH" not in result_of(r.run("man", [])).get("page", ""):
        r.failures.append("man: the result has no manual page")

    # The benchmark, as small as it goes (64 MiB generated), and on a given
    # disk (--size sizes only a generated one: a usage error with --source).
    r.run("bench", ["--size", "64M", "--workdir", r.tmp, "--threads", "2"])
    r.run("bench", ["--source", t("disk.raw"), "--workdir", r.tmp, "--threads", "2"])
    r.run("bench", ["--size", "64M", "--workdir", missing], expect=1)
    r.run("bench", ["--source", missing, "--workdir", r.tmp], expect=1)
    r.run("bench", ["--size", "64M", "--source", t("disk.raw")], expect=64)
    r.run("bench", ["--size", "8M"], expect=64)  # below 64 MiB


def usage_errors(r, commands):
    """A bad flag and a bad value: exit 64, an error event naming the command."""
    for command in commands:
        r.run(command, ["--no-such-flag"], expect=64)
    r.run("convert", ["--threads", "99999", "a", "b"], expect=64)
    r.run("infoo", ["x"], expect=64, name="barge")
    r.run("", [], expect=64, name="barge")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("args", nargs="*", metavar="BARGE | COMMAND",
                    help="the barge binary; with --check, the command every event names (optional)")
    ap.add_argument("--check", type=int, metavar="EXIT_CODE", help="check one run's stdout (stdin)")
    ap.add_argument("--schema", action="store_true", help="print the merged schema")
    ap.add_argument("-v", "--verbose", action="store_true", help="print every run's stdout")
    a = ap.parse_args()
    if a.schema:
        json.dump(load_schema(), sys.stdout, indent=2)
        print()
        return 0
    if importlib.util.find_spec("jsonschema") is None:
        print("skip: python3-jsonschema is not installed", file=sys.stderr)
        return 1 if os.environ.get("BARGE_REQUIRE_TOOLS") == "1" else 77
    if a.check is not None:
        problems = check_run(sys.stdin.read(), a.check, " ".join(a.args) or None)
        for p in problems:
            print(p, file=sys.stderr)
        return 1 if problems else 0
    if len(a.args) != 1:
        ap.error("give the barge binary")
    barge = os.path.abspath(a.args[0])
    for tool in ("qemu-img", "qemu-io"):
        if shutil.which(tool) is None:
            print(f"skip: {tool} is missing", file=sys.stderr)
            return 1 if os.environ.get("BARGE_REQUIRE_TOOLS") == "1" else 77

    schema = load_schema()
    commands = leaf_commands(barge)
    base = os.environ.get("TMPDIR") or "/var/tmp"
    with tempfile.TemporaryDirectory(prefix="barge-json-", dir=base) as tmp:
        r = Runner(barge, tmp, schema, a.verbose)
        scenario(r)
        usage_errors(r, commands)
    problems = list(r.failures)
    for command in commands:
        if result_def(command) not in schema["$defs"]:
            problems.append(f"{command}: no result schema '{result_def(command)}' in docs/json.md")
        # Every command succeeds once, but those that need a real domain.
        if command not in r.ran_ok and command not in ("vm backup", "vm instant-restore", "cbt enable",
                                                      "cbt disable"):
            problems.append(f"{command}: never ran successfully in this test")
        if command not in r.ran_failing and command not in NO_RUNTIME_FAILURE:
            problems.append(f"{command}: never failed (other than a usage error) in this test")
        if command not in r.ran_usage:
            problems.append(f"{command}: never had a usage error in this test")
    for event in EVENTS:
        if event not in r.seen:
            problems.append(f"no {event} event was validated in this test")
    for name in schema["$defs"]:
        if name.startswith("result-") and name[len("result-"):] not in [c.replace(" ", "-") for c in commands]:
            problems.append(f"docs/json.md: '{name}' is no command of `barge --help`")
    for p in problems:
        print("FAIL: " + p, file=sys.stderr)
    print(f"{len(commands)} commands, {len(r.failures)} runs failed, {len(problems)} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
