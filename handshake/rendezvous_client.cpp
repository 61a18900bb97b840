#include <unistd.h>

#include <algorithm>
#include <optional>
#include <variant>

#include "handshake/authentication.hpp"
#include "handshake/connection.hpp"
#include "handshake/hex.hpp"
#include "handshake/host_table.hpp"
#include "handshake/rendezvous_protocol.hpp"
#include "handshake/rendezvous_table.hpp"
#include "handshake/table_directory.hpp"
#include "rdmachan/error.hpp"
#include "rdmachan/rendezvous.hpp"
#include "handshake/flight_events.hpp"
#include "common/host_identity.hpp"
#include "common/logger.hpp"

namespace rdmachan {

using namespace handshake;

namespace {

// The table as exchange_view() gives it: the bytes as received or mapped, each row parsed when
// its endpoint is asked for, and the DC directory read in place.
class LazyTable final : public RendezvousTableView {
  public:
    std::uint32_t size() const override { return world; }
    std::string_view dc_directory() const override { return directory_text; }
    Endpoint endpoint(std::uint32_t rank) const override {
        if (rank >= world)
            throw Error("RendezvousTableView::endpoint: rank " + std::to_string(rank) + " is outside world size " +
                        std::to_string(world));
        if (!materialised.empty()) return materialised[rank];
        const auto [begin, end] = directory.row(rank);
        Endpoint endpoint;
        try {
            endpoint = parse_table_row(nlohmann::json::parse(table_text.substr(begin, end - begin)), rank, recipient);
        } catch (const nlohmann::json::exception& error) {
            throw Error(server + " sent a row for rank " + std::to_string(rank) + " that is not JSON: " + error.what());
        } catch (const Error& error) {
            throw Error(server + " sent an invalid endpoint for rank " + std::to_string(rank) + ": " + error.what());
        }
        if (endpoint.rank != rank)
            throw Error(server + " sent the endpoint of rank " + std::to_string(endpoint.rank) + " at index " +
                        std::to_string(rank));
        const auto entry = std::lower_bound(rc_for_me.begin(), rc_for_me.end(), rank,
                                            [](const RcEntry& entry, std::uint32_t wanted) { return entry.peer < wanted; });
        if (entry != rc_for_me.end() && entry->peer == rank) endpoint.rc.push_back({recipient, entry->qpn, entry->psn});
        return endpoint;
    }

    std::string server;
    std::uint32_t world = 0;
    std::uint32_t recipient = 0;
    std::optional<MappedTable> mapped;  // the host's copy, or
    std::string owned;                  // the table and directory as received
    std::string_view table_text;
    std::string_view directory_text;
    DirectoryView directory;
    std::vector<RcEntry> rc_for_me;       // sorted by peer: the entry each rank made for this one
    std::vector<Endpoint> materialised;  // a table that came without a directory, decoded whole
};

}  // namespace

struct Rendezvous::State {
    RendezvousSettings settings;
    std::chrono::steady_clock::time_point deadline;
    std::unique_ptr<RendezvousServer> server;  // rank 0 with serve_in_process
    asio::io_context io;
    std::optional<FramedConnection> connection;
    std::vector<Endpoint> table;
    // exchange_view(): the table kept as bytes instead of decoded into `table`.
    bool materialise = true;
    std::shared_ptr<LazyTable> view;
    std::uint32_t server_version = 0;
    RendezvousTableSource source;
    // The rank that published the host's copy holds it until the Rendezvous is destroyed, after
    // the barrier, by which time every rank of the host has read it.
    std::optional<PublishedTable> published;
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

    // Connects and exchanges hellos; the server's hello frame. A connection that ends before the
    // server sent a byte was never taken by the server: at thousands of ranks connecting at once
    // its accept queue overflows, and the kernel resets connections it dropped there (16,384
    // ranks on 2 cores: 87 ranks reset). Nothing of this rank is held by the server then, so it
    // connects again, backing off, until the caller's deadline.
    Task<std::string> say_hello(const std::string& client_hello) {
        RetryBackoff backoff;
        for (bool warned = false;;) {
            tcp::socket socket = co_await connect_with_retries(settings.host, settings.port);
            connection.emplace(std::move(socket), server_name(), unauthenticated_frame_size_cap);
            std::string lost;
            try {
                co_await connection->write_frame(client_hello);
                co_return co_await connection->read_frame();
            } catch (const Error& error) {
                if (connection->bytes_received() != 0) throw;
                lost = error.what();
            }
            if (!warned) {
                detail::logger().warn("{}: {} before the server answered; connecting again", me(), lost);
                warned = true;
            }
            connection->close();
            co_await backoff.pause();
        }
    }

    std::string me() const {
        return "rank " + std::to_string(settings.rank) + " of job '" + settings.job + "'";
    }

    // "rank 3 of job 'x' on host 1a2b3c4d (network namespace 4026531840)": the host named by the
    // start of its boot id and its namespace, as same-host detection tells hosts apart.
    std::string me_on_host() const {
        const detail::HostIdentity host = detail::this_host_identity();
        return me() + " on host " + to_hex(host.boot_id.data(), 4) + " (network namespace " +
               std::to_string(host.network_namespace) + ")";
    }

