#!/usr/bin/env bash
# Installs everything rdmachan needs to build and test, from Debian/Ubuntu packages.
# Idempotent: packages already present are not reinstalled, and the package lists are
# refreshed only when something is missing.
#   scripts/setup.sh [--build-only] [PACKAGE...]
#     --build-only   only what building the library and its programs needs (scripts/demo.sh):
#                    no test, VM or fuzzing tools
#     PACKAGE...     extra packages, for the tools that need more (the measuring scripts:
#                    gnuplot-nox, ucx-utils)
set -euo pipefail

build_only=0
if [ "${1:-}" = "--build-only" ]; then
    build_only=1
    shift
fi

packages=(
    build-essential cmake ninja-build pkg-config git
    libibverbs-dev rdma-core ibverbs-providers
    libboost-dev nlohmann-json3-dev libspdlog-dev libfmt-dev libcli11-dev libssl-dev
    doctest-dev
    # The PMIx bootstrap (optional in the build: without it, reported unavailable).
    libpmix-dev
)
if [ "$build_only" -eq 0 ]; then
    packages+=(
        iproute2 valgrind clang python3
        # mpirun (Open MPI, a PMIx launcher): the PMIx bootstrap's tests and the demo under it.
        openmpi-bin
        # A stuck mpirun job's stacks, printed by tests/pmix/run_replacement_mpirun.sh.
        gdb
        # etcd, which the membership store's tests start one of per case (tests/handshake/etcd_process.hpp).
        etcd-server
        # The soft-RoCE VM tests (tests/vm): qemu boots Debian's kernel with an initramfs of ours.
        qemu-system-x86 busybox-static cpio kmod xz-utils
    )
fi
packages+=("$@")

if [ "$(id -u)" -eq 0 ]; then
    as_root=()
elif command -v sudo >/dev/null 2>&1; then
    as_root=(sudo)
else
    echo "setup: need root or sudo to install: ${packages[*]}" >&2
    exit 1
fi

missing=()
for package in "${packages[@]}"; do
    if ! dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed"; then
        missing+=("$package")
    fi
done

if [ "${#missing[@]}" -gt 0 ]; then
    echo "setup: installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    "${as_root[@]}" apt-get update -qq
    "${as_root[@]}" apt-get install -y -qq -o DPkg::Lock::Timeout=300 --no-install-recommends "${missing[@]}"
else
    echo "setup: all build and test dependencies are installed"
fi

# libFuzzer's and Clang's sanitizer runtimes (the fuzz targets, the Clang sanitizer build): their
# own package on Debian 12; on releases where clang ships them, the package does not exist and
# nothing is needed.
[ "$build_only" -eq 1 ] && exit 0
if ! dpkg-query -W -f='${Status}' libclang-rt-dev 2>/dev/null | grep -q "install ok installed"; then
    export DEBIAN_FRONTEND=noninteractive
    if ! apt-cache show libclang-rt-dev >/dev/null 2>&1; then "${as_root[@]}" apt-get update -qq; fi
    if apt-cache show libclang-rt-dev >/dev/null 2>&1; then
        "${as_root[@]}" apt-get install -y -qq --no-install-recommends libclang-rt-dev
    fi
fi
