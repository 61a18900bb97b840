// The host's shared copy of the job table (handshake/host_table.hpp): what a reader accepts and
// every reason it refuses a copy, each named in the error with the reader.
#include "handshake/host_table.hpp"

#include <doctest/doctest.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <optional>
#include <string>

#include "rdmachan/error.hpp"

using namespace rdmachan::handshake;

namespace {

const std::string kReader = "rank 3 of host h1";

SharedTableLocation location_of(int fd, std::string_view announced) {
    SharedTableLocation location;
    location.pid = static_cast<std::uint32_t>(::getpid());
    location.fd = fd;
    location.size = announced.size();
    location.digest = sha256(as_bytes(announced));
    return location;
}

std::string refusal(const SharedTableLocation& location) {
    try {
        MappedTable mapped(location, kReader);
    } catch (const rdmachan::Error& error) {
        return error.what();
    }
    return "(accepted)";
}

std::string table_text(char fill, std::size_t size) {
    std::string text = R"({"type":"table","rows":[)";
    text.append(size, fill);
    return text + "]}";
}

}  // namespace

TEST_CASE("a published table is sealed, and a reader maps exactly its bytes") {
    const std::string table = table_text('x', 100000);
    std::optional<PublishedTable> published(std::in_place, table);
    CHECK((::fcntl(published->fd(), F_GET_SEALS) & (F_SEAL_WRITE | F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL)) ==
          (F_SEAL_WRITE | F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL));
    // Nobody, the publisher included, can change it any more.
    errno = 0;
    CHECK(::pwrite(published->fd(), "y", 1, 10) == -1);
    CHECK(errno == EPERM);
    CHECK(::ftruncate(published->fd(), 10) == -1);

    MappedTable mapped(location_of(published->fd(), table), kReader);
    CHECK(mapped.bytes() == table);
    // The mapping outlives the publisher's descriptor.
    published.reset();
    CHECK(mapped.bytes() == table);
}

TEST_CASE("a copy shorter or longer than announced is refused as truncated or grown") {
    const std::string table = table_text('x', 4096);
    PublishedTable shorter(std::string_view(table).substr(0, table.size() - 100));
    const std::string error = refusal(location_of(shorter.fd(), table));
    CHECK(error.find(kReader + " refused the host's shared job table") == 0);
    CHECK(error.find("holds " + std::to_string(table.size() - 100) + " bytes where the server announced " +
                     std::to_string(table.size()) + " (truncated or grown)") != std::string::npos);
    PublishedTable longer(table + "  ");
    CHECK(refusal(location_of(longer.fd(), table)).find("(truncated or grown)") != std::string::npos);
}

TEST_CASE("a corrupted copy, or another job's or session's, is refused by its digest") {
    const std::string table = table_text('x', 4096);
    std::string corrupted = table;
    corrupted[2000] = 'z';
    PublishedTable flipped(corrupted);
    const std::string error = refusal(location_of(flipped.fd(), table));
    CHECK(error.find(kReader) == 0);
    CHECK(error.find("its SHA-256 differs from the server's: corrupted, or another job's or session's table") !=
          std::string::npos);
    // Another job's table of the same size: only the digest tells them apart.
    const std::string other_job = table_text('q', 4096);
    PublishedTable other(other_job);
    CHECK(refusal(location_of(other.fd(), table)).find("SHA-256 differs") != std::string::npos);
    CHECK(refusal(location_of(other.fd(), other_job)) == "(accepted)");
}

TEST_CASE("a copy that could still change, or is no memfd, is refused") {
    const std::string table = table_text('x', 1000);
    const int unsealed = ::memfd_create("unsealed-table", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    REQUIRE(unsealed >= 0);
    REQUIRE(::write(unsealed, table.data(), table.size()) == static_cast<ssize_t>(table.size()));
    CHECK(refusal(location_of(unsealed, table))
              .find("it is not sealed against writing and resizing, so it could change after this check") !=
          std::string::npos);
    // Sealed against growing and shrinking but still writable: refused too.
    REQUIRE(::fcntl(unsealed, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW) == 0);
    CHECK(refusal(location_of(unsealed, table)).find("not sealed against writing") != std::string::npos);
    ::close(unsealed);

    char path[] = "/tmp/host_table_test_XXXXXX";
    const int file = ::mkstemp(path);
    REQUIRE(file >= 0);
    ::unlink(path);
    REQUIRE(::write(file, table.data(), table.size()) == static_cast<ssize_t>(table.size()));
    CHECK(refusal(location_of(file, table)).find("it is not a sealable memfd") != std::string::npos);
    ::close(file);
}

TEST_CASE("a descriptor that is a FIFO or a socket is refused without being opened") {
    const std::string table = table_text('x', 100);
    int fifo[2];
    REQUIRE(::pipe(fifo) == 0);
    // Opening a FIFO's /proc link for reading with no writer would block: refused before that.
    ::close(fifo[1]);
    CHECK(refusal(location_of(fifo[0], table)).find("it is not a regular file (a memfd)") != std::string::npos);
    ::close(fifo[0]);
    int sockets[2];
    REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM, 0, sockets) == 0);
    CHECK(refusal(location_of(sockets[0], table)).find("not a regular file") != std::string::npos);
    ::close(sockets[0]);
    ::close(sockets[1]);
}

TEST_CASE("a copy that cannot be reached is refused naming the path") {
    const std::string table = table_text('x', 100);
    SharedTableLocation location = location_of(987654, table);  // no such descriptor
    const std::string error = refusal(location);
    CHECK(error.find("(/proc/" + std::to_string(::getpid()) + "/fd/987654): cannot open it") != std::string::npos);
    location.pid = 0x7ffffff0;  // no such process
    CHECK(refusal(location).find("cannot open it") != std::string::npos);
}
