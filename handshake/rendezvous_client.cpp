#include <optional>

#include "handshake/authentication.hpp"
#include "handshake/connection.hpp"
#include "handshake/hex.hpp"
#include "handshake/rendezvous_protocol.hpp"
#include "handshake/rendezvous_table.hpp"
#include "rdmachan/error.hpp"
#include "rdmachan/rendezvous.hpp"
#include "handshake/flight_events.hpp"
#include "common/logger.hpp"

namespace rdmachan {

using namespace handshake;

struct Rendezvous::State {
    RendezvousSettings settings;
    std::chrono::steady_clock::time_point deadline;
    std::unique_ptr<RendezvousServer> server;  // rank 0 with serve_in_process
    asio::io_context io;
    std::optional<FramedConnection> connection;
    std::vector<Endpoint> table;
    enum class Step { fresh, exchanged, released, broken } step = Step::fresh;
    // Peer replacement: what the watch read since the last poll_events(), and why it stopped.
    std::vector<RendezvousEvent> events;
    std::string watch_failure;
    bool watching = false;

    const char* role() const {
        switch (settings.replacement) {
            case PeerReplacement::disabled: return "";
            case PeerReplacement::enabled: return "watch";
            case PeerReplacement::replace_failed_rank: return "replace";
        }
        return "";
    }

    std::string server_name() const {
        return "rendezvous server " + settings.host + ":" + std::to_string(settings.port);
    }

    std::string me() const {
        return "rank " + std::to_string(settings.rank) + " of job '" + settings.job + "'";
    }

    Task<void> exchange(const Endpoint& mine) {
        tcp::socket socket = co_await connect_with_retries(settings.host, settings.port);
        connection.emplace(std::move(socket), server_name(), unauthenticated_frame_size_cap);
        const std::string session = to_hex_u64(mine.session);
        const std::string client_nonce = make_nonce();
        nlohmann::json hello_body = {{"rank", settings.rank},
                                           {"world_size", settings.world_size},
                                           {"job", settings.job},
                                           {"session", session},
                                           {"nonce", client_nonce}};
        if (*role() != '\0') hello_body["replacement"] = role();
        const std::string client_hello = encode_hello(hello_body.dump());
        co_await connection->write_frame(client_hello);
        const Hello hello = decode_hello(co_await connection->read_frame(), server_name());
        const nlohmann::json body = parse_json_object(hello.body, server_name(), "hello");
        if (body.contains("error") && body["error"].is_string())
            throw Error(server_name() + " rejected " + me() + ": " +
                        body["error"].get<std::string>());
        if (!body.contains("nonce") || !body["nonce"].is_string())
            throw Error(server_name() + " sent a hello without a nonce");
        const std::string server_nonce = body["nonce"].get<std::string>();
        if (*role() != '\0' && !(body.contains("replacement") && body["replacement"] == true))
            throw Error(server_name() + " does not offer peer replacement, which " + me() +
                        " asks for (start the server with RendezvousServerSettings::replacement)");
        const std::string rank = std::to_string(settings.rank);
        const std::string client_proof = rendezvous_proof(settings.token, rendezvous_client_label, settings.job,
                                                          rank, session, client_nonce, server_nonce, role());
        const nlohmann::json proof_message = {{"type", "proof"}, {"proof", client_proof}};
        co_await connection->write_message(proof_message);
        const nlohmann::json accepted = co_await connection->read_message("accepted");
        const std::string expected = rendezvous_proof(settings.token, rendezvous_server_label, settings.job, rank,
                                                      session, client_nonce, server_nonce, role());
        if (!accepted.contains("proof") || !accepted["proof"].is_string() ||
            !proofs_match(expected, accepted["proof"].get<std::string>()))
            throw Error(server_name() + " failed to prove the job token to " + me());
        connection->set_size_cap(authenticated_frame_size_cap);
        // The RC entries travel as compact [peer, qpn, psn] triples (protocol 2).
        Endpoint without_rc = mine;
        without_rc.rc.clear();
        const nlohmann::json registration = {
            {"type", "register"}, {"endpoint", without_rc}, {"rc", compact_rc_entries(mine.rc)}};
        co_await connection->write_message(registration);
        flight::record(flight::HandshakeEvent::state, flight::text("rendezvous: registered"), settings.rank, settings.port);

        const std::string table_frame = co_await connection->read_frame();
        flight::record(flight::HandshakeEvent::state, flight::text("rendezvous: table received"), settings.rank, settings.port);
        std::vector<Endpoint> scanned;
        if (scan_table(table_frame, settings.world_size, settings.rank, scanned)) {
            table = std::move(scanned);
            co_return;
        }
        // Not the canonical form (or not valid): the JSON parse says what is wrong, if anything.
        const nlohmann::json table_message = connection->parse_message(table_frame, "table");
        const auto rows = table_message.find("rows");
        if (rows == table_message.end() || !rows->is_array() || rows->size() != settings.world_size)
            throw Error(server_name() + " sent a table that is not " +
                        std::to_string(settings.world_size) + " rows");
        std::vector<Endpoint> received(settings.world_size);
        for (std::uint32_t index = 0; index < settings.world_size; ++index) {
            try {
                received[index] = parse_table_row((*rows)[index], index, settings.rank);
            } catch (const Error& error) {
                throw Error(server_name() + " sent an invalid endpoint for rank " +
                            std::to_string(index) + ": " + error.what());
            }
            if (received[index].rank != index)
                throw Error(server_name() + " sent the endpoint of rank " +
                            std::to_string(received[index].rank) + " at index " +
                            std::to_string(index));
        }
        table = std::move(received);
    }