    Task<void> exchange(const Endpoint& mine) {
        const std::string session = to_hex_u64(mine.session);
        const std::string client_nonce = make_nonce();
        nlohmann::json hello_body = {{"rank", settings.rank},
                                           {"world_size", settings.world_size},
                                           {"job", settings.job},
                                           {"session", session},
                                           {"nonce", client_nonce}};
        if (*role() != '\0') hello_body["replacement"] = role();
        // A replacement arrives after the others shared their table: it receives its own.
        const bool names_host =
            settings.share_table_per_host && settings.replacement != PeerReplacement::replace_failed_rank;
        if (names_host) hello_body["host"] = detail::host_key(detail::this_host_identity());
        const std::string client_hello = encode_hello(hello_body.dump());
        const Hello hello = decode_hello(co_await say_hello(client_hello), server_name());
        server_version = hello.version;
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

        // A protocol-2 server, or a rank that named no host: its own table, as protocol 2 sends it.
        if (server_version < 3 || !names_host) {
            const std::string table_frame = co_await connection->read_frame();
            flight::record(flight::HandshakeEvent::state, flight::text("rendezvous: table received"), settings.rank, settings.port);
            read_table(table_frame);
            if (!materialise) {
                view = make_view();
                view->materialised = std::move(table);
            }
            co_return;
        }
        co_await receive_table();
    }

    // Protocol 3: the header with the RC entries made for this rank, then the table: read from
    // the host's copy where the server names one, else received (and published for the host
    // when the server asks).
    Task<void> receive_table() {
        const nlohmann::json header = co_await connection->read_message("table_header");
        const auto rc = header.find("rc");
        if (rc == header.end()) throw Error(server_name() + " sent a table_header without 'rc'");
        std::vector<RcEntry> entries;
        try {
            entries = parse_compact_rc_entries(*rc);
        } catch (const Error& error) {
            throw Error(server_name() + " sent invalid RC entries for " + me() + ": " + error.what());
        }
        // The answers are built before each co_await: GCC 12 cannot keep a braced JSON
        // initializer of string literals across a suspension ("array used as initializer").
        std::string refusal;
        nlohmann::json answer;
        if (const auto shared = header.find("shared"); shared != header.end()) {
            const SharedTableLocation location = read_location(*shared);
            const std::uint64_t table_size = read_table_size(*shared, location.size);
            try {
                MappedTable copy(location, me_on_host());
                source.host_copy_bytes = copy.bytes().size();
                take_table(std::move(copy), table_size);
                source.kind = RendezvousTableSource::Kind::host_copy;
            } catch (const Error& error) {
                refusal = error.what();
            }
            if (refusal.empty()) {
                answer = {{"type", "table_read"}};
                co_await connection->write_message(answer);
            } else {
                // A copy this rank cannot use costs it only its own copy.
                detail::logger().warn("{}; receiving its own copy instead", refusal);
                source.refused = refusal;
                answer = {{"type", "send_table"}, {"why", refusal}};
                co_await connection->write_message(answer);
                std::string own = co_await read_table_frames();
                take_table(std::move(own), table_frame_size);
            }
        } else {
            std::string received = co_await read_table_frames();
            const std::size_t received_table_size = table_frame_size;
            if (const auto share = header.find("share"); share != header.end() && *share == true) {
                try {
                    published.emplace(received);
                } catch (const Error& error) {
                    refusal = error.what();
                }
                if (refusal.empty()) {
                    source.kind = RendezvousTableSource::Kind::published_for_host;
                    answer = {{"type", "shared"}, {"pid", static_cast<std::uint32_t>(::getpid())}, {"fd", published->fd()}};
                } else {
                    detail::logger().warn("{} could not share the table with its host: {}", me_on_host(), refusal);
                    source.refused = refusal;
                    answer = {{"type", "shared"}, {"error", refusal}};
                }
                if (refusal.empty() && !materialise) {
                    // Its own copy, mapped: the received bytes need not stay in this rank's heap.
                    take_table(MappedTable(*published), received_table_size);
                } else {
                    take_table(std::move(received), received_table_size);
                }
                co_await connection->write_message(answer);
            } else {
                take_table(std::move(received), received_table_size);
            }
        }
        flight::record(flight::HandshakeEvent::state, flight::text("rendezvous: table received"), settings.rank, settings.port);
        std::sort(entries.begin(), entries.end(), [](const RcEntry& left, const RcEntry& right) { return left.peer < right.peer; });
        for (std::size_t index = 0; index < entries.size(); ++index) {
            const RcEntry& entry = entries[index];
            if (entry.peer >= settings.world_size)
                throw Error(server_name() + " sent an RC entry from rank " + std::to_string(entry.peer) +
                            ", outside world size " + std::to_string(settings.world_size));
            if (index != 0 && entries[index - 1].peer == entry.peer)
                throw Error(server_name() + " sent two RC entries from rank " + std::to_string(entry.peer));
            if (materialise) table[entry.peer].rc.push_back({settings.rank, entry.qpn, entry.psn});
        }
        if (!materialise) view->rc_for_me = std::move(entries);
    }

