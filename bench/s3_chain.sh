#!/usr/bin/env bash
# Chains in a bucket (issue 38): a generated disk backed up into a real Ceph
# radosgw on 127.0.0.1 (bench/radosgw.sh) and restored from it, against
# the peers in the same run:
#   ceiling      aws s3 cp up and down of the same bytes as barge's full
#                point (multipart, 8 in flight): the server's own limit
#   full         barge backup --target s3://  vs  restic backup to the
#                same server (target >= 2x)  vs  barge backup to a folder
#                then aws s3 cp (target >= 1.3x: no staging)
#   incremental  after 1% of the clusters changed: barge with the changed
#                ranges (CBT, --dirty-extents) and by digests (reading the
#                whole disk, as restic must) vs restic backup (target >= 5x)
#   restore      barge restore s3://... vs restic restore (target >= 2x)
#                vs aws s3 cp of the chain then a local restore (>= 1.3x)
#   requests     PUTs per GiB written and GETs per GiB read (radosgw's
#                usage log), beside what a store of 2 MiB blocks needs
#   cut          a full backup killed by PID once half its point reached
#                the server, then run again: the bytes the server received
#                in the second run, as a fraction of the point (target <= 55%)
# Every restore is compared with the disk (cmp).
#
#   bench/s3_chain.sh [--size 1G] [--long] [--seed 1] [--workdir /var/tmp]
#                     [--barge PATH] [--repeat 1]
#
# --long: the issue's 4 GiB disk. Needs radosgw, ceph-mon, ceph-osd,
# ceph-common, awscli, restic, qemu-img. Stops every daemon by PID and
# deletes its data on every exit path.
CACHE=warm
SIZE=${SIZE:-1G}
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/radosgw.sh"

usage() { sed -n '2,28p' "$0"; }

rest=()
while [ $# -gt 0 ]; do
  case "$1" in
    --long) SIZE=4G; shift ;;
    *) rest+=("$1"); shift ;;
  esac
done
parse_common_flags "${rest[@]+"${rest[@]}"}"
need_tools radosgw ceph-mon ceph-osd ceph radosgw-admin aws restic qemu-img numfmt python3
make_workdir
trap 'rgw_stop; rm -rf "$WORK"' EXIT
print_machine
echo "restic:     $(restic version | head -1)"
echo "aws:        $(aws --version 2>&1 | head -1)"

bytes_of() { numfmt --from=iec "$1"; }
DISK_BYTES=$(bytes_of "$SIZE")
rgw_bench_start "$DISK_BYTES"
export RESTIC_PASSWORD=bench RESTIC_CACHE_DIR=$WORK/restic-cache
RESTIC_REPO=s3:$RGW_URL/bench/restic

echo
echo "== disk: $SIZE generated (seed $SEED)"
DISK=$WORK/disk.raw
"$BARGE" bench generate --size "$SIZE" --seed "$SEED" "$DISK"
ORIG=$WORK/disk-orig.raw
cp --sparse=always "$DISK" "$ORIG"

