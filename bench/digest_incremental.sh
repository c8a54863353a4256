#!/usr/bin/env bash
# Incrementals by digest (barge backup --incremental --changed-by digests)
# on a disk with no change tracking, against reading the disk once and
# against restic and borg backing up the same changed file. A generated
# disk gets a full backup (barge: plain and with its SHA-256 table, to show
# what keeping the table costs a full), then 1% of its clusters change, and
# each tool backs up the changed disk. Ratios next to the targets (issue
# 23): digest incremental <= 2x one read; >= 3x faster than restic and borg.
#
#   bench/digest_incremental.sh [--size 512M] [--seed 1] [--workdir /var/tmp]
#                               [--barge PATH] [--cache warm|cold|both]
#                               [--repeat 1]
# (issue 23's figures: --size 4G --cache warm)
source "$(dirname "$0")/lib.sh"

usage() { sed -n '2,12p' "$0"; }

SIZE=512M
CACHE=warm
parse_common_flags "$@"
need_tools restic borg qemu-io numfmt
make_workdir
print_machine
echo "restic:     $(restic version | head -1)"
echo "borg:       $(borg --version)"

DISK=$WORK/disk.raw
echo
echo "== disk"
"$BARGE" bench generate --size "$SIZE" --seed "$SEED" "$DISK"
SIZE_BYTES=$(stat -c %s "$DISK")
echo "allocated: $(du -B1 "$DISK" | cut -f1) bytes of $SIZE_BYTES"

# 1% of the 64 KiB clusters get new bytes (a fixed pattern per cluster and
# seed: deterministic; written through qemu-io like a guest would).
CLUSTERS=$((SIZE_BYTES / 65536))
CHANGED=$((CLUSTERS / 100))
change_disk() {
  local round=$1
  awk -v n="$CHANGED" -v total="$CLUSTERS" -v seed="$((SEED * 1000 + round))" 'BEGIN {
      srand(seed); got = 0
      while (got < n) { c = int(rand() * total); if (!(c in seen)) { seen[c] = 1; got++ } }
      for (c in seen) printf "-c\nwrite -P %d %d 65536\n", 1 + (c + seed) % 250, c * 65536 }' > "$WORK/ops"
  local args=()
  while IFS= read -r line; do args+=("$line"); done < "$WORK/ops"
  qemu-io -f raw "${args[@]}" "$DISK" > /dev/null
}

export RESTIC_PASSWORD=bench RESTIC_CACHE_DIR=$WORK/restic-cache BORG_BASE_DIR=$WORK/borg-base
export BORG_UNKNOWN_UNENCRYPTED_REPO_ACCESS_IS_OK=yes BORG_RELOCATED_REPO_ACCESS_IS_OK=yes

echo
echo "== runs ($CHANGED of $CLUSTERS clusters change per round)"
for mode in $(cache_modes); do
for run in $(runs); do
  rm -rf "$WORK"/b-plain "$WORK"/b-dig "$WORK"/restic "$WORK"/borg "$RESTIC_CACHE_DIR" "$BORG_BASE_DIR"
  restic init --repo "$WORK/restic" > /dev/null
  borg init -e none "$WORK/borg" > /dev/null
  # Fulls (first backups), for reference.
  prepare_cache "$mode" "$DISK"; echo " [$CACHE_HOW, run $run of $REPEAT]"
  measure barge-full "$mode" "$WORK/b-plain" -- \
    "$BARGE" backup --source "$DISK" --source-format raw --target "$WORK/b-plain" --name disk
  prepare_cache "$mode" "$DISK"
  measure barge-full+sha256 "$mode" "$WORK/b-dig" -- \
    "$BARGE" backup --source "$DISK" --source-format raw --target "$WORK/b-dig" --name disk --changed-by digests
  prepare_cache "$mode" "$DISK"
  measure_written restic-first "$mode" "$WORK/restic" -- \
    restic backup --repo "$WORK/restic" --compression auto "$DISK"
  prepare_cache "$mode" "$DISK"
  measure_written borg-first "$mode" "$WORK/borg" -- \
    borg create -C zstd,3 "$WORK/borg::first" "$DISK"

  change_disk "$run"
  prepare_cache "$mode" "$DISK"
  measure read-once "$mode" "" -- bash -c 'cat "$1" > /dev/null' _ "$DISK"
  prepare_cache "$mode" "$DISK"
  measure_written barge-digest-incremental "$mode" "$WORK/b-dig" -- \
    "$BARGE" backup --source "$DISK" --source-format raw --target "$WORK/b-dig" --name disk \
    --incremental --changed-by digests
  prepare_cache "$mode" "$DISK"
  measure_written restic-changed "$mode" "$WORK/restic" -- \
    restic backup --repo "$WORK/restic" --compression auto "$DISK"
  prepare_cache "$mode" "$DISK"
  measure_written borg-changed "$mode" "$WORK/borg" -- \
    borg create -C zstd,3 "$WORK/borg::changed" "$DISK"
  # The chain reads back as the changed disk (qemu-img is the oracle).
  last=$(ls "$WORK/b-dig/disk/"*.qcow2 | sort | tail -1)
  qemu-img compare -q -f qcow2 -F raw "$last" "$DISK" || die "the digest incremental does not read as the disk"
done
done

print_results
echo
echo "== ratios and targets (issue 23)"
for mode in $(cache_modes); do
  inc=$(get barge-digest-incremental "$mode" wall)
  r_read=$(ratio "$inc" "$(get read-once "$mode" wall)")
  r_restic=$(ratio "$(get restic-changed "$mode" wall)" "$inc")
  r_borg=$(ratio "$(get borg-changed "$mode" wall)" "$inc")
  r_full=$(ratio "$(get barge-full+sha256 "$mode" wall)" "$(get barge-full "$mode" wall)")
  r_full_cpu=$(ratio "$(get barge-full+sha256 "$mode" cpu)" "$(get barge-full "$mode" cpu)")
  printf '%-6s digest incremental / read once       %6s  (target <= 2)   %s\n' "$mode" "$r_read" "$(verdict "$r_read" "<=" 2)"
  printf '%-6s restic changed / digest incremental  %6s  (target >= 3)   %s\n' "$mode" "$r_restic" "$(verdict "$r_restic" ">=" 3)"
  printf '%-6s borg changed / digest incremental    %6s  (target >= 3)   %s\n' "$mode" "$r_borg" "$(verdict "$r_borg" ">=" 3)"
  printf '%-6s full with SHA-256 table / plain full %6s wall, %s cpu (why the table is kept only by digest chains)\n' \
    "$mode" "$r_full" "$r_full_cpu"
done
