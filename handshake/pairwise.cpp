#include <optional>

#include "handshake/authentication.hpp"
#include "handshake/crypto.hpp"
#include "handshake/connection.hpp"
#include "rdmachan/error.hpp"
#include "rdmachan/handshake.hpp"
#include "handshake/flight_events.hpp"
#include "common/logger.hpp"

namespace rdmachan {

using namespace handshake;

namespace {

constexpr const char* connector_label = "rdmachan pairwise connector v1";
constexpr const char* listener_label = "rdmachan pairwise listener v1";

Endpoint read_endpoint(const nlohmann::json& message, const std::string& peer) {
    if (!message.contains("endpoint")) throw Error("message from " + peer + " lacks 'endpoint'");
    Endpoint endpoint;
    try {
        from_json(message["endpoint"], endpoint);
    } catch (const Error& error) {
        throw Error(peer + " sent an invalid endpoint: " + error.what());
    }
    return endpoint;
}

// Each side's hello says it confirms readiness (the "ready" step below). With a protocol-version-2
// side whose hello lacks the field (it predates that step) the exchange ends at the endpoints.
constexpr const char* confirms_ready_field = "confirms_ready";

nlohmann::json hello_body(const std::string& nonce) { return {{"nonce", nonce}, {confirms_ready_field, true}}; }

bool confirms_ready(const nlohmann::json& hello) {
    const auto field = hello.find(confirms_ready_field);
    return field != hello.end() && field->is_boolean() && field->get<bool>();
}

// Runs make_ready; its failure becomes the text the peer is told, empty when it succeeded.
std::string try_make_ready(const PairwiseReady& make_ready, const Endpoint& theirs) {
    try {
        make_ready(theirs);
    } catch (const std::exception& error) {
        return error.what();
    }
    return {};
}

// What the listener learned from a connector that proved the job token.
struct Connector {
    Endpoint endpoint;
    std::string connector_nonce;
    std::string listener_nonce;
    bool confirms_ready = false;
};

// Listener side of one connection up to the connector's endpoint; throws naming the peer.
Task<Connector> authenticate(FramedConnection& connection, const PairwiseSettings& settings) {
    const Hello hello = decode_hello(co_await connection.read_frame(), connection.peer());
    const nlohmann::json body = parse_json_object(hello.body, connection.peer(), "hello");
    if (!body.contains("nonce") || !body["nonce"].is_string())
        throw Error("hello from " + connection.peer() + " lacks a nonce");
    Connector connector;
    connector.connector_nonce = body["nonce"].get<std::string>();
    connector.confirms_ready = confirms_ready(body);
    connector.listener_nonce = make_nonce();
    const std::string reply = encode_hello(hello_body(connector.listener_nonce).dump());
    co_await connection.write_frame(reply);
    const nlohmann::json proof = co_await connection.read_message("proof");
    const std::string expected =
        make_proof(settings.token, connector_label, {connector.connector_nonce, connector.listener_nonce});
    if (!proof.contains("proof") || !proof["proof"].is_string() ||
        !proofs_match(expected, proof["proof"].get<std::string>())) {
        const nlohmann::json refusal = {{"type", "error"},
                                        {"message", "failed to prove the job token"}};
        co_await connection.write_message(refusal);
        throw Error(connection.peer() +
                    " failed to prove the job token (wrong RDMACHAN_JOB_TOKEN?)");
    }
    connection.set_size_cap(authenticated_frame_size_cap);
    const nlohmann::json theirs = co_await connection.read_message("endpoint");
    connector.endpoint = read_endpoint(theirs, connection.peer());
    co_return connector;
}

// Listener side after authentication: ready itself, answer with its endpoint, and wait for the
// connector's confirmation. Every failure here ends the exchange (the connector proved the
// token: it is the peer, not a stranger to refuse).
Task<void> answer(FramedConnection& connection, const PairwiseSettings& settings, const Endpoint& mine,
                  const Connector& connector, const PairwiseReady& make_ready, std::string& waiting_for) {
    const std::string failure = try_make_ready(make_ready, connector.endpoint);
    if (!failure.empty()) {
        // Named, not a temporary in the co_await: GCC 12 cannot initialise one there.
        const nlohmann::json refusal = {{"type", "error"}, {"message", "the listener cannot connect: " + failure}};
        co_await connection.write_message(refusal);
        throw Error("exchange_pairwise: cannot connect to " + connection.peer() + ": " + failure);
    }
    flight::record(flight::HandshakeEvent::state, flight::text("pairwise: ready"), mine.rank);
    const std::string my_proof =
        make_proof(settings.token, listener_label, {connector.connector_nonce, connector.listener_nonce});
    const nlohmann::json answer_message = {
        {"type", "endpoint"}, {"proof", my_proof}, {"endpoint", mine}};
    co_await connection.write_message(answer_message);
    if (connector.confirms_ready) {
        waiting_for = "the connector " + connection.peer() + " did not confirm it was ready";
        (void)co_await connection.read_message("ready");
        flight::record(flight::HandshakeEvent::state, flight::text("pairwise: peer ready"), mine.rank);
    }
}

Task<void> listen(asio::io_context& io, const PairwiseSettings& settings, const Endpoint& mine,
                  const PairwiseReady& make_ready, std::optional<Endpoint>& result, std::string& waiting_for) {
    tcp::acceptor acceptor(io);
    try {
        const tcp::endpoint address(asio::ip::make_address(settings.address), settings.port);
        acceptor.open(address.protocol());
        acceptor.set_option(tcp::acceptor::reuse_address(true));
        acceptor.bind(address);
        acceptor.listen();
    } catch (const boost::system::system_error& error) {
        throw Error("exchange_pairwise: cannot listen on " + settings.address + ":" +
                    std::to_string(settings.port) + ": " + error.code().message());
    }
    flight::record(flight::HandshakeEvent::state, flight::text("pairwise: listening"), mine.rank, acceptor.local_endpoint().port());
    if (settings.on_listening) settings.on_listening(acceptor.local_endpoint().port());
    // One peer at a time: a channel has exactly one, and a stranger is refused before the next.
    while (!result) {
        tcp::socket socket = co_await acceptor.async_accept(asio::use_awaitable);
        boost::system::error_code ignored;
        const std::string peer = describe(socket.remote_endpoint(ignored));
        FramedConnection connection(std::move(socket), peer, unauthenticated_frame_size_cap);
        flight::record(flight::HandshakeEvent::state, flight::text("pairwise: connection accepted"), mine.rank);
        std::optional<Connector> connector;
        std::string failure;
        try {
            connector = co_await authenticate(connection, settings);
        } catch (const Error& error) {
            failure = error.what();
        }
        flight::record(flight::HandshakeEvent::state,
                       flight::text(failure.empty() ? "pairwise: connector's endpoint received" : "pairwise: connector refused"), mine.rank);
        if (!failure.empty()) {
            detail::logger().warn("exchange_pairwise on {}: rejected {}",
                                  describe(acceptor.local_endpoint()), failure);
            connection.close();
            continue;
        }
        co_await answer(connection, settings, mine, *connector, make_ready, waiting_for);
        result = std::move(connector->endpoint);
        connection.close();
    }
}

Task<void> connect(const PairwiseSettings& settings, const Endpoint& mine, const PairwiseReady& make_ready,
                   std::optional<Endpoint>& result) {
    const std::string listener =
        "listener " + settings.address + ":" + std::to_string(settings.port);
    tcp::socket socket = co_await connect_with_retries(settings.address, settings.port, settings.on_connect_refused);
    FramedConnection connection(std::move(socket), listener, unauthenticated_frame_size_cap);
    flight::record(flight::HandshakeEvent::state, flight::text("pairwise: connected to the listener"), mine.rank, settings.port);
    const std::string connector_nonce = make_nonce();
    const std::string hello = encode_hello(hello_body(connector_nonce).dump());
    co_await connection.write_frame(hello);
    const Hello reply = decode_hello(co_await connection.read_frame(), listener);
    const nlohmann::json body = parse_json_object(reply.body, listener, "hello");
    if (!body.contains("nonce") || !body["nonce"].is_string())
        throw Error("hello from " + listener + " lacks a nonce");
    const std::string listener_nonce = body["nonce"].get<std::string>();
    const std::string my_proof =
        make_proof(settings.token, connector_label, {connector_nonce, listener_nonce});
    const nlohmann::json proof_message = {{"type", "proof"}, {"proof", my_proof}};
    co_await connection.write_message(proof_message);
    const nlohmann::json endpoint_message = {{"type", "endpoint"}, {"endpoint", mine}};
    co_await connection.write_message(endpoint_message);
    connection.set_size_cap(authenticated_frame_size_cap);
    // A listener that confirms readiness is ready for our requests once its endpoint arrives.
    const nlohmann::json theirs = co_await connection.read_message("endpoint");
    const std::string expected =
        make_proof(settings.token, listener_label, {connector_nonce, listener_nonce});
    if (!theirs.contains("proof") || !theirs["proof"].is_string() ||
        !proofs_match(expected, theirs["proof"].get<std::string>()))
        throw Error(listener + " failed to prove the job token");
    Endpoint endpoint = read_endpoint(theirs, listener);
    flight::record(flight::HandshakeEvent::state, flight::text("pairwise: endpoints exchanged"), mine.rank, settings.port);
    const std::string failure = try_make_ready(make_ready, endpoint);
    if (!failure.empty()) {
        const nlohmann::json refusal = {{"type", "error"}, {"message", "the connector cannot connect: " + failure}};
        if (confirms_ready(body)) co_await connection.write_message(refusal);
        throw Error("exchange_pairwise: cannot connect to " + listener + ": " + failure);
    }
    const nlohmann::json ready = {{"type", "ready"}};
    if (confirms_ready(body)) co_await connection.write_message(ready);
    flight::record(flight::HandshakeEvent::state, flight::text("pairwise: ready"), mine.rank, settings.port);
    result = std::move(endpoint);
    connection.close();
}

}  // namespace

Endpoint exchange_pairwise(const PairwiseSettings& settings, const Endpoint& mine) {
    return exchange_pairwise(settings, mine, [](const Endpoint&) {});
}

Endpoint exchange_pairwise(const PairwiseSettings& settings, const Endpoint& mine, const PairwiseReady& make_ready) {
    validate(mine);
    const auto deadline = std::chrono::steady_clock::now() + settings.timeout;
    const bool listening = settings.role == PairwiseSettings::Role::listen;
    asio::io_context io;
    std::optional<Endpoint> result;
    std::string waiting_for;  // what the listener waits for once a connector proved the token
    const bool finished = listening ? run_until(io, listen(io, settings, mine, make_ready, result, waiting_for), deadline)
                                    : run_until(io, connect(settings, mine, make_ready, result), deadline);
    if (!finished || !result)
        throw Error(std::string("exchange_pairwise: ") +
                    (!waiting_for.empty() ? waiting_for
                     : listening          ? "no peer proved the job token on " + settings.address + ":" + std::to_string(settings.port)
                                          : "no answer from listener " + settings.address + ":" + std::to_string(settings.port)) +
                    " within the deadline of " + std::to_string(settings.timeout.count()) + " ms");
    return *result;
}

std::uint32_t negotiate_mtu(std::uint32_t local, std::uint32_t remote, std::uint32_t port_active) {
    for (auto [name, value] :
         {std::pair{"local", local}, {"remote", remote}, {"port active", port_active}})
        if (!is_valid_mtu(value))
            throw Error(std::string("negotiate_mtu: ") + name + " MTU " + std::to_string(value) +
                        " is not one of 256, 512, 1024, 2048, 4096");
    return std::min({local, remote, port_active});
}

std::uint32_t random_psn() {
    return static_cast<std::uint32_t>(random_u64() & 0xffffff);
}

std::uint64_t random_dc_key() {
    return random_u64();
}

std::uint64_t random_session_id() {
    for (;;)
        if (const std::uint64_t value = random_u64(); value != 0) return value;
}

}  // namespace rdmachan
