#!/usr/bin/env bash
# barge vm backup against virtnbdbackup on the same VM disk and the same
# guest writes: full backup (-l full), then one incremental (-l inc) after
# ~5% of the disk was rewritten; both compress (barge zstd:1, virtnbdbackup
# lz4 -z). Wall time, CPU time, peak RSS, bytes written, and the ratios next
# to the targets (full >= 3x faster, incremental never slower). Exits
# non-zero only when something fails to run; missed targets are reported.
#
#   bench/vm_backup_vs_virtnbdbackup.sh [--size 2G] [--seed 1] [--workdir /var/tmp]
#                                       [--barge PATH] [--cache warm|cold|both]
#
# Needs root, libvirtd + QEMU (TCG is enough; see /work/shared/TESTBED.md) and
# virtnbdbackup. virtnbdbackup refuses a domain that has checkpoints it did
# not create ("Foreign checkpoint found"), so the two tools back up two
# identical domains (two copies of one disk, the same guest writes on both),
# each with its own checkpoint chain. Both read through QEMU's NBD export of
# a paused domain; QEMU's own CPU time is counted for neither.
CACHE=${CACHE:-warm}
source "$(dirname "$0")/lib.sh"

usage() { sed -n '2,17p' "$0"; }

parse_common_flags "$@"
# Each run extends a checkpoint chain; one run per cache mode.
[ "$REPEAT" = 1 ] || die "--repeat is not supported here"
need_tools virsh virtnbdbackup qemu-img numfmt python3
[ "$(id -u)" = 0 ] || die "needs root (libvirt's system instance)"
SIZE_BYTES=$(numfmt --from=iec "$SIZE")
VIRSH="timeout 120 virsh -q -c qemu:///system"

# libvirtd and virtlogd, started as the tests do (tests/vm_libvirt_env.h).
ensure_libvirtd() {
  $VIRSH version >/dev/null 2>&1 && return 0
  mkdir -p /var/log/libvirt /var/run/libvirt /var/lib/libvirt/qemu
  getent group kvm >/dev/null || groupadd -r kvm
  getent passwd libvirt-qemu >/dev/null || { groupadd -r libvirt-qemu; useradd -r -g libvirt-qemu -G kvm libvirt-qemu; }
  # No udev here: give group kvm (QEMU's user is in it) the /dev/kvm access
  # udev would, or libvirt re-probes QEMU at every lookup (tests do the same).
  if [ -c /dev/kvm ]; then chgrp kvm /dev/kvm && chmod g+rw /dev/kvm; fi
  pgrep -x virtlogd >/dev/null || virtlogd -d
  pgrep -x libvirtd >/dev/null || libvirtd -d
  local i
  for i in $(seq 60); do
    $VIRSH version >/dev/null 2>&1 && return 0
    sleep 0.5
  done
  die "libvirtd did not start"
}
ensure_libvirtd

make_workdir
chmod 777 "$WORK"   # QEMU runs as libvirt-qemu
# Domains go before the work folder (lib.sh's EXIT trap removes it).
DOMAINS=()
cleanup_domains() {
  local d
  for d in "${DOMAINS[@]}"; do
    $VIRSH destroy "$d" >/dev/null 2>&1 || true
    $VIRSH undefine "$d" --checkpoints-metadata >/dev/null 2>&1 || true
  done
}
eval "LIB_EXIT_TRAP=$(trap -p EXIT | sed -e 's/^trap -- //' -e 's/ EXIT$//')"
trap 'cleanup_domains; '"$LIB_EXIT_TRAP" EXIT

print_machine
echo "virtnbdbackup: $(virtnbdbackup -V 2>&1 | tail -1)"
echo "libvirt:    $($VIRSH version 2>/dev/null | grep -i 'running hypervisor\|library' | tr '\n' ' ')"

