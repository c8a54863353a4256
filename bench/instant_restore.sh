#!/usr/bin/env bash
# Instant recovery: barge vm instant-restore of a point (full + N
# incrementals, 5% of the clusters rewritten in each) to a TCG domain with no
# OS, against a plain barge restore of the same point in the same run. For
# each run: the seconds from the command to the domain running (its `started`
# event), the move (from then to the domain on DISK with the export stopped:
# the command's end) and the whole command; each phase's second is printed; the guest writes 1 MiB through the monitor during the move,
# and DISK is compared with the restored point plus that write. Page cache
# warm; medians of --repeat runs, the two taking turns. Needs a running
# libvirtd (qemu:///system) with QEMU.
#
#   bench/instant_restore.sh [--size 256M] [--increments 5] [--seed 1]
#                            [--workdir /var/tmp] [--barge PATH] [--repeat 1]
# Targets (issue 22): running within 2 s; the move within 1.5x barge restore.
source "$(dirname "$0")/lib.sh"

usage() { sed -n '2,14p' "$0"; }

SIZE=256M
INCREMENTS=5
args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --increments) INCREMENTS=$2; shift 2 ;;
    *) args+=("$1"); shift ;;
  esac
done
parse_common_flags "${args[@]+"${args[@]}"}"
CACHE=warm
need_tools qemu-img qemu-io nbdkit virsh python3 numfmt
VIRSH="virsh -q -c qemu:///system"
$VIRSH version > /dev/null 2>&1 || die "libvirtd is not answering on qemu:///system (TESTBED.md: virtlogd -d; libvirtd -d)"
make_workdir
chmod 0711 "$WORK"   # QEMU's user reaches DISK and the overlay's folder
DOMAIN=barge-bench-instant-$$
cleanup() {
  $VIRSH destroy "$DOMAIN" > /dev/null 2>&1 || true
  $VIRSH undefine "$DOMAIN" > /dev/null 2>&1 || true
  if [ "${BARGE_BENCH_KEEP:-0}" != 1 ]; then rm -rf "$WORK"; fi
}
trap cleanup EXIT
print_machine
echo "chain:      full + $INCREMENTS incrementals (5% of clusters each); domain: TCG, 64 MiB, no OS"

