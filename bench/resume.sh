#!/usr/bin/env bash
# A backup cut at 50% and resumed, against one uninterrupted, on the same
# generated disk served by nbdkit at a network-like rate (the rate filter):
# the bytes the resumed run reads (nbdkit's log filter, and barge's own
# count) as a fraction of the uninterrupted run's (target: <= 55%), times,
# and whether both images are byte for byte the same. Then the same for
# `barge replicate` of the export to a raw file (cmp against the
# uninterrupted copy), and to an NBD export (nbdkit's file plugin on a
# second socket; its journal in --state-dir, read back over NBD).
#
#   bench/resume.sh [--size 1G] [--seed 1] [--workdir /var/tmp] [--barge PATH]
#                   [--rate 1G] [--cut 0.5]   (--rate: bits per second)
source "$(dirname "$0")/lib.sh"

usage() { sed -n '2,9p' "$0"; }

SIZE=1G
RATE=300M
CUT=0.5
args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --rate) RATE=$2; shift 2 ;;
    --cut) CUT=$2; shift 2 ;;
    *) args+=("$1"); shift ;;
  esac
done
parse_common_flags "${args[@]+"${args[@]}"}"
need_tools nbdkit python3 qemu-img
make_workdir
print_machine
echo "rate:       $RATE bit/s (nbdkit rate filter), cut at $CUT of the data"

DISK=$WORK/disk.raw
SOCK=$WORK/nbd.sock
"$BARGE" bench generate --size "$SIZE" --seed "$SEED" "$DISK" >/dev/null
echo "disk:       $(stat -c %s "$DISK") bytes, $(du -B1 "$DISK" | cut -f1) allocated"

