#!/usr/bin/env bash
# A fuzzing campaign of a chosen length: each target in turn (one at a time)
# runs for --seconds on a scratch copy of fuzz/corpus/<target>/, then the
# new inputs are merged back (-set_cover_merge=1: a near-minimal set of
# inputs with the same coverage) and the committed corpus is kept under --corpus-cap bytes
# (default 384 KiB) and --max-inputs files (default 1000); seed_* and
# regress_* inputs always stay. Prints executions, coverage (libFuzzer's cov
# and ft) and crashes per target; crash inputs are kept in the work folder
# and make the script exit 1.
#   scripts/fuzz_campaign.sh --seconds N [--targets a,b,...] [--build DIR]
#                            [--corpus-cap BYTES] [--max-inputs N] [--no-merge] [--work DIR]
# Needs the fuzz build: CC=clang CXX=clang++ cmake -S . -B build-fuzz -G Ninja
#   -DCMAKE_BUILD_TYPE=Debug -DBARGE_SANITIZE=ON -DBARGE_FUZZ=ON -DBARGE_BENCH=OFF
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
seconds=""
targets=""
build="$root/build-fuzz"
cap=$((384 * 1024))
max_inputs=1000
merge=1
work=""
usage() { sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
while (($#)); do
  case "$1" in
    --seconds) seconds=$2; shift 2 ;;
    --targets) targets=$2; shift 2 ;;
    --build) build=$2; shift 2 ;;
    --corpus-cap) cap=$2; shift 2 ;;
    --max-inputs) max_inputs=$2; shift 2 ;;
    --no-merge) merge=0; shift ;;
    --work) work=$2; shift 2 ;;
    -h|--help) usage ;;
    *) echo "fuzz_campaign: unknown argument $1" >&2; usage ;;
  esac
done
[[ "$seconds" =~ ^[0-9]+$ ]] || usage
if [ -z "$targets" ]; then
  targets=$(cd "$root/fuzz" && ls ./*_fuzzer.cc | sed 's|^\./||; s|\.cc$||' | paste -sd, -)
fi
if [ -z "$work" ]; then work=$(mktemp -d /var/tmp/barge-campaign-XXXXXX); fi
mkdir -p "$work"
echo "fuzz_campaign: ${seconds}s per target, work folder $work" >&2

export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
flags=(-timeout=10 -rss_limit_mb=2048 -max_len=1048576 -print_final_stats=1)
failed=0
rows=()
IFS=, read -ra list <<<"$targets"
for name in "${list[@]}"; do
  bin="$build/fuzz/$name"
  [ -x "$bin" ] || { echo "fuzz_campaign: $name is not built in $build" >&2; exit 1; }
  corpus="$root/fuzz/corpus/$name"
  mkdir -p "$corpus"
  scratch="$work/$name"
  mkdir -p "$scratch/corpus" "$scratch/crashes"
  cp -r "$corpus/." "$scratch/corpus/"
  echo "fuzz_campaign: $name for ${seconds}s" >&2
  rc=0
  (cd "$scratch" && "$bin" "${flags[@]}" -max_total_time="$seconds" \
      -artifact_prefix="$scratch/crashes/" "$scratch/corpus" >"$scratch/fuzz.log" 2>&1) || rc=$?
  execs=$(grep -E '^stat::number_of_executed_units' "$scratch/fuzz.log" | awk '{print $2}' | tail -1)
  last=$(grep -E '^#[0-9]+' "$scratch/fuzz.log" | tail -1)
  cov=$(sed -n 's/.* cov: \([0-9]*\).*/\1/p' <<<"$last")
  ft=$(sed -n 's/.* ft: \([0-9]*\).*/\1/p' <<<"$last")
  crashes=$(find "$scratch/crashes" -type f | wc -l)
  if [ "$rc" -ne 0 ] || [ "$crashes" -ne 0 ]; then
    failed=1
    echo "fuzz_campaign: $name FAILED (exit $rc); log $scratch/fuzz.log, inputs in $scratch/crashes" >&2
    grep -E 'ERROR|SUMMARY|Test unit written' "$scratch/fuzz.log" | head -5 >&2 || true
  fi
  if [ "$merge" -eq 1 ] && [ "$rc" -eq 0 ]; then
    # Minimize into a fresh folder: a greedy set cover of everything
    # (committed and new) with the same features.
    fresh="$scratch/merged"
    rm -rf "$fresh"
    mkdir -p "$fresh"
    (cd "$scratch" && "$bin" -set_cover_merge=1 "${flags[@]}" "$fresh" "$corpus" "$scratch/corpus" \
        >"$scratch/merge.log" 2>&1) || { echo "fuzz_campaign: merge of $name failed" >&2; tail -5 "$scratch/merge.log" >&2; failed=1; }
    # seed_* and regress_* keep their names; then new inputs, smallest
    # first, while the folder stays under the cap.
    keep="$scratch/keep"
    rm -rf "$keep"
    mkdir -p "$keep"
    cp "$corpus"/seed_* "$corpus"/regress_* "$keep/" 2>/dev/null || true
    total=$(find "$keep" -type f -printf '%s\n' | awk '{s += $1} END {print s + 0}')
    # Merged inputs are named by the SHA-1 of their bytes: skip the named
    # ones already kept.
    kept_sums=" $( (cd "$keep" && sha1sum -- * 2>/dev/null || true) | awk '{print $1}' | paste -sd' ' -) "
    dropped=0
    count=$(find "$keep" -type f | wc -l)
    while read -r size file; do
      base=$(basename "$file")
      [[ "$kept_sums" == *" $base "* ]] && continue
      if [ $((total + size)) -gt "$cap" ] || [ "$count" -ge "$max_inputs" ]; then
        dropped=$((dropped + 1))
        continue
      fi
      count=$((count + 1))
      cp "$file" "$keep/$base"
      total=$((total + size))
    done < <(find "$fresh" -type f -printf '%s %p\n' | sort -n)
    find "$corpus" -type f ! -name 'seed_*' ! -name 'regress_*' -delete
    cp "$keep/." -r "$corpus/"
    [ "$dropped" -eq 0 ] || echo "fuzz_campaign: $name: $dropped merged inputs left out (cap $cap bytes, $max_inputs inputs)" >&2
  fi
  files=$(find "$corpus" -type f | wc -l)
  bytes=$(find "$corpus" -type f -printf '%s\n' | awk '{s += $1} END {print s + 0}')
  rows+=("$(printf '%-32s %10s %7s %7s %7s %6s %9s' "$name" "${execs:-?}" "${cov:-?}" "${ft:-?}" "$crashes" "$files" "$bytes")")
done
printf '%-32s %10s %7s %7s %7s %6s %9s\n' target execs cov ft crashes inputs bytes
printf '%s\n' "${rows[@]}"
exit "$failed"
