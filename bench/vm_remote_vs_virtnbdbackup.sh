#!/usr/bin/env bash
# A remote full backup over TLS, barge against virtnbdbackup's remote mode,
# on the same domain of a simulated hypervisor: a network namespace reached
# through a veth pair, running its own libvirtd (listening for TLS only,
# certificates made here by certtool; QEMU's backup exports with x509 TLS,
# client certificates verified) and its own sshd (virtnbdbackup's remote
# mode needs ssh to the host; keys made here). The namespace's hostname is
# its IP address, so libvirt reports a host other than this one and
# virtnbdbackup takes its remote path. Both tools talk to libvirt over
# qemu+tls:// and read the disk over NBD on TCP with TLS through the veth
# pair; both compress (barge zstd:1, its default; virtnbdbackup lz4, -z).
# virtnbdbackup runs first (it refuses checkpoints it did not make), then
# barge; the disk is in the page cache for both. Each output is restored
# (barge restore; virtnbdrestore in its remote mode) and compared with the
# domain's disk. Prints wall/CPU/RSS, bytes, the CPU the hypervisor's QEMU
# spent serving each, and the ratio next to the target (barge >= 2x
# faster). Exits non-zero only when something fails to run. virtnbdbackup
# runs as nobody: it has no flag for its NBD client certificates, and libnbd
# looks for them in /etc/pki/libnbd for root (not written here), in
# ~/.pki/libnbd for other users.
#
#   bench/vm_remote_vs_virtnbdbackup.sh [--size 4G] [--seed 1] [--workdir /var/tmp]
#                                       [--barge PATH] [--repeat N] [--background-load N]
#
# --repeat N: N fulls of each, taking turns (virtnbdbackup, barge, ...);
# the figures are medians. --background-load N: a second pass (the same
# fulls again) with N busy loops running during both tools' runs
# (bench/load.sh), labelled -loadN. barge's checkpoints are deleted before
# each virtnbdbackup run after the first (it refuses foreign ones).
# Needs root (ip netns, unshare), libvirtd, QEMU (TCG is enough), certtool,
# sshd, virtnbdbackup. Stops what it started by PID, deletes its namespace,
# veth pair and files on every exit path. --size 512M for a quick run.
CACHE=warm
SIZE=${SIZE:-4G}
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/load.sh"

usage() { sed -n '2,32p' "$0"; }

take_load_flag "$@"
parse_common_flags "${ARGS[@]}"
[ "$CACHE" = warm ] || die "--cache: only warm here (the hypervisor's QEMU reads the disk)"
need_tools setpriv virsh libvirtd qemu-img certtool ssh-keygen /usr/sbin/sshd ip unshare numfmt virtnbdbackup virtnbdrestore
[ "$(id -u)" = 0 ] || die "needs root (ip netns, unshare)"
make_workdir
chmod 755 "$WORK"

NS=hypervisor-$$
VETH=bhv$$
NET=10.232.$(( $$ % 250 ))
HOST_IP=$NET.1
NS_IP=$NET.2
# Ports of the NBD exports (one range each; checked free in the namespace,
# which is new and empty).
BARGE_PORTS=$(( 20000 + $$ % 10000 ))
VNB_PORT=$(( BARGE_PORTS + 10 ))
LIBVIRTD_PID="" SSHD_PID="" NS_MADE=0 DOMAIN=""
VIRSH=""

cleanup() {
  set +e
  stop_load
  if [ -n "$DOMAIN" ] && [ -n "$VIRSH" ]; then
    $VIRSH destroy "$DOMAIN" >/dev/null 2>&1
    $VIRSH undefine "$DOMAIN" --checkpoints-metadata >/dev/null 2>&1
  fi
  local pid
  for pid in $LIBVIRTD_PID $SSHD_PID; do kill "$pid" 2>/dev/null; done
  for pid in $LIBVIRTD_PID $SSHD_PID; do
    for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null
  done
  if [ "$NS_MADE" = 1 ]; then
    # Whatever is left in the namespace (QEMU, a qemu-nbd virtnbdrestore
    # started over ssh), by PID, then the namespace with its veth end.
    for pid in $(ip netns pids "$NS" 2>/dev/null); do kill -9 "$pid" 2>/dev/null; done
    ip netns del "$NS" 2>/dev/null
    ip link del "$VETH"a 2>/dev/null
  fi
  # The port leases' lock files barge made for this host.
  rm -f /run/lock/barge/nbd-ports/"$NS_IP"-* 2>/dev/null
  if [ "${BARGE_BENCH_KEEP:-0}" = 1 ]; then echo "kept $WORK" >&2; else rm -rf "$WORK"; fi
}
trap cleanup EXIT

