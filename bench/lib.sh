# Shared helpers of the bench/*_vs_peers.sh scripts (sourced, not run).
# Timing: /usr/bin/time (Debian package "time"): wall, user+sys CPU, peak RSS.
# Results go into a TSV file ($RESULTS) and are printed as a table at the end.

set -euo pipefail

BARGE=${BARGE:-barge}
WORKROOT=${WORKROOT:-/var/tmp}
SIZE=${SIZE:-2G}
SEED=${SEED:-1}
CACHE=${CACHE:-both}   # cold, warm or both
REPEAT=${REPEAT:-1}    # runs of each measurement; figures are their medians

die() { echo "error: $*" >&2; exit 2; }

need_tools() {
  local missing=()
  for t in "$@"; do command -v "$t" >/dev/null 2>&1 || missing+=("$t"); done
  [ -x /usr/bin/time ] || missing+=("/usr/bin/time (Debian package: time)")
  if [ ${#missing[@]} -gt 0 ]; then
    die "missing tools: ${missing[*]} (Debian: qemu-utils, nbdkit, libnbd-bin, time)"
  fi
}

# Parses the flags every script shares; leftover flags are an error.
parse_common_flags() {
  while [ $# -gt 0 ]; do
    case "$1" in
      --size) SIZE=$2; shift 2 ;;
      --seed) SEED=$2; shift 2 ;;
      --workdir) WORKROOT=$2; shift 2 ;;
      --barge) BARGE=$2; shift 2 ;;
      --cache) CACHE=$2; shift 2 ;;
      --repeat) REPEAT=$2; shift 2 ;;
      -h|--help) usage; exit 0 ;;
      *) die "unknown flag $1 (see --help)" ;;
    esac
  done
  case "$CACHE" in cold|warm|both) ;; *) die "--cache must be cold, warm or both" ;; esac
  [[ "$REPEAT" =~ ^[1-9][0-9]*$ ]] || die "--repeat must be a whole number >= 1"
  command -v "$BARGE" >/dev/null 2>&1 || die "barge not found (set --barge PATH or BARGE=)"
  BARGE=$(command -v "$BARGE")
}

# Makes $WORK (removed on exit, whatever happens).
make_workdir() {
  WORK=$(mktemp -d "$WORKROOT/barge-peers-XXXXXX")
  RESULTS=$WORK/results.tsv
  : > "$RESULTS"
  # BARGE_BENCH_KEEP=1 keeps the work folder (data and outputs) for a look.
  if [ "${BARGE_BENCH_KEEP:-0}" = 1 ]; then
    trap 'echo "kept $WORK" >&2' EXIT
  else
    trap 'rm -rf "$WORK"' EXIT
  fi
  trap 'exit 130' INT TERM
}

print_machine() {
  echo "== machine"
  echo "date:       $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "cpu:        $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //') x $(nproc) (nproc)"
  echo "memory:     $(free -h | awk '/^Mem:/ {print $2}')"
  echo "kernel:     $(uname -sr)"
  echo "workdir:    $WORKROOT ($(stat -f -c %T "$WORKROOT"), $(df -h --output=avail "$WORKROOT" | tail -1 | tr -d ' ') free)"
  echo "load:       $(cut -d' ' -f1-3 /proc/loadavg) (1/5/15 min)"
  echo "barge:      $BARGE ($("$BARGE" --version 2>/dev/null || echo '?'))"
  command -v qemu-img >/dev/null && echo "qemu-img:   $(qemu-img --version | head -1)"
  command -v nbdcopy >/dev/null && echo "nbdcopy:    $(nbdcopy --version | head -1)"
  echo "size:       $SIZE (seed $SEED), cache: $CACHE"
}

# Drops cached pages: the whole page cache when permitted, else each given
# file's pages (POSIX_FADV_DONTNEED through dd iflag=nocache). Sets CACHE_HOW.
drop_cache() {
  sync
  if (echo 3 > /proc/sys/vm/drop_caches) 2>/dev/null; then
    CACHE_HOW="cold (drop_caches)"
    return
  fi
  local f
  for f in "$@"; do
    if [ -d "$f" ]; then
      find "$f" -type f -exec dd if={} iflag=nocache count=0 status=none \;
    elif [ -f "$f" ]; then
      dd if="$f" iflag=nocache count=0 status=none
    fi
  done
  CACHE_HOW="cold (fadvise)"
}

