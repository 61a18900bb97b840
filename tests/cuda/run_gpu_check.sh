#!/usr/bin/env bash
# The GPU check, on a machine with an NVIDIA GPU: gpu_soft_device_test (a CUDA kernel posting
# through the mlx5 data path into rings the software device executes) over the same-host path
# and over TCP, then once under compute-sanitizer's memcheck. Takes the folder
# pack_gpu_check.sh made; writes each run's output to OUTPUT_DIRECTORY and prints it.
#   tests/cuda/run_gpu_check.sh PACKED_FOLDER OUTPUT_DIRECTORY
set -uo pipefail
packed=$(cd "${1:?usage: run_gpu_check.sh PACKED_FOLDER OUTPUT_DIRECTORY}" && pwd)
output=${2:?usage: run_gpu_check.sh PACKED_FOLDER OUTPUT_DIRECTORY}
mkdir -p "$output"
program="$packed/gpu_soft_device_test"
export LD_LIBRARY_PATH="$packed/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
# The loader's own failure (a library or symbol version missing) is exit 127; the program's
# answer to an unknown option is 2.
"$program" --loader-check >/dev/null 2>&1
if [ $? -eq 127 ]; then
    echo "run_gpu_check: the machine's libstdc++ or libgcc_s does not serve the program; using the packed ones"
    export LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$packed/fallback"
fi
ldd "$program" | grep "not found" && { echo "run_gpu_check: libraries missing"; exit 1; }

nvidia-smi -L 2>&1 | tee "$output/gpu.txt"
status=0
run() {
    local name=$1
    shift
    echo "== $name: $*"
    timeout 150 "$@" >"$output/$name.txt" 2>&1
    local code=$?
    cat "$output/$name.txt"
    echo "== $name: exit $code"
    [ "$code" -eq 0 ] || status=1
}
run same_host "$program" auto
run tcp "$program" tcp
run host_poster "$program" --host-poster
if command -v compute-sanitizer >/dev/null 2>&1; then
    run memcheck compute-sanitizer --tool memcheck --error-exitcode 3 "$program" auto
else
    echo "run_gpu_check: compute-sanitizer is not installed: memcheck not run"
fi
exit "$status"