print_machine
echo "uptime:     $(uptime)"
echo "virtnbdbackup: $(virtnbdbackup -V 2>&1 | tail -1)"
echo "libvirtd:   $(libvirtd --version)"

echo
echo "== network: namespace $NS, veth ${VETH}a ($HOST_IP) <-> ${VETH}b ($NS_IP)"
ip netns add "$NS"
NS_MADE=1
ip link add "$VETH"a type veth peer name "$VETH"b
ip link set "$VETH"b netns "$NS"
ip addr add "$HOST_IP/30" dev "$VETH"a
ip link set "$VETH"a up
ip netns exec "$NS" ip addr add "$NS_IP/30" dev "$VETH"b
ip netns exec "$NS" ip link set "$VETH"b up
ip netns exec "$NS" ip link set lo up

echo
echo "== certificates (certtool: CA, server for $NS_IP, client) and ssh keys"
PKI=$WORK/pki
mkdir -p "$PKI"
(
  cd "$PKI" || exit 2
  printf 'cn = bench CA\nca\ncert_signing_key\nexpiration_days = 2\n' > ca.info
  printf 'organization = barge bench\ncn = %s\nip_address = %s\ntls_www_server\nsigning_key\nencryption_key\nexpiration_days = 2\n' \
    "$NS_IP" "$NS_IP" > server.info
  printf 'organization = barge bench\ncn = client\ntls_www_client\nsigning_key\nencryption_key\nexpiration_days = 2\n' > client.info
  key="certtool -q --generate-privkey --key-type=rsa --bits=2048 --outfile"
  $key ca-key.pem 2>/dev/null
  certtool -q --generate-self-signed --load-privkey ca-key.pem --template ca.info --outfile ca-cert.pem 2>/dev/null
  for who in server client; do
    $key $who-key.pem 2>/dev/null
    certtool -q --generate-certificate --load-privkey $who-key.pem --load-ca-certificate ca-cert.pem \
      --load-ca-privkey ca-key.pem --template $who.info --outfile $who-cert.pem 2>/dev/null
  done
  # libvirt's file names (server in the namespace, client here), QEMU's
  # backup export (server), the NBD client's (barge --tls-certificates;
  # libnbd's default folder for virtnbdbackup, under its own HOME).
  mkdir libvirt-server libvirt-client qemu-server nbd-client
  cp ca-cert.pem libvirt-server/cacert.pem; cp server-cert.pem libvirt-server/servercert.pem
  cp server-key.pem libvirt-server/serverkey.pem
  cp ca-cert.pem libvirt-client/cacert.pem; cp client-cert.pem libvirt-client/clientcert.pem
  cp client-key.pem libvirt-client/clientkey.pem
  cp ca-cert.pem server-cert.pem server-key.pem qemu-server/
  cp ca-cert.pem client-cert.pem client-key.pem nbd-client/
  chmod 600 nbd-client/client-key.pem libvirt-client/clientkey.pem
)
# virtnbdbackup has no flag for the NBD client's certificates: libnbd
# takes /etc/pki/libnbd for root, ~/.pki/libnbd for anyone else. So it runs
# as $VNB_USER with a HOME of its own: its ssh key (paramiko reads ~/.ssh),
# the client certificates in ~/.pki/libnbd, libvirt's in ~/pki.
VNB_USER=nobody
VNB_HOME=$WORK/vnbhome
mkdir -p "$VNB_HOME/.ssh" "$VNB_HOME/.pki"
chmod 700 "$VNB_HOME/.ssh"
cp -r "$PKI/nbd-client" "$VNB_HOME/.pki/libnbd"
cp -r "$PKI/libvirt-client" "$VNB_HOME/pki"
SSHD_DIR=$WORK/sshd
mkdir -p "$SSHD_DIR"
chmod 700 "$SSHD_DIR"
ssh-keygen -q -t ed25519 -N '' -f "$SSHD_DIR/host_key"
ssh-keygen -q -t ed25519 -N '' -f "$VNB_HOME/.ssh/id_ed25519"
cp "$VNB_HOME/.ssh/id_ed25519.pub" "$SSHD_DIR/authorized_keys"
chown -R "$VNB_USER:" "$VNB_HOME"

