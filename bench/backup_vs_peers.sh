#!/usr/bin/env bash
# barge backup / convert against qemu-img and nbdcopy on the same generated
# disk (barge bench generate): wall time, CPU time, peak RSS, output size,
# and the ratios next to the project's targets. Exits non-zero only when
# something fails to run; missed targets are reported, not fatal.
#
#   bench/backup_vs_peers.sh [--size 2G] [--seed 1] [--workdir /var/tmp]
#                            [--barge PATH] [--cache cold|warm|both]
#                            [--repeat 1]   (N runs each, tools in turn; medians)
source "$(dirname "$0")/lib.sh"

usage() { sed -n '2,9p' "$0"; }

parse_common_flags "$@"
need_tools qemu-img nbdcopy numfmt
make_workdir
print_machine

DISK=$WORK/disk.raw
echo
echo "== disk"
"$BARGE" bench generate --size "$SIZE" --seed "$SEED" "$DISK"
echo "allocated: $(du -B1 "$DISK" | cut -f1) bytes of $(stat -c %s "$DISK")"

echo
echo "== runs"
for mode in $(cache_modes); do
for run in $(runs); do
  rm -rf "$WORK"/out*
  prepare_cache "$mode" "$DISK"; echo " [$CACHE_HOW, run $run of $REPEAT]"
  # barge's default level (zstd:1), then qemu's level (3) for like with like.
  measure barge-backup-zstd "$mode" "$WORK/out-bb" -- \
    "$BARGE" backup --source "$DISK" --source-format raw --target "$WORK/out-bb" --name disk
  rm -rf "$WORK"/out*
  prepare_cache "$mode" "$DISK"
  measure barge-backup-zstd:3 "$mode" "$WORK/out-bb" -- \
    "$BARGE" backup --source "$DISK" --source-format raw --target "$WORK/out-bb" --name disk --compress zstd:3
  rm -rf "$WORK"/out*
  # The default before issue 24 (docs/benchmarks.md, "compression level").
  prepare_cache "$mode" "$DISK"
  measure barge-backup-zstd:2 "$mode" "$WORK/out-bb" -- \
    "$BARGE" backup --source "$DISK" --source-format raw --target "$WORK/out-bb" --name disk --compress zstd:2
  rm -rf "$WORK"/out*
  prepare_cache "$mode" "$DISK"
  measure qemu-img-convert-zstd "$mode" "$WORK/out-q.qcow2" -- \
    qemu-img convert -f raw -O qcow2 -c -o compression_type=zstd -W -m 16 "$DISK" "$WORK/out-q.qcow2"
  rm -rf "$WORK"/out*

  prepare_cache "$mode" "$DISK"
  measure barge-convert-raw "$mode" "$WORK/out-b.raw" -- \
    "$BARGE" convert -f raw --compress none -O raw "$DISK" "$WORK/out-b.raw"
  rm -f "$WORK"/out*
  # Without the final fsync, like nbdcopy and qemu-img convert.
  prepare_cache "$mode" "$DISK"
  measure barge-convert-raw-nosync "$mode" "$WORK/out-b.raw" -- \
    "$BARGE" convert -f raw --compress none -O raw --no-sync "$DISK" "$WORK/out-b.raw"
  rm -f "$WORK"/out*
  prepare_cache "$mode" "$DISK"
  measure nbdcopy-raw "$mode" "$WORK/out-n.raw" -- \
    nbdcopy "$DISK" "$WORK/out-n.raw"
  rm -f "$WORK"/out*
  # The same copy made durable, as barge's is (nbdcopy does not flush).
  prepare_cache "$mode" "$DISK"
  measure nbdcopy-raw+sync "$mode" "$WORK/out-n.raw" -- \
    bash -c 'nbdcopy "$1" "$2" && sync "$2"' _ "$DISK" "$WORK/out-n.raw"
  rm -f "$WORK"/out*
  prepare_cache "$mode" "$DISK"
  measure qemu-img-convert-raw "$mode" "$WORK/out-qr.raw" -- \
    qemu-img convert -f raw -O raw -W -m 16 "$DISK" "$WORK/out-qr.raw"
  rm -f "$WORK"/out*
done
done

print_results

echo
echo "== ratios and targets"
for mode in $(cache_modes); do
  bw=$(get barge-backup-zstd "$mode" wall); qw=$(get qemu-img-convert-zstd "$mode" wall)
  bs=$(get barge-backup-zstd "$mode" bytes); qs=$(get qemu-img-convert-zstd "$mode" bytes)
  speed=$(ratio "$qw" "$bw"); size=$(ratio "$bs" "$qs")
  speed3=$(ratio "$qw" "$(get barge-backup-zstd:3 "$mode" wall)")
  size3=$(ratio "$(get barge-backup-zstd:3 "$mode" bytes)" "$qs")
  speed2=$(ratio "$qw" "$(get barge-backup-zstd:2 "$mode" wall)")
  size2=$(ratio "$(get barge-backup-zstd:2 "$mode" bytes)" "$qs")
  cw=$(get barge-convert-raw "$mode" wall); nw=$(get nbdcopy-raw "$mode" wall); rw=$(get qemu-img-convert-raw "$mode" wall)
  cn=$(get barge-convert-raw-nosync "$mode" wall)
  vs_nbd=$(ratio "$nw" "$cn"); vs_q=$(ratio "$rw" "$cn")
  vs_nbd_sync=$(ratio "$(get nbdcopy-raw+sync "$mode" wall)" "$cw")
  echo "[$mode]"
  echo "  compressed backup: barge ${speed}x faster than qemu-img -c zstd   (target >= 1.5x: $(verdict "$speed" '>=' 1.5); issue 24 >= 3x: $(verdict "$speed" '>=' 3))"
  echo "  compressed size:   barge/qemu-img = ${size}                       (target <= 1.05: $(verdict "$size" '<=' 1.05))"
  echo "  same level as qemu: barge --compress zstd:3 ${speed3}x faster, size ${size3}"
  echo "  former default:    barge --compress zstd:2 ${speed2}x faster, size ${size2}"
  echo "  raw copy:          barge --no-sync ${vs_nbd}x nbdcopy's speed      (target >= 1.0: $(verdict "$vs_nbd" '>=' 1.0)); neither fsyncs"
  echo "  raw copy:          barge --no-sync ${vs_q}x qemu-img convert's speed"
  echo "  raw copy, durable: barge (fsync, the default) ${vs_nbd_sync}x the speed of nbdcopy + sync;" \
       "vs plain nbdcopy $(ratio "$nw" "$cw")x"
  echo "  cpu seconds:       barge backup $(get barge-backup-zstd "$mode" cpu), qemu-img $(get qemu-img-convert-zstd "$mode" cpu);" \
       "barge convert $(get barge-convert-raw "$mode" cpu), nbdcopy $(get nbdcopy-raw "$mode" cpu)"
done
echo "  end-to-end vs slowest stage: see 'barge bench' (target >= 0.8)"