# Guest writes through the monitor's qemu-io on the disk backend (as
# TestDomain::Write): PLACES extents spread over the disk, ~5% in all, each
# filled from its own pattern file of the disk's own non-zero 64 KiB blocks
# (sampled across the disk: its mix of text and random data, so the changed
# blocks compress like the rest of the disk, and none is all zeros).
PLACES=16
DIRTY_LEN=$(( SIZE_BYTES / 20 / PLACES / 65536 * 65536 ))
[ "$DIRTY_LEN" -ge 65536 ] || DIRTY_LEN=65536
make_patterns() {
  python3 - "$RAW" "$WORK/pattern" "$PLACES" "$DIRTY_LEN" <<'PY'
import os, sys
raw, prefix, places, length = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
B = 65536
need = places * length // B
blocks = os.path.getsize(raw) // B
zero = bytes(B)
with open(raw, "rb") as f:
    for stride in (max(1, blocks // (4 * need)), 1):
        cands = []
        for i in range(0, blocks, stride):
            f.seek(i * B)
            b = f.read(B)
            if b != zero:
                cands.append(i)
        if len(cands) >= need:
            break
    if len(cands) < need:
        sys.exit("not enough non-zero blocks in the disk for the guest writes")
    # Evenly spaced over the disk's non-zero blocks.
    picked = [cands[k * len(cands) // need] for k in range(need)]
    per = length // B
    for p in range(places):
        with open(f"{prefix}-{p}.raw", "wb") as out:
            for i in picked[p::places][:per]:
                f.seek(i * B)
                out.write(f.read(B))
PY
  chmod 644 "$WORK"/pattern-*.raw
}

echo
echo "== disk"
RAW=$WORK/disk.raw
"$BARGE" bench generate --size "$SIZE" --seed "$SEED" "$RAW"
echo "allocated: $(du -B1 "$RAW" | cut -f1) bytes of $(stat -c %s "$RAW")"
qemu-img convert -f raw -O qcow2 "$RAW" "$WORK/disk-v.qcow2"
make_patterns
rm -f "$RAW"
cp --sparse=always "$WORK/disk-v.qcow2" "$WORK/disk-b.qcow2"
chmod 666 "$WORK"/disk-*.qcow2
echo "qcow2:     $(stat -c %s "$WORK/disk-v.qcow2") bytes (one copy per tool)"

# A throwaway TCG domain (no OS, 64 MiB, pc, virtio disk), as the tests'
# TestDomain::Xml; started paused.
define_domain() {
  local name=$1 disk=$2
  cat > "$WORK/$name.xml" <<EOF
<domain type='qemu'><name>$name</name><memory unit='MiB'>64</memory><vcpu>1</vcpu>
<os><type arch='x86_64' machine='pc'>hvm</type></os><devices>
<disk type='file' device='disk'><driver name='qemu' type='qcow2'/><source file='$disk'/><target dev='vda' bus='virtio'/></disk>
</devices></domain>
EOF
  $VIRSH define "$WORK/$name.xml" >/dev/null
  DOMAINS+=("$name")
  $VIRSH start "$name" --paused >/dev/null
}
DOM_V=barge-bench-vnb-$$
DOM_B=barge-bench-barge-$$
define_domain "$DOM_V" "$WORK/disk-v.qcow2"
define_domain "$DOM_B" "$WORK/disk-b.qcow2"
echo "domains:   $DOM_V (virtnbdbackup), $DOM_B (barge), paused, TCG"

dirty() {
  local dom=$1 i off out
  for i in $(seq 0 $((PLACES - 1))); do
    off=$(( (SIZE_BYTES / PLACES * i + SIZE_BYTES / PLACES / 3) / 65536 * 65536 ))
    out=$($VIRSH qemu-monitor-command "$dom" --hmp \
      "qemu-io -d /machine/peripheral/virtio-disk0/virtio-backend \"write -s $WORK/pattern-$i.raw $off $DIRTY_LEN\"")
    case "$out" in *rror*) die "guest write on $dom failed: $out" ;; esac
  done
  out=$($VIRSH qemu-monitor-command "$dom" --hmp 'qemu-io -d /machine/peripheral/virtio-disk0/virtio-backend "flush"')
}

# Before each run: the inputs' page cache as asked, and no dirty pages left
# from the previous run's output (virtnbdbackup does not sync its files;
# barge fdatasyncs its own).
settle() {
  prepare_cache "$1" "$WORK/disk-v.qcow2" "$WORK/disk-b.qcow2"
  sync
}

CATALOG=$WORK/catalog.db
VNB_FLAGS=(-U qemu:///system -d "$DOM_V" -z -n -S "$WORK")
BARGE_FLAGS=(vm backup --domain "$DOM_B" --skip-quiesce --catalog "$CATALOG")

echo
echo "== runs (full: virtnbdbackup first; incremental: barge first)"
for mode in $(cache_modes); do
  OUT_V=$WORK/out-v-$mode OUT_B=$WORK/out-b-$mode TRACKER=t-$mode
  "$BARGE" tracker create "$TRACKER" --domain "$DOM_B" --catalog "$CATALOG" >/dev/null

  settle "$mode"; echo " [$CACHE_HOW]"
  measure_written virtnbdbackup-full "$mode" "$OUT_V" -- virtnbdbackup "${VNB_FLAGS[@]}" -l full -o "$OUT_V"
  settle "$mode"
  measure_written barge-full "$mode" "$OUT_B" -- "$BARGE" "${BARGE_FLAGS[@]}" --tracker "$TRACKER" --target "$OUT_B"
  grep -q '^Full backup' "$WORK/barge-full.log" || die "barge's first backup was not full: $(head -1 "$WORK/barge-full.log")"
  # For information: the same full at zstd:3, the level qemu uses (its own
  # tracker and folder, removed afterwards; no target on it).
  "$BARGE" tracker create "z3-$mode" --domain "$DOM_B" --catalog "$CATALOG" >/dev/null
  settle "$mode"
  measure_written barge-full-zstd:3 "$mode" "$WORK/out-b3-$mode" -- \
    "$BARGE" "${BARGE_FLAGS[@]}" --tracker "z3-$mode" --target "$WORK/out-b3-$mode" --compress zstd:3
  rm -rf "$WORK/out-b3-$mode"

  dirty "$DOM_V"
  dirty "$DOM_B"
  echo "  dirtied $PLACES x $(numfmt --to=iec-i --suffix=B "$DIRTY_LEN") on each domain" \
       "($(numfmt --to=iec-i --suffix=B $((PLACES * DIRTY_LEN))), $(awk -v a=$((PLACES * DIRTY_LEN)) -v b="$SIZE_BYTES" 'BEGIN {printf "%.1f", 100 * a / b}')% of the disk)"

  settle "$mode"
  measure_written barge-inc "$mode" "$OUT_B" -- "$BARGE" "${BARGE_FLAGS[@]}" --tracker "$TRACKER" --target "$OUT_B"
  grep -q '^Incremental backup' "$WORK/barge-inc.log" || die "barge's second backup was not incremental: $(head -1 "$WORK/barge-inc.log")"
  settle "$mode"
  measure_written virtnbdbackup-inc "$mode" "$OUT_V" -- virtnbdbackup "${VNB_FLAGS[@]}" -l inc -o "$OUT_V"
  grep -q 'inc' <(ls "$OUT_V") || die "virtnbdbackup wrote no incremental file"
done

print_results

echo
echo "== ratios and targets (virtnbdbackup wall / barge wall; bytes = every file written into the backup folder)"
for mode in $(cache_modes); do
  full=$(ratio "$(get virtnbdbackup-full "$mode" wall)" "$(get barge-full "$mode" wall)")
  inc=$(ratio "$(get virtnbdbackup-inc "$mode" wall)" "$(get barge-inc "$mode" wall)")
  echo "[$mode]"
  echo "  full:  barge ${full}x faster   (target >= 3x: $(verdict "$full" '>=' 3))"
  echo "  inc:   barge ${inc}x faster   (target >= 1.0: $(verdict "$inc" '>=' 1.0))"
  echo "  bytes: full barge/virtnbdbackup = $(ratio "$(get barge-full "$mode" bytes)" "$(get virtnbdbackup-full "$mode" bytes)")" \
       "($(get barge-full "$mode" bytes) / $(get virtnbdbackup-full "$mode" bytes));" \
       "inc $(ratio "$(get barge-inc "$mode" bytes)" "$(get virtnbdbackup-inc "$mode" bytes)")" \
       "($(get barge-inc "$mode" bytes) / $(get virtnbdbackup-inc "$mode" bytes))"
  echo "  cpu:   full barge $(get barge-full "$mode" cpu) s, virtnbdbackup $(get virtnbdbackup-full "$mode" cpu) s;" \
       "inc barge $(get barge-inc "$mode" cpu) s, virtnbdbackup $(get virtnbdbackup-inc "$mode" cpu) s"
  z3=$(ratio "$(get virtnbdbackup-full "$mode" wall)" "$(get barge-full-zstd:3 "$mode" wall)")
  echo "  info:  full with barge --compress zstd:3: ${z3}x faster," \
       "bytes barge/virtnbdbackup = $(ratio "$(get barge-full-zstd:3 "$mode" bytes)" "$(get virtnbdbackup-full "$mode" bytes)")"
done
echo "  load at the end: $(cut -d' ' -f1-3 /proc/loadavg) (1/5/15 min; other work on the 2 cores skews every ratio)"
echo "  barge: zstd:1 (its default), all cores, xxh3 digests, fdatasync; virtnbdbackup: lz4 (-z, level 2), stream format"
