// One copy of the job table per host (rendezvous protocol 3, handshake/README.md): the first rank
// of a host to receive the table publishes it, and the host's other ranks read that copy instead
// of receiving their own. The copy is a memfd sealed against any change, reached by the others
// through /proc/<pid>/fd/<fd>; a reader accepts it only when its size and SHA-256 are those the
// server, which built the table, announced over the reader's own authenticated connection. So a
// copy that was corrupted, cut short or belongs to another job or session is refused, and
// because the seals forbid writing, what a reader checked once stays true while it reads.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "handshake/crypto.hpp"

namespace rdmachan::handshake {

// Where a host's copy lies and what it must hold, as the server announces it.
struct SharedTableLocation {
    std::uint32_t pid = 0;  // the publishing rank's process
    std::int32_t fd = -1;   // its descriptor of the memfd
    std::uint64_t size = 0;
    Digest digest{};  // SHA-256 of the table's bytes
};

// The publishing rank's copy. The memfd stays open as long as this object lives; a reader that
// mapped it keeps its mapping after that.
class PublishedTable {
  public:
    // Writes `bytes` into a new memfd and seals it. Throws rdmachan::Error with the reason.
    explicit PublishedTable(std::string_view bytes);
    ~PublishedTable();
    PublishedTable(PublishedTable&& other) noexcept;
    PublishedTable& operator=(PublishedTable&& other) noexcept;
    PublishedTable(const PublishedTable&) = delete;
    PublishedTable& operator=(const PublishedTable&) = delete;

    int fd() const { return fd_; }
    std::size_t size() const { return size_; }

  private:
    int fd_ = -1;
    std::size_t size_ = 0;
};

// A host's copy as another rank reads it: mapped read-only after its checks.
class MappedTable {
  public:
    // Opens the copy at `location` and checks it. Throws rdmachan::Error naming `reader` (which
    // rank of which host reads) and why the copy is refused: it cannot be opened, its size is
    // not the announced one (truncated or grown), it is not sealed against writing and resizing,
    // or its digest is not the server's (corrupted, or another job's or session's table).
    MappedTable(const SharedTableLocation& location, const std::string& reader);
    // The publishing rank's own copy, mapped read-only: what it wrote, so nothing to check.
    // Throws rdmachan::Error when the mapping fails.
    explicit MappedTable(const PublishedTable& published);
    ~MappedTable();
    MappedTable(MappedTable&& other) noexcept;
    MappedTable& operator=(MappedTable&& other) noexcept;
    MappedTable(const MappedTable&) = delete;
    MappedTable& operator=(const MappedTable&) = delete;

    std::string_view bytes() const { return {static_cast<const char*>(address_), size_}; }

  private:
    void* address_ = nullptr;
    std::size_t size_ = 0;
};

}  // namespace rdmachan::handshake
