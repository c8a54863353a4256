#!/usr/bin/env bash
# Reading a point in place: barge export (nbdkit + barge's plugin, every
# cluster checked against its digest) against qemu-nbd -r serving the same
# chain unverified. A point of full + N incrementals (5% of the clusters
# rewritten in each; --increments 0: a single full point, no chain);
# (a) nbdcopy of the whole export to null: (sequential, multi-conn), with
# extents (nbdcopy's default) and with --no-extents (every byte read),
# (b) fio 4 KiB random reads through fio's nbd engine (libnbd). A third
# server, "barge-plugin-mt", is barge's plugin under nbdkit with nbdkit's
# default threads: what `barge export` forgoes by running nbdkit with
# --threads=1 before 1.33.10 (an upstream abort when a client hangs up
# mid-request; pipeline/export.h), measured (when the plugin is found
# beside barge).
# Page cache cold (dropped before each measurement) and/or warm (the layers
# read once before), --cache cold|warm|both (default warm); medians of
# --repeat runs, the servers taking turns. Exits non-zero only when
# something fails.
#
#   bench/export_vs_qemu_nbd.sh [--size 256M] [--increments 5] [--seed 1]
#                               [--workdir /var/tmp] [--barge PATH]
#                               [--repeat 3] [--fio-seconds 10] [--cache warm]
# Targets (issue 22): sequential >= 0.9x qemu-nbd, random 4 KiB >= 0.8x.
source "$(dirname "$0")/lib.sh"

usage() { sed -n '2,22p' "$0"; }

SIZE=256M
REPEAT=3
INCREMENTS=5
FIO_SECONDS=10
args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --increments) INCREMENTS=$2; shift 2 ;;
    --fio-seconds) FIO_SECONDS=$2; shift 2 ;;
    *) args+=("$1"); shift ;;
  esac
done
CACHE=warm
parse_common_flags "${args[@]+"${args[@]}"}"
need_tools qemu-nbd qemu-img nbdcopy nbdinfo nbdkit python3 numfmt
HAVE_FIO=0
if command -v fio >/dev/null && fio --enghelp 2>&1 | grep -qw nbd; then HAVE_FIO=1; fi
make_workdir
print_machine
echo "chain:      full + $INCREMENTS incrementals (5% of clusters each); fio: $([ $HAVE_FIO = 1 ] && echo "nbd engine, ${FIO_SECONDS}s" || echo 'missing (no random-read figures)')"

SERVER_PID=
stop_server() {
  if [ -n "$SERVER_PID" ]; then
    kill -TERM "$SERVER_PID" 2>/dev/null || true
    wait "$SERVER_PID" 2>/dev/null || true
    SERVER_PID=
  fi
}
trap 'stop_server; rm -rf "$WORK"' EXIT