echo
echo "== chain"
DISK=$WORK/disk.raw
"$BARGE" bench generate --size "$SIZE" --seed "$SEED" "$DISK" > /dev/null
make_chain "$DISK" "$WORK/backups" "$INCREMENTS"
echo "  $(ls -1 "$CHAIN"/*.qcow2 | wc -l) layers, $(numfmt --to=iec-i --suffix=B "$(du -cb "$CHAIN"/*.qcow2 | tail -1 | cut -f1)") stored"
rm -f "$DISK"  # the restores below are the reference

PLACEHOLDER=$WORK/old.qcow2
qemu-img create -q -f qcow2 "$PLACEHOLDER" "$SIZE"
cat > "$WORK/domain.xml" <<EOF
<domain type='qemu'><name>$DOMAIN</name><memory unit='MiB'>64</memory><vcpu>1</vcpu>
<os><type arch='x86_64' machine='pc'>hvm</type></os><devices>
<disk type='file' device='disk'><driver name='qemu' type='qcow2'/><source file='$PLACEHOLDER'/>
<target dev='vda' bus='virtio'/></disk></devices></domain>
EOF

# instant_run N: one instant restore with a guest write during the move;
# appends instant-running and instant-moved rows to $RESULTS.
instant_run() {
  local events=$WORK/ir.events target=$WORK/ir.raw
  $VIRSH define "$WORK/domain.xml" > /dev/null
  rm -f "$target" "$events" "$WORK/state/catalog.db"
  mkdir -p "$WORK/state"
  local t0
  t0=$(date +%s.%N)
  ( /usr/bin/time -f '%e %U %S %M' -o "$WORK/ir.time" "$BARGE" vm instant-restore "$CHAIN" --domain "$DOMAIN" \
      --to "$target" --catalog "$WORK/state/catalog.db" --json 2> "$WORK/ir.err" \
      | while IFS= read -r line; do printf '%s\t%s\n' "$(date +%s.%N)" "$line"; done > "$events" ) &
  local pid=$! wrote=0
  while kill -0 "$pid" 2>/dev/null; do
    if [ "$wrote" = 0 ] && grep -q '"phase":"started"' "$events" 2>/dev/null; then
      $VIRSH qemu-monitor-command "$DOMAIN" --hmp \
        'qemu-io -d /machine/peripheral/virtio-disk0/virtio-backend "write -P 0x5a 1M 1M"' > /dev/null
      wrote=1
    fi
    sleep 0.02
  done
  wait "$pid" || true
  grep -q '"event":"result"' "$events" || { cat "$WORK/ir.err" >&2; die "instant-restore failed"; }
  [ "$wrote" = 1 ] || die "the run ended before the guest could write"
  local running done moved user sys rss wall
  running=$(awk -F'\t' -v t0="$t0" '/"phase":"started"/ { printf "%.2f", $1 - t0; exit }' "$events")
  done=$(awk -F'\t' -v t0="$t0" '/"event":"result"/ { printf "%.2f", $1 - t0; exit }' "$events")
  moved=$(awk -v a="$done" -v b="$running" 'BEGIN { printf "%.2f", a - b }')
  read -r wall user sys rss < <(tail -1 "$WORK/ir.time")
  printf 'instant-running\twarm\t%s\t0\t0\t0\n' "$running" >> "$RESULTS"
  printf 'instant-done\twarm\t%s\t%s\t%s\t%s\n' "$done" "$(awk -v u="$user" -v s="$sys" 'BEGIN {printf "%.2f", u + s}')" \
    "$rss" "$(du -B1 "$target" | cut -f1)" >> "$RESULTS"
  printf 'instant-move\twarm\t%s\t0\t0\t0\n' "$moved" >> "$RESULTS"
  # Where the time goes: each event's second after the command.
  printf '  %-28s %s\n' instant-restore "$(python3 -c '
import json, sys
t0 = float(sys.argv[2]); out = []
for line in open(sys.argv[1]):
    t, text = line.rstrip("\n").split("\t", 1)
    e = json.loads(text)
    if e["event"] in ("phase", "result"):
        out.append("%s %.2fs" % (e.get("phase", "done"), float(t) - t0))
    if e["event"] == "result":
        out.append("(barge: running %.2fs, whole %.2fs)" % (e["started_seconds"], e["duration_seconds"]))
print(", ".join(out))' "$events" "$t0")"
  $VIRSH destroy "$DOMAIN" > /dev/null
  $VIRSH undefine "$DOMAIN" > /dev/null
  # DISK is the point plus the guest's write.
  qemu-io -f raw -c 'write -P 0x5a 1M 1M' "$WORK/restored.raw" > /dev/null
  cmp "$target" "$WORK/restored.raw" || die "DISK differs from the point plus the guest's write"
  rm -f "$target"
}

echo
echo "== runs (page cache warm)"
warm_cache "$CHAIN"
for run in $(runs); do
  echo " [run $run of $REPEAT]"
  measure barge-restore warm "$WORK/restored.raw" -- "$BARGE" restore "$CHAIN" --to "$WORK/restored.raw" --force
  instant_run
done

print_results
echo
echo "== ratios and targets"
r=$(get barge-restore warm wall); run=$(get instant-running warm wall); moved=$(get instant-move warm wall)
done=$(get instant-done warm wall)
q=$(ratio "$moved" "$r"); qd=$(ratio "$done" "$r")
echo "  domain running after ${run}s (target <= 2 s: $(verdict "$run" '<=' 2))"
echo "  move (domain running -> on DISK, export stopped) ${moved}s = ${q}x barge restore's ${r}s (target <= 1.5x: $(verdict "$q" '<=' 1.5))"
echo "  whole command ${done}s = ${qd}x barge restore"
