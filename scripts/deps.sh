#!/usr/bin/env bash
# Installs the Debian packages barge needs, only those missing.
#   scripts/deps.sh build   # compiler, libraries
#   scripts/deps.sh demo    # build + qemu-img (the demo shows qemu's view too)
#   scripts/deps.sh test    # demo + every oracle and peer the tests use
set -euo pipefail
profile=${1:-test}

build_pkgs=(cmake ninja-build g++ pkg-config libtbb-dev libzstd-dev libxxhash-dev
  libnbd-dev libgnutls28-dev libcurl4-openssl-dev libvirt-dev liburing-dev zlib1g-dev libssl-dev libsqlite3-dev
  nlohmann-json3-dev libcli11-dev libgtest-dev libbenchmark-dev libyaml-cpp-dev
  # barge serve: prometheus-cpp's Exposer (/metrics) on civetweb, whose C
  # API answers /healthz.
  prometheus-cpp-dev libcivetweb-dev
  # nbdkit-barge-plugin.so (nbdkit/): nbdkit-plugin.h; barge export runs nbdkit.
  nbdkit-plugin-dev nbdkit)
demo_pkgs=(qemu-utils)
test_pkgs=(clang libclang-rt-14-dev libnbd-bin nbdkit zstd xxhash util-linux time
  qemu-system-x86 libvirt-daemon libvirt-daemon-driver-qemu libvirt-clients
  e2fsprogs xz-utils gzip
  # tests/vm_remote_ssh_test.cc: an sshd of the test's own, ssh and
  # ssh-keygen; libvirt-daemon's virt-ssh-helper is libvirt's remote end.
  openssh-server openssh-client
  # promtool tests the shipped alerting rules (deploy/prometheus/); the
  # server scrapes barge serve in tests/policy_serve_test.cc.
  prometheus
  # tests/json_schema_test.py validates every command's --json output
  python3 python3-jsonschema
  # man and groff render `barge man` in its test (bash runs the completion's)
  man-db groff-base bash
  # systemd-analyze verifies deploy/systemd/ (works without systemd running).
  systemd
  # bench/export_vs_qemu_nbd.sh: fio's nbd engine for random reads.
  fio
  # qemu-ga's libraries: tests/guest/make_guest.sh copies them from the host
  # into the quiesce test's guest (kernel, busybox and qemu-ga themselves are
  # fetched with `apt-get download`, never installed).
  libglib2.0-0 libnuma1 liburing2 libudev1 libpcre2-8-0
  # NBD over TLS: certtool makes the CA, certificates and keys of
  # tests/nbd_tls_cli_test.cc and bench/nbd_tls.sh; ip (netns, veth) puts
  # the bench's server on another "host".
  gnutls-bin iproute2
  # tests/http_source_test.cc: a real web server with byte ranges, HTTP and
  # HTTPS (certtool certificate), basic auth (openssl passwd).
  nginx-light openssl
  # tests/slurm_fleet_test.cc: a real Slurm on one machine (munged,
  # slurmctld, slurmd) runs deploy/slurm/barge-array.sbatch; python3-yaml
  # reads deploy/kubernetes/ in tests/deploy_kubernetes_check.py.
  slurm-wlm munge python3-yaml
  # bench/digest_incremental.sh and bench/shared_base.sh (issue 23): the
  # peers measured in the same run.
  restic borgbackup
  # bench/vm_remote_vs_virtnbdbackup.sh (issue 41): virtnbdbackup's remote
  # mode; bench/http_source.sh (issue 39): qemu-img's curl block driver.
  virtnbdbackup qemu-block-extra
  # tests/s3_client_test.cc, tests/s3_source_test.cc (issue 38): a real Ceph
  # radosgw on one machine (mon + osd on memstore + rgw,
  # tests/testing/radosgw.cc) and the AWS CLI as the second client.
  ceph-mon ceph-osd radosgw ceph-common awscli
  # tests/status_page_test.cc: headless Chromium loads serve's status page
  # (issue 42): its DOM and a screenshot.
  chromium)

pkgs=("${build_pkgs[@]}")
case "$profile" in
  build) ;;
  demo) pkgs+=("${demo_pkgs[@]}") ;;
  test) pkgs+=("${demo_pkgs[@]}" "${test_pkgs[@]}") ;;
  *) echo "usage: $0 build|demo|test" >&2; exit 2 ;;
esac

missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "barge: installing ${missing[*]}" >&2
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo=sudo
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