    Task<void> barrier() {
        const nlohmann::json message = {{"type", "barrier"}};
        co_await connection->write_message(message);
        co_await connection->read_message("release");
        flight::record(flight::HandshakeEvent::state, flight::text("rendezvous: barrier released"), settings.rank, settings.port);
    }

    // The watch: events until the connection closes (or the Rendezvous is destroyed).
    Task<void> read_events() {
        try {
            for (;;) {
                const std::string frame = co_await connection->read_frame();
                const nlohmann::json message = parse_json_object(frame, server_name(), "event");
                events.push_back(parse_event(message));
            }
        } catch (const Error& error) {
            watch_failure = error.what();
        }
    }

    RendezvousEvent parse_event(const nlohmann::json& message) const {
        const auto type = message.find("type");
        const auto rank = message.find("rank");
        const auto session = message.find("session");
        if (type == message.end() || !type->is_string() || rank == message.end() || !rank->is_number_unsigned() ||
            rank->get<std::uint64_t>() >= settings.world_size || session == message.end() || !session->is_string())
            throw Error(server_name() + " sent an event without a valid type, rank or session");
        RendezvousEvent event;
        event.rank = rank->get<std::uint32_t>();
        if (!parse_hex_u64(session->get<std::string>(), event.session))
            throw Error(server_name() + " sent an event whose session is not 64-bit hex text");
        if (*type == "failed") {
            event.kind = RendezvousEvent::Kind::failed;
        } else if (*type == "ready") {
            event.kind = RendezvousEvent::Kind::ready;
        } else if (*type == "replacement") {
            event.kind = RendezvousEvent::Kind::replacement;
            const auto row = message.find("row");
            if (row == message.end()) throw Error(server_name() + " sent a replacement event without a row");
            event.endpoint = parse_table_row(*row, event.rank, settings.rank);
            if (event.endpoint.session != event.session)
                throw Error(server_name() + " sent a replacement event whose row has another session");
        } else {
            throw Error(server_name() + " sent an event of unknown type '" + type->get<std::string>().substr(0, 40) +
                        "'");
        }
        return event;
    }

