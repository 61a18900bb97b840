#include "handshake/host_table.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <span>
#include <utility>

#include "rdmachan/error.hpp"

namespace rdmachan::handshake {
namespace {

// What a reader requires: no write, shrink or grow can happen after its check.
constexpr int required_seals = F_SEAL_WRITE | F_SEAL_SHRINK | F_SEAL_GROW;

std::string errno_text(int error) {
    return std::string(std::strerror(error)) + " (errno " + std::to_string(error) + ")";
}

class Descriptor {
  public:
    explicit Descriptor(int fd) : fd_(fd) {}
    ~Descriptor() {
        if (fd_ >= 0) ::close(fd_);
    }
    Descriptor(const Descriptor&) = delete;
    Descriptor& operator=(const Descriptor&) = delete;
    int get() const { return fd_; }
    int release() { return std::exchange(fd_, -1); }

  private:
    int fd_;
};

}  // namespace

PublishedTable::PublishedTable(std::string_view bytes) {
    Descriptor memory(::memfd_create("rdmachan-job-table", MFD_CLOEXEC | MFD_ALLOW_SEALING));
    if (memory.get() < 0) throw Error("sharing the job table: memfd_create failed: " + errno_text(errno));
    std::size_t written = 0;
    while (written < bytes.size()) {
        const ssize_t count = ::write(memory.get(), bytes.data() + written, bytes.size() - written);
        if (count < 0 && errno == EINTR) continue;
        if (count <= 0)
            throw Error("sharing the job table: writing " + std::to_string(bytes.size()) + " bytes failed: " +
                        errno_text(count < 0 ? errno : EIO));
        written += static_cast<std::size_t>(count);
    }
    if (::fcntl(memory.get(), F_ADD_SEALS, required_seals | F_SEAL_SEAL) != 0)
        throw Error("sharing the job table: sealing it failed: " + errno_text(errno));
    fd_ = memory.release();
    size_ = bytes.size();
}

PublishedTable::~PublishedTable() {
    if (fd_ >= 0) ::close(fd_);
}

PublishedTable::PublishedTable(PublishedTable&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)), size_(std::exchange(other.size_, 0)) {}

PublishedTable& PublishedTable::operator=(PublishedTable&& other) noexcept {
    if (this != &other) {
        if (fd_ >= 0) ::close(fd_);
        fd_ = std::exchange(other.fd_, -1);
        size_ = std::exchange(other.size_, 0);
    }
    return *this;
}

MappedTable::MappedTable(const PublishedTable& published) : size_(published.size()) {
    void* address = size_ == 0 ? MAP_FAILED : ::mmap(nullptr, size_, PROT_READ, MAP_SHARED, published.fd(), 0);
    if (address == MAP_FAILED) throw Error("mapping this rank's own copy of the table failed: " + errno_text(errno));
    address_ = address;
}

MappedTable::MappedTable(const SharedTableLocation& location, const std::string& reader) {
    const std::string path = "/proc/" + std::to_string(location.pid) + "/fd/" + std::to_string(location.fd);
    const auto refused = [&](const std::string& why) {
        return Error(reader + " refused the host's shared job table (" + path + "): " + why);
    };
    // Only a regular file (a memfd is one) is opened: the pid and descriptor come from another
    // rank, and opening a FIFO would block, a device could act on being opened. O_NONBLOCK and
    // O_NOCTTY keep the open harmless should the descriptor change between the two calls.
    struct stat status{};
    if (::stat(path.c_str(), &status) != 0) throw refused("cannot open it: " + errno_text(errno));
    if (!S_ISREG(status.st_mode)) throw refused("it is not a regular file (a memfd)");
    Descriptor file(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY));
    if (file.get() < 0) throw refused("cannot open it: " + errno_text(errno));
    if (::fstat(file.get(), &status) != 0) throw refused("cannot stat it: " + errno_text(errno));
    if (!S_ISREG(status.st_mode)) throw refused("it is not a regular file (a memfd)");
    if (static_cast<std::uint64_t>(status.st_size) != location.size)
        throw refused("it holds " + std::to_string(status.st_size) + " bytes where the server announced " +
                      std::to_string(location.size) + " (truncated or grown)");
    const int seals = ::fcntl(file.get(), F_GET_SEALS);
    if (seals < 0) throw refused("it is not a sealable memfd: " + errno_text(errno));
    if ((seals & required_seals) != required_seals)
        throw refused("it is not sealed against writing and resizing, so it could change after this check");
    if (location.size == 0) throw refused("it is empty");
    void* address = ::mmap(nullptr, location.size, PROT_READ, MAP_SHARED, file.get(), 0);
    if (address == MAP_FAILED) throw refused("mapping it failed: " + errno_text(errno));
    address_ = address;
    size_ = static_cast<std::size_t>(location.size);
    const Digest digest = sha256({static_cast<const std::uint8_t*>(address_), size_});
    if (!equal_in_constant_time(digest, location.digest)) {
        ::munmap(address_, size_);
        address_ = nullptr;
        throw refused("its SHA-256 differs from the server's: corrupted, or another job's or session's table");
    }
}

MappedTable::~MappedTable() {
    if (address_ != nullptr) ::munmap(address_, size_);
}

MappedTable::MappedTable(MappedTable&& other) noexcept
    : address_(std::exchange(other.address_, nullptr)), size_(std::exchange(other.size_, 0)) {}

MappedTable& MappedTable::operator=(MappedTable&& other) noexcept {
    if (this != &other) {
        if (address_ != nullptr) ::munmap(address_, size_);
        address_ = std::exchange(other.address_, nullptr);
        size_ = std::exchange(other.size_, 0);
    }
    return *this;
}

}  // namespace rdmachan::handshake
