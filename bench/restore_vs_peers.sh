#!/usr/bin/env bash
# Restore of a chain (full + 5 incrementals, 5% of clusters changed in each)
# to raw: barge restore (every cluster verified) against (a) the KubeVirt
# procedure (copy the chain, qemu-img rebase -u down it, qemu-img convert of
# the top) and (b) qemu-img convert -O raw of the top layer. Then an
# incremental backup of 1% dirty data against the full backup of the same
# disk. Exits non-zero only when something fails to run.
#
#   bench/restore_vs_peers.sh [--size 2G] [--incr-size 8G] [--seed 1]
#                             [--workdir /var/tmp] [--barge PATH]
#                             [--cache cold|warm|both] [--repeat 1]
# --repeat N runs every measurement N times (the tools take turns) and
# reports medians.
source "$(dirname "$0")/lib.sh"

usage() { sed -n '2,13p' "$0"; }

INCR_SIZE=8G
args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --incr-size) INCR_SIZE=$2; shift 2 ;;
    *) args+=("$1"); shift ;;
  esac
done
parse_common_flags "${args[@]+"${args[@]}"}"
need_tools qemu-img python3 numfmt
make_workdir
print_machine
echo "incr-size:  $INCR_SIZE (1% dirty incremental vs full)"


# backup_image ARGS...: runs barge backup into $TARGET/disk, prints the new
# image's path (images are named NNNN-TIME.qcow2: the last one sorts last).
backup_image() {
  "$BARGE" backup "$@" > /dev/null
  ls -1 "$TARGET"/disk/*.qcow2 | sort | tail -1
}

echo
echo "== chain: full + 5 incrementals (5% of clusters each)"
DISK=$WORK/disk.raw
"$BARGE" bench generate --size "$SIZE" --seed "$SEED" "$DISK"
TARGET=$WORK/backups
LAYERS=()
LAYERS+=("$(backup_image --source "$DISK" --source-format raw --target "$TARGET" --name disk)")
for i in 1 2 3 4 5; do
  dirty_percent "$DISK" 5 "$((SEED * 100 + i))" "$WORK/dirty$i.json"
  LAYERS+=("$(backup_image --source "$DISK" --source-format raw --target "$TARGET" --name disk \
    --incremental --dirty-extents "$WORK/dirty$i.json")")
done
CHAIN=$TARGET/disk
TOP=${LAYERS[5]}
for l in "${LAYERS[@]}"; do echo "  $(basename "$l")  $(numfmt --to=iec-i --suffix=B "$(stat -c %s "$l")")"; done
qemu-img info --backing-chain "$TOP" | grep -E '^(image|backing file):' | head -12 | sed 's/^/  /'

# The KubeVirt procedure: copy, rebase -u each layer onto the previous copy,
# convert the top.
kubevirt_restore() {
  local dst=$1 out=$2
  mkdir -p "$dst"
  cp --sparse=always "${LAYERS[@]}" "$dst/"
  local i prev
  for i in 1 2 3 4 5; do
    prev=$(basename "${LAYERS[$((i - 1))]}")
    qemu-img rebase -u -f qcow2 -b "$prev" -F qcow2 "$dst/$(basename "${LAYERS[$i]}")"
  done
  qemu-img convert -f qcow2 -O raw -W -m 16 "$dst/$(basename "$TOP")" "$out"
}
export -f kubevirt_restore
export LAYERS_STR="${LAYERS[*]}" TOP

echo
echo "== restore runs"
for mode in $(cache_modes); do
for run in $(runs); do
  rm -rf "$WORK"/out* "$WORK/kv"
  prepare_cache "$mode" "$CHAIN"; echo " [$CACHE_HOW, run $run of $REPEAT]"
  measure barge-restore-raw "$mode" "$WORK/out-b.raw" -- "$BARGE" restore "$CHAIN" --to "$WORK/out-b.raw"
  rm -f "$WORK"/out*
  # Without the final fsync, like the peers below (qemu-img convert does not
  # flush its output by default).
  prepare_cache "$mode" "$CHAIN"
  measure barge-restore-raw-nosync "$mode" "$WORK/out-b.raw" -- \
    "$BARGE" restore "$CHAIN" --to "$WORK/out-b.raw" --no-sync
  cmp "$DISK" "$WORK/out-b.raw" >/dev/null || die "barge restore output differs from the disk"
  rm -f "$WORK"/out*
  prepare_cache "$mode" "$CHAIN"
  measure kubevirt-rebase-convert "$mode" "$WORK/out-k.raw" -- \
    bash -c 'LAYERS=($LAYERS_STR); kubevirt_restore "$1" "$2"' _ "$WORK/kv" "$WORK/out-k.raw"
  cmp "$DISK" "$WORK/out-k.raw" >/dev/null || die "KubeVirt-procedure output differs from the disk"
  rm -rf "$WORK"/out* "$WORK/kv"
  prepare_cache "$mode" "$CHAIN"
  measure qemu-img-convert-top "$mode" "$WORK/out-q.raw" -- \
    qemu-img convert -f qcow2 -O raw -W -m 16 "$TOP" "$WORK/out-q.raw"
  rm -f "$WORK"/out*
  # The same made durable, as barge's default restore is.
  prepare_cache "$mode" "$CHAIN"
  measure qemu-img-convert-top+sync "$mode" "$WORK/out-q.raw" -- \
    bash -c 'qemu-img convert -f qcow2 -O raw -W -m 16 "$1" "$2" && sync "$2"' _ "$TOP" "$WORK/out-q.raw"
  rm -f "$WORK"/out*
done
done

echo
echo "== incremental (1% dirty) vs full backup of a $INCR_SIZE disk"
rm -rf "$TARGET" "$DISK"
DISK2=$WORK/disk2.raw
"$BARGE" bench generate --size "$INCR_SIZE" --seed "$((SEED + 1))" "$DISK2"
for mode in $(cache_modes); do
for run in $(runs); do
  rm -rf "$WORK/b2"
  prepare_cache "$mode" "$DISK2"; echo " [$CACHE_HOW, run $run of $REPEAT]"
  measure barge-full-backup "$mode" "$WORK/b2" -- \
    "$BARGE" backup --source "$DISK2" --source-format raw --target "$WORK/b2" --name disk
  dirty_percent "$DISK2" 1 "$((SEED * 1000 + 7 + run))" "$WORK/dirty-1pct.json"
  prepare_cache "$mode" "$DISK2"
  measure barge-incr-1pct "$mode" "$WORK/b2" -- \
    "$BARGE" backup --source "$DISK2" --source-format raw --target "$WORK/b2" --name disk \
    --incremental --dirty-extents "$WORK/dirty-1pct.json"
done
done

print_results

echo
echo "== ratios and targets"
for mode in $(cache_modes); do
  b=$(get barge-restore-raw-nosync "$mode" wall); k=$(get kubevirt-rebase-convert "$mode" wall); q=$(get qemu-img-convert-top "$mode" wall)
  faster_peer=$(awk -v a="$k" -v b="$q" 'BEGIN { print (a < b) ? a : b }')
  r=$(ratio "$faster_peer" "$b")
  bs=$(get barge-restore-raw "$mode" wall); qs=$(get qemu-img-convert-top+sync "$mode" wall)
  f=$(get barge-full-backup "$mode" wall); i=$(get barge-incr-1pct "$mode" wall)
  pct=$(awk -v i="$i" -v f="$f" 'BEGIN { printf "%.1f", 100 * i / f }')
  echo "[$mode]"
  echo "  restore: barge ${r}x faster than the faster peer (KubeVirt $(ratio "$k" "$b")x, convert-top $(ratio "$q" "$b")x)" \
       "(target >= 2x: $(verdict "$r" '>=' 2)); neither fsyncs its output"
  echo "  restore, both durable: barge (fsync, the default) $(ratio "$qs" "$bs")x faster than qemu-img convert-top + sync;" \
       "barge with fsync vs the unsynced peers: $(ratio "$q" "$bs")x convert-top, $(ratio "$k" "$bs")x KubeVirt"
  echo "  incremental 1%: ${pct}% of the full backup's time (target <= 10%: $(verdict "$pct" '<=' 10))"
done
