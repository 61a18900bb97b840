#!/usr/bin/env bash
# Unpacks Debian 12's libboost1.81-dev headers into build/boost-1.81 without installing the
# package (it conflicts with the default 1.74 headers), so that tests/asio builds its suites
# against Boost 1.81 too (asio_test_boost_1_81: per-operation cancellation and deferred).
#   scripts/unpack_boost_1_81.sh [target folder]      (default: build/boost-1.81)
# Then re-run cmake on the build directory.
set -euo pipefail

source_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
target="${1:-$source_dir/build/boost-1.81}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

(cd "$work" && apt-get download libboost1.81-dev)
mkdir -p "$target"
dpkg -x "$work"/libboost1.81-dev_*.deb "$target"
grep -m1 '^#define BOOST_LIB_VERSION' "$target/usr/include/boost/version.hpp"
echo "Boost 1.81 headers in $target/usr/include"
