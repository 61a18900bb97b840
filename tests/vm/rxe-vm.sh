#!/bin/bash
# rxe-vm.sh — run one command inside a throw-away qemu guest that boots Debian's stock kernel
# with two soft-RoCE (rdma_rxe) devices, and exit with the command's status.
#
# Why a VM: the build machines have no RDMA NIC and their kernel has no RDMA stack, but the
# verbs provider must be tested against a real kernel verbs implementation. Debian's kernel
# ships rdma_rxe as a module; qemu (TCG, no KVM needed) boots it in a few seconds.
#
# Usage: rxe-vm.sh [--timeout SECONDS] [--share DIR] [--log FILE] [--] command [args...]
#   --share DIR   host directory mounted read-write at the same path (default: $PWD); the
#                 command starts there. The host's / is mounted read-only and the command runs
#                 chroot'ed into it, so host-built binaries find the host's own libraries.
#   --timeout S   power the VM off after S seconds (default 300): exit 124.
# Exit status: the command's; 124 on timeout; 125 when the VM could not produce a status
# (missing tools, no kernel, boot or setup failure) — with the reason on stderr.
# Guest: veth0 169.254.77.1 <-> veth1 169.254.77.2, rxe0 on veth0, rxe1 on veth1, exported as
#   RDMACHAN_RXE_DEVICE=rxe0 RDMACHAN_RXE_PEER_DEVICE=rxe1 (and RXE_DEV/RXE_DEV2).
# Cache: $RDMACHAN_VM_CACHE (default ~/.cache/rdmachan-vm): kernel package, boot image, initramfs.
set -euo pipefail

timeout_seconds=300
share_dir=$PWD
log_file=
while [ $# -gt 0 ]; do
    case $1 in
        --timeout) timeout_seconds=$2; shift 2 ;;
        --share) share_dir=$(realpath "$2"); shift 2 ;;
        --log) log_file=$2; shift 2 ;;
        --) shift; break ;;
        -*) echo "rxe-vm: unknown option $1" >&2; exit 2 ;;
        *) break ;;
    esac
done
[ $# -gt 0 ] || { echo "rxe-vm: no command given" >&2; exit 2; }

cache_dir=${RDMACHAN_VM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/rdmachan-vm}
vm_fail() { echo "rxe-vm: cannot start the VM: $*" >&2; exit 125; }
note() { echo "rxe-vm: $*" >&2; }

# ---- host tools: installed from Debian packages, only when missing (CI starts fresh).
as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo -n "$@"; fi; }
required_packages=(qemu-system-x86 busybox-static cpio kmod xz-utils iproute2 rdma-core
                   ibverbs-providers)
missing_packages=()
for package in "${required_packages[@]}"; do
    dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q 'install ok installed' ||
        missing_packages+=("$package")
