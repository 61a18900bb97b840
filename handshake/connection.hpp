// A TCP stream carrying handshake frames, plus the connect-with-retries both clients use.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <functional>
#include <random>
#include <nlohmann/json.hpp>
#include <string>

#include "handshake/asio.hpp"
#include "handshake/frame.hpp"

namespace rdmachan::handshake {

class FramedConnection {
  public:
    FramedConnection(tcp::socket socket, std::string peer, std::size_t size_cap);

    // Errors (end of stream, truncation, oversize, socket errors) are rdmachan::Error naming
    // the peer.
    Task<std::string> read_frame();
    Task<void> write_frame(std::string payload);

    // Reads a frame holding a JSON message of the given type; a {"type":"error"} message is
    // thrown as rdmachan::Error carrying the peer's text.
    Task<nlohmann::json> read_message(const char* expected_type);
    // The checks of read_message on a frame already read.
    nlohmann::json parse_message(const std::string& frame, const char* expected_type) const;
    Task<void> write_message(const nlohmann::json& message);

    void set_peer(std::string peer);
    void set_size_cap(std::size_t size_cap) { decoder_.set_size_cap(size_cap); }
    const std::string& peer() const { return decoder_.peer(); }
    // Every byte read from the socket so far (frame headers included).
    std::uint64_t bytes_received() const { return bytes_received_; }
    void close();

  private:
    tcp::socket socket_;
    FrameDecoder decoder_;
    std::array<std::uint8_t, 16384> buffer_;
    std::uint64_t bytes_received_ = 0;
};

// Parses JSON text received from `peer`, requiring an object; errors name the peer.
nlohmann::json parse_json_object(const std::string& text, const std::string& peer,
                                 const char* what);

// The pause between two attempts at something that may succeed later: from 5 ms, doubling to
// 100 ms, with jitter so many ranks retrying at once do not retry in lockstep.
class RetryBackoff {
  public:
    Task<void> pause();

  private:
    std::chrono::milliseconds next_{5};
    std::minstd_rand random_{std::random_device{}()};
};

// Resolves and connects until it succeeds, pausing between attempts as RetryBackoff does; the
// caller's deadline ends it. `on_refused`, if set, is called after each failed attempt.
Task<tcp::socket> connect_with_retries(std::string host, std::uint16_t port,
                                       std::function<void()> on_refused = {});

std::string describe(const tcp::endpoint& endpoint);

// Runs `task` on `io` until it finishes or the deadline passes. Returns false on timeout (the
// io_context is stopped and the task stays suspended until `io` is destroyed); rethrows the
// task's exception.
bool run_until(asio::io_context& io, Task<void> task,
               std::chrono::steady_clock::time_point deadline);

}  // namespace rdmachan::handshake
