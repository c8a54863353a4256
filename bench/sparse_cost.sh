#!/usr/bin/env bash
# Cost of a thin disk (issue 24): a sparse raw disk of --virtual bytes holding
# --data bytes (four runs of random bytes at spread offsets) against a disk
# of --data bytes holding the same runs back to back. Each command (full
# backup, a 1 MiB incremental from an extents file, an incremental by
# digests, verify, restore to raw and to qcow2, a merge of the full and the
# first incremental) runs on both; the ratio
# big/small should be <= 1.2. The full backup is also compared with
# `qemu-img convert -c -O qcow2 -o compression_type=zstd -W -m 16` of the
# big disk (target: barge <= qemu-img).
#
#   bench/sparse_cost.sh [--virtual 16T] [--data 1G] [--seed 1]
#                        [--workdir /var/tmp] [--barge PATH] [--repeat 1]
source "$(dirname "$0")/lib.sh"

usage() { sed -n '2,12p' "$0"; }

VIRTUAL=16T
DATA=1G
args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --virtual) VIRTUAL=$2; shift 2 ;;
    --data) DATA=$2; shift 2 ;;
    *) args+=("$1"); shift ;;
  esac
done
CACHE=warm
parse_common_flags "${args[@]+"${args[@]}"}"
need_tools qemu-img numfmt python3
make_workdir
print_machine
VIRTUAL_BYTES=$(numfmt --from=iec "$VIRTUAL")
DATA_BYTES=$(numfmt --from=iec "$DATA")
BIG=$WORK/big.raw SMALL=$WORK/small.raw
# ext4 refuses a file of exactly 16 TiB ("File too large"): 64 MiB less.
if ! truncate -s "$VIRTUAL_BYTES" "$BIG" 2>/dev/null; then
  VIRTUAL_BYTES=$((VIRTUAL_BYTES - 64 * 1048576))
  truncate -s "$VIRTUAL_BYTES" "$BIG" || die "cannot make a sparse file of $VIRTUAL here"
  VIRTUAL="$VIRTUAL - 64M (the filesystem refuses $VIRTUAL)"
fi
echo "virtual:    $VIRTUAL ($VIRTUAL_BYTES bytes), data $DATA"

RUN=$((DATA_BYTES / 4))
[ $((RUN % 1048576)) -eq 0 ] || die "--data must be a multiple of 4 MiB"
truncate -s "$DATA_BYTES" "$SMALL"
# Run i of the data lies at i/4 of the big disk and at i*RUN of the small.
for i in 0 1 2 3; do
  head -c "$RUN" /dev/urandom > "$WORK/run"
  dd if="$WORK/run" of="$BIG" bs=1M seek=$(( (VIRTUAL_BYTES / 4 * i + 1048576) / 1048576 )) conv=notrunc status=none
  dd if="$WORK/run" of="$SMALL" bs=1M seek=$((RUN * i / 1048576)) conv=notrunc status=none
done
rm -f "$WORK/run"
echo "allocated:  big $(du -B1 "$BIG" | cut -f1), small $(du -B1 "$SMALL" | cut -f1) bytes"

# warm_data FILE...: reads only the allocated extents of each file into the
# page cache (lib.sh's warm_cache reads every byte, and the kernel zero-fills
# holes at a few hundred MB/s: 16 TiB would take hours, where no command
# measured here reads a hole).
warm_data() {
  python3 - "$@" <<'PY'
import os, sys
for path in sys.argv[1:]:
    fd = os.open(path, os.O_RDONLY)
    size, pos = os.fstat(fd).st_size, 0
    while pos < size:
        try:
            data = os.lseek(fd, pos, os.SEEK_DATA)
        except OSError:
            break
        end = os.lseek(fd, data, os.SEEK_HOLE)
        while data < end:
            n = len(os.pread(fd, min(1 << 24, end - data), data))
            if n == 0:
                break
            data += n
        pos = end
    os.close(fd)
PY
  CACHE_HOW="warm"
}

# change DISK OFFSET OUT.json: 1 MiB of new bytes at OFFSET, as an extents file.
change() {
  dd if=/dev/urandom of="$1" bs=1M count=1 seek=$(($2 / 1048576)) conv=notrunc status=none
  printf '{"format":"barge-extents","version":1,"virtual_size":%s,"extents":[{"offset":%s,"length":1048576}]}\n' \
    "$(stat -c %s "$1")" "$2" > "$3"
}

echo
echo "== runs"
for run in $(runs); do
  for d in small big; do
    disk=$WORK/$d.raw
    rm -rf "$WORK/t-$d" "$WORK/r-$d.raw" "$WORK/r-$d.qcow2" "$WORK/q-$d.qcow2"
    warm_data "$disk"
    measure "$d backup" warm "$WORK/t-$d" -- "$BARGE" backup --source "$disk" --source-format raw \
      --target "$WORK/t-$d" --name disk --changed-by digests
    change "$disk" $((RUN / 2 + 1048576)) "$WORK/x-$d.json"
    measure_written "$d incr-extents" warm "$WORK/t-$d" -- "$BARGE" backup --source "$disk" --source-format raw \
      --target "$WORK/t-$d" --name disk --incremental --dirty-extents "$WORK/x-$d.json"
    change "$disk" $((RUN / 2 + 4 * 1048576)) "$WORK/x-$d.json"
    measure_written "$d incr-digests" warm "$WORK/t-$d" -- "$BARGE" backup --source "$disk" --source-format raw \
      --target "$WORK/t-$d" --name disk --incremental --changed-by digests
    measure "$d verify" warm "$WORK/t-$d" -- "$BARGE" verify "$WORK/t-$d/disk"
    measure "$d restore-raw" warm "$WORK/r-$d.raw" -- "$BARGE" restore "$WORK/t-$d/disk" --to "$WORK/r-$d.raw"
    rm -f "$WORK/r-$d.raw"
    measure "$d restore-qcow2" warm "$WORK/r-$d.qcow2" -- "$BARGE" restore "$WORK/t-$d/disk" \
      --to "$WORK/r-$d.qcow2" -O qcow2
    rm -f "$WORK/r-$d.qcow2"
    measure "$d merge" warm "$WORK/t-$d" -- "$BARGE" merge "$WORK/t-$d/disk" --through 1
  done
  measure "qemu-img convert big" warm "$WORK/q-big.qcow2" -- qemu-img convert -c -O qcow2 \
    -o compression_type=zstd -W -m 16 -f raw "$BIG" "$WORK/q-big.qcow2"
  rm -f "$WORK/q-big.qcow2"
  rm -rf "$WORK/t-small" "$WORK/t-big"
done

print_results
echo
echo "== ratios (big / small wall; target <= 1.2)"
for c in backup incr-extents incr-digests verify restore-raw restore-qcow2 merge; do
  r=$(ratio "$(get "big $c" warm wall)" "$(get "small $c" warm wall)")
  printf '  %-16s %6s  %s\n' "$c" "$r" "$(verdict "$r" "<=" 1.2)"
done
r=$(ratio "$(get "big backup" warm wall)" "$(get "qemu-img convert big" warm wall)")
printf '  %-16s %6s  %s\n' "backup/qemu-img" "$r" "$(verdict "$r" "<=" 1.0)"
