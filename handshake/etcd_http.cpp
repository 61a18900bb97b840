#include "handshake/etcd_http.hpp"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/ssl.h>
#include <sys/socket.h>

#include <boost/asio/ssl.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http.hpp>
#include <optional>

#include "handshake/resolve.hpp"

namespace rdmachan::handshake {

namespace http = boost::beast::http;
namespace ssl = boost::asio::ssl;

EtcdAddress parse_etcd_address(std::string_view url) {
    const auto refuse = [&](const char* why) -> EtcdAddress {
        throw Error("etcd endpoint '" + std::string(url.substr(0, 200)) + "' " + why +
                    " (expected http://host:port or https://host:port)");
    };
    EtcdAddress address;
    std::string_view rest;
    if (url.starts_with("http://")) {
        rest = url.substr(7);
    } else if (url.starts_with("https://")) {
        address.tls = true;
        rest = url.substr(8);
    } else {
        return refuse("has no http:// or https:// scheme");
    }
    if (!rest.empty() && rest.back() == '/') rest.remove_suffix(1);
    if (rest.find('/') != std::string_view::npos) return refuse("has a path");
    std::size_t colon = std::string_view::npos;
    if (rest.starts_with("[")) {
        const std::size_t close = rest.find(']');
        if (close == std::string_view::npos) return refuse("has an unclosed '['");
        address.host = std::string(rest.substr(1, close - 1));
        colon = close + 1;
        if (colon >= rest.size() || rest[colon] != ':') return refuse("has no port");
    } else {
        colon = rest.rfind(':');
        if (colon == std::string_view::npos) return refuse("has no port");
        address.host = std::string(rest.substr(0, colon));
    }
    address.port = std::string(rest.substr(colon + 1));
    if (address.host.empty()) return refuse("has no host");
    if (address.port.empty() || address.port.size() > 5 ||
        address.port.find_first_not_of("0123456789") != std::string::npos || std::stoul(address.port) == 0 ||
        std::stoul(address.port) > 65535)
        return refuse("has no valid port");
    address.name = "etcd " + std::string(url);
    return address;
}

namespace {

void setsockopt_int(tcp::socket& socket, int level, int name, int value) {
    // Best effort: without the option the connection works, it only notices a silent peer later.
    (void)::setsockopt(socket.native_handle(), level, name, &value, sizeof value);
}

}  // namespace

struct HttpConnection::State {
    EtcdAddress address;
    std::string ca_file;
    std::optional<tcp::socket> socket;
    std::optional<ssl::context> tls_context;
    std::optional<ssl::stream<tcp::socket>> tls;
    boost::beast::flat_buffer buffer;
    std::optional<http::response_parser<http::string_body>> streamed;
    bool closed = false;

    http::request<http::string_body> request(std::string target, std::string body, const std::string& token) const {
        http::request<http::string_body> request{http::verb::post, std::move(target), 11};
        request.set(http::field::host, address.host);
        request.set(http::field::content_type, "application/json");
        if (!token.empty()) request.set(http::field::authorization, token);
        request.body() = std::move(body);
        request.prepare_payload();
        return request;
    }

