#!/usr/bin/env bash
# Ten clones of one base disk, 3% of each one's clusters changed, backed up
# with `barge backup --base` against `restic backup --compression auto` and
# `borg create -C zstd,3` of the same ten files (each tool has the base
# stored first, untimed): wall time, CPU, peak RSS, bytes stored, and the
# targets of issue 23 (stored <= base + 1.2x changed data; >= 3x faster
# than each peer; storage within 1.1x of theirs). Exits non-zero only when
# something fails to run; missed targets are reported, not fatal.
#
#   bench/shared_base.sh [--size 256M] [--seed 1] [--workdir /var/tmp]
#                        [--barge PATH] [--cache warm|cold|both] [--repeat 1]
#                        [--clones 10] [--changed-percent 3]
#   (the issue's numbers: --size 4G; needs about 12x SIZE of free space)
source "$(dirname "$0")/lib.sh"

usage() { sed -n '2,13p' "$0"; }

SIZE=256M
CACHE=warm
CLONES=10
PERCENT=3
args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --clones) CLONES=$2; shift 2 ;;
    --changed-percent) PERCENT=$2; shift 2 ;;
    *) args+=("$1"); shift ;;
  esac
done
parse_common_flags "${args[@]+"${args[@]}"}"
[[ "$CLONES" =~ ^[1-9][0-9]*$ ]] || die "--clones must be a whole number >= 1"
[[ "$PERCENT" =~ ^[0-9]+$ ]] && [ "$PERCENT" -le 100 ] || die "--changed-percent must be 0..100"
need_tools qemu-img numfmt python3 restic borg
make_workdir
print_machine
echo "restic:     $(restic version | head -1)"
echo "borg:       $(borg --version)"
echo "clones:     $CLONES, $PERCENT% of the clusters (64 KiB) of each changed"

BASE=$WORK/base.raw
echo
echo "== disks"
"$BARGE" bench generate --size "$SIZE" --seed "$SEED" "$BASE"
echo "base allocated: $(du -B1 "$BASE" | cut -f1) bytes of $(stat -c %s "$BASE")"
# Each clone: a sparse copy of the base with PERCENT% of its clusters
# overwritten by random bytes (distinct clusters, seed per clone). The
# changed bytes are what an ideal deduplicating store must add.
CHANGED=$(python3 - "$BASE" "$WORK" "$CLONES" "$PERCENT" "$SEED" <<'EOF'
import os, random, shutil, subprocess, sys
base, work, clones, percent, seed = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
cluster = 64 << 10
size = os.path.getsize(base)
n = size // cluster
total = 0
for i in range(clones):
    path = os.path.join(work, "clone%02d.raw" % i)
    subprocess.run(["cp", "--sparse=always", base, path], check=True)
    rng = random.Random(seed * 1000 + i)
    picks = rng.sample(range(n), n * percent // 100)
    with open(path, "r+b") as f:
        for c in sorted(picks):
            f.seek(c * cluster)
            f.write(rng.randbytes(cluster))
    total += len(picks) * cluster
print(total)
EOF
)
echo "changed data: $CHANGED bytes over $CLONES clones"
CLONE_FILES=("$WORK"/clone*.raw)

export RESTIC_PASSWORD=bench
export BORG_PASSPHRASE="" BORG_UNKNOWN_UNENCRYPTED_REPO_ACCESS_IS_OK=yes BORG_RELOCATED_REPO_ACCESS_IS_OK=yes

echo
echo "== runs"
for mode in $(cache_modes); do
for run in $(runs); do
  rm -rf "$WORK"/bk "$WORK"/restic "$WORK"/borg
  # The base, stored first by each tool (not timed).
  "$BARGE" backup --source "$BASE" --source-format raw --target "$WORK/bk" --name golden > "$WORK/base-barge.log"
  BASE_BARGE=$(dir_bytes "$WORK/bk")
  restic init --repo "$WORK/restic" > /dev/null
  (cd "$WORK" && restic -r "$WORK/restic" backup --compression auto base.raw > "$WORK/base-restic.log")
  BASE_RESTIC=$(dir_bytes "$WORK/restic")
  borg init -e none "$WORK/borg" > /dev/null
  (cd "$WORK" && borg create -C zstd,3 "$WORK/borg::base" base.raw)
  BASE_BORG=$(dir_bytes "$WORK/borg")

  prepare_cache "$mode" "${CLONE_FILES[@]}"; echo " [$CACHE_HOW, run $run of $REPEAT]"
  measure_written barge-base-clones "$mode" "$WORK/bk" -- bash -c '
    for f in "${@:2}"; do
      n=$(basename "$f" .raw)
      "$1" backup --source "$f" --source-format raw --target "'"$WORK"'/bk" --name "$n" --base golden || exit 1
    done' _ "$BARGE" "${CLONE_FILES[@]}"
  prepare_cache "$mode" "${CLONE_FILES[@]}"
  measure_written restic-clones "$mode" "$WORK/restic" -- \
    bash -c 'cd "$1" && shift && restic -r "$PWD/restic" backup --compression auto "$@"' _ "$WORK" \
    "${CLONE_FILES[@]##*/}"
  prepare_cache "$mode" "${CLONE_FILES[@]}"
  measure_written borg-clones "$mode" "$WORK/borg" -- \
    bash -c 'cd "$1" && shift && borg create -C zstd,3 "$PWD/borg::clones" "$@"' _ "$WORK" "${CLONE_FILES[@]##*/}"
  # Every clone reads back identical through its base, by qemu-img alone.
  for f in "${CLONE_FILES[@]}"; do
    n=$(basename "$f" .raw)
    qemu-img compare -q -f raw "$f" "$WORK"/bk/"$n"/*.qcow2 || die "$n: barge's point differs from the clone"
  done
done
done

print_results
echo
echo "== targets"
echo "base stored: barge $BASE_BARGE, restic $BASE_RESTIC, borg $BASE_BORG bytes"
for mode in $(cache_modes); do
  b_wall=$(get barge-base-clones "$mode" wall)
  b_bytes=$(get barge-base-clones "$mode" bytes)
  limit=$(awk -v c="$CHANGED" 'BEGIN { printf "%.0f", 1.2 * c }')
  echo "[$mode] barge clones stored $b_bytes bytes over its base; changed data $CHANGED;" \
    "ratio $(ratio "$b_bytes" "$CHANGED") (target <= 1.20: $(verdict "$(ratio "$b_bytes" "$CHANGED")" '<=' 1.2))"
  echo "[$mode] total barge $((BASE_BARGE + b_bytes)) <= base + 1.2x changed $((BASE_BARGE + limit)):" \
    "$(verdict "$((BASE_BARGE + b_bytes))" '<=' "$((BASE_BARGE + limit))")"
  for peer in restic borg; do
    p_wall=$(get "$peer-clones" "$mode" wall)
    p_bytes=$(get "$peer-clones" "$mode" bytes)
    base_var=BASE_${peer^^}
    p_total=$(( ${!base_var} + p_bytes ))
    speed=$(ratio "$p_wall" "$b_wall")
    store=$(ratio "$((BASE_BARGE + b_bytes))" "$p_total")
    echo "[$mode] vs $peer: ${speed}x faster (target >= 3: $(verdict "$speed" '>=' 3));" \
      "storage barge/$peer $store (total $((BASE_BARGE + b_bytes)) vs $p_total; target <= 1.10: $(verdict "$store" '<=' 1.1))"
  done
done
