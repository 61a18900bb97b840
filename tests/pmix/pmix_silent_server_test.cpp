// A PMIx launcher whose server accepts the connection and never answers (what Open MPI 4.1's
// mpirun does to some spawned processes: handshake/README.md, "A launcher that never answers").
// libpmix's PMIx_Init would wait for it without end; MultiChannelBuilder::build() must fail at
// the channel's deadline, saying what happened, and a second build() in the same process must
// fail at once (libpmix's lock is still held by the first PMIx_Init). Runs in its own process:
// the PMIx_Init it gives up on never returns.
#include <doctest/doctest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "rdmachan/error.hpp"
#include "rdmachan/multi_channel.hpp"

namespace {

using namespace std::chrono_literals;

// Accepts every connection on a loopback port and keeps it open, reading nothing.
class SilentServer {
  public:
    SilentServer() {
        listener_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        REQUIRE(listener_ >= 0);
        sockaddr_in address{};
        address.sin_family = AF_INET;
        address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        REQUIRE(::bind(listener_, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0);
        REQUIRE(::listen(listener_, 8) == 0);
        socklen_t length = sizeof address;
        REQUIRE(::getsockname(listener_, reinterpret_cast<sockaddr*>(&address), &length) == 0);
        port_ = ntohs(address.sin_port);
        thread_ = std::thread([this] {
            for (;;) {
                const int connection = ::accept4(listener_, nullptr, nullptr, SOCK_CLOEXEC);
                if (connection < 0) return;  // the listener was shut down
                accepted_.fetch_add(1);
                connections_.push_back(connection);
            }
        });
    }
    ~SilentServer() {
        ::shutdown(listener_, SHUT_RDWR);
        thread_.join();
        ::close(listener_);
        for (const int connection : connections_) ::close(connection);
    }
    std::uint16_t port() const { return port_; }
    int accepted() const { return accepted_.load(); }

  private:
    int listener_ = -1;
    std::uint16_t port_ = 0;
    std::atomic<int> accepted_{0};
    std::vector<int> connections_;  // the accepting thread's
    std::thread thread_;
};

std::string build_error(std::chrono::milliseconds deadline) {
    try {
        const rdmachan::ChannelBuilder channel = rdmachan::ChannelBuilder().device("soft").deadline(deadline);
        (void)rdmachan::MultiChannelBuilder(channel).bootstrap(rdmachan::Bootstrap::pmix).build();
    } catch (const rdmachan::Error& error) {
        return error.what();
    }
    return "";
}

}  // namespace

TEST_CASE("a PMIx server that never answers fails build() at the deadline, then at once") {
    const SilentServer server;
    // The variables a PMIx launcher gives its processes: a namespace, a rank, the server's URI.
    const std::string uri = "silent.0;tcp4://127.0.0.1:" + std::to_string(server.port());
    REQUIRE(::setenv("PMIX_NAMESPACE", "silent", 1) == 0);
    REQUIRE(::setenv("PMIX_RANK", "0", 1) == 0);
    REQUIRE(::setenv("PMIX_SERVER_URI41", uri.c_str(), 1) == 0);

    const auto started = std::chrono::steady_clock::now();
    const std::string first = build_error(1500ms);
    const auto waited = std::chrono::steady_clock::now() - started;
    INFO("the first build's error: " << first);
    CHECK(first.find("MultiChannelBuilder::build") != std::string::npos);
    CHECK(first.find("PMIx_Init did not return within") != std::string::npos);
    CHECK(first.find("never answered it") != std::string::npos);
    CHECK(server.accepted() >= 1);  // libpmix did reach the server: the wait was for its answer
    // It waited for the deadline, not less (a PMIx_Init that failed at once would be another
    // error), and returned (the test would otherwise hang until ctest's timeout).
    CHECK(waited >= 1500ms);

    const auto again = std::chrono::steady_clock::now();
    const std::string second = build_error(1500ms);
    INFO("the second build's error: " << second);
    CHECK(second.find("an earlier PMIx_Init of this process never returned") != std::string::npos);
    CHECK(std::chrono::steady_clock::now() - again < 1500ms);
}