    // Each operation on whichever stream this connection has.
    template <typename Operation>
    auto on_stream(Operation&& operation) {
        if (tls) return operation(*tls);
        return operation(*socket);
    }
};

HttpConnection::HttpConnection(EtcdAddress address, std::string ca_file)
    : state_(std::make_unique<State>()) {
    state_->address = std::move(address);
    state_->ca_file = std::move(ca_file);
}

HttpConnection::~HttpConnection() = default;

Task<void> HttpConnection::connect() {
    State& state = *state_;
    auto executor = co_await asio::this_coro::executor;
    // In the state from the start, so that close() can end the connect.
    tcp::socket& socket = state.socket.emplace(executor);
    std::string step = "resolving " + state.address.host;
    try {
        const std::vector<tcp::endpoint> endpoints = co_await resolve(state.address.host, state.address.port);
        if (state.closed) throw EtcdUnreachable(step + ": closed before connecting");
        step = "connecting";
        co_await asio::async_connect(socket, endpoints, asio::use_awaitable);
    } catch (const boost::system::system_error& failure) {
        throw EtcdUnreachable(step + ": " + failure.code().message());
    }
    if (state.closed) throw EtcdUnreachable("closed while connecting");
    boost::system::error_code ignored;
    socket.set_option(tcp::no_delay(true), ignored);
    // A watch's stream is quiet while nothing changes: probes find a peer that vanished without
    // closing (its host gone) within about 20 s, and the watch connects again.
    socket.set_option(asio::socket_base::keep_alive(true), ignored);
    setsockopt_int(socket, IPPROTO_TCP, TCP_KEEPIDLE, 10);
    setsockopt_int(socket, IPPROTO_TCP, TCP_KEEPINTVL, 5);
    setsockopt_int(socket, IPPROTO_TCP, TCP_KEEPCNT, 2);
    if (!state.address.tls) co_return;
    ssl::context& context = state.tls_context.emplace(ssl::context::tls_client);
    context.set_verify_mode(ssl::verify_peer);
    boost::system::error_code error;
    if (state.ca_file.empty())
        context.set_default_verify_paths(error);
    else
        context.load_verify_file(state.ca_file, error);
    if (error)
        throw Error("loading the certificate authority '" + state.ca_file + "' failed: " + error.message());
    context.set_verify_callback(ssl::host_name_verification(state.address.host));
    ssl::stream<tcp::socket>& tls = state.tls.emplace(std::move(socket), context);
    state.socket.reset();
    // Server name indication: a server with several certificates picks the one for this name.
    if (!SSL_set_tlsext_host_name(tls.native_handle(), state.address.host.c_str()))
        throw Error("setting the TLS server name '" + state.address.host + "' failed");
    try {
        co_await tls.async_handshake(ssl::stream_base::client, asio::use_awaitable);
    } catch (const boost::system::system_error& failure) {
        // A certificate this client does not trust stays untrusted however often it is tried:
        // refused at once, naming why, not retried until the caller's deadline as an etcd that
        // is not up yet would be.
        if (const long verdict = SSL_get_verify_result(tls.native_handle()); verdict != X509_V_OK) {
            throw Error("TLS handshake: " + failure.code().message() + ": " + X509_verify_cert_error_string(verdict) +
                        " (trusted: " + (state.ca_file.empty() ? std::string("the system's certificate authorities")
                                                               : "the CA file '" + state.ca_file + "'") +
                        ")");
        }
        throw EtcdUnreachable("TLS handshake: " + failure.code().message());
    }
}

void HttpConnection::close() {
    boost::system::error_code ignored;
    state_->closed = true;
    if (state_->tls) state_->tls->next_layer().close(ignored);
    if (state_->socket) state_->socket->close(ignored);
}

Task<HttpAnswer> HttpConnection::post(std::string target, std::string body, std::string token) {
    State& state = *state_;
    auto request = state.request(std::move(target), std::move(body), token);
    http::response_parser<http::string_body> parser;
    parser.body_limit(etcd_answer_size_cap);
    try {
        co_await state.on_stream([&](auto& stream) { return http::async_write(stream, request, asio::use_awaitable); });
        co_await state.on_stream(
            [&](auto& stream) { return http::async_read(stream, state.buffer, parser, asio::use_awaitable); });
    } catch (const boost::system::system_error& failure) {
        throw EtcdConnectionLost("the HTTP exchange failed: " + failure.code().message());
    }
    co_return HttpAnswer{parser.get().result_int(), std::move(parser.get().body())};
}

Task<unsigned> HttpConnection::post_streamed(std::string target, std::string body, std::string token) {
    State& state = *state_;
    auto request = state.request(std::move(target), std::move(body), token);
    auto& parser = state.streamed.emplace();
    // The watch's body never ends by design; read_some's caller bounds what it keeps.
    parser.body_limit(boost::none);
    try {
        co_await state.on_stream([&](auto& stream) { return http::async_write(stream, request, asio::use_awaitable); });
        co_await state.on_stream(
            [&](auto& stream) { return http::async_read_header(stream, state.buffer, parser, asio::use_awaitable); });
    } catch (const boost::system::system_error& failure) {
        throw EtcdConnectionLost("the HTTP exchange failed: " + failure.code().message());
    }
    co_return parser.get().result_int();
}

Task<std::string> HttpConnection::read_some() {
    State& state = *state_;
    if (!state.streamed) throw Error("read_some without a streamed answer");
    auto& parser = *state.streamed;
    while (parser.get().body().empty() && !parser.is_done()) {
        try {
            co_await state.on_stream(
                [&](auto& stream) { return http::async_read_some(stream, state.buffer, parser, asio::use_awaitable); });
        } catch (const boost::system::system_error& failure) {
            throw EtcdConnectionLost("reading the streamed answer failed: " + failure.code().message());
        }
    }
    std::string bytes = std::move(parser.get().body());
    parser.get().body().clear();
    co_return bytes;
}

}  // namespace rdmachan::handshake
