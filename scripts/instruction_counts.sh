#!/usr/bin/env bash
# Instruction counts, two levels, each built in a Release (-O3) build directory and run under
# callgrind counting only the measured_* functions on the calling thread:
#   - the raw mlx5 data path (mlx5_data_path_benchmark: SendQueue::post, CompletionQueue::poll);
#   - through the public API (channel_instruction_benchmark: Channel::post_write and a 16-write
#     WorkBatch down to the doorbell, and PendingWork::poll delivering the completion, through
#     the engine, the provider and the real resolver, on the software device);
#   - libmlx5's own ibv_post_send and ibv_poll_cq for the same two rows (libmlx5_instruction_benchmark:
#     Debian's libibverbs and libmlx5 as installed, over a fake uverbs device), printed beside the
#     API's figures;
#   - the poller over compressed CQE sessions beside the same completions uncompressed
#     (mlx5_compressed_poll_benchmark; libmlx5 has no decoder of compressed CQEs to compare with:
#     its poll of 16 uncompressed completions is the libmlx5 table's poll column).
# Prints the markdown tables that docs/PERFORMANCE.md quotes.
#   scripts/instruction_counts.sh [build-dir]     (default: build-perf-o3)
set -euo pipefail

source_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build_dir="${1:-build-perf-o3}"
operations="${OPERATIONS:-1000000}"

"$source_dir/scripts/setup.sh" >/dev/null  # valgrind among the rest

"$source_dir/scripts/build_release.sh" "$build_dir" mlx5_data_path_benchmark
"$source_dir/scripts/build_release.sh" "$build_dir" channel_instruction_benchmark
"$source_dir/scripts/build_release.sh" "$build_dir" libmlx5_instruction_benchmark
"$source_dir/scripts/build_release.sh" "$build_dir" mlx5_compressed_poll_benchmark
libmlx5_benchmark="$build_dir/tests/libmlx5/libmlx5_instruction_benchmark"
benchmark="$build_dir/tests/mlx5/mlx5_data_path_benchmark"
api_benchmark="$build_dir/tests/channel/channel_instruction_benchmark"
api_operations="${API_OPERATIONS:-2000}"

out_dir="$(mktemp -d)"
trap 'rm -rf "$out_dir"' EXIT
# Collection is off except inside the measured_* functions (one post or poll call each); the
# benchmark dumps the counters after each row.
valgrind --tool=callgrind --collect-atstart=no --toggle-collect='*measured_*' \
    --callgrind-out-file="$out_dir/callgrind.out" "$benchmark" --operations "$operations" \
    2>"$out_dir/valgrind.log" || { cat "$out_dir/valgrind.log" >&2; exit 1; }

echo "compiler: $(${CXX:-c++} --version | head -n 1); build type Release ($(grep -m1 '^CMAKE_CXX_FLAGS_RELEASE' "$build_dir/CMakeCache.txt" | cut -d= -f2)); $(valgrind --version)"
echo
"$benchmark" --table "$out_dir/callgrind.out"

# The public API: the software device's thread runs too, but never enters a measured function.
# Uncompressed names and positions: the table reads the inclusive cost of the calls into the
# software device's doorbell (the device's work, not the library's) and shows it apart.
valgrind --tool=callgrind --collect-atstart=no --toggle-collect='*measured_*' \
    --compress-strings=no --compress-pos=no --callgrind-out-file="$out_dir/api.out" "$api_benchmark" --operations "$api_operations" \
    2>"$out_dir/api-valgrind.log" || { cat "$out_dir/api-valgrind.log" >&2; exit 1; }

# libmlx5's post and poll, counted the same way.
valgrind --tool=callgrind --collect-atstart=no --toggle-collect='*measured_*' \
    --callgrind-out-file="$out_dir/libmlx5.out" "$libmlx5_benchmark" --operations "$api_operations" \
    2>"$out_dir/libmlx5-valgrind.log" || { cat "$out_dir/libmlx5-valgrind.log" >&2; exit 1; }
read -r -a libmlx5_totals <<<"$("$libmlx5_benchmark" --totals "$out_dir/libmlx5.out")"
echo
"$api_benchmark" --table "$out_dir/api.out" --libmlx5 "${libmlx5_totals[@]}"
echo
"$libmlx5_benchmark" --table "$out_dir/libmlx5.out"

# The poller over compressed sessions, counted the same way.
compressed_benchmark="$build_dir/tests/mlx5/mlx5_compressed_poll_benchmark"
valgrind --tool=callgrind --collect-atstart=no --toggle-collect='*measured_*' \
    --callgrind-out-file="$out_dir/compressed.out" "$compressed_benchmark" --operations 20480 \
    >"$out_dir/compressed.log" 2>&1 || { cat "$out_dir/compressed.log" >&2; exit 1; }
echo
"$compressed_benchmark" --table "$out_dir/compressed.out" | tee "$out_dir/compressed.table"
# Target: a completion from a compressed session costs fewer instructions than a plain one,
# 16 per poll.
awk -F'|' '/uncompressed \(per completion\)/ { plain = $3 + 0 } /from sessions of 64 \(per completion\)/ { compressed = $3 + 0 }
    END {
        if (plain > 0 && compressed > 0)
            printf "\nCompressed against plain, 16 per poll: %.2fx the instructions per completion; target below 1x: %s.\n",
                   compressed / plain, compressed < plain ? "met" : "missed"
    }' "$out_dir/compressed.table"
