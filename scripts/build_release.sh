#!/usr/bin/env bash
# Configures a Release (-O3) build in BUILD_DIR and builds one target; on failure prints the
# build's output and exits non-zero, so the measuring scripts never measure a stale binary.
#   scripts/build_release.sh BUILD_DIR TARGET
set -euo pipefail
source_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build_dir=$1
target=$2
log="$(mktemp)"
trap 'rm -f "$log"' EXIT
if ! { cmake -S "$source_dir" -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release &&
       cmake --build "$build_dir" --target "$target" -j 2; } >"$log" 2>&1; then
    cat "$log" >&2
    echo "build_release.sh: building $target in $build_dir failed (log above)" >&2
    exit 1
fi
