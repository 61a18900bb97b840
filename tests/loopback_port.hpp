// Test helper: a TCP port on 127.0.0.1 held for the object's lifetime: where nothing answers (a
// soft device that is not one, an etcd that is not there; a device's LID is its port). Bound only,
// a connect to it is refused and no other socket can take the port meanwhile; listening, the test
// accepts what connects.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>

#include <doctest/doctest.h>

namespace rdmachan::test {

class LoopbackPort {
public:
    enum class Mode { refusing, listening };
    explicit LoopbackPort(Mode mode) : descriptor_(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0)) {
        REQUIRE(descriptor_ >= 0);
        sockaddr_in address{};
        address.sin_family = AF_INET;
        address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        REQUIRE(::bind(descriptor_, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0);
        if (mode == Mode::listening) REQUIRE(::listen(descriptor_, 4) == 0);
        socklen_t length = sizeof address;
        REQUIRE(::getsockname(descriptor_, reinterpret_cast<sockaddr*>(&address), &length) == 0);
        port_ = ntohs(address.sin_port);
    }
    ~LoopbackPort() { ::close(descriptor_); }
    LoopbackPort(const LoopbackPort&) = delete;
    LoopbackPort& operator=(const LoopbackPort&) = delete;

    int descriptor() const { return descriptor_; }
    std::uint16_t port() const { return port_; }

private:
    int descriptor_;
    std::uint16_t port_ = 0;
};

}  // namespace rdmachan::test