echo
echo "== chain"
DISK=$WORK/disk.raw
"$BARGE" bench generate --size "$SIZE" --seed "$SEED" "$DISK" > /dev/null
TARGET=$WORK/backups
make_chain "$DISK" "$TARGET" "$INCREMENTS"
TOP=$(ls -1 "$CHAIN"/*.qcow2 | sort | tail -1)
echo "  $(ls -1 "$CHAIN"/*.qcow2 | wc -l) layers, $(numfmt --to=iec-i --suffix=B "$(du -cb "$CHAIN"/*.qcow2 | tail -1 | cut -f1)") stored; top $(basename "$TOP")"
SOCK=$WORK/nbd.sock
URI="nbd+unix:///?socket=$SOCK"

start_barge() {
  # A ready event left from the previous server must not count for this one.
  rm -f "$WORK/export.out"
  "$BARGE" export "$CHAIN" --socket "$SOCK" --json > "$WORK/export.out" 2> "$WORK/export.err" &
  SERVER_PID=$!
  for _ in $(seq 500); do
    grep -q '"event":"ready"' "$WORK/export.out" 2>/dev/null && return
    kill -0 "$SERVER_PID" 2>/dev/null || { cat "$WORK/export.err" >&2; die "barge export ended"; }
    sleep 0.02
  done
  die "barge export did not get ready"
}
# barge's nbdkit plugin beside the barge binary (the build tree's cli/).
PLUGIN=$(dirname "$BARGE")/nbdkit-barge-plugin.so
[ -f "$PLUGIN" ] || PLUGIN=$(dirname "$BARGE")/../lib/barge/nbdkit-barge-plugin.so
SERVERS="barge-export qemu-nbd-r"
if [ -f "$PLUGIN" ]; then SERVERS="barge-export barge-plugin-mt qemu-nbd-r"; fi
start_plugin_mt() {
  # As barge export runs it, less --threads=1 (nbdkit's default threads).
  nbdkit -f --exit-with-parent --readonly -U "$SOCK" "$PLUGIN" chain="$CHAIN" 2> "$WORK/nbdkit-mt.err" &
  SERVER_PID=$!
  for _ in $(seq 500); do
    nbdinfo --size "$URI" >/dev/null 2>&1 && return
    kill -0 "$SERVER_PID" 2>/dev/null || { cat "$WORK/nbdkit-mt.err" >&2; die "nbdkit with the plugin ended"; }
    sleep 0.02
  done
  die "nbdkit with the plugin did not get ready"
}
start_qemu() {
  # --shared 8: several connections at once, so that nbdcopy gets
  # multi-conn here too (qemu-nbd advertises it for read-only exports);
  # -t: it stays up between clients.
  qemu-nbd -r -t -f qcow2 --shared 8 --socket "$SOCK" "$TOP" 2> "$WORK/qemu-nbd.err" &
  SERVER_PID=$!
  for _ in $(seq 500); do
    nbdinfo --size "$URI" >/dev/null 2>&1 && return
    sleep 0.02
  done
  die "qemu-nbd did not get ready"
}

# fio_iops LABEL MODE: 4 KiB random reads for $FIO_SECONDS, 4 jobs x
# iodepth 16; appends "LABEL MODE IOPS" to $WORK/iops.tsv.
fio_iops() {
  local label=$1 mode=$2
  fio --name=rand --ioengine=nbd --uri="$URI" --rw=randread --bs=4k --iodepth=16 --numjobs=4 \
    --group_reporting --time_based --runtime="$FIO_SECONDS" --output-format=json > "$WORK/fio.json" 2> "$WORK/fio.err" \
    || { cat "$WORK/fio.err" >&2; die "fio against $label failed"; }
  local iops
  # fio's nbd engine prints "fio: connected to NBD server" before the JSON.
  iops=$(python3 -c 'import json,sys; t=open(sys.argv[1]).read(); print(round(json.loads(t[t.index("{"):])["jobs"][0]["read"]["iops"]))' \
    "$WORK/fio.json")
  printf '%s\t%s\t%s\n' "$label" "$mode" "$iops" >> "$WORK/iops.tsv"
  printf '  %-28s fio 4k randread %8s IOPS (%s)\n' "$label" "$iops" "$mode"
}

echo
echo "== runs (page cache: $(cache_modes))"
: > "$WORK/iops.tsv"
for run in $(runs); do
  echo " [run $run of $REPEAT]"
  for mode in $(cache_modes); do
    for server in $SERVERS; do
      # The server starts on the cache state measured (barge's start reads
      # the manifests and digest tables).
      prepare_cache "$mode" "$CHAIN"/*
      case "$server" in
        barge-export) start_barge ;;
        barge-plugin-mt) start_plugin_mt ;;
        *) start_qemu ;;
      esac
      measure "$server-nbdcopy" "$mode" "$WORK/none" -- nbdcopy "$URI" null:
      [ "$mode" = cold ] && drop_cache "$CHAIN"/*
      measure "$server-nbdcopy-noext" "$mode" "$WORK/none" -- nbdcopy --no-extents "$URI" null:
      if [ "$HAVE_FIO" = 1 ]; then
        [ "$mode" = cold ] && drop_cache "$CHAIN"/*
        fio_iops "$server" "$mode"
      fi
      stop_server
    done
  done
done
# The bytes served are the disk's: one full copy from each, compared.
start_barge; nbdcopy "$URI" "$WORK/b.raw"; stop_server
cmp "$DISK" "$WORK/b.raw" || die "barge export served other bytes than the disk"
rm -f "$WORK/b.raw"

print_results
median_iops() {
  awk -F'\t' -v l="$1" -v m="$2" '$1 == l && $2 == m { print $3 }' "$WORK/iops.tsv" | sort -g | awk '{ v[NR] = $1 } END { if (NR) print v[int((NR + 1) / 2)] }'
}

echo
echo "== ratios and targets"
for mode in $(cache_modes); do
  for kind in nbdcopy nbdcopy-noext; do
    what="with extents"; [ "$kind" = nbdcopy-noext ] && what="--no-extents"
    q=$(get "qemu-nbd-r-$kind" "$mode" wall)
    for server in $SERVERS; do
      [ "$server" = qemu-nbd-r ] && continue
      b=$(get "$server-$kind" "$mode" wall)
      r=$(ratio "$q" "$b")
      echo "  $mode: sequential (nbdcopy $what, $SIZE): $server ${r}x qemu-nbd's throughput ($server ${b}s, qemu-nbd ${q}s) (target >= 0.9x: $(verdict "$r" '>=' 0.9))"
    done
  done
  if [ "$HAVE_FIO" = 1 ]; then
    qi=$(median_iops qemu-nbd-r "$mode")
    for server in $SERVERS; do
      [ "$server" = qemu-nbd-r ] && continue
      bi=$(median_iops "$server" "$mode")
      ri=$(ratio "$bi" "$qi")
      echo "  $mode: random 4 KiB reads (fio nbd): $server ${ri}x qemu-nbd's IOPS ($server $bi, qemu-nbd $qi) (target >= 0.8x: $(verdict "$ri" '>=' 0.8))"
    done
  fi
done
