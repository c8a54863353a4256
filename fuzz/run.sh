#!/usr/bin/env bash
# Runs every built fuzz target for a fixed time on a scratch copy of its seed
# corpus (CI). Only crashes, sanitizer reports and hangs fail. Longer runs
# that grow the corpus: scripts/fuzz_campaign.sh.
#   fuzz/run.sh BUILD_DIR SECONDS
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=$(cd "$1" && pwd)
seconds=${2:-20}
work=$(mktemp -d /var/tmp/barge-fuzz-XXXXXX)
trap 'rm -rf "$work"' EXIT
found=0
for src in "$root"/fuzz/*_fuzzer.cc; do
  [ -e "$src" ] || continue
  name=$(basename "$src" .cc)
  bin="$build/fuzz/$name"
  [ -x "$bin" ] || { echo "fuzz: $name not built" >&2; exit 1; }
  found=$((found + 1))
  mkdir -p "$work/$name"
  if [ -d "$root/fuzz/corpus/$name" ]; then cp -r "$root/fuzz/corpus/$name/." "$work/$name/"; fi
  echo "fuzz: $name for ${seconds}s"
  (cd "$work" && "$bin" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
      -max_len=1048576 -print_final_stats=1 "$work/$name" 2>"$work/$name.log") || {
    tail -50 "$work/$name.log" >&2
    echo "fuzz: $name FAILED" >&2
    exit 1
  }
  grep -E '^stat::number_of_executed_units' "$work/$name.log" || true
  grep -E '^#[0-9]+[[:space:]]+DONE' "$work/$name.log" | tail -1 || true
done
echo "fuzz: $found targets ran clean"
