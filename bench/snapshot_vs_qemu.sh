#!/usr/bin/env bash
# Internal snapshots: barge's offline create/delete (bench/snapshot_bench,
# the library path `barge snapshot` will take: image lock, free-space check,
# the edit) against qemu-img snapshot -c/-d on a large sparse qcow2 image
# with --size bytes allocated (metadata preallocation: every cluster mapped,
# the file sparse) in a --virtual-size disk; then the metrics of all
# --snapshots snapshots in one pass against one qemu-img check. Every
# process is timed whole (start-up included). Exits non-zero only when
# something fails to run or an image is not clean afterwards.
#
#   bench/snapshot_vs_qemu.sh [--size 8G] [--virtual-size 64G] [--snapshots 10]
#                             [--bench-bin PATH] [--workdir /var/tmp]
#                             [--cache cold|warm|both] [--repeat 1]
# --repeat N runs every measurement N times (the tools take turns) and
# reports medians.
source "$(dirname "$0")/lib.sh"

usage() { sed -n '2,16p' "$0"; }

SIZE=8G
VSIZE=64G
SNAPSHOTS=10
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BENCH_BIN=${BENCH_BIN:-$ROOT/build/bench/snapshot_bench}
[ -x "$ROOT/build/cli/barge" ] && BARGE=${BARGE_OVERRIDE:-$ROOT/build/cli/barge}
args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --virtual-size) VSIZE=$2; shift 2 ;;
    --snapshots) SNAPSHOTS=$2; shift 2 ;;
    --bench-bin) BENCH_BIN=$2; shift 2 ;;
    *) args+=("$1"); shift ;;
  esac
done
parse_common_flags "${args[@]+"${args[@]}"}"
[[ "$SNAPSHOTS" =~ ^[1-9][0-9]*$ ]] && [ "$SNAPSHOTS" -ge 2 ] || die "--snapshots must be a whole number >= 2"
[ -x "$BENCH_BIN" ] || die "snapshot_bench not found at $BENCH_BIN (build it: scripts/build.sh, or --bench-bin PATH)"
need_tools qemu-img numfmt
make_workdir
print_machine
echo "image:      $SIZE allocated (preallocation=metadata) in a $VSIZE disk, $SNAPSHOTS snapshots"
echo "driver:     $BENCH_BIN"

BASE=$WORK/base.qcow2
qemu-img create -q -f qcow2 -o preallocation=metadata "$BASE" "$SIZE"
qemu-img resize -q -f qcow2 "$BASE" "$VSIZE"
qemu-img check -f qcow2 "$BASE" | tail -2 | sed 's/^/  /'

# in_order TOOL IMAGE OP FIRST LAST: one process per snapshot sFIRST..sLAST.
in_order() {
  local tool=$1 img=$2 op=$3 i
  for i in $(seq "$4" "$5"); do
    if [ "$tool" = barge ]; then
      "$BENCH_BIN" "$op" "$img" "s$i" > /dev/null
    else
      qemu-img snapshot "-${op:0:1}" "s$i" "$img"
    fi
  done
}
export -f in_order
export BENCH_BIN

check_clean() {
  qemu-img check -q -f qcow2 "$1" || die "qemu-img check found problems in $1"
}

echo
echo "== runs"
for mode in $(cache_modes); do
for run in $(runs); do
  rm -f "$WORK"/a.qcow2 "$WORK"/q.qcow2
  cp --sparse=always "$BASE" "$WORK/a.qcow2"
  cp --sparse=always "$BASE" "$WORK/q.qcow2"
  # Each measurement starts with nothing left to write back.
  sync
  prepare_cache "$mode" "$WORK/a.qcow2"; echo " [$CACHE_HOW, run $run of $REPEAT]"
  measure barge-create-first "$mode" "$WORK/a.qcow2" -- "$BENCH_BIN" create "$WORK/a.qcow2" s1
  sync; prepare_cache "$mode" "$WORK/q.qcow2"
  measure qemu-img-create-first "$mode" "$WORK/q.qcow2" -- qemu-img snapshot -c s1 "$WORK/q.qcow2"
  sync; prepare_cache "$mode" "$WORK/a.qcow2"
  measure barge-create-rest "$mode" "$WORK/a.qcow2" -- bash -c 'in_order barge "$1" create 2 "$2"' _ "$WORK/a.qcow2" "$SNAPSHOTS"
  sync; prepare_cache "$mode" "$WORK/q.qcow2"
  measure qemu-img-create-rest "$mode" "$WORK/q.qcow2" -- bash -c 'in_order qemu "$1" create 2 "$2"' _ "$WORK/q.qcow2" "$SNAPSHOTS"
  check_clean "$WORK/a.qcow2"
  sync; prepare_cache "$mode" "$WORK/a.qcow2"
  measure barge-metrics-all "$mode" "$WORK/a.qcow2" -- "$BENCH_BIN" metrics "$WORK/a.qcow2"
  sync; prepare_cache "$mode" "$WORK/a.qcow2"
  measure qemu-img-check "$mode" "$WORK/a.qcow2" -- qemu-img check -f qcow2 "$WORK/a.qcow2"
  sync; prepare_cache "$mode" "$WORK/a.qcow2"
  measure barge-delete-first "$mode" "$WORK/a.qcow2" -- "$BENCH_BIN" delete "$WORK/a.qcow2" s1
  sync; prepare_cache "$mode" "$WORK/q.qcow2"
  measure qemu-img-delete-first "$mode" "$WORK/q.qcow2" -- qemu-img snapshot -d s1 "$WORK/q.qcow2"
  sync; prepare_cache "$mode" "$WORK/a.qcow2"
  measure barge-delete-rest "$mode" "$WORK/a.qcow2" -- bash -c 'in_order barge "$1" delete 2 "$2"' _ "$WORK/a.qcow2" "$SNAPSHOTS"
  sync; prepare_cache "$mode" "$WORK/q.qcow2"
  measure qemu-img-delete-rest "$mode" "$WORK/q.qcow2" -- bash -c 'in_order qemu "$1" delete 2 "$2"' _ "$WORK/q.qcow2" "$SNAPSHOTS"
  check_clean "$WORK/a.qcow2"
  [ -z "$(qemu-img snapshot -l "$WORK/a.qcow2")" ] || die "snapshots left in barge's image"
done
done

print_results

echo
echo "== ratios and targets (qemu-img time / barge time; whole processes)"
for mode in $(cache_modes); do
  echo "[$mode]"
  for op in create-first create-rest delete-first delete-rest; do
    r=$(ratio "$(get "qemu-img-$op" "$mode" wall)" "$(get "barge-$op" "$mode" wall)")
    c=$(ratio "$(get "qemu-img-$op" "$mode" cpu)" "$(get "barge-$op" "$mode" cpu)")
    echo "  $op: barge ${r}x qemu-img in wall time (target >= 2x: $(verdict "$r" '>=' 2)), ${c}x in CPU time"
  done
  m=$(get barge-metrics-all "$mode" wall); c=$(get qemu-img-check "$mode" wall)
  echo "  metrics of $SNAPSHOTS snapshots in one pass: ${m}s, one qemu-img check ${c}s" \
       "(target: no slower: $(verdict "$(ratio "$c" "$m")" '>=' 1));" \
       "CPU $(get barge-metrics-all "$mode" cpu)s vs $(get qemu-img-check "$mode" cpu)s"
done
