#!/usr/bin/env bash
# The whole test suite, from a fresh Debian 12 machine:
#   1. install missing packages (build, oracles, peers),
#   2. release build + every test (unit and integration against qemu-img,
#      qemu-nbd, nbdkit); missing tools fail instead of skipping,
#   3. clang AddressSanitizer + UBSan build of what that stage runs (no
#      integration or reliability test): unit tests, then each fuzz
#      target for a short fixed time on its seed corpus.
# BARGE_FUZZ_SECONDS (default 20) sets the time per fuzz target.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/deps.sh" test
export BARGE_REQUIRE_TOOLS=1
# ccache (when installed): objects shared with other checkouts (scripts/build.sh).
export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$root} CCACHE_NOHASHDIR=${CCACHE_NOHASHDIR:-1}
jobs=$(nproc)

# The libvirt tests share one libvirtd across their processes (tests/
# vm_libvirt_env.cc starts it when none runs); the suite stops the one it
# started, by its PID, however it ends.
libvirtd_before=$(pgrep -x libvirtd || true)
stop_test_libvirtd() {
  if [ -z "$libvirtd_before" ] && [ -s /var/run/libvirtd.pid ]; then
    kill "$(cat /var/run/libvirtd.pid)" 2>/dev/null || true
  fi
}
trap stop_test_libvirtd EXIT

echo "== release build and tests"
BARGE_BUILD_DIR="$root/build" "$root/scripts/build.sh"
(cd "$root/build" && ctest -j "$jobs" --output-on-failure --timeout 900)

echo "== sanitizer build (ASan+UBSan) and fuzzing"
asan="$root/build-asan"
CC=clang CXX=clang++ cmake -S "$root" -B "$asan" -G Ninja -DCMAKE_BUILD_TYPE=Debug \
  -DBARGE_SANITIZE=ON -DBARGE_FUZZ=ON -DBARGE_BENCH=OFF -DBARGE_INTEGRATION_TESTS=OFF >/dev/null
cmake --build "$asan" -j "$jobs"
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=0
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
(cd "$asan" && ctest -j "$jobs" -L unit --output-on-failure --timeout 900)
"$root/fuzz/run.sh" "$asan" "${BARGE_FUZZ_SECONDS:-20}"
echo "== all tests passed"
