// A hand-driven rendezvous client for the tests that play a hostile or old rank: frames in and
// out over a blocking socket.
#pragma once

#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/write.hpp>
#include <cstdint>
#include <string>

#include "handshake/frame.hpp"

namespace rdmachan::test {

class RawClient {
  public:
    explicit RawClient(std::uint16_t port) : socket_(io_), decoder_("server", 1 << 20) {
        socket_.connect({boost::asio::ip::make_address("127.0.0.1"), port});
    }
    void send(const std::string& payload) {
        boost::asio::write(socket_, boost::asio::buffer(rdmachan::handshake::encode_frame(payload)));
    }
    // The next frame, or "" when the server closed the connection.
    std::string receive() {
        for (;;) {
            if (auto frame = decoder_.next_frame()) return *frame;
            std::uint8_t chunk[4096];
            boost::system::error_code error;
            const std::size_t got = socket_.read_some(boost::asio::buffer(chunk), error);
            if (error) return {};
            decoder_.feed({chunk, got});
        }
    }

  private:
    boost::asio::io_context io_;
    boost::asio::ip::tcp::socket socket_;
    rdmachan::handshake::FrameDecoder decoder_;
};

}  // namespace rdmachan::test
