#!/usr/bin/env bash
# A batch of many small disks backed up under one policy (barge run --force,
# max_parallel P) against the same backups run by hand with the same
# parallelism (one barge backup per disk, xargs -P P): wall time, CPU time,
# peak RSS, output bytes, and the ratio policy / by hand. Issue 15's target:
# the policy costs no more (ratio <= 1.05, i.e. within this machine's
# noise). Exits non-zero only when something fails to run.
#
#   bench/policy_vs_manual.sh [--sources 64] [--size 16M] [--parallel 2]
#                             [--seed 1] [--workdir /var/tmp] [--barge PATH]
#                             [--cache cold|warm|both] [--repeat 1]
# --size is each disk's (barge bench generate, seeds SEED..SEED+N-1: holes,
# zero runs, text-like and random data in varying mixes).
source "$(dirname "$0")/lib.sh"

usage() { sed -n '2,13p' "$0"; }

SIZE=16M
SOURCES=64
PARALLEL=$(nproc)
args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --sources) SOURCES=$2; shift 2 ;;
    --parallel) PARALLEL=$2; shift 2 ;;
    *) args+=("$1"); shift ;;
  esac
done
parse_common_flags "${args[@]+"${args[@]}"}"
[[ "$SOURCES" =~ ^[1-9][0-9]*$ ]] || die "--sources must be a whole number >= 1"
[[ "$PARALLEL" =~ ^[1-9][0-9]*$ && "$PARALLEL" -le 64 ]] || die "--parallel must be 1..64"
need_tools xargs numfmt
make_workdir
print_machine
echo "sources:    $SOURCES disks of $SIZE, $PARALLEL at once"

echo
echo "== disks"
mkdir -p "$WORK/disks"
for i in $(seq 0 $((SOURCES - 1))); do
  "$BARGE" bench generate --size "$SIZE" --seed $((SEED + i)) "$WORK/disks/d$i.raw" > /dev/null
done
echo "$SOURCES disks, $(du -sB1 "$WORK/disks" | cut -f1) bytes allocated"

POLICY=$WORK/policy.yaml
{
  echo "name: batch"
  echo "sources:"
  for i in $(seq 0 $((SOURCES - 1))); do echo "  - image: $WORK/disks/d$i.raw"; done
  echo "targets: [$WORK/out-policy]"
  echo "max_parallel: $PARALLEL"
} > "$POLICY"

# by_hand: what an admin's script does for the same backups.
by_hand() {
  find "$WORK/disks" -name '*.raw' -print0 | sort -z |
    xargs -0 -P "$PARALLEL" -n 1 sh -c 'exec "$0" backup --source "$2" --target "$1" --name "$(basename "$2" .raw)"' \
      "$BARGE" "$WORK/out-hand" > /dev/null
}
# by_hand is a shell function: measure runs it through bash.
export -f by_hand
export WORK PARALLEL BARGE

echo
echo "== runs"
for mode in $(cache_modes); do
for run in $(runs); do
  rm -rf "$WORK/out-policy" "$WORK/out-hand" "$WORK/catalog.db" "$WORK/locks"
  mkdir -p "$WORK/out-policy" "$WORK/out-hand"
  prepare_cache "$mode" "$WORK/disks"; echo " [$CACHE_HOW, run $run of $REPEAT]"
  measure policy-run "$mode" "$WORK/out-policy" -- \
    env BARGE_CATALOG="$WORK/catalog.db" "$BARGE" run --policy "$POLICY" --force
  prepare_cache "$mode" "$WORK/disks"
  measure by-hand-xargs "$mode" "$WORK/out-hand" -- bash -c by_hand
  # Same backups: one point per disk on both sides.
  np=$(find "$WORK/out-policy" -name '*.json' | wc -l); nh=$(find "$WORK/out-hand" -name '*.json' | wc -l)
  [ "$np" = "$SOURCES" ] && [ "$nh" = "$SOURCES" ] || die "expected $SOURCES points each, got $np (policy) and $nh (by hand)"
done
done

print_results

echo
echo "== ratio and target (policy / by hand, wall time; <= 1.05 means it costs no more)"
for mode in $(cache_modes); do
  pw=$(get policy-run "$mode" wall); hw=$(get by-hand-xargs "$mode" wall)
  pc=$(get policy-run "$mode" cpu); hc=$(get by-hand-xargs "$mode" cpu)
  r=$(ratio "$pw" "$hw")
  per=$(awk -v p="$pw" -v h="$hw" -v n="$SOURCES" 'BEGIN { printf "%+.1f", (p - h) * 1000 / n }')
  printf '  %-5s wall %ss vs %ss: ratio %s (%s); CPU %ss vs %ss; %s ms per source\n' "$mode" "$pw" "$hw" "$r" \
    "$(verdict "$r" '<=' 1.05)" "$pc" "$hc" "$per"
done
