#!/usr/bin/env bash
# Sets up, builds and runs rdmachan-demo. Arguments are passed to the demo.
# Only what the demo needs: the build packages (no test, VM or fuzzing tools), then the library
# and the demo alone, in Release.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/setup.sh" --build-only
cmake -S "$root" -B "$root/build/demo" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DRDMACHAN_BUILD_TESTS=OFF >/dev/null
cmake --build "$root/build/demo" -j "$(nproc)" --target rdmachan-demo
exec "$root/build/demo/examples/rdmachan-demo" "$@"
