#!/usr/bin/env bash
# The reliability campaign (issue 13, docs/reliability.md): for every command
# that writes, power loss at every durability boundary, EIO/ENOSPC (and,
# past --quick, EDQUOT/EROFS) injected once at every filesystem call site,
# kill -9 of real processes at random moments, a real full tmpfs, and two
# image catalog writers at once. Prints one figure per command and campaign
# and a table per command; exits non-zero on any loss, damage or unclear error.
#
#   scripts/reliability.sh [--quick | --long] [--kills N] [--seed S]
#                          [--only REGEX] [--report FILE] [--build DIR]
#
#   --quick      the ctest size (3 sites per kind and errno, 2 kills, one fill)
#   (default)    every call site, EIO and ENOSPC plus EDQUOT/EROFS, 12 kills
#   --long       as the default over 3 data seeds, 40 kills per command
#   --kills N    kills per command (and per catalog pair)
#   --seed S     the seed of data, kill delays and sampled sites (default 1)
#   --only RE    only the commands whose test name matches (gtest filter
#                pattern, e.g. 'backup_full' or 'merge:*restore*')
#   --report F   also write each figure as a JSON line to F
# The full-filesystem campaign mounts tmpfs (root only); without root it is
# skipped with a message. Data stays small (4-48 MiB per command) and goes
# to $TMPDIR (default /var/tmp); it is removed afterwards.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build="$root/build"
level=default
seed=1
kills=""
only=""
report=""
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) level=quick ;;
    --long) level=long ;;
    --kills) kills="$2"; shift ;;
    --seed) seed="$2"; shift ;;
    --only) only="$2"; shift ;;
    --report) report="$2"; shift ;;
    --build) build="$2"; shift ;;
    -h|--help) sed -n '2,22p' "$0"; exit 0 ;;
    *) echo "reliability.sh: unknown option $1" >&2; exit 64 ;;
  esac
  shift
done
bin="$build/tests/reliability/reliability_test"
if [ ! -x "$bin" ]; then
  echo "reliability.sh: $bin missing; build first (cmake --build $build)" >&2
  exit 1
fi
filter="*"
if [ -n "$only" ]; then
  filter=""
  IFS=':' read -ra parts <<<"$only"
  for p in "${parts[@]}"; do filter="$filter${filter:+:}*/$p:*$p*"; done
fi
export BARGE_RELIABILITY_LEVEL="$level" BARGE_RELIABILITY_SEED="$seed"
[ -n "$kills" ] && export BARGE_RELIABILITY_KILLS="$kills"
[ -n "$report" ] && export BARGE_RELIABILITY_REPORT="$report"
echo "== reliability campaign: level $level, seed $seed${kills:+, $kills kills}${only:+, only $only}"
log=$(mktemp "${TMPDIR:-/tmp}/barge-reliability-XXXXXX.log")
start=$(date +%s)
set +e
"$bin" --gtest_filter="$filter" >"$log" 2>&1
status=$?
set -e
# Each figure as it was reported, failures and skips, then the table.
grep -E '^\[ figure|^\[  FAILED|^\[  SKIPPED|^\[ +OK|SKIPPED|Failure$' "$log" || true
sed -n '/^command /,$p' "$log"
echo "== $(( $(date +%s) - start )) s; full log: $log"
exit "$status"
