#!/usr/bin/env bash
# Builds the guest of the quiesce test (tests/vm_quiesce_test.cc): a Debian
# cloud kernel and an initramfs with busybox and the real QEMU guest agent.
#   tests/guest/make_guest.sh OUTDIR   # writes OUTDIR/vmlinuz, OUTDIR/initrd.img
# Nothing is installed on the host: the kernel, busybox-static and
# qemu-guest-agent packages are fetched with `apt-get download` and unpacked;
# qemu-ga's shared libraries are copied from the host (same Debian 12).
# Cached: does nothing when both outputs are newer than this script.
#
# The guest (see docs/orchestration.md, "The quiesce test's guest"):
# - /init mounts /dev/vdb (ext4, if present) on /mnt, then runs qemu-ga on
#   the virtio-serial port named org.qemu.guest_agent.0;
# - the fsfreeze hook logs "barge-hook freeze N" / "barge-hook thaw N" to
#   /dev/ttyS0, stamps the same text into 4 KiB block 0 (freeze) or 1 (thaw)
#   of /dev/vda, and on freeze writes /mnt/barge-freeze-N before the
#   filesystem is frozen.
set -euo pipefail
[ $# -eq 1 ] || { echo "usage: $0 OUTDIR" >&2; exit 2; }
script=$(readlink -f "$0")
out=$(mkdir -p "$1" && cd "$1" && pwd)

# One builder at a time (tests may run in parallel); the others wait and
# then find the cached result.
exec 9>"$out/.lock"
flock 9
if [ "$out/vmlinuz" -nt "$script" ] && [ "$out/initrd.img" -nt "$script" ]; then
  exit 0
fi

sudo=""
[ "$(id -u)" -eq 0 ] || sudo=sudo
work=$(mktemp -d "$out/.work.XXXXXX")
trap 'rm -rf "$work"' EXIT
cd "$work"

if ! compgen -G '/var/lib/apt/lists/*_Packages*' >/dev/null; then $sudo apt-get update -qq; fi
# The cloud flavour: virtio as modules, few other drivers, boots in seconds
# under TCG. The metapackage names the current ABI's real package.
kernel_pkg() {
  { apt-cache depends linux-image-cloud-amd64 2>/dev/null || true; } |
    awk '$1 == "Depends:" && $2 ~ /^linux-image-/ && !found { print $2; found = 1 }'
}
download() {
  # As root apt would hand the download to its _apt user, who cannot write here.
  apt-get -qq -o APT::Sandbox::User="$(id -un)" download "$@"
}
kpkg=$(kernel_pkg)
# Stale package lists name versions the mirror no longer has: refresh once.
if [ -z "$kpkg" ] || ! download "$kpkg" busybox-static qemu-guest-agent; then
  rm -f ./*.deb
  $sudo apt-get update -qq
  kpkg=$(kernel_pkg)
  download "$kpkg" busybox-static qemu-guest-agent
fi
mkdir x
for deb in ./*.deb; do dpkg-deb -x "$deb" x; done
bb=$PWD/x/bin/busybox
kver=$(basename x/lib/modules/*)

root=$PWD/root
mkdir -p "$root"/{bin,dev,proc,sys,run,mnt,tmp,etc/barge,usr/sbin,lib/modules/"$kver"}
cp x/bin/busybox "$root/bin/busybox"
ln -s busybox "$root/bin/sh"

# qemu-ga with the host's libraries; it must run here first.
cp x/usr/sbin/qemu-ga "$root/usr/sbin/qemu-ga"
x/usr/sbin/qemu-ga --version >/dev/null || { echo "qemu-ga does not run with the host's libraries" >&2; exit 1; }
if ldd x/usr/sbin/qemu-ga | grep -q "not found"; then
  echo "qemu-ga needs libraries the host lacks (scripts/deps.sh test installs them):" >&2
  ldd x/usr/sbin/qemu-ga | grep "not found" >&2
  exit 1
fi
for lib in $(ldd x/usr/sbin/qemu-ga | awk '$2 == "=>" && $3 ~ /^\// { print $3 } $1 ~ /^\// { print $1 }'); do
  mkdir -p "$root$(dirname "$lib")"
  cp -L "$lib" "$root$lib"
done

# Modules (the cloud kernel builds virtio as modules), dependencies first.
# The package has no modules.dep: busybox's depmod writes one.
"$bb" depmod -b x "$kver"
moddir=x/lib/modules/$kver
: >"$root/etc/modules"
for m in virtio_pci virtio_console virtio_blk; do
  line=$(grep -E "^kernel/.*/$m\.ko(\.xz)?:" "$moddir/modules.dep") ||
    { echo "$kpkg has no module $m" >&2; exit 1; }
  deps=${line#*:}
  # modules.dep lists the full closure, the deepest dependency last.
  for f in $(echo $deps | tr ' ' '\n' | tac) "${line%%:*}"; do
    name=$(basename "$f")
    grep -qx "${name%.xz}" "$root/etc/modules" && continue
    case "$f" in
      *.xz) xz -dc "$moddir/$f" >"$root/lib/modules/$kver/${name%.xz}" ;;
      *) cp "$moddir/$f" "$root/lib/modules/$kver/$name" ;;
    esac
    echo "${name%.xz}" >>"$root/etc/modules"
  done
