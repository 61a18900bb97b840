#!/usr/bin/env bash
# Packs the built gpu_soft_device_test with every shared library it loads (but the C library's
# own, which every Linux machine has) into one folder, for a GPU machine that has the CUDA driver
# but none of the project's Debian libraries. libstdc++ and libgcc_s go to fallback/: the
# machine's own are newer and are used unless they are missing.
#   tests/cuda/pack_gpu_check.sh BUILD_DIRECTORY DESTINATION
#   then, on the GPU machine: tests/cuda/run_gpu_check.sh DESTINATION OUTPUT_DIRECTORY
set -euo pipefail
build=${1:?usage: pack_gpu_check.sh BUILD_DIRECTORY DESTINATION}
destination=${2:?usage: pack_gpu_check.sh BUILD_DIRECTORY DESTINATION}
program="$build/tests/cuda/gpu_soft_device_test"
[ -x "$program" ] || { echo "pack_gpu_check: $program is not built (ninja rdmachan_gpu_soft_device_test)" >&2; exit 1; }
rm -rf "$destination"
mkdir -p "$destination/lib" "$destination/fallback"
cp "$program" "$destination/"
ldd "$program" | awk '/=> \// { print $3 }' | while read -r library; do
    case "$(basename "$library")" in
        libc.so.*|libm.so.*|libpthread.so.*|libdl.so.*|librt.so.*|ld-linux*) ;;
        libstdc++.so.*|libgcc_s.so.*) cp -L "$library" "$destination/fallback/" ;;
        *) cp -L "$library" "$destination/lib/" ;;
    esac
done
du -sh "$destination"
