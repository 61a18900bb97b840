// The software device's same-host path: whether a peer device runs on this host (same kernel
// boot, same user, same network and PID namespaces), which path RDMACHAN_SOFT_TRANSPORT asks
// for, and the cross-memory-attach copies (process_vm_readv/process_vm_writev) that move
// payloads straight between the two processes' registered memory.
#pragma once

#include <sys/uio.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

#include "common/host_identity.hpp"

namespace rdmachan::soft {

// RDMACHAN_SOFT_TRANSPORT: auto (default) uses the same-host path when the peer is on this host
// and cross-memory attach works; tcp never uses it; shm requires a same-host peer (a peer on
// another host is an error naming it).
enum class TransportMode : std::uint8_t { automatic, same_host, tcp };

// Reads RDMACHAN_SOFT_TRANSPORT; throws SoftDeviceError naming the variable for any other value.
TransportMode transport_mode_from_environment();
const char* to_string(TransportMode mode);

// What two devices compare to decide they share a host (common/host_identity.hpp).
using detail::HostIdentity;
using detail::this_host_identity;
using detail::different_host_reason;

// Whether process `pid` has exited (or was reaped): then none of its threads is in a write. A pid
// that cannot be asked about (out of descriptors) counts as alive: a deregistration then fails
// rather than returns too early. A pid reused by another process also counts as alive, with the
// same safe outcome.
bool process_exited(std::uint32_t pid);

// Reads 8 bytes at `address` in process `pid` and compares them with `expected`: 0 when cross
// memory attach works and `pid` is the process that published the word, else an errno (EPERM,
// ENOSYS, ESRCH, ..., or EIO for a different value). RDMACHAN_SOFT_REFUSE_CMA=1 makes it answer
// EPERM without trying, as a ptrace-restricted or seccomp-filtered process would.
int probe_cross_memory_attach(std::uint32_t pid, std::uint64_t address, std::uint64_t expected);

// Copies `length` bytes between this process (`local`) and process `pid` (`remote`) with
// process_vm_readv / process_vm_writev, repeating on partial transfers. Returns 0 or the errno
// (EFAULT for a partial copy that cannot continue). No allocation; the vectors stay unchanged.
int read_from_process(std::uint32_t pid, const iovec* local, std::size_t local_count, const iovec* remote,
                      std::size_t remote_count, std::size_t length);
int write_to_process(std::uint32_t pid, const iovec* local, std::size_t local_count, const iovec* remote,
                     std::size_t remote_count, std::size_t length);

// A same-host peer process held by a pidfd, so that its pid, once reused by another process, is
// never taken for it. process_vm_readv/writev take a pid, not a pidfd (kernels up to 6.18 at
// least), so every move by pid is bracketed (move_with_peer):
//   - opened: the pidfd is opened after the peer's hello arrived and before its probe word is
//     read back by cross-memory attach. The peer was alive with this pid when it sent the hello
//     and alive with it when the probe read its random word; a process cannot come back, so it
//     held the pid the whole time in between, and the pidfd (opened in between) is the peer.
//   - before each move: the pidfd says the peer has not exited, so the pid is still the peer's
//     (an exited peer's pid is not taken: the move fails with ESRCH);
//   - after each move: the peer still has not exited, so it held the pid during the whole system
//     call, and the bytes moved to or from the peer. If it exited meanwhile the move reports
//     ESRCH, as a move into a dead peer does.
// What the brackets cannot exclude: the peer exits, is reaped, and its pid is handed to another
// process of the same user that maps the destination writable, all between the check before and
// the system call's own lookup of the pid (a few instructions, unless this thread is stopped
// right there). The check after then reports it, but the bytes have moved. Only a move by pidfd
// closes that window (proposed for Linux as PROCESS_VM_PIDFD, not in this kernel), or writing
// through a /proc/<pid>/mem descriptor, which is bound to the address space but measured at half
// the bandwidth here (transport/soft/README.md, "Same host").
class PeerProcess {
public:
    PeerProcess() = default;
    ~PeerProcess();
    PeerProcess(const PeerProcess&) = delete;
    PeerProcess& operator=(const PeerProcess&) = delete;

    // Opens the pidfd of `pid` and checks, by cross-memory attach, that `probe_address` holds
    // `probe_value` there: 0, or the errno (EIO for another value). Call it once, after the
    // peer's hello arrived.
    int open(std::uint32_t pid, std::uint64_t probe_address, std::uint64_t probe_value);
    bool is_open() const { return descriptor_ >= 0; }
    std::uint32_t pid() const { return pid_; }
    int descriptor() const { return descriptor_; }
    // True once the peer exited (or when no pidfd is open).
    bool exited() const;

private:
    int descriptor_ = -1;
    std::uint32_t pid_ = 0;
};

// read_from_process / write_to_process on the peer, bracketed by PeerProcess::exited() (see
// above): ESRCH when the peer exited before or during the move.
int read_from_peer(const PeerProcess& peer, const iovec* local, std::size_t local_count, const iovec* remote,
                   std::size_t remote_count, std::size_t length);
int write_to_peer(const PeerProcess& peer, const iovec* local, std::size_t local_count, const iovec* remote,
                  std::size_t remote_count, std::size_t length);

}  // namespace rdmachan::soft
