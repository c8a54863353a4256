#!/usr/bin/env bash
# Encryption at rest's cost (issue 40 §2): a generated disk backed up into a
# real Ceph radosgw on 127.0.0.1 (bench/radosgw.sh) and restored from it,
# plain and with --encryption-key-file, the two taking turns each run:
#   full      barge backup --target s3://  encrypted / plain  (target <= 1.10)
#   restore   barge restore s3://...      encrypted / plain  (target <= 1.10)
# Every restore is compared with the disk (cmp).
#
#   bench/s3_crypt.sh [--size 256M] [--seed 1] [--workdir /var/tmp]
#                     [--barge PATH] [--repeat 3]
#
# Needs radosgw, ceph-mon, ceph-osd, ceph-common, awscli, qemu-img. Stops
# every daemon by PID and deletes its data on every exit path.
CACHE=warm
SIZE=${SIZE:-256M}
REPEAT=${REPEAT:-3}
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/radosgw.sh"

usage() { sed -n '2,13p' "$0"; }

parse_common_flags "$@"
need_tools radosgw ceph-mon ceph-osd ceph radosgw-admin aws qemu-img numfmt
make_workdir
trap 'rgw_stop; rm -rf "$WORK"' EXIT
print_machine

DISK_BYTES=$(numfmt --from=iec "$SIZE")
rgw_start "$(( DISK_BYTES * 4 > 4 * 1024 * 1024 * 1024 ? DISK_BYTES * 4 : 4 * 1024 * 1024 * 1024 ))"
export "${RGW_ENV[@]}"
export AWS_ENDPOINT_URL=$RGW_URL
S3="aws --endpoint-url $RGW_URL s3"
$S3 mb s3://bench > /dev/null

KEY=$WORK/key
head -c 32 /dev/urandom > "$KEY"
chmod 600 "$KEY"

echo
echo "== disk: $SIZE generated (seed $SEED)"
DISK=$WORK/disk.raw
"$BARGE" bench generate --size "$SIZE" --seed "$SEED" "$DISK"
warm_cache "$DISK"

for run in $(runs); do
  echo " [run $run of $REPEAT]"
  $S3 rm --recursive --quiet s3://bench/ > /dev/null || true
  for mode in plain crypt; do
    flags=()
    [ "$mode" = crypt ] && flags=(--encryption-key-file "$KEY")
    measure "$mode-full" warm "$DISK" -- \
      "$BARGE" backup --source "$DISK" --source-format raw --target "s3://bench/$mode" --name disk "${flags[@]}"
    measure "$mode-restore" warm "$WORK/out.raw" -- \
      "$BARGE" restore "s3://bench/$mode/disk" --to "$WORK/out.raw" "${flags[@]}"
    cmp "$DISK" "$WORK/out.raw" > /dev/null || die "$mode restore differs from the disk"
    rm -f "$WORK/out.raw"
  done
done

print_results
echo
echo "== ratios (medians)"
r_full=$(ratio "$(get crypt-full warm wall)" "$(get plain-full warm wall)")
r_rest=$(ratio "$(get crypt-restore warm wall)" "$(get plain-restore warm wall)")
printf '%-44s %6s  %s\n' \
  "encrypted full / plain full (wall)" "$r_full" "(target <= 1.10)  $(verdict "$r_full" "<=" 1.10)" \
  "encrypted restore / plain restore (wall)" "$r_rest" "(target <= 1.10)  $(verdict "$r_rest" "<=" 1.10)" \
  "encrypted full / plain full (cpu)" "$(ratio "$(get crypt-full warm cpu)" "$(get plain-full warm cpu)")" "(reported)" \
  "encrypted restore / plain restore (cpu)" "$(ratio "$(get crypt-restore warm cpu)" "$(get plain-restore warm cpu)")" "(reported)"
