#!/usr/bin/env bash
# Builds the qcow2 seed images of the fuzz corpus with qemu-img and qemu-io:
# small (3 KiB - 100 KiB; mostly 512-byte clusters, so a few KiB hold many
# tables) valid images that between them hold data,
# compressed (zlib and zstd), zero and unallocated clusters, bitmaps with
# dirty bits, an internal snapshot, a backing name, an external data file,
# extended L2, v2 headers and refcount widths 1 and 64. The structure-aware
# mutator (qcow2_mutator.cc) starts from these.
#   fuzz/make_seeds.sh [OUT_DIR]
# Without OUT_DIR the seeds replace the seed_*.qcow2 files of every qcow2
# target's corpus (regress_* inputs stay) and the chain target's seeds.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
for tool in qemu-img qemu-io; do
  command -v "$tool" >/dev/null || { echo "make_seeds: $tool is needed" >&2; exit 1; }
done
work=$(mktemp -d /var/tmp/barge-seeds-XXXXXX)
trap 'rm -rf "$work"' EXIT
cd "$work"

img() { qemu-img create -q -f qcow2 "$@"; }
io() { qemu-io -f qcow2 "$1" "${@:2}" >/dev/null; }
# Writes of a few patterns: data clusters, a zero cluster, a gap.
fill() {
  local f=$1 cs=$2
  io "$f" -c "write -P 0xa5 0 $((cs * 2))" -c "write -P 0x3c $((cs * 5)) $cs" \
    -c "write -z $((cs * 7)) $cs" -c "write -P 0x11 $((cs * 12)) 512"
}

# 1. Plain image, 512-byte clusters: many L2 tables and refcount entries.
img -o cluster_size=512 plain512.qcow2 64K && fill plain512.qcow2 512
# 2. refcount_bits=1 (packed refcounts), zero-alloc cluster.
img -o cluster_size=512,refcount_bits=1 refcount1.qcow2 64K && fill refcount1.qcow2 512
io refcount1.qcow2 -c "write -z 0 512"  # ZERO_ALLOC over data
# 3. refcount_bits=64, 1 KiB clusters.
img -o cluster_size=1024,refcount_bits=64 refcount64.qcow2 64K && fill refcount64.qcow2 1024
# 4. Compressed clusters, zlib and zstd (low-entropy data compresses).
printf 'barge seed %.0s' $(seq 1 3000) | head -c 65536 > text.raw
head -c 16384 text.raw > text16k.raw
qemu-img convert -q -f raw -O qcow2 -c -o cluster_size=512 text.raw zlib.qcow2
qemu-img convert -q -f raw -O qcow2 -c -o cluster_size=4096,compression_type=zstd text16k.raw zstd.qcow2
io zlib.qcow2 -c "write -z 8192 512"
# 5. Extended L2 (subclusters), 16 KiB clusters.
img -o cluster_size=16384,extended_l2=on ext_l2.qcow2 128K
io ext_l2.qcow2 -c "write -P 0x77 0 1024" -c "write -z 20480 2048" -c "write -P 0x12 34816 4096"
# 6. Persistent bitmaps with dirty bits (qemu-io writes while they track).
img -o cluster_size=512 bitmaps.qcow2 64K
qemu-img bitmap --add -g 512 bitmaps.qcow2 b0
qemu-img bitmap --add -g 4096 --disable bitmaps.qcow2 frozen
fill bitmaps.qcow2 512
# 7. Internal snapshot, then more writes (the snapshot L1 shares L2 tables).
img -o cluster_size=512 snapshot.qcow2 64K && fill snapshot.qcow2 512
qemu-img snapshot -c snap1 snapshot.qcow2
io snapshot.qcow2 -c "write -P 0x99 512 512"
# 8. Backing name (relative, with format), overlay with own data.
img -o cluster_size=512 base.qcow2 64K && fill base.qcow2 512
img -o cluster_size=512 -b base.qcow2 -F qcow2 overlay.qcow2
io overlay.qcow2 -c "write -P 0x44 512 512" -c "write -z 0 512"
# 9. External data file (raw flag off) and data_file_raw.
img -o cluster_size=512,data_file=data.raw datafile.qcow2 64K
io datafile.qcow2 -c "write -P 0x55 0 2048"
img -o cluster_size=512,data_file=data2.raw,data_file_raw=on datafile_raw.qcow2 16K
# 10. Version 2 header (compat 0.10).
img -o cluster_size=512,compat=0.10 v2.qcow2 64K && fill v2.qcow2 512
# 11. Backing chain for the chain target: raw <- mid (qcow2) <- top.
head -c 16384 text.raw > chain_base.raw
img -o cluster_size=512 -b chain_base.raw -F raw chain_mid.qcow2 16K
io chain_mid.qcow2 -c "write -P 0x21 0 1024"
img -o cluster_size=512 -b chain_mid.qcow2 -F qcow2 chain_top.qcow2 16K
io chain_top.qcow2 -c "write -P 0x31 8192 512"

seeds=(plain512 refcount1 refcount64 zlib zstd ext_l2 bitmaps snapshot overlay datafile datafile_raw v2)
for s in "${seeds[@]}"; do qemu-img check -q -f qcow2 "$s.qcow2"; done

# The chain target reads one input as several files joined by this marker
# (see qcow2_chain_fuzzer.cc): file 0 is top.qcow2, file i is layer<i>.
marker='BARGE-FUZZ-FILE'
chain() {
  local out=$1
  shift
  local first=1
  for f in "$@"; do
    [ $first -eq 1 ] || printf '%s' "$marker"
    cat "$f"
    first=0
  done >"$out"
}
# Backing names must point at the layers by the names the target serves.
qemu-img rebase -q -u -f qcow2 -b layer1 -F qcow2 chain_top.qcow2
qemu-img rebase -q -u -f qcow2 -b layer2 -F raw chain_mid.qcow2
qemu-img rebase -q -u -f qcow2 -b layer1 -F qcow2 overlay.qcow2
chain chain3.bin chain_top.qcow2 chain_mid.qcow2 chain_base.raw
chain chain2.bin overlay.qcow2 base.qcow2
chain chain_loop.bin chain_top.qcow2 chain_top.qcow2  # layer1 names layer1: a loop

out=${1:-}
place() {  # place DIR FILES...: copies FILES as seed_<name> into DIR
  local dir=$1
  shift
  mkdir -p "$dir"
  for f in "$@"; do cp "$f" "$dir/seed_$(basename "$f")"; done
}
if [ -n "$out" ]; then
  place "$out" ./*.qcow2 chain*.bin
else
  for t in qcow2_image_fuzzer qcow2_check_fuzzer qcow2_bitmap_edit_fuzzer qcow2_header_fuzzer \
    qcow2_tables_fuzzer; do
    rm -f "$root/fuzz/corpus/$t"/seed_*
    place "$root/fuzz/corpus/$t" $(printf '%s.qcow2 ' "${seeds[@]}")
  done
  rm -f "$root/fuzz/corpus/qcow2_chain_fuzzer"/seed_*
  place "$root/fuzz/corpus/qcow2_chain_fuzzer" chain3.bin chain2.bin chain_loop.bin
fi
ls -l "$work"/*.qcow2 "$work"/chain*.bin >&2