    // Protocol 3's table frame and DC directory frame, one after the other (the table's size in
    // table_frame_size). Either may instead be the server's error (the rendezvous failed while
    // it sent them): that is thrown, naming the server and what it reported.
    std::size_t table_frame_size = 0;
    Task<std::string> read_table_frames() {
        std::string frames = co_await connection->read_frame();
        if (frames.rfind(R"({"type":"table",)", 0) != 0) connection->parse_message(frames, "table");
        table_frame_size = frames.size();
        const std::string directory = co_await connection->read_frame();
        if (directory.rfind("RDCDIR01", 0) != 0) connection->parse_message(directory, "DC directory");
        frames += directory;
        co_return frames;
    }

    std::shared_ptr<LazyTable> make_view() const {
        auto made = std::make_shared<LazyTable>();
        made->server = server_name();
        made->world = settings.world_size;
        made->recipient = settings.rank;
        return made;
    }

    // Protocol 3's table frame (its first `table_size` bytes) and DC directory, as received or
    // in a mapped copy: decoded whole (exchange) or kept, each row parsed when asked for
    // (exchange_view).
    void take_table(std::variant<std::string, MappedTable> bytes, std::size_t table_size) {
        if (materialise) {
            const std::string_view text = std::holds_alternative<std::string>(bytes)
                                              ? std::string_view(std::get<std::string>(bytes))
                                              : std::get<MappedTable>(bytes).bytes();
            read_table(text.substr(0, table_size));
            return;
        }
        view = make_view();
        if (std::holds_alternative<std::string>(bytes)) {
            view->owned = std::move(std::get<std::string>(bytes));
        } else {
            view->mapped.emplace(std::move(std::get<MappedTable>(bytes)));
        }
        const std::string_view kept = view->mapped ? view->mapped->bytes() : std::string_view(view->owned);
        view->table_text = kept.substr(0, table_size);
        view->directory_text = kept.substr(table_size);
        try {
            view->directory = DirectoryView(view->directory_text, settings.world_size, table_size);
        } catch (const Error& error) {
            throw Error(server_name() + " sent a table whose " + error.what());
        }
    }

    std::uint64_t read_table_size(const nlohmann::json& shared, std::uint64_t size) const {
        const auto found = shared.find("table_size");
        if (found == shared.end() || !found->is_number_unsigned() || found->get<std::uint64_t>() > size)
            throw Error(server_name() + " named a shared table without a 'table_size' inside its size");
        return found->get<std::uint64_t>();
    }

    SharedTableLocation read_location(const nlohmann::json& shared) const {
        SharedTableLocation location;
        const auto field = [&](const char* key) -> const nlohmann::json& {
            const auto found = shared.find(key);
            if (found == shared.end()) throw Error(server_name() + " named a shared table without '" + key + "'");
            return *found;
        };
        const nlohmann::json& pid = field("pid");
        const nlohmann::json& fd = field("fd");
        const nlohmann::json& size = field("size");
        const nlohmann::json& digest = field("digest");
        if (!pid.is_number_unsigned() || pid.get<std::uint64_t>() > 0xffffffff || !fd.is_number_unsigned() ||
            fd.get<std::uint64_t>() > 0x7fffffff || !size.is_number_unsigned() || !digest.is_string() ||
            !from_hex(digest.get_ref<const std::string&>(), location.digest.data(), location.digest.size()))
            throw Error(server_name() + " named a shared table with fields of the wrong type");
        location.pid = pid.get<std::uint32_t>();
        location.fd = fd.get<std::int32_t>();
        location.size = size.get<std::uint64_t>();
        return location;
    }

    // The table frame: the canonical text through the scanner, anything else through the JSON
    // parser, which names what is wrong.
    void read_table(std::string_view table_frame) {
        std::vector<Endpoint> scanned;
        if (scan_table(table_frame, settings.world_size, settings.rank, scanned)) {
            table = std::move(scanned);
            return;
        }
        const nlohmann::json table_message = connection->parse_message(std::string(table_frame), "table");
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

    // exchange() (materialise) or exchange_view(), once.
    void run_exchange(const char* call, const Endpoint& mine, bool decode_whole) {
        const std::string name = std::string("Rendezvous::") + call;
        if (step != Step::fresh) throw Error(name + ": " + me() + " already exchanged (or failed)");
        if (mine.rank != settings.rank)
            throw Error(name + ": endpoint rank " + std::to_string(mine.rank) + " differs from the settings' rank " +
                        std::to_string(settings.rank));
        validate(mine);
        materialise = decode_whole;
        run(call, [&] { return exchange(mine); });
        step = Step::exchanged;
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

const RendezvousTableSource& Rendezvous::table_source() const {
    return state_->source;
}

std::vector<Endpoint> Rendezvous::exchange(const Endpoint& mine) {
    state_->run_exchange("exchange", mine, true);
    return state_->table;
}

std::shared_ptr<const RendezvousTableView> Rendezvous::exchange_view(const Endpoint& mine) {
    state_->run_exchange("exchange_view", mine, false);
    return std::move(state_->view);
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
