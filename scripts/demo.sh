#!/usr/bin/env bash
# Sets up, builds and runs rdmachan-demo. Arguments are passed to the demo.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/setup.sh"
cmake -S "$root" -B "$root/build/demo" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DRDMACHAN_BUILD_TESTS=OFF >/dev/null
cmake --build "$root/build/demo" -j "$(nproc)" --target rdmachan-demo
exec "$root/build/demo/examples/rdmachan-demo" "$@"
