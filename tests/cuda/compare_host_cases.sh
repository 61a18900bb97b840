#!/usr/bin/env bash
# Runs the g++ and the nvcc build of the host cases and compares what they wrote byte for byte.
#   compare_host_cases.sh GXX-BINARY NVCC-BINARY
set -euo pipefail
gxx=${1:?usage: compare_host_cases.sh GXX-BINARY NVCC-BINARY}
nvcc=${2:?usage: compare_host_cases.sh GXX-BINARY NVCC-BINARY}
out=$(mktemp -d); trap 'rm -rf "$out"' EXIT
"$gxx" "$out/gxx.bin"
"$nvcc" "$out/nvcc.bin"
size=$(stat -c %s "$out/gxx.bin")
# A run that wrote (almost) nothing would compare equal: the cases write about 450 KB.
if [ "$size" -lt 100000 ]; then echo "the g++ build wrote only $size bytes"; exit 1; fi
if ! cmp "$out/gxx.bin" "$out/nvcc.bin"; then
    echo "the nvcc build's WQEs, doorbell records or completions differ from the g++ build's"
    exit 1
fi
echo "host cases: g++ and nvcc builds wrote the same $size bytes ($(grep -ac '^post 0 1' "$out/gxx.bin") single posts accepted)"
