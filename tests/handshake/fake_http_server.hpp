// A loopback HTTP server that answers every request with the same fixed response and closes: a
// garbled or hostile etcd, for the store's answer checks.
#pragma once

#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace rdmachan::test {

class FakeHttpServer {
  public:
    // `body` goes out as a 200 answer with Content-Length (or, `streamed`, chunked, as a watch).
    explicit FakeHttpServer(std::string body, bool streamed = false) { listen(std::move(body), streamed); }
    // A server that accepts and reads, and never answers: a hung etcd.
    static constexpr struct Silent {} silent{};
    explicit FakeHttpServer(Silent) : silent_(true) { listen("", false); }

  private:
    void listen(std::string body, bool streamed) {
        if (streamed) {
            char size[32];
            std::snprintf(size, sizeof size, "%zx", body.size());
            response_ = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n" +
                        std::string(size) + "\r\n" + body + "\r\n0\r\n\r\n";
        } else {
            response_ = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: " +
                        std::to_string(body.size()) + "\r\n\r\n" + body;
        }
        listener_ = ::socket(AF_INET, SOCK_STREAM, 0);
        sockaddr_in address{};
        address.sin_family = AF_INET;
        address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        socklen_t length = sizeof address;
        if (listener_ < 0 || ::bind(listener_, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0 ||
            ::listen(listener_, 16) != 0 ||
            ::getsockname(listener_, reinterpret_cast<sockaddr*>(&address), &length) != 0)
            throw std::runtime_error("the fake HTTP server cannot listen");
        port_ = ntohs(address.sin_port);
        thread_ = std::thread([this] { serve(); });
    }

  public:
    ~FakeHttpServer() {
        stopping_ = true;
        thread_.join();
        ::close(listener_);
    }

    std::string endpoint() const { return "http://127.0.0.1:" + std::to_string(port_); }

  private:
    void serve() {
        while (!stopping_) {
            pollfd waiting{listener_, POLLIN, 0};
            if (::poll(&waiting, 1, 50) <= 0) continue;
            const int connection = ::accept(listener_, nullptr, nullptr);
            if (connection < 0) continue;
            // The request's head and its small body, then the answer, whatever was asked.
            std::string request;
            char buffer[4096];
            for (int rounds = 0; rounds < 40 && request.find("\r\n\r\n") == std::string::npos; ++rounds) {
                pollfd readable{connection, POLLIN, 0};
                if (::poll(&readable, 1, 50) <= 0) continue;
                const ssize_t received = ::recv(connection, buffer, sizeof buffer, 0);
                if (received <= 0) break;
                request.append(buffer, static_cast<std::size_t>(received));
            }
            if (silent_) {
                held_.push_back(connection);
                continue;
            }
            (void)::send(connection, response_.data(), response_.size(), MSG_NOSIGNAL);
            ::shutdown(connection, SHUT_RDWR);
            ::close(connection);
        }
        for (int connection : held_) ::close(connection);
    }

    bool silent_ = false;
    std::vector<int> held_;  // the silent server's connections, open until it stops
    std::string response_;
    int listener_ = -1;
    std::uint16_t port_ = 0;
    std::atomic<bool> stopping_{false};
    std::thread thread_;
};

}  // namespace rdmachan::test