# Reads the given files into the page cache.
warm_cache() {
  local f
  for f in "$@"; do
    if [ -d "$f" ]; then find "$f" -type f -exec cat {} + > /dev/null; elif [ -f "$f" ]; then cat "$f" > /dev/null; fi
  done
  CACHE_HOW="warm"
}

# measure LABEL CACHE OUTPUT -- CMD ARGS...: runs CMD under /usr/bin/time
# and appends "label cache wall cpu rss_kib output_bytes" to $RESULTS.
# OUTPUT (file or folder) is sized afterwards: apparent size of qcow2 files,
# allocated bytes (du) otherwise. The command's own output goes to a log.
measure() {
  local label=$1 cache=$2 output=$3
  shift 4
  local tfile=$WORK/time.out log=$WORK/$label.log
  if ! /usr/bin/time -f '%e %U %S %M' -o "$tfile" "$@" > "$log" 2>&1; then
    echo "error: $label failed:" >&2
    tail -20 "$log" >&2
    exit 1
  fi
  local wall user sys rss
  read -r wall user sys rss < <(tail -1 "$tfile")
  local bytes=0
  if [ -n "${MEASURE_WRITTEN_SINCE:-}" ]; then
    bytes=$(( $(dir_bytes "$output") - MEASURE_WRITTEN_SINCE ))
  elif [ -d "$output" ]; then
    bytes=$(find "$output" -name '*.qcow2' -printf '%s\n' | awk '{s+=$1} END {printf "%.0f\n", s}')
  elif [[ "$output" == *.qcow2 ]]; then
    bytes=$(stat -c %s "$output")
  elif [ -e "$output" ]; then
    bytes=$(du -B1 "$output" | cut -f1)
  fi
  local cpu
  cpu=$(awk -v u="$user" -v s="$sys" 'BEGIN {printf "%.2f", u + s}')
  printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$label" "$cache" "$wall" "$cpu" "$rss" "$bytes" >> "$RESULTS"
  printf '  %-28s %-18s wall %7ss  cpu %7ss  rss %6s MiB  out %s\n' "$label" "$cache" "$wall" "$cpu" \
    "$((rss / 1024))" "$(numfmt --to=iec-i --suffix=B "$bytes")"
}

# dir_bytes DIR: apparent size of every regular file under DIR (0 if none).
dir_bytes() {
  [ -d "$1" ] || { echo 0; return; }
  find "$1" -type f -printf '%s\n' | awk '{s += $1} END {printf "%.0f\n", s}'
}

# measure_written LABEL CACHE DIR -- CMD ARGS...: as measure, but the output
# bytes are what CMD added to folder DIR (every file, apparent size), so a
# second backup into the same folder counts only its own files.
measure_written() {
  local since
  since=$(dir_bytes "$3")
  MEASURE_WRITTEN_SINCE=$since measure "$@"
}

# Field of a measurement: get LABEL CACHE FIELD (wall, cpu, rss, bytes), the
# median over its runs (--repeat; the lower middle one of an even count).
get() {
  awk -F'\t' -v l="$1" -v c="$2" -v f="$3" '
    BEGIN { i = (f == "wall") ? 3 : (f == "cpu") ? 4 : (f == "rss") ? 5 : 6 }
    $1 == l && $2 == c { print $i }' "$RESULTS" | sort -g | awk '{ v[NR] = $1 } END { if (NR) print v[int((NR + 1) / 2)] }'
}

# runs: the run numbers of each measurement, 1 .. $REPEAT. Loop over them
# inside a cache mode, so that the tools take turns (a drift of the machine
# then touches all of them alike).
runs() { seq "$REPEAT"; }

# ratio A B: A / B with 2 decimals ("-" when B is 0 or empty).
ratio() {
  awk -v a="$1" -v b="$2" 'BEGIN { if (b + 0 == 0) print "-"; else printf "%.2f", a / b }'
}

# verdict VALUE OP TARGET: "met" or "MISSED" (OP is >= or <=).
verdict() {
  awk -v v="$1" -v op="$2" -v t="$3" 'BEGIN {
    if (v == "-" || v == "") { print "n/a"; exit }
    ok = (op == ">=") ? (v + 0 >= t + 0) : (v + 0 <= t + 0); print ok ? "met" : "MISSED" }'
}

# cache_modes: the modes to run, from $CACHE.
cache_modes() {
  case "$CACHE" in both) echo "cold warm" ;; *) echo "$CACHE" ;; esac
}

# prepare_cache MODE FILES...: cold or warm page cache for the inputs.
prepare_cache() {
  local mode=$1
  shift
  if [ "$mode" = cold ]; then drop_cache "$@"; else warm_cache "$@"; fi
}