echo
echo "== sshd and libvirtd in $NS (libvirtd: its own mount and UTS namespaces, hostname $NS_IP)"
mkdir -p /run/sshd   # the privilege separation folder sshd checks for
cat > "$SSHD_DIR/sshd_config" <<EOF
ListenAddress $NS_IP
Port 22
HostKey $SSHD_DIR/host_key
PidFile $SSHD_DIR/sshd.pid
AuthorizedKeysFile $SSHD_DIR/authorized_keys
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
Subsystem sftp internal-sftp
EOF
ip netns exec "$NS" /usr/sbin/sshd -D -f "$SSHD_DIR/sshd_config" -E "$SSHD_DIR/sshd.log" </dev/null &
SSHD_PID=$!

LV=$WORK/libvirt
for sub in etc run lib lib/qemu log; do mkdir -p "$LV/$sub"; done
cat > "$LV/etc/libvirtd.conf" <<EOF
listen_tls = 1
listen_tcp = 0
listen_addr = "$NS_IP"
key_file = "$PKI/libvirt-server/serverkey.pem"
cert_file = "$PKI/libvirt-server/servercert.pem"
ca_file = "$PKI/libvirt-server/cacert.pem"
log_outputs = "3:file:$LV/log/libvirtd.log"
EOF
cat > "$LV/etc/qemu.conf" <<EOF
user = "root"
group = "root"
stdio_handler = "file"
backup_tls_x509_cert_dir = "$PKI/qemu-server"
backup_tls_x509_verify = 1
EOF
# Every step execs: $! is libvirtd's own PID.
env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin ip netns exec "$NS" unshare -m -u --propagation private sh -c "
  hostname $NS_IP &&
  mount --bind $LV/etc /etc/libvirt && mount --bind $LV/run /run/libvirt &&
  mount --bind $LV/lib /var/lib/libvirt && mount --bind $LV/log /var/log/libvirt &&
  exec libvirtd --listen -f $LV/etc/libvirtd.conf -p $LV/libvirtd.pid" > "$LV/daemon.out" 2>&1 </dev/null &
LIBVIRTD_PID=$!

URI="qemu+tls://$NS_IP/system?pkipath=$PKI/libvirt-client"
VIRSH="timeout 120 virsh -q -c $URI"
for i in $(seq 400); do
  $VIRSH version >/dev/null 2>&1 && break
  kill -0 "$LIBVIRTD_PID" 2>/dev/null || die "libvirtd in $NS exited: $(cat "$LV/daemon.out"; tail -5 "$LV/log/libvirtd.log" 2>/dev/null)"
  [ "$i" -lt 400 ] || die "libvirtd in $NS not answering over TLS"
  sleep 0.3
done
for i in $(seq 100); do
  (exec 3<>"/dev/tcp/$NS_IP/22") 2>/dev/null && break
  [ "$i" -lt 100 ] || die "sshd in $NS not listening: $(cat "$SSHD_DIR/sshd.log")"
  sleep 0.1
done
echo "libvirtd:   pid $LIBVIRTD_PID, $URI, hostname '$($VIRSH hostname)'"
echo "sshd:       pid $SSHD_PID, root@$NS_IP:22 (key only)"

echo
echo "== disk and domain"
RAW=$WORK/disk.raw
DISK=$WORK/disk.qcow2
"$BARGE" bench generate --size "$SIZE" --seed "$SEED" "$RAW"
echo "allocated:  $(du -B1 "$RAW" | cut -f1) bytes of $(stat -c %s "$RAW")"
qemu-img convert -f raw -O qcow2 "$RAW" "$DISK"
rm -f "$RAW"
echo "qcow2:      $(stat -c %s "$DISK") bytes"
DOMAIN=barge-bench-remote-$$
cat > "$WORK/domain.xml" <<EOF
<domain type='qemu'><name>$DOMAIN</name><memory unit='MiB'>64</memory><vcpu>1</vcpu>
<os><type arch='x86_64' machine='pc'>hvm</type></os><devices>
<disk type='file' device='disk'><driver name='qemu' type='qcow2'/><source file='$DISK'/><target dev='vda' bus='virtio'/></disk>
</devices></domain>
EOF
$VIRSH define "$WORK/domain.xml" >/dev/null
$VIRSH start "$DOMAIN" --paused >/dev/null
echo "domain:     $DOMAIN on $NS_IP, paused, TCG"
QEMU_PID=$(cat "$LV/run/qemu/$DOMAIN.pid")
# CPU seconds the hypervisor's QEMU (the NBD server, encrypting) has used.
qemu_cpu() {
  awk -v hz="$(getconf CLK_TCK)" '{ printf "%.2f\n", ($14 + $15) / hz }' "/proc/$QEMU_PID/stat"
}
# server_cpu LABEL BEFORE: QEMU's CPU seconds since BEFORE, printed and kept.
server_cpu() {
  local used
  used=$(awk -v a="$(qemu_cpu)" -v b="$2" 'BEGIN { printf "%.2f", a - b }')
  echo "$used" >> "$WORK/server-$1"
  echo "    (the hypervisor's QEMU, serving it: cpu ${used}s)"
}

