#!/usr/bin/env bash
# Configures and builds barge into build/ (release with debug info).
#   scripts/build.sh [extra cmake args]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${BARGE_BUILD_DIR:-$root/build}
# ccache (when installed) shares objects between checkouts of the tree:
# paths relative to the checkout, the build folder's name not hashed.
export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$root} CCACHE_NOHASHDIR=${CCACHE_NOHASHDIR:-1}
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo "$@" >/dev/null
cmake --build "$build" -j "$(nproc)"