done

cat >"$root/init" <<INIT
#!/bin/sh
# barge quiesce test guest (tests/guest/make_guest.sh)
export PATH=/bin:/usr/sbin
/bin/busybox --install -s /bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
for m in \$(cat /etc/modules); do insmod /lib/modules/$kver/\$m; done
port=""
for i in \$(seq 1 200); do
  for p in /sys/class/virtio-ports/*; do
    [ "\$(cat "\$p/name" 2>/dev/null)" = org.qemu.guest_agent.0 ] && port=/dev/\${p##*/}
  done
  [ -n "\$port" ] && [ -e "\$port" ] && break
  sleep 0.1
done
[ -b /dev/vdb ] && mount -t ext4 /dev/vdb /mnt && echo "barge-guest: /dev/vdb on /mnt"
echo "barge-guest: qemu-ga on \$port"
while true; do
  qemu-ga -m virtio-serial -p "\$port" -F/etc/barge/fsfreeze-hook -t /run -f /run/qemu-ga.pid
  echo "barge-guest: qemu-ga exited (\$?)"
  sleep 1
done
INIT
cat >"$root/etc/barge/fsfreeze-hook" <<'HOOK'
#!/bin/sh
# qemu-ga runs this with "freeze" before freezing and "thaw" after thawing.
counter=/run/barge-hook-$1
n=$(( $(cat "$counter" 2>/dev/null || echo 0) + 1 ))
echo "$n" >"$counter"
text="barge-hook $1 $n"
echo "$text" >/dev/ttyS0
case "$1" in
  freeze) block=0; grep -q " /mnt " /proc/mounts && echo "$text" >"/mnt/barge-freeze-$n" ;;
  thaw) block=1 ;;
  *) exit 0 ;;
esac
[ -b /dev/vda ] && printf '%s\n' "$text" | dd of=/dev/vda bs=4096 seek=$block count=1 conv=sync,notrunc,fsync 2>/dev/null
exit 0
HOOK
chmod 755 "$root/init" "$root/etc/barge/fsfreeze-hook"

(cd "$root" && find . | "$bb" cpio -o -H newc -R 0:0 2>/dev/null | gzip -6) >initrd.img
cp x/boot/vmlinuz-"$kver" vmlinuz
chmod 644 vmlinuz initrd.img
mv vmlinuz "$out/vmlinuz"
mv initrd.img "$out/initrd.img"
echo "$kpkg" >"$out/kernel-package"