    template <typename Body>
    void run(const char* call, Body body) {
        bool completed = false;
        try {
            completed = run_until(io, body(), deadline);
        } catch (...) {
            step = Step::broken;
            throw;
        }
        if (!completed) {
            step = Step::broken;
            throw Error(
                "Rendezvous::" + std::string(call) + ": " + me() + " with " + server_name() +
                ": deadline of " + std::to_string(settings.timeout.count()) + " ms expired" +
                (connection ? " waiting for the other ranks" : " before the server answered"));
        }
    }
};

Rendezvous::Rendezvous(RendezvousSettings settings) : state_(std::make_unique<State>()) {
    State& state = *state_;
    state.settings = std::move(settings);
    state.deadline = std::chrono::steady_clock::now() + state.settings.timeout;
    if (state.settings.world_size == 0 || state.settings.rank >= state.settings.world_size)
        throw Error("Rendezvous: rank " + std::to_string(state.settings.rank) +
                    " is out of range for world size " + std::to_string(state.settings.world_size));
    if (state.settings.serve_in_process && state.settings.rank == 0) {
        // The server's own deadline comes a little earlier, so clients still connected hear
        // which ranks are missing before their own deadline passes.
        const auto margin = std::min(state.settings.timeout / 10, std::chrono::milliseconds(250));
        state.server = std::make_unique<RendezvousServer>(RendezvousServerSettings{
            state.settings.host, state.settings.port, state.settings.world_size, state.settings.job,
            state.settings.token, state.settings.timeout - margin,
            state.settings.replacement != PeerReplacement::disabled});
        state.settings.port = state.server->port();
        state.server->start();
    }
}

Rendezvous::~Rendezvous() = default;

std::uint16_t Rendezvous::port() const {
    return state_->settings.port;
}

std::uint64_t Rendezvous::bytes_received() const {
    return state_->connection ? state_->connection->bytes_received() : 0;
}

std::vector<Endpoint> Rendezvous::exchange(const Endpoint& mine) {
    State& state = *state_;
    if (state.step != State::Step::fresh)
        throw Error("Rendezvous::exchange: " + state.me() + " already exchanged (or failed)");
    if (mine.rank != state.settings.rank)
        throw Error("Rendezvous::exchange: endpoint rank " + std::to_string(mine.rank) +
                    " differs from the settings' rank " + std::to_string(state.settings.rank));
    validate(mine);
    state.run("exchange", [&] { return state.exchange(mine); });
    state.step = State::Step::exchanged;
    return state.table;
}

void Rendezvous::barrier() {
    State& state = *state_;
    if (state.step != State::Step::exchanged)
        throw Error("Rendezvous::barrier: " + state.me() + " must exchange() successfully first");
    state.run("barrier", [&] { return state.barrier(); });
    state.step = State::Step::released;
    if (state.settings.replacement != PeerReplacement::disabled) {
        // The connection stays: the server reports failures and replacements on it.
        state.watching = true;
        asio::co_spawn(state.io, state.read_events(), asio::detached_t{});
    } else {
        state.connection->close();
    }
    // Rank 0's process hosts the server: make sure every rank got its release before going on.
    if (state.server) state.server->wait();
}

std::vector<RendezvousEvent> Rendezvous::poll_events() {
    State& state = *state_;
    if (!state.watching)
        throw Error("Rendezvous::poll_events: " + state.me() +
                    " is not watching (peer replacement disabled, or barrier() not done)");
    state.io.restart();
    state.io.poll();
    std::vector<RendezvousEvent> events = std::move(state.events);
    state.events.clear();
    if (events.empty() && !state.watch_failure.empty())
        throw Error("Rendezvous::poll_events: " + state.me() + " lost its connection to " + state.server_name() +
                    ": " + state.watch_failure);
    return events;
}

void Rendezvous::acknowledge_replacement(std::uint32_t peer, std::uint64_t session,
                                         const std::optional<RcEntry>& entry) {
    State& state = *state_;
    if (!state.watching)
        throw Error("Rendezvous::acknowledge_replacement: " + state.me() + " is not watching");
    if (!state.watch_failure.empty())
        throw Error("Rendezvous::acknowledge_replacement: " + state.me() + " lost its connection to " +
                    state.server_name() + ": " + state.watch_failure);
    nlohmann::json message = {{"type", "reconnected"}, {"peer", peer}, {"session", to_hex_u64(session)}};
    message["rc"] = entry ? nlohmann::json::array({entry->qpn, entry->psn}) : nlohmann::json::array();
    const auto deadline = std::chrono::steady_clock::now() + state.settings.timeout;
    if (!run_until(state.io, state.connection->write_frame(message.dump()), deadline))
        throw Error("Rendezvous::acknowledge_replacement: " + state.me() + " with " + state.server_name() +
                    ": deadline of " + std::to_string(state.settings.timeout.count()) + " ms expired");
}

std::vector<Endpoint> rendezvous(const RendezvousSettings& settings, const Endpoint& mine) {
    Rendezvous session(settings);
    std::vector<Endpoint> table = session.exchange(mine);
    session.barrier();
    return table;
}

}  // namespace rdmachan