for run in $(runs); do
  echo " [run $run of $REPEAT]"
  # Fresh every run: the disk as generated, an empty bucket prefix.
  cp --sparse=always "$ORIG" "$DISK"
  $S3 rm --recursive --quiet s3://bench/ > /dev/null || true
  rm -rf "$WORK/local" "$WORK/down" "$WORK/out"* "$RESTIC_CACHE_DIR" "$WORK/restic-out"
  warm_cache "$DISK"

  # full: to a folder, then aws s3 cp (the staged way)
  measure local-full warm "$WORK/local" -- \
    "$BARGE" backup --source "$DISK" --source-format raw --target "$WORK/local" --name disk
  POINT=$(ls -1 "$WORK/local/disk/"*.qcow2 | tail -1)
  POINT_BYTES=$(stat -c %s "$POINT")
  measure_ops aws-cp-up "$POINT" -- $S3 cp --quiet "$POINT" s3://bench/ceiling/point.qcow2
  measure_ops aws-cp-down "$WORK/down.qcow2" -- $S3 cp --quiet s3://bench/ceiling/point.qcow2 "$WORK/down.qcow2"
  rm -f "$WORK/down.qcow2"
  $S3 rm --quiet s3://bench/ceiling/point.qcow2
  # full: straight into the bucket
  measure_ops barge-s3-full "$POINT" -- \
    "$BARGE" backup --source "$DISK" --source-format raw --target s3://bench/chains \
      --name disk
  # full: restic into the same server
  restic -r "$RESTIC_REPO" init > /dev/null
  measure_ops restic-full "$POINT" -- restic -r "$RESTIC_REPO" backup --compression auto "$DISK"

  # a second chain of the same disk, for the incremental by digests
  "$BARGE" backup --source "$DISK" --source-format raw --target s3://bench/chains --name disk2 \
    > /dev/null
  # incremental after 1% changed
  dirty_percent "$DISK" 1 "$((SEED * 100 + run))" "$WORK/dirty.json"
  warm_cache "$DISK"
  measure_ops barge-s3-incr-cbt "$DISK" -- \
    "$BARGE" backup --source "$DISK" --source-format raw --target s3://bench/chains --name disk \
      --incremental --dirty-extents "$WORK/dirty.json"
  measure_ops barge-s3-incr-digests "$DISK" -- \
    "$BARGE" backup --source "$DISK" --source-format raw --target s3://bench/chains --name disk2 \
      --incremental --changed-by digests
  measure_ops restic-incr "$DISK" -- restic -r "$RESTIC_REPO" backup --compression auto "$DISK"

  # restore of the latest point
  measure_ops barge-s3-restore "$WORK/out-b.raw" -- \
    "$BARGE" restore s3://bench/chains/disk --to "$WORK/out-b.raw"
  cmp "$DISK" "$WORK/out-b.raw" > /dev/null || die "barge restore from the bucket differs from the disk"
  rm -f "$WORK/out-b.raw"
  measure_ops restic-restore "$WORK/restic-out" -- \
    restic -r "$RESTIC_REPO" restore latest --target "$WORK/restic-out"
  cmp "$DISK" "$WORK/restic-out$DISK" > /dev/null || die "restic restore differs from the disk"
  rm -rf "$WORK/restic-out"
  measure_ops download-then-restore "$WORK/out-d.raw" -- bash -c '
    '"$S3"' cp --quiet --recursive s3://bench/chains/disk "$1/down/disk" &&
    "$2" restore "$1/down/disk" --to "$1/out-d.raw"' _ "$WORK" "$BARGE"
  cmp "$DISK" "$WORK/out-d.raw" > /dev/null || die "download-then-restore differs from the disk"
  rm -rf "$WORK/out-d.raw" "$WORK/down"

  # a cut at half the point, then the same backup again
  cp --sparse=always "$ORIG" "$DISK"
  warm_cache "$DISK"
  before=$(rgw_ops)
  "$BARGE" backup --source "$DISK" --source-format raw --target s3://bench/cut --name disk \
    > "$WORK/cut.log" 2>&1 &
  pid=$!
  got=0
  # The usage log flushes every second: the backup may end between a
  # check and the kill (then nothing was cut: CUT_AT says how much came).
  while kill -0 "$pid" 2>/dev/null; do
    now=$(rgw_ops)
    got=$(( $(cut -d' ' -f5 <<< "$now") - $(cut -d' ' -f5 <<< "$before") ))
    if [ "$got" -ge $(( POINT_BYTES / 2 )) ]; then kill -9 "$pid" 2>/dev/null || true; break; fi
  done
  wait "$pid" 2>/dev/null || true
  CUT_AT=$(ratio "$got" "$POINT_BYTES")
  # The killed run's lock object stays until it expires (2 minutes): the
  # next run is tried again while it says Busy (exit 4), as a user would;
  # what counts here is the bytes it sends, not its time.
  measure_ops barge-s3-after-cut "$POINT" -- bash -c '
    until "$1" backup --source "$2" --source-format raw --target s3://bench/cut --name disk; do
      [ $? -eq 4 ] || exit 1; sleep 5; done' _ "$BARGE" "$DISK"