OUT_V=$WORK/out-v
OUT_B=$WORK/out-b
CATALOG=$WORK/catalog.db
SCRATCH=$WORK/scratch
mkdir -p "$SCRATCH"
# virtnbdbackup asks for --user/--password with any qemu+ URI but ssh's;
# the daemon asks for none (TLS client certificates), so these are unused.
VNB_URI="qemu+tls://$NS_IP/system?pkipath=$VNB_HOME/pki"
# (TMPDIR: virtnbdrestore leaves its qemu-nbd pid and log files there.)
mkdir -p "$VNB_HOME/tmp"
chown "$VNB_USER:" "$VNB_HOME/tmp"
AS_VNB=(setpriv --reuid "$VNB_USER" --regid "$(id -g "$VNB_USER")" --clear-groups
        env HOME="$VNB_HOME" TMPDIR="$VNB_HOME/tmp")
VNB=("${AS_VNB[@]}" virtnbdbackup -U "$VNB_URI" --user bench --password unused --ssh-user root
     -d "$DOMAIN" -l full -z -n --tls -P "$VNB_PORT" -S "$SCRATCH")
BARGE_ARGS=(vm backup --domain "$DOMAIN" --skip-quiesce --catalog "$CATALOG" --connect "$URI"
            --scratch-dir "$SCRATCH" --tls-certificates "$PKI/nbd-client" --nbd-port-range "$BARGE_PORTS-$((BARGE_PORTS + 3))")

echo
echo "== runs (remote full backup over TLS; virtnbdbackup first)"
for load in $(load_levels); do
sfx=$(load_suffix "$load")
for run in $(runs); do
  if [ "$load" -gt 0 ] || [ "$run" -gt 1 ]; then
    # virtnbdbackup refuses checkpoints it did not make ("Foreign
    # checkpoint"): barge's of the runs before go first (metadata only;
    # every run of each tool is a full).
    for cp in $($VIRSH checkpoint-list "$DOMAIN" --name 2>/dev/null | grep -v '^virtnbdbackup'); do
      $VIRSH checkpoint-delete "$DOMAIN" "$cp" --metadata >/dev/null
    done
  fi
  echo " [run $run, $load busy loops]"
  warm_cache "$DISK"; sync
  rm -rf "$OUT_V"
  mkdir "$OUT_V"
  chown "$VNB_USER:" "$OUT_V"
  start_load "$load"
  before=$(qemu_cpu)
  measure_written "virtnbdbackup-remote-full$sfx" warm "$OUT_V" -- "${VNB[@]}" -o "$OUT_V"
  server_cpu "virtnbdbackup$sfx" "$before"
  stop_load
  grep -q "Connected to remote host: \[$NS_IP\]" "$OUT_V"/backup.full.*.log ||
    die "virtnbdbackup did not take its remote path: $(grep -m3 -i 'remote\|local' "$OUT_V"/backup.full.*.log)"
  grep -q "nbds://$NS_IP:$VNB_PORT" "$OUT_V"/backup.full.*.log ||
    die "virtnbdbackup did not read over NBD with TLS: $(grep -m3 'nbd' "$OUT_V"/backup.full.*.log)"

  warm_cache "$DISK"; sync
  rm -rf "$OUT_B"
  mkdir "$OUT_B"
  "$BARGE" tracker create "t$run$sfx" --domain "$DOMAIN" --connect "$URI" --catalog "$CATALOG" >/dev/null
  start_load "$load"
  before=$(qemu_cpu)
  measure_written "barge-remote-full$sfx" warm "$OUT_B" -- "$BARGE" "${BARGE_ARGS[@]}" --tracker "t$run$sfx" --target "$OUT_B" --json
  server_cpu "barge$sfx" "$before"
  stop_load
  grep -q '"backup_type":"full"' "$WORK/barge-remote-full$sfx.log" ||
    die "barge's backup was not a full: $(grep -m1 '"result"' "$WORK/barge-remote-full$sfx.log")"
  grep -q '"transport":"tls"' "$WORK/barge-remote-full$sfx.log" ||
    die "barge did not read over TLS: $(grep -m1 '"result"' "$WORK/barge-remote-full$sfx.log")"
