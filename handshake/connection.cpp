#include "handshake/connection.hpp"

#include "handshake/resolve.hpp"

#include "rdmachan/error.hpp"
#include "handshake/flight_events.hpp"

namespace rdmachan::handshake {

FramedConnection::FramedConnection(tcp::socket socket, std::string peer, std::size_t size_cap)
    : socket_(std::move(socket)), decoder_(std::move(peer), size_cap) {
    boost::system::error_code ignored;
    socket_.set_option(tcp::no_delay(true), ignored);
}

void FramedConnection::set_peer(std::string peer) {
    decoder_.set_peer(std::move(peer));
}

Task<std::string> FramedConnection::read_frame() {
    for (;;) {
        if (auto frame = decoder_.next_frame()) {
            flight::record(flight::HandshakeEvent::frame_received, frame->size());
            co_return std::move(*frame);
        }
        boost::system::error_code error;
        std::size_t received = 0;
        try {
            received = co_await socket_.async_read_some(asio::buffer(buffer_), asio::use_awaitable);
        } catch (const boost::system::system_error& failure) {
            error = failure.code();
        }
        if (error == asio::error::eof) {
            decoder_.finish();
            throw Error("connection from " + peer() + " closed before the next frame");
        }
        if (error) throw Error("reading from " + peer() + " failed: " + error.message());
        bytes_received_ += received;
        decoder_.feed(std::span<const std::uint8_t>(buffer_.data(), received));
    }
}

Task<void> FramedConnection::write_frame(std::string payload) {
    // The header and the payload as two buffers: a table frame of a large job is not copied.
    const std::string header = encode_frame_header(payload.size());
    const std::array<asio::const_buffer, 2> buffers = {asio::buffer(header), asio::buffer(payload)};
    boost::system::error_code error;
    try {
        co_await asio::async_write(socket_, buffers, asio::use_awaitable);
    } catch (const boost::system::system_error& failure) {
        error = failure.code();
    }
    if (error) throw Error("writing to " + peer() + " failed: " + error.message());
    flight::record(flight::HandshakeEvent::frame_sent, payload.size());
}

Task<nlohmann::json> FramedConnection::read_message(const char* expected_type) {
    const std::string frame = co_await read_frame();
    co_return parse_message(frame, expected_type);
}

nlohmann::json FramedConnection::parse_message(const std::string& frame, const char* expected_type) const {
    nlohmann::json message = parse_json_object(frame, peer(), "message");
    const auto type = message.find("type");
    if (type == message.end() || !type->is_string())
        throw Error("message from " + peer() + " has no string field 'type'");
    if (*type == "error") {
        const auto text = message.find("message");
        throw Error(peer() + " reported: " +
                    (text != message.end() && text->is_string() ? text->get<std::string>()
                                                                : std::string("(no message)")));
    }
    if (*type != expected_type)
        throw Error("expected a '" + std::string(expected_type) + "' message from " + peer() +
                    ", got '" + type->get<std::string>().substr(0, 40) + "'");
    return message;
}

Task<void> FramedConnection::write_message(const nlohmann::json& message) {
    co_await write_frame(message.dump());
}

void FramedConnection::close() {
    boost::system::error_code ignored;
    socket_.shutdown(tcp::socket::shutdown_both, ignored);
    socket_.close(ignored);
}

nlohmann::json parse_json_object(const std::string& text, const std::string& peer,
                                 const char* what) {
    nlohmann::json json = nlohmann::json::parse(text, nullptr, false);
    if (json.is_discarded() || !json.is_object())
        throw Error(std::string(what) + " from " + peer + " is not a JSON object (" +
                    std::to_string(text.size()) + " bytes)");
    return json;
}

Task<void> RetryBackoff::pause() {
    asio::steady_timer timer(co_await asio::this_coro::executor);
    timer.expires_after(next_ + std::chrono::milliseconds(random_() % (next_.count() + 1)));
    co_await timer.async_wait(asio::use_awaitable);
    next_ = std::min(next_ * 2, std::chrono::milliseconds(100));
}

Task<tcp::socket> connect_with_retries(std::string host, std::uint16_t port,
                                       std::function<void()> on_refused) {
    auto executor = co_await asio::this_coro::executor;
    RetryBackoff backoff;
    for (;;) {
        tcp::socket socket(executor);
        bool connected = false;
        try {
            const std::vector<tcp::endpoint> endpoints = co_await resolve(host, std::to_string(port));
            co_await asio::async_connect(socket, endpoints, asio::use_awaitable);
            connected = true;
        } catch (const boost::system::system_error&) {
            // Not listening yet (or not resolvable yet): the peer may simply start later.
        }
        if (connected) co_return socket;
        if (on_refused) on_refused();
        co_await backoff.pause();
    }
}

std::string describe(const tcp::endpoint& endpoint) {
    const auto address = endpoint.address();
    return (address.is_v6() ? "[" + address.to_string() + "]" : address.to_string()) + ":" +
           std::to_string(endpoint.port());
}

bool run_until(asio::io_context& io, Task<void> task,
               std::chrono::steady_clock::time_point deadline) {
    // Shared with the completion handler: after a timeout the suspended task outlives this call.
    struct Outcome {
        bool finished = false;
        std::exception_ptr failure;
    };
    auto outcome = std::make_shared<Outcome>();
    io.restart();
    asio::co_spawn(io, std::move(task), [outcome](std::exception_ptr error) {
        outcome->finished = true;
        outcome->failure = error;
    });
    while (!outcome->finished && std::chrono::steady_clock::now() < deadline && !io.stopped())
        io.run_one_until(deadline);
    if (!outcome->finished) {
        io.stop();
        return false;
    }
    if (outcome->failure) std::rethrow_exception(outcome->failure);
    return true;
}

}  // namespace rdmachan::handshake
