#!/usr/bin/env bash
# Replication of one raw disk to 3 destinations, each verified by SHA-512:
# barge replicate (one read, three writers, --verify re-reads each copy)
# against 3x (cp --sparse=always + sha512sum) and 3x (nbdcopy + sha512sum),
# with the source's SHA-512 computed once for the peers. Warm and cold
# page cache. Exits non-zero only when something fails to run.
#
#   bench/replicate_vs_peers.sh [--size 2G] [--seed 1] [--workdir /var/tmp]
#                               [--barge PATH] [--cache cold|warm|both]
#                               [--repeat 1]   (N runs each, tools in turn; medians)
source "$(dirname "$0")/lib.sh"

usage() { sed -n '2,10p' "$0"; }

parse_common_flags "$@"
need_tools nbdcopy sha512sum cp numfmt
"$BARGE" replicate --help >/dev/null 2>&1 || die "this barge has no working 'replicate' command"
make_workdir
print_machine

DISK=$WORK/disk.raw
echo
echo "== disk"
"$BARGE" bench generate --size "$SIZE" --seed "$SEED" "$DISK"

# peer_copy TOOL SRC DIR: source digest once, then per copy: copy + digest,
# compared with the source's.
peer_copy() {
  local tool=$1 src=$2 dir=$3 want got i
  want=$(sha512sum "$src" | cut -d' ' -f1)
  for i in 1 2 3; do
    if [ "$tool" = cp ]; then cp --sparse=always "$src" "$dir/r$i.raw"; else nbdcopy "$src" "$dir/r$i.raw"; fi
    got=$(sha512sum "$dir/r$i.raw" | cut -d' ' -f1)
    [ "$got" = "$want" ] || { echo "copy $i differs" >&2; return 1; }
  done
}
export -f peer_copy

echo
echo "== runs"
for mode in $(cache_modes); do
for run in $(runs); do
  rm -rf "$WORK/out"; mkdir -p "$WORK/out"
  prepare_cache "$mode" "$DISK"; echo " [$CACHE_HOW, run $run of $REPEAT]"
  measure barge-replicate-x3 "$mode" "$WORK/out" -- \
    "$BARGE" replicate "$DISK" --source-format raw --format raw --verify \
    --to "$WORK/out/r1.raw" --to "$WORK/out/r2.raw" --to "$WORK/out/r3.raw"
  rm -rf "$WORK/out"; mkdir -p "$WORK/out"
  prepare_cache "$mode" "$DISK"
  measure cp-sha512sum-x3 "$mode" "$WORK/out" -- bash -c 'peer_copy cp "$1" "$2"' _ "$DISK" "$WORK/out"
  rm -rf "$WORK/out"; mkdir -p "$WORK/out"
  prepare_cache "$mode" "$DISK"
  measure nbdcopy-sha512sum-x3 "$mode" "$WORK/out" -- bash -c 'peer_copy nbd "$1" "$2"' _ "$DISK" "$WORK/out"
  rm -rf "$WORK/out"
done
done

print_results

echo
echo "== ratios"
for mode in $(cache_modes); do
  b=$(get barge-replicate-x3 "$mode" wall)
  echo "[$mode] barge $(ratio "$(get cp-sha512sum-x3 "$mode" wall)" "$b")x faster than cp+sha512sum," \
       "$(ratio "$(get nbdcopy-sha512sum-x3 "$mode" wall)" "$b")x faster than nbdcopy+sha512sum"
done
