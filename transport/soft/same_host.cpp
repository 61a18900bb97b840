// Same-host detection and cross-memory-attach copies for the software device.
#include "transport/soft/same_host.hpp"

#include <poll.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "transport/soft/device.hpp"

namespace rdmachan::soft {
namespace {

// Copies `length` bytes, resuming after a partial transfer (the kernel stops at a page it
// cannot reach, or transfers less than asked at its discretion).
template <typename Copy>
int copy_vectors(Copy copy, const iovec* local, std::size_t local_count, const iovec* remote, std::size_t remote_count,
                 std::size_t length) {
    constexpr std::size_t kVectors = 64;  // far below IOV_MAX; the device carries at most 32 segments
    if (local_count > kVectors || remote_count > kVectors) return EINVAL;
    iovec local_left[kVectors];
    iovec remote_left[kVectors];
    std::copy_n(local, local_count, local_left);
    std::copy_n(remote, remote_count, remote_left);
    std::size_t local_first = 0;
    std::size_t remote_first = 0;
    std::size_t done = 0;
    while (done < length) {
        const ssize_t moved = copy(local_left + local_first, local_count - local_first, remote_left + remote_first,
                                   remote_count - remote_first);
        if (moved < 0) {
            if (errno == EINTR) continue;
            return errno;
        }
        if (moved == 0) return EFAULT;
        done += static_cast<std::size_t>(moved);
        // Skip what was moved in both vector lists.
        auto advance = [](iovec* vectors, std::size_t count, std::size_t& first, std::size_t bytes) {
            while (bytes != 0 && first < count) {
                const std::size_t step = std::min(bytes, vectors[first].iov_len);
                vectors[first].iov_base = static_cast<std::uint8_t*>(vectors[first].iov_base) + step;
                vectors[first].iov_len -= step;
                bytes -= step;
                if (vectors[first].iov_len == 0) ++first;
            }
        };
        advance(local_left, local_count, local_first, static_cast<std::size_t>(moved));
        advance(remote_left, remote_count, remote_first, static_cast<std::size_t>(moved));
    }
    return 0;
}

}  // namespace

TransportMode transport_mode_from_environment() {
    const char* value = std::getenv("RDMACHAN_SOFT_TRANSPORT");
    if (value == nullptr || *value == '\0' || std::strcmp(value, "auto") == 0) return TransportMode::automatic;
    if (std::strcmp(value, "shm") == 0) return TransportMode::same_host;
    if (std::strcmp(value, "tcp") == 0) return TransportMode::tcp;
    throw SoftDeviceError(std::string("RDMACHAN_SOFT_TRANSPORT = '") + value + "' is not one of auto, shm, tcp");
}

const char* to_string(TransportMode mode) {
    switch (mode) {
        case TransportMode::automatic: return "auto";
        case TransportMode::same_host: return "shm";
        case TransportMode::tcp: return "tcp";
    }
    return "unknown";
}


int probe_cross_memory_attach(std::uint32_t pid, std::uint64_t address, std::uint64_t expected) {
    if (const char* refuse = std::getenv("RDMACHAN_SOFT_REFUSE_CMA"); refuse != nullptr && std::strcmp(refuse, "1") == 0) {
        return EPERM;
    }
    std::uint64_t value = 0;
    const iovec local{&value, sizeof value};
    const iovec remote{reinterpret_cast<void*>(address), sizeof value};
    if (const int error = read_from_process(pid, &local, 1, &remote, 1, sizeof value); error != 0) return error;
    return value == expected ? 0 : EIO;
}

int read_from_process(std::uint32_t pid, const iovec* local, std::size_t local_count, const iovec* remote,
                      std::size_t remote_count, std::size_t length) {
    return copy_vectors(
        [pid](const iovec* to, std::size_t to_count, const iovec* from, std::size_t from_count) {
            return ::process_vm_readv(static_cast<pid_t>(pid), to, to_count, from, from_count, 0);
        },
        local, local_count, remote, remote_count, length);
}

int write_to_process(std::uint32_t pid, const iovec* local, std::size_t local_count, const iovec* remote,
                     std::size_t remote_count, std::size_t length) {
    return copy_vectors(
        [pid](const iovec* from, std::size_t from_count, const iovec* to, std::size_t to_count) {
            return ::process_vm_writev(static_cast<pid_t>(pid), from, from_count, to, to_count, 0);
        },
        local, local_count, remote, remote_count, length);
}

PeerProcess::~PeerProcess() {
    if (descriptor_ >= 0) ::close(descriptor_);
}

int PeerProcess::open(std::uint32_t pid, std::uint64_t probe_address, std::uint64_t probe_value) {
    if (descriptor_ >= 0) ::close(descriptor_);
    pid_ = pid;
    descriptor_ = static_cast<int>(::syscall(SYS_pidfd_open, static_cast<pid_t>(pid), 0));
    if (descriptor_ < 0) return errno;
    // The order is what makes the pidfd the peer's (same_host.hpp): pidfd first, then the probe.
    std::uint64_t value = 0;
    const iovec local{&value, sizeof value};
    const iovec remote{reinterpret_cast<void*>(probe_address), sizeof value};
    int error = read_from_process(pid, &local, 1, &remote, 1, sizeof value);
    if (error == 0 && value != probe_value) error = EIO;
    if (error == 0 && exited()) error = ESRCH;
    if (error != 0) {
        ::close(descriptor_);
        descriptor_ = -1;
    }
    return error;
}

bool PeerProcess::exited() const {
    if (descriptor_ < 0) return true;
    // A pidfd polls readable once its process exited. Any other answer than "not yet" counts as
    // exited: a move is then refused, never made to a pid that is not known to be the peer's.
    pollfd exit{descriptor_, POLLIN, 0};
    int ready;
    do {
        ready = ::poll(&exit, 1, 0);
    } while (ready < 0 && errno == EINTR);
    return ready != 0;
}

int read_from_peer(const PeerProcess& peer, const iovec* local, std::size_t local_count, const iovec* remote,
                   std::size_t remote_count, std::size_t length) {
    if (peer.exited()) return ESRCH;
    const int error = read_from_process(peer.pid(), local, local_count, remote, remote_count, length);
    return error == 0 && peer.exited() ? ESRCH : error;
}

int write_to_peer(const PeerProcess& peer, const iovec* local, std::size_t local_count, const iovec* remote,
                  std::size_t remote_count, std::size_t length) {
    if (peer.exited()) return ESRCH;
    const int error = write_to_process(peer.pid(), local, local_count, remote, remote_count, length);
    return error == 0 && peer.exited() ? ESRCH : error;
}

bool process_exited(std::uint32_t pid) {
    const int descriptor = static_cast<int>(::syscall(SYS_pidfd_open, static_cast<pid_t>(pid), 0));
    if (descriptor < 0) return errno == ESRCH;
    pollfd exited{descriptor, POLLIN, 0};
    const bool readable = ::poll(&exited, 1, 0) == 1 && (exited.revents & POLLIN) != 0;  // readable: it exited
    ::close(descriptor);
    return readable;
}

}  // namespace rdmachan::soft
