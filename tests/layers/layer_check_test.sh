#!/usr/bin/env bash
# The layer check fails where it must: in a scratch tree holding docs/ARCHITECTURE.md's layer
# table, includes that follow it pass, and an upward include (common/ into the channel core) and
# a sideways one (handshake/ into the transport) each fail, named by file and line.
#   layer_check_test.sh PROJECT-ROOT
set -euo pipefail
root="$1"
scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
check() { python3 "$root/scripts/check_layers.py" --root "$scratch"; }
fail() { echo "layer_check_test: $1"; echo "--- output of the check:"; cat "$scratch/output"; exit 1; }

mkdir -p "$scratch/docs" "$scratch/common" "$scratch/src" "$scratch/handshake" "$scratch/transport/soft" \
    "$scratch/include/rdmachan"
cp "$root/docs/ARCHITECTURE.md" "$scratch/docs/"
printf '#pragma once\n' >"$scratch/include/rdmachan/error.hpp"
printf '#pragma once\n#include "rdmachan/error.hpp"\n' >"$scratch/common/logger.hpp"
printf '#include "common/logger.hpp"\n#include "transport/device_interface.hpp"\n' >"$scratch/transport/soft/device.cpp"
printf '#pragma once\n' >"$scratch/transport/device_interface.hpp"
printf '#include "handshake/frame.hpp"\n#include "transport/device_interface.hpp"\n#include <vector>\n' >"$scratch/src/engine.cpp"
printf '#pragma once\n#include "common/logger.hpp"\n' >"$scratch/handshake/frame.hpp"
check >"$scratch/output" 2>&1 || fail "includes that follow the table were refused"

printf '#pragma once\n#include <atomic>\n#include "src/engine.hpp"\n' >"$scratch/common/planted.hpp"
printf '#include "handshake/frame.hpp"\n#include "transport/soft/device.hpp"\n' >"$scratch/handshake/planted.cpp"
status=0
check >"$scratch/output" 2>&1 || status=$?
[ "$status" -eq 1 ] || fail "exit status $status for two wrong includes, expected 1"
grep -q '^common/planted.hpp:3: #include "src/engine.hpp" reaches into src/ from common/' "$scratch/output" ||
    fail "the upward include from common/ was not named by file and line"
grep -q '^handshake/planted.cpp:2: #include "transport/soft/device.hpp" reaches into transport/soft/ from handshake/' \
    "$scratch/output" || fail "the include from handshake/ into the transport was not named by file and line"
[ "$(grep -c 'reaches into' "$scratch/output")" -eq 2 ] || fail "expected exactly the two planted includes refused"
echo "layer_check_test: includes along the table pass; the planted upward and sideways includes fail, named by line"