print_results() {
  echo
  echo "== results (medians of $REPEAT run(s): wall/cpu seconds, peak RSS MiB, output bytes; wall's range)"
  printf '%-28s %-6s %8s %8s %8s %14s  %s\n' tool cache wall cpu rss_MiB output wall_min-max
  local label cache
  awk -F'\t' '!seen[$1 FS $2]++ { print $1 "\t" $2 }' "$RESULTS" | while IFS=$'\t' read -r label cache; do
    local walls
    walls=$(awk -F'\t' -v l="$label" -v c="$cache" '$1 == l && $2 == c { print $3 }' "$RESULTS" | sort -g)
    printf '%-28s %-6s %8s %8s %8d %14s  %s-%s\n' "$label" "$cache" "$(get "$label" "$cache" wall)" \
      "$(get "$label" "$cache" cpu)" "$(( $(get "$label" "$cache" rss) / 1024 ))" "$(get "$label" "$cache" bytes)" \
      "$(head -1 <<< "$walls")" "$(tail -1 <<< "$walls")"
  done
}

# dirty DISK SEED OUT.json: rewrites 5% of the disk's 64 KiB clusters (runs of
# 1..16) with random bytes and writes the changed ranges as an extents file.
dirty() {
  python3 - "$@" <<'EOF'
import json, os, random, sys
path, seed, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
cluster = 64 << 10
clusters = os.path.getsize(path) // cluster
rng = random.Random(seed)
chosen = set()
while len(chosen) < clusters // 20:
    start = rng.randrange(clusters)
    chosen.update(range(start, min(clusters, start + rng.randint(1, 16))))
extents = []
with open(path, "r+b") as f:
    for c in sorted(chosen):
        f.seek(c * cluster)
        f.write(rng.randbytes(cluster))
        if extents and extents[-1]["offset"] + extents[-1]["length"] == c * cluster:
            extents[-1]["length"] += cluster
        else:
            extents.append({"offset": c * cluster, "length": cluster})
with open(out, "w") as f:
    json.dump({"format": "barge-extents", "version": 1, "virtual_size": os.path.getsize(path), "extents": extents}, f)
EOF
}

# dirty_percent DISK PERCENT SEED OUT.json: overwrites PERCENT of the disk's 64 KiB
# clusters (runs of 1..16 clusters; half random, half text-like bytes) and
# writes the changed ranges as a barge extents file.
dirty_percent() {
  python3 - "$@" <<'EOF'
import json, os, random, sys
path, percent, seed, out = sys.argv[1], float(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
cluster = 64 << 10
size = os.path.getsize(path)
clusters = size // cluster
rng = random.Random(seed)
target = int(clusters * percent / 100)
chosen = set()
while len(chosen) < target:
    start = rng.randrange(clusters)
    for c in range(start, min(clusters, start + rng.randint(1, 16))):
        if len(chosen) < target:
            chosen.add(c)
text = (b"changed block of a guest file system, fairly compressible text %d\n" % seed) * 1024
extents = []
with open(path, "r+b") as f:
    for c in sorted(chosen):
        data = rng.randbytes(cluster) if c % 2 else text[:cluster]
        f.seek(c * cluster)
        f.write(data)
        if extents and extents[-1]["offset"] + extents[-1]["length"] == c * cluster:
            extents[-1]["length"] += cluster
        else:
            extents.append({"offset": c * cluster, "length": cluster})
    f.flush()
    os.fsync(f.fileno())
with open(out, "w") as f:
    json.dump({"format": "barge-extents", "version": 1, "virtual_size": size, "extents": extents}, f)
print(f"dirtied {len(chosen)} of {clusters} clusters ({len(extents)} runs)")
EOF
}

# make_chain DISK TARGET INCREMENTS: a full backup of raw DISK into TARGET
# (chain "disk"), then INCREMENTS incrementals, each after `dirty` rewrote
# 5% of DISK; sets CHAIN.
make_chain() {
  local disk=$1 target=$2 n=$3 i
  "$BARGE" backup --source "$disk" --source-format raw --target "$target" --name disk > /dev/null
  for i in $(seq "$n"); do
    dirty "$disk" "$((SEED * 100 + i))" "$WORK/dirty$i.json"
    "$BARGE" backup --source "$disk" --source-format raw --target "$target" --name disk \
      --incremental --dirty-extents "$WORK/dirty$i.json" > /dev/null
  done
  CHAIN=$target/disk
}