done

print_results
echo
echo "== requests (radosgw usage log; last run)"
printf '%-24s %8s %8s %8s %14s %14s\n' step PUTs GETs other bytes_in bytes_out
for l in aws-cp-up aws-cp-down barge-s3-full restic-full barge-s3-incr-cbt barge-s3-incr-digests restic-incr \
         barge-s3-restore restic-restore download-then-restore barge-s3-after-cut; do
  printf '%-24s %8s %8s %8s %14s %14s\n' "$l" "$(ops_field $l 1)" "$(ops_field $l 2)" "$(ops_field $l 3)" \
    "$(ops_field $l 5)" "$(ops_field $l 4)"
done
gib() { awk -v b="$1" 'BEGIN { printf "%.3f", b / 1073741824 }'; }
per_gib() { awk -v n="$1" -v b="$2" 'BEGIN { if (b + 0 == 0) print "-"; else printf "%.1f", n / (b / 1073741824) }'; }
full_in=$(ops_field barge-s3-full 5)
restore_out=$(ops_field barge-s3-restore 4)
echo "barge: $(per_gib "$(ops_field barge-s3-full 1)" "$full_in") PUTs per GiB written; $(per_gib "$(ops_field barge-s3-restore 2)" "$restore_out") GETs per GiB read"
echo "a store of 2 MiB blocks: 512 PUTs per GiB written, 512 GETs per GiB read (one object per block)"

echo
echo "== ratios (medians)"
full=$(get barge-s3-full warm wall)
r_ceiling_up=$(ratio "$(get aws-cp-up warm wall)" "$full")
r_restic_full=$(ratio "$(get restic-full warm wall)" "$full")
staged=$(awk -v a="$(get local-full warm wall)" -v b="$(get aws-cp-up warm wall)" 'BEGIN { print a + b }')
r_staged=$(ratio "$staged" "$full")
r_restic_incr=$(ratio "$(get restic-incr warm wall)" "$(get barge-s3-incr-cbt warm wall)")
r_restic_incr_d=$(ratio "$(get restic-incr warm wall)" "$(get barge-s3-incr-digests warm wall)")
rest=$(get barge-s3-restore warm wall)
r_restic_rest=$(ratio "$(get restic-restore warm wall)" "$rest")
r_down=$(ratio "$(get download-then-restore warm wall)" "$rest")
r_ceiling_down=$(ratio "$(get aws-cp-down warm wall)" "$rest")
resent=$(ratio "$(ops_field barge-s3-after-cut 5)" "$POINT_BYTES")
printf '%-58s %6s  %s\n' \
  "aws s3 cp up of the point / barge full into the bucket" "$r_ceiling_up" "(the server's ceiling: >= 0.85)  $(verdict "$r_ceiling_up" ">=" 0.85)" \
  "restic full / barge full" "$r_restic_full" "(target >= 2)  $(verdict "$r_restic_full" ">=" 2)" \
  "folder backup + aws s3 cp / barge full" "$r_staged" "(target >= 1.3)  $(verdict "$r_staged" ">=" 1.3)" \
  "restic incremental / barge incremental (CBT ranges)" "$r_restic_incr" "(target >= 5)  $(verdict "$r_restic_incr" ">=" 5)" \
  "restic incremental / barge incremental (digests)" "$r_restic_incr_d" "(reported)" \
  "aws s3 cp down of the point / barge restore" "$r_ceiling_down" "(the server's ceiling: >= 0.85)  $(verdict "$r_ceiling_down" ">=" 0.85)" \
  "restic restore / barge restore" "$r_restic_rest" "(target >= 2)  $(verdict "$r_restic_rest" ">=" 2)" \
  "download + local restore / barge restore" "$r_down" "(target >= 1.3)  $(verdict "$r_down" ">=" 1.3)" \
  "bytes sent again after a cut at $CUT_AT of the point" "$resent" "(target <= 0.55)  $(verdict "$resent" "<=" 0.55)"