done
if [ ${#missing_packages[@]} -gt 0 ]; then
    note "installing ${missing_packages[*]}"
    apt_log=$(mktemp /tmp/rdmachan-vm-apt.XXXXXX)
    if ! { as_root apt-get update -qq &&
           as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq -o DPkg::Lock::Timeout=300 \
               --no-install-recommends "${missing_packages[@]}"; } >"$apt_log" 2>&1; then
        cat "$apt_log" >&2
        vm_fail "apt-get install ${missing_packages[*]} failed (log above)"
    fi
    rm -f "$apt_log"
fi

mkdir -p "$cache_dir"
# Concurrent runs (several ctest invocations) must not build the cache at the same time.
exec 8>"$cache_dir/lock"
flock -w 600 8 || vm_fail "cache lock $cache_dir/lock busy for 600 s"

# ---- the guest kernel: the package linux-image-amd64 points to, unpacked once.
kernel_package_file=$cache_dir/kernel-package
if [ ! -s "$kernel_package_file" ]; then
    find_kernel() {
        apt-cache depends linux-image-amd64 2>/dev/null |
            sed -n 's/^ *Depends: \(linux-image-[0-9][^ ]*\)$/\1/p' | head -n 1
    }
    kernel_package=$(find_kernel)
    if [ -z "$kernel_package" ]; then
        as_root apt-get update -qq >&2 || true
        kernel_package=$(find_kernel)
    fi
    [ -n "$kernel_package" ] || vm_fail "apt-cache knows no linux-image-amd64 dependency"
    echo "$kernel_package" >"$kernel_package_file"
fi
kernel_package=$(cat "$kernel_package_file")
kernel_version=${kernel_package#linux-image-}
kernel_dir=$cache_dir/$kernel_package
if [ ! -f "$kernel_dir/ready" ]; then
    note "downloading $kernel_package"
    rm -rf "$kernel_dir" && mkdir -p "$kernel_dir"
    download() { (cd "$kernel_dir" && apt-get download "$kernel_package" >download.log 2>&1); }
    # Stale package lists (a fresh CI image) make the download fail once: refresh, retry.
    if ! download && ! { as_root apt-get update -qq >/dev/null 2>&1; download; }; then
        grep -v '^W: Download is performed unsandboxed' "$kernel_dir/download.log" >&2
        vm_fail "apt-get download $kernel_package failed (apt-get's words above)"
    fi
    dpkg-deb --fsys-tarfile "$kernel_dir"/*.deb | tar -xO "./boot/vmlinuz-$kernel_version" \
        >"$kernel_dir/bzImage" || vm_fail "cannot unpack the kernel image from $kernel_package"
    # Under TCG, decompressing the bzImage costs seconds at every boot. Debian builds with
    # CONFIG_PVH, so the raw ELF inside (xz-compressed after a fixed header) boots directly
    # through qboot's PVH entry; keep it when it can be extracted, else boot the bzImage.
    xz_offset=$(LC_ALL=C grep -obUaP '\xfd7zXZ\x00' "$kernel_dir/bzImage" | head -n 1 | cut -d: -f1 || true)
    if [ -n "$xz_offset" ]; then
        tail -c "+$((xz_offset + 1))" "$kernel_dir/bzImage" >"$kernel_dir/payload.xz"
        xz -dc --single-stream "$kernel_dir/payload.xz" >"$kernel_dir/vmlinux" 2>/dev/null || true
        rm -f "$kernel_dir/payload.xz"
        [ "$(head -c 4 "$kernel_dir/vmlinux" | od -An -tx1 | tr -d ' ')" = 7f454c46 ] ||
            rm -f "$kernel_dir/vmlinux"
    fi
    touch "$kernel_dir/ready"
fi

# ---- the initramfs: busybox, the RDMA modules in dependency order, iproute2/rdma and the
# rxe provider for set-up. Rebuilt when this script changes.
script_hash=$(sha256sum "$0" | cut -c1-12)
initramfs=$cache_dir/initramfs-$kernel_version-$script_hash.cpio
if [ ! -f "$initramfs" ]; then
    note "building $initramfs"
    root=$(mktemp -d "$cache_dir/root.XXXXXX")
    # The module tree (~400 MB unpacked) is needed only while building; keep just the .deb.
    modules_tree=$(mktemp -d "$cache_dir/modules.XXXXXX")
    dpkg-deb -x "$kernel_dir"/*.deb "$modules_tree" || vm_fail "cannot unpack $kernel_package"
    depmod -b "$modules_tree" "$kernel_version" || vm_fail "depmod failed"
    mkdir -p "$root"/{usr/bin,usr/lib,usr/lib64,proc,sys,dev,tmp,run,etc/libibverbs.d,hostroot,share}
    for link in bin sbin lib lib64; do
        target=usr/$link; [ "$link" = sbin ] && target=usr/bin
        ln -s "$target" "$root/$link"
    done
    ln -s bin "$root/usr/sbin"
    # The guest needs real iproute2 (veth, policy rules) and rdma (link add type rxe), each
    # with its shared libraries (at the paths ldd names, which the symlinks above resolve);
    # busybox fills in the rest but its "ip" applet lacks these features.
    add_with_libraries() {
        local file library
        for file in "$@"; do
            for library in "$file" $(ldd "$file" | grep -o '/[^ ]*'); do
                [ -e "$root$library" ] && continue
                mkdir -p "$root$(dirname "$library")" && cp -L "$library" "$root$library"
            done
        done
    }
    add_with_libraries "$(command -v ip)" "$(command -v rdma)"
    [ -e "$root/usr/bin/ip" ] || cp -L "$(command -v ip)" "$root/usr/bin/ip"
    [ -e "$root/usr/bin/rdma" ] || cp -L "$(command -v rdma)" "$root/usr/bin/rdma"
    cp /bin/busybox "$root/usr/bin/"
    for applet in $(/bin/busybox --list); do
        [ -e "$root/usr/bin/$applet" ] || ln -s busybox "$root/usr/bin/$applet"
    done
    for module in rdma_rxe veth 9p 9pnet_virtio virtio_pci crc32_generic; do
        modprobe -d "$modules_tree" -S "$kernel_version" --show-depends "$module" |
            awk '$1 == "insmod" { print $2 }'
    done | awk '!seen[$0]++' >"$root/etc/module-paths"
    mkdir -p "$root/modules"
    : >"$root/etc/modules"
    while read -r module_path; do
        cp "$module_path" "$root/modules/"
        echo "/modules/$(basename "$module_path")" >>"$root/etc/modules"
    done <"$root/etc/module-paths"
    install -m 755 /dev/stdin "$root/init" <<'GUEST_INIT'
#!/bin/sh
# PID 1 in the guest: bring up soft-RoCE, mount the host, run the command, report its status.
export PATH=/usr/bin
mount -t proc proc /proc && mount -t sysfs sysfs /sys && mount -t devtmpfs devtmpfs /dev
. /run-config
report() { echo "RDMACHAN-VM-STATUS-$token=$1"; sync; poweroff -f; }
setup_failed() { echo "rxe-vm guest: set-up failed: $*"; report 125; }
while read -r module; do insmod "$module" || setup_failed "insmod $module"; done </etc/modules
/usr/bin/ip link set lo up
/usr/bin/ip link add veth0 type veth peer name veth1 || setup_failed "veth pair"
/usr/bin/ip address add 169.254.77.1/24 dev veth0
/usr/bin/ip address add 169.254.77.2/24 dev veth1
/usr/bin/ip link set veth0 up && /usr/bin/ip link set veth1 up || setup_failed "veth up"
# Both addresses belong to this one kernel, so by default traffic between them goes through
# lo and rxe's address resolution for rxe0 -> rxe1 times out at RTR (ETIMEDOUT). Routing
# locally generated packets for the peer address out through the veth pair avoids that;
# the local table (moved behind these rules) still accepts them on arrival.
for interface in all default veth0 veth1; do
    echo 1 >/proc/sys/net/ipv4/conf/$interface/accept_local
    echo 0 >/proc/sys/net/ipv4/conf/$interface/rp_filter
done
{ /usr/bin/ip rule add priority 200 table local &&
  /usr/bin/ip rule delete priority 0 table local &&
  /usr/bin/ip rule add priority 20 iif lo to 169.254.77.2 table 77 &&
  /usr/bin/ip rule add priority 21 iif lo to 169.254.77.1 table 78 &&
  /usr/bin/ip route add 169.254.77.2 dev veth0 src 169.254.77.1 table 77 &&
  /usr/bin/ip route add 169.254.77.1 dev veth1 src 169.254.77.2 table 78; } ||
    setup_failed "policy routing"
/usr/bin/rdma link add rxe0 type rxe netdev veth0 || setup_failed "rdma link add rxe0"
/usr/bin/rdma link add rxe1 type rxe netdev veth1 || setup_failed "rdma link add rxe1"
for device in rxe0 rxe1; do
    # The IPv4-mapped GID appears a moment after the port goes ACTIVE; wait for both (10 s).
    tries=0
    until grep -q ACTIVE /sys/class/infiniband/$device/ports/1/state 2>/dev/null &&
          grep -q ffff /sys/class/infiniband/$device/ports/1/gids/1 2>/dev/null; do
        tries=$((tries + 1)); [ $tries -le 100 ] || setup_failed "$device not active"
        usleep 100000
    done
done
mount -t 9p -o trans=virtio,version=9p2000.L,msize=262144,ro hostroot /hostroot ||
    setup_failed "mount host root"
for directory in proc sys dev; do mount --bind /$directory /hostroot/$directory; done
mount -t tmpfs tmpfs /hostroot/tmp && mount -t tmpfs tmpfs /hostroot/run
mount -t 9p -o trans=virtio,version=9p2000.L,msize=262144 share /share || setup_failed "mount share"
mkdir -p "/hostroot$share_dir" 2>/dev/null
mount --bind /share "/hostroot$share_dir" || setup_failed "bind $share_dir"
cp /command /hostroot/tmp/rdmachan-vm-command
echo "rxe-vm guest: ready after $(cut -d' ' -f1 /proc/uptime) s"
RDMACHAN_RXE_DEVICE=rxe0 RDMACHAN_RXE_PEER_DEVICE=rxe1 RXE_DEV=rxe0 RXE_DEV2=rxe1 \
    chroot /hostroot /bin/sh -c "cd '$share_dir' && . /tmp/rdmachan-vm-command" </dev/null
status=$?
umount "/hostroot$share_dir" 2>/dev/null
report $status
GUEST_INIT
    (cd "$root" && find . | LC_ALL=C sort | cpio -o -H newc --quiet) >"$initramfs.partial"
    mv "$initramfs.partial" "$initramfs"
    rm -rf "$root" "$modules_tree"
    find "$cache_dir" -maxdepth 1 -name 'initramfs-*.cpio' ! -path "$initramfs" -delete
fi
flock -u 8

# ---- this run: a small second cpio (appended) carries the command and a fresh token, so
# a status line printed by the command itself cannot be mistaken for the guest's report.
run_dir=$(mktemp -d /tmp/rdmachan-vm.XXXXXX)
trap 'rm -rf "$run_dir"' EXIT
mkdir -p "$run_dir/root"
token=$(od -An -N8 -tx1 /dev/urandom | tr -d ' \n')
printf 'token=%s\nshare_dir=%q\n' "$token" "$share_dir" >"$run_dir/root/run-config"
{
    printf 'exec'
    for argument in "$@"; do printf ' %q' "$argument"; done
    printf '\n'
} >"$run_dir/root/command"
(cd "$run_dir/root" && find . | cpio -o -H newc --quiet) >"$run_dir/run.cpio"
cat "$initramfs" "$run_dir/run.cpio" >"$run_dir/initrd"

qemu=(qemu-system-x86_64 -accel tcg,thread=multi -cpu max -smp 2 -m 1024 -nodefaults
      -no-user-config -display none -no-reboot -serial stdio -initrd "$run_dir/initrd"
      -append "console=ttyS0 quiet panic=-1 mitigations=off rdinit=/init"
      -fsdev "local,id=hostroot,path=/,security_model=none,readonly=on,multidevs=remap"
      -device virtio-9p-pci,fsdev=hostroot,mount_tag=hostroot
      -fsdev "local,id=share,path=$share_dir,security_model=none,multidevs=remap"
      -device virtio-9p-pci,fsdev=share,mount_tag=share)
if [ -f "$kernel_dir/vmlinux" ] && [ -f /usr/share/qemu/qboot.rom ]; then
    qemu+=(-bios /usr/share/qemu/qboot.rom -kernel "$kernel_dir/vmlinux")
else
    qemu+=(-kernel "$kernel_dir/bzImage")
fi
console=$run_dir/console
set +e
timeout -k 5 "$timeout_seconds" "${qemu[@]}" </dev/null 2>&1 | tr -d '\r' | tee "$console" |
    grep --line-buffered -v -e "^RDMACHAN-VM-STATUS-$token=" -e '^\[ *[0-9.]*\] reboot: Power down$'
qemu_status=${PIPESTATUS[0]}
set -e
[ -z "$log_file" ] || cp "$console" "$log_file"
if [ "$qemu_status" = 124 ] || [ "$qemu_status" = 137 ]; then
    note "timeout: the VM ran longer than ${timeout_seconds} s"
    exit 124
fi
status=$(sed -n "s/^RDMACHAN-VM-STATUS-$token=\([0-9]*\)$/\1/p" "$console" | tail -n 1)
[ -n "$status" ] || vm_fail "the guest reported no status (qemu exit $qemu_status); see the console above"
exit "$status"
