#!/usr/bin/env bash
# Chain sync to a bucket (issue 40 section 1): a local chain of a generated
# disk (a full and 5 incrementals, each after 5% of the clusters changed)
# copied into a real Ceph radosgw on 127.0.0.1 (bench/radosgw.sh), against
# the peer in the same run:
#   sync         barge sync FOLDER s3://... (every point verified in the
#                folder before and in the bucket after its copy) vs
#                aws s3 sync of the same folder (no check; target >= 1.0x)
#   incremental  one more point, then both again: barge must move that
#                point's files only (bytes the server received / the
#                point's bytes, target <= 1.05)
# The bucket's chain is restored and compared with the disk (cmp).
#
#   bench/s3_sync.sh [--size 1G] [--long] [--seed 1] [--workdir /var/tmp]
#                    [--barge PATH] [--repeat 1]
#
# --long: the issue's 4 GiB disk. Needs radosgw, ceph-mon, ceph-osd,
# ceph-common, awscli, qemu-img. Stops every daemon by PID and deletes its
# data on every exit path.
CACHE=warm
SIZE=${SIZE:-1G}
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/radosgw.sh"

usage() { sed -n '2,19p' "$0"; }

rest=()
while [ $# -gt 0 ]; do
  case "$1" in
    --long) SIZE=4G; shift ;;
    *) rest+=("$1"); shift ;;
  esac
done
parse_common_flags "${rest[@]+"${rest[@]}"}"
need_tools radosgw ceph-mon ceph-osd ceph radosgw-admin aws qemu-img numfmt python3
make_workdir
trap 'rgw_stop; rm -rf "$WORK"' EXIT
print_machine
echo "aws:        $(aws --version 2>&1 | head -1)"

DISK_BYTES=$(numfmt --from=iec "$SIZE")
rgw_bench_start "$DISK_BYTES"

# point_bytes CHAIN ID: the bytes of a point's files (image, digest tables,
# manifest): what a sync of that point sends.
point_bytes() {
  python3 - "$1" "$2" <<'EOF'
import json, os, sys
chain, pid = sys.argv[1], sys.argv[2]
m = json.load(open(os.path.join(chain, pid + ".json")))
names = [pid + ".json", m["image"], m["digest_table"]] + ([m["strong_digest_table"]] if m.get("strong_digest_table") else [])
print(sum(os.path.getsize(os.path.join(chain, n)) for n in names))
EOF
}

echo
echo "== disk: $SIZE generated (seed $SEED), a full and 5 incrementals"
DISK=$WORK/disk.raw
"$BARGE" bench generate --size "$SIZE" --seed "$SEED" "$DISK"
make_chain "$DISK" "$WORK/local" 5
CHAIN_BYTES=$(dir_bytes "$CHAIN")
echo "chain:      $(ls "$CHAIN"/*.json | wc -l) points, $(numfmt --to=iec-i --suffix=B "$CHAIN_BYTES")"
# The 7th point, added between the runs' full and incremental syncs; a
# copy of the chain without it for every run's start.
cp -a "$CHAIN" "$WORK/six"
cp --sparse=always "$DISK" "$WORK/disk-six.raw"

for run in $(runs); do
  echo " [run $run of $REPEAT]"
  $S3 rm --recursive --quiet s3://bench/ > /dev/null || true
  rm -rf "$CHAIN" "$WORK/out.raw"
  cp -a "$WORK/six" "$CHAIN"
  cp --sparse=always "$WORK/disk-six.raw" "$DISK"
  warm_cache "$CHAIN"/*.qcow2
  measure_ops aws-s3-sync "$CHAIN" -- $S3 sync --quiet "$CHAIN" s3://bench/aws/disk
  measure_ops barge-sync "$CHAIN" -- "$BARGE" sync "$CHAIN" s3://bench/barge/disk

  dirty "$DISK" "$((SEED * 100 + 50 + run))" "$WORK/dirty-more.json"
  "$BARGE" backup --source "$DISK" --source-format raw --target "$WORK/local" --name disk \
    --incremental --dirty-extents "$WORK/dirty-more.json" > /dev/null
  LAST=$(basename "$(ls -1 "$CHAIN"/*.json | tail -1)" .json)
  LAST_BYTES=$(point_bytes "$CHAIN" "$LAST")
  warm_cache "$CHAIN"/*.qcow2
  measure_ops aws-s3-sync-incr "$CHAIN/$LAST.json" -- $S3 sync --quiet "$CHAIN" s3://bench/aws/disk
  measure_ops barge-sync-incr "$CHAIN/$LAST.json" -- "$BARGE" sync "$CHAIN" s3://bench/barge/disk

  "$BARGE" restore s3://bench/barge/disk --to "$WORK/out.raw" > /dev/null
  cmp "$DISK" "$WORK/out.raw" > /dev/null || die "the bucket's chain restores other bytes than the disk"
  rm -f "$WORK/out.raw"
done

print_results
echo
echo "== requests (radosgw usage log; last run)"
printf '%-20s %8s %8s %8s %14s %14s\n' step PUTs GETs other bytes_in bytes_out
for l in aws-s3-sync barge-sync aws-s3-sync-incr barge-sync-incr; do
  printf '%-20s %8s %8s %8s %14s %14s\n' "$l" "$(ops_field $l 1)" "$(ops_field $l 2)" "$(ops_field $l 3)" \
    "$(ops_field $l 5)" "$(ops_field $l 4)"
done
echo "chain before the last point: $CHAIN_BYTES bytes; the last point's files: $LAST_BYTES bytes"

echo
echo "== ratios (medians)"
r_sync=$(ratio "$(get aws-s3-sync warm wall)" "$(get barge-sync warm wall)")
r_incr=$(ratio "$(get aws-s3-sync-incr warm wall)" "$(get barge-sync-incr warm wall)")
moved=$(ratio "$(ops_field barge-sync-incr 5)" "$LAST_BYTES")
printf '%-58s %6s  %s\n' \
  "aws s3 sync / barge sync (6 points, each verified)" "$r_sync" "(target >= 1.0)  $(verdict "$r_sync" ">=" 1.0)" \
  "aws s3 sync / barge sync, one more point" "$r_incr" "(reported)" \
  "bytes barge sent for one more point / that point's files" "$moved" "(target <= 1.05)  $(verdict "$moved" "<=" 1.05)"