done
done

echo
echo "== restores compared with the domain's disk"
# barge: its chain restored to a raw file.
"$BARGE" restore "$OUT_B/$DOMAIN/vda" --to "$WORK/restored-b.raw" --force >/dev/null
qemu-img compare -U -q -f raw -F qcow2 "$WORK/restored-b.raw" "$DISK" ||
  die "barge's restore differs from the disk"
echo "barge:         restored image = disk (qemu-img compare)"
rm -f "$WORK/restored-b.raw"
# virtnbdbackup: virtnbdrestore in its remote mode (the same libvirt URI and
# ssh; it starts qemu-nbd on the hypervisor over ssh and writes through it,
# here plain NBD over the veth pair: only the bytes matter).
# (It makes the output folder on the hypervisor over sftp: not made here.)
"${AS_VNB[@]}" virtnbdrestore -U "$VNB_URI" --user bench --password unused --ssh-user root \
  -P "$((VNB_PORT + 1))" -n -i "$OUT_V" -o "$WORK/restored-v" -L "$VNB_HOME/virtnbdrestore.log" > "$WORK/virtnbdrestore.out" 2>&1 ||
  die "virtnbdrestore failed: $(tail -40 "$WORK/virtnbdrestore.out")"
RESTORED_V=$WORK/restored-v/$(basename "$DISK")
[ -f "$RESTORED_V" ] || die "virtnbdrestore wrote no $RESTORED_V: $(ls "$WORK/restored-v")"
# The qemu-nbd it started on the hypervisor still runs, with the qcow2's
# metadata in its cache: stopped by its PID (a clean close writes it out).
for f in "$VNB_HOME"/tmp/qemu-nbd-restore*.pid; do
  [ -s "$f" ] || continue
  pid=$(cat "$f")
  kill "$pid" 2>/dev/null || true
  for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
done
qemu-img compare -U -F qcow2 "$RESTORED_V" "$DISK" > "$WORK/compare-v.out" 2>&1 ||
  die "virtnbdbackup's restore differs from the disk: $(cat "$WORK/compare-v.out"; qemu-img info "$RESTORED_V")"
echo "virtnbdbackup: restored image = disk (virtnbdrestore, qemu-img compare)"
rm -rf "$WORK/restored-v"

print_results

echo
echo "== ratio and target (virtnbdbackup wall / barge wall; bytes = every file written into the backup folder)"
for load in $(load_levels); do
sfx=$(load_suffix "$load")
echo " [$load busy loops]"
r=$(ratio "$(get "virtnbdbackup-remote-full$sfx" warm wall)" "$(get "barge-remote-full$sfx" warm wall)")
echo "  remote full over TLS: barge ${r}x faster   (target >= 2x: $(verdict "$r" '>=' 2))"
echo "  bytes: barge/virtnbdbackup = $(ratio "$(get "barge-remote-full$sfx" warm bytes)" "$(get "virtnbdbackup-remote-full$sfx" warm bytes)")" \
     "($(get "barge-remote-full$sfx" warm bytes) / $(get "virtnbdbackup-remote-full$sfx" warm bytes))"
echo "  cpu:   barge $(get "barge-remote-full$sfx" warm cpu) s, virtnbdbackup $(get "virtnbdbackup-remote-full$sfx" warm cpu) s" \
     "(client only); the hypervisor's QEMU serving them:" \
     "barge $(sort -g "$WORK/server-barge$sfx" | paste -sd/) s, virtnbdbackup $(sort -g "$WORK/server-virtnbdbackup$sfx" | paste -sd/) s" \
     "(on one machine it shares the same cores)"
done
echo "  uptime at the end: $(uptime)"
echo "  barge: zstd:1 (its default), xxh3 digests, fdatasync; virtnbdbackup: lz4 (-z), stream format, --tls"