NBDKIT_PID=
serve() {  # serve LOGFILE: the disk at $RATE on $SOCK, reads logged
  rm -f "$SOCK"
  nbdkit --foreground --exit-with-parent --unix "$SOCK" --filter=log --filter=rate file "$DISK" \
    rate="$RATE" logfile="$1" &
  NBDKIT_PID=$!
  for _ in $(seq 100); do [ -S "$SOCK" ] && return; sleep 0.05; done
  die "nbdkit did not start"
}
stop() { kill "$NBDKIT_PID" 2>/dev/null || true; wait "$NBDKIT_PID" 2>/dev/null || true; }
read_bytes() {  # bytes read in an nbdkit log
  python3 -c 'import re,sys; print(sum(int(m,16) for m in re.findall(r" Read .*?count=0x([0-9a-f]+)", open(sys.argv[1]).read())))' "$1"
}
field() { python3 -c 'import json,sys; r=[json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]; r=[e for e in r if e["event"]=="result"][0]; v=r
for k in sys.argv[2].split("."): v=v[k]
print(v)' "$1" "$2"; }
since() { python3 -c 'import sys,time; print(f"{time.time()-float(sys.argv[1]):.2f}")' "$1"; }
calc() { python3 -c "print(f'{$1:.3f}')"; }
backup() {  # backup TARGET OUT.json [flags]
  local target=$1 out=$2; shift 2
  "$BARGE" backup --source "nbd+unix:///?socket=$SOCK" --target "$target" --name disk --json "$@" >"$out"
}

kill_at_cut() {  # kill_at_cut OUT.json PID: SIGKILL once the progress passes $CUT
python3 - "$1" "$CUT" "$2" <<'EOF'
import json, os, signal, sys, time
path, cut, pid = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
seen = 0
while True:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        sys.exit("the run ended before the cut")
    with open(path) as f:
        for line in f.readlines()[seen:]:
            seen += 1
            e = json.loads(line)
            if e.get("event") == "progress" and e["done_bytes"] >= cut * e["total_bytes"]:
                os.kill(pid, signal.SIGKILL)
                print(f"killed at {e['done_bytes']} of {e['total_bytes']} bytes done")
                with open(path + ".cut", "w") as out:
                    out.write(f"{e['done_bytes'] / e['total_bytes']:.3f}")
                sys.exit(0)
    time.sleep(0.02)
EOF
}

echo
echo "== uninterrupted"
serve "$WORK/whole.log"
start=$(date +%s.%N)
backup "$WORK/whole" "$WORK/whole.json"
whole_s=$(since "$start")
stop
whole_read=$(read_bytes "$WORK/whole.log")
echo "time: ${whole_s}s, read: $whole_read bytes"

echo
echo "== cut at $CUT (kill -9 once the progress says so), then resumed"
serve "$WORK/cut.log"
start=$(date +%s.%N)
# barge itself in the background (not a shell function's subshell): the
# SIGKILL must hit barge.
"$BARGE" backup --source "nbd+unix:///?socket=$SOCK" --target "$WORK/cut" --name disk --json >"$WORK/cut.json" &
pid=$!
kill_at_cut "$WORK/cut.json" "$pid"
wait "$pid" 2>/dev/null || true
cut_s=$(since "$start")
staged=$(ls -a "$WORK"/cut/disk/ | grep -c 'barge-tmp$' || true)
[ "$staged" = 1 ] || die "the killed run left no staged image"
stop
echo "killed run: ${cut_s}s, read $(read_bytes "$WORK/cut.log") bytes"
serve "$WORK/resumed.log"
start=$(date +%s.%N)
backup "$WORK/cut" "$WORK/resumed.json"
resumed_s=$(since "$start")
stop
resumed_read=$(read_bytes "$WORK/resumed.log")
echo "resumed run: ${resumed_s}s, read $resumed_read bytes (barge: $(field "$WORK/resumed.json" bytes_read)), staged bytes taken: $(field "$WORK/resumed.json" resume.staged_bytes)"

a=$(ls "$WORK"/whole/disk/*.qcow2)
b=$(ls "$WORK"/cut/disk/*.qcow2)
same=no; cmp -s "$a" "$b" && same=yes
qemu-img compare -q "$b" "$DISK" || die "the resumed image differs from the disk"
"$BARGE" verify "$WORK/cut/disk" >/dev/null || die "the resumed chain does not verify"

echo
echo "== result"
frac=$(calc "$resumed_read / $whole_read")
printf '%-34s %s\n' "uninterrupted: time, read" "${whole_s}s, $whole_read bytes"
printf '%-34s %s\n' "cut run (killed): time" "${cut_s}s"
printf '%-34s %s\n' "resumed: time, read" "${resumed_s}s, $resumed_read bytes"
printf '%-34s %s\n' "progress at the kill (of the work)" "$(cat "$WORK/cut.json.cut")"
printf '%-34s %s (target <= 0.55 when cut at 0.5)\n' "resumed read / uninterrupted read" "$frac"
printf '%-34s %s\n' "cut + resumed time / uninterrupted" "$(calc "($cut_s + $resumed_s) / $whole_s")"
printf '%-34s %s\n' "images byte-identical (cmp)" "$same"

echo
echo "== replicate: uninterrupted, then cut at $CUT and resumed"
replicate() {  # replicate DST OUT.json
  "$BARGE" replicate "nbd+unix:///?socket=$SOCK" --to "$1" --json >"$2"
}
serve "$WORK/rwhole.log"
start=$(date +%s.%N)
replicate "$WORK/rwhole.raw" "$WORK/rwhole.json"
rwhole_s=$(since "$start")
stop
rwhole_read=$(read_bytes "$WORK/rwhole.log")
serve "$WORK/rcut.log"
start=$(date +%s.%N)
"$BARGE" replicate "nbd+unix:///?socket=$SOCK" --to "$WORK/rcut.raw" --json >"$WORK/rcut.json" &
pid=$!
kill_at_cut "$WORK/rcut.json" "$pid"
wait "$pid" 2>/dev/null || true
rcut_s=$(since "$start")
stop
[ -f "$WORK/.rcut.raw.barge-resume" ] || die "the killed replicate left no journal"
serve "$WORK/rresumed.log"
start=$(date +%s.%N)
replicate "$WORK/rcut.raw" "$WORK/rresumed.json"
rresumed_s=$(since "$start")
stop
rresumed_read=$(read_bytes "$WORK/rresumed.log")
rsame=no; cmp -s "$WORK/rwhole.raw" "$WORK/rcut.raw" && rsame=yes
cmp -s "$WORK/rcut.raw" "$DISK" || die "the resumed copy differs from the disk"
printf '%-34s %s\n' "replicate uninterrupted: time, read" "${rwhole_s}s, $rwhole_read bytes"
printf '%-34s %s\n' "replicate cut run (killed): time" "${rcut_s}s"
printf '%-34s %s\n' "replicate resumed: time, read" "${rresumed_s}s, $rresumed_read bytes (barge: $(field "$WORK/rresumed.json" bytes_read), kept: $(field "$WORK/rresumed.json" resume.staged_bytes))"
printf '%-34s %s\n' "progress at the kill (of the copy)" "$(cat "$WORK/rcut.json.cut")"
printf '%-34s %s (target <= 0.55 when cut at 0.5)\n' "replicate resumed read / whole" "$(calc "$rresumed_read / $rwhole_read")"
printf '%-34s %s\n' "copies byte-identical (cmp)" "$rsame"

echo
echo "== replicate to an NBD export: cut at $CUT and resumed"
TSOCK=$WORK/target.sock
TARGET=$WORK/target.raw
STATE=$WORK/state
TARGET_PID=
serve_target() {  # the export $TARGET on $TSOCK, as fast as it goes
  rm -f "$TSOCK"
  nbdkit --foreground --exit-with-parent --unix "$TSOCK" file "$TARGET" &
  TARGET_PID=$!
  for _ in $(seq 100); do [ -S "$TSOCK" ] && return; sleep 0.05; done
  die "nbdkit (target) did not start"
}
stop_target() { kill "$TARGET_PID" 2>/dev/null || true; wait "$TARGET_PID" 2>/dev/null || true; }
truncate -s "$(stat -c %s "$DISK")" "$TARGET"
serve_target
TURI="nbd+unix:///?socket=$TSOCK"
serve "$WORK/ncut.log"
start=$(date +%s.%N)
"$BARGE" replicate "nbd+unix:///?socket=$SOCK" --to "$TURI" --state-dir "$STATE" --json >"$WORK/ncut.json" &
pid=$!
kill_at_cut "$WORK/ncut.json" "$pid"
wait "$pid" 2>/dev/null || true
ncut_s=$(since "$start")
stop
ls "$STATE"/*.barge-resume >/dev/null 2>&1 || die "the killed replicate left no journal in the state folder"
serve "$WORK/nresumed.log"
start=$(date +%s.%N)
"$BARGE" replicate "nbd+unix:///?socket=$SOCK" --to "$TURI" --state-dir "$STATE" --json >"$WORK/nresumed.json"
nresumed_s=$(since "$start")
stop
stop_target
nresumed_read=$(read_bytes "$WORK/nresumed.log")
nsame=no; cmp -s "$WORK/rwhole.raw" "$TARGET" && nsame=yes
cmp -s "$TARGET" "$DISK" || die "the resumed export differs from the disk"
printf '%-34s %s\n' "to NBD cut run (killed): time" "${ncut_s}s"
printf '%-34s %s\n' "to NBD resumed: time, read" "${nresumed_s}s, $nresumed_read bytes (barge: $(field "$WORK/nresumed.json" bytes_read), kept: $(field "$WORK/nresumed.json" resume.staged_bytes))"
printf '%-34s %s\n' "progress at the kill (of the copy)" "$(cat "$WORK/ncut.json.cut")"
printf '%-34s %s (target <= 0.55 when cut at 0.5)\n' "to NBD resumed read / whole" "$(calc "$nresumed_read / $rwhole_read")"
printf '%-34s %s\n' "export = uninterrupted copy (cmp)" "$nsame"
