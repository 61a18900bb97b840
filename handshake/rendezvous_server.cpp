#include <sys/resource.h>

#include <condition_variable>
#include <list>
#include <mutex>
#include <optional>
#include <thread>

#include "handshake/authentication.hpp"
#include "handshake/connection.hpp"
#include "handshake/hex.hpp"
#include "handshake/rendezvous_protocol.hpp"
#include "handshake/rendezvous_table.hpp"
#include "rdmachan/error.hpp"
#include "rdmachan/rendezvous.hpp"
#include "src/logger.hpp"

namespace rdmachan {

using namespace handshake;

namespace handshake {

std::string format_ranks(const std::vector<std::uint32_t>& ranks) {
    std::string text;
    for (std::size_t index = 0; index < ranks.size();) {
        std::size_t end = index;
        while (end + 1 < ranks.size() && ranks[end + 1] == ranks[end] + 1) ++end;
        if (!text.empty()) text += ", ";
        text += std::to_string(ranks[index]);
        // Appended in two steps: GCC 12 at -O3 warns (-Wrestrict, GCC bug 105329) about the
        // inlined copy in `"-" + std::string`.
        if (end > index) {
            text += '-';
            text += std::to_string(ranks[end]);
        }
        index = end + 1;
    }
    return text;
}

}  // namespace handshake

namespace {

enum class Phase { gathering, table_sent, released, failed };

std::string describe_accept_error(const boost::system::error_code& error) {
    std::string text = error.message();
    if (error == boost::system::errc::too_many_files_open) {
        rlimit limit{};
        ::getrlimit(RLIMIT_NOFILE, &limit);
        text += " (this process is out of file descriptors: RLIMIT_NOFILE is " + std::to_string(limit.rlim_cur) +
                ", hard limit " + std::to_string(limit.rlim_max) + ")";
    }
    return text;
}

// An RC entry as the server keeps it per (rank, peer): qpn and psn are 24 bits each; `present`
// tells an entry from a peer the rank made no queue pair for.
struct PackedRcEntry {
    std::uint32_t qpn : 24 = 0;
    std::uint32_t present : 1 = 0;
    std::uint32_t psn = 0;
};

// The RC entries of `endpoint` indexed by the peer they are for. A peer out of range or named
// twice is the registering rank's error (Rejection text names the field).
std::vector<PackedRcEntry> index_rc_entries(const Endpoint& endpoint, std::uint32_t world_size) {
    std::vector<PackedRcEntry> by_peer(endpoint.rc.empty() ? 0 : world_size);
    for (std::size_t index = 0; index < endpoint.rc.size(); ++index) {
        const RcEntry& entry = endpoint.rc[index];
        const std::string field = "rc[" + std::to_string(index) + "].peer";
        if (entry.peer >= world_size)
            throw Error("endpoint field '" + field + "' = " + std::to_string(entry.peer) +
                        " is not a rank of world size " + std::to_string(world_size));
        if (by_peer[entry.peer].present)
            throw Error("endpoint field '" + field + "' = " + std::to_string(entry.peer) +
                        " names a peer that an earlier rc entry names already");
        by_peer[entry.peer].qpn = entry.qpn & 0xffffff;
        by_peer[entry.peer].psn = entry.psn;
        by_peer[entry.peer].present = 1;
    }
    return by_peer;
}

// Thrown inside a connection's coroutine to reject the peer with a message sent back to it.
struct Rejection {
    std::string message;
};

}  // namespace

struct RendezvousServer::State {
    RendezvousServerSettings settings;
    asio::io_context io;
    tcp::acceptor acceptor{io};
    asio::steady_timer deadline_timer{io};
    // Waiters park on these timers (never expiring); cancel() wakes them all.
    asio::steady_timer table_event{io};
    asio::steady_timer release_event{io};
    asio::steady_timer table_slot_event{io};  // cancel_one() when a table write finishes
    static constexpr std::uint32_t max_tables_in_flight = 32;
    std::uint32_t tables_in_flight = 0;
    std::list<std::shared_ptr<FramedConnection>> connections;
    // Read by other threads while the server runs; set once before start().
    std::uint16_t port = 0;
    std::string listening_on;

    Phase phase = Phase::gathering;
    // Per registered rank: its session, its table row serialized once around the RC part, and
    // the RC entry it made for each peer (indexed by peer). Each rank's table is assembled from
    // these by concatenation (see table_for), O(N) bytes per rank.
    std::vector<std::optional<std::uint64_t>> registered;
    std::vector<TableRowText> row_text;
    std::vector<std::vector<PackedRcEntry>> rc_for_peer;
    std::uint32_t registered_count = 0;
    std::vector<bool> in_barrier;
    std::uint32_t barrier_count = 0;
    std::uint32_t released_count = 0;
    std::string failure;
    std::string accept_failure;  // the last reason accept() failed, for the deadline's report

    std::thread thread;
    std::mutex mutex;
    std::condition_variable finished_signal;
    bool finished = false;
    std::uint32_t registered_so_far = 0;  // registered_count, for wait_registered()
    std::condition_variable registered_signal;
    std::string final_error;  // empty on success

    std::string name() const {
        return "rendezvous server for job '" + settings.job + "' on " + listening_on;
    }

    Task<void> accept_loop() {
        asio::steady_timer pause(io);
        for (;;) {
            tcp::socket socket(io);
            boost::system::error_code accept_error;
            try {
                socket = co_await acceptor.async_accept(asio::use_awaitable);
            } catch (const boost::system::system_error& failure) {
                accept_error = failure.code();
            }
            if (accept_error == asio::error::operation_aborted || !acceptor.is_open()) co_return;
            if (accept_error) {
                // Out of descriptors, most likely: the ranks waiting in the backlog get in once
                // some are free; until then the deadline's report carries the reason.
                if (accept_failure.empty())
                    detail::logger().error("{}: accepting a connection failed: {}", name(),
                                           describe_accept_error(accept_error));
                accept_failure = describe_accept_error(accept_error);
                pause.expires_after(std::chrono::milliseconds(50));
                co_await pause.async_wait(asio::use_awaitable);
                continue;
            }
            boost::system::error_code error;
            const tcp::endpoint remote = socket.remote_endpoint(error);
            auto connection = std::make_shared<FramedConnection>(
                std::move(socket), error ? std::string("unknown peer") : describe(remote),
                unauthenticated_frame_size_cap);
            connections.push_back(connection);
            asio::co_spawn(io, serve(connection), asio::detached_t{});
        }
    }

    Task<void> wait_for(asio::steady_timer& event, Phase leave_when) {
        while (phase != leave_when && phase != Phase::failed) {
            try {
                co_await event.async_wait(asio::use_awaitable);
            } catch (const boost::system::system_error&) {
                // Cancelled: the phase changed (or the server is shutting down); look again.
            }
        }
    }

    Task<void> serve(std::shared_ptr<FramedConnection> connection) {
        bool sent_hello = false;
        std::optional<std::uint32_t> rank;
        std::string rejection;
        try {
            const Hello hello = decode_hello(co_await connection->read_frame(), connection->peer());
            const nlohmann::json body = parse_json_object(hello.body, connection->peer(), "hello");
            auto field = [&](const char* key) -> const nlohmann::json& {
                auto found = body.find(key);
                if (found == body.end()) throw Rejection{std::string("hello lacks '") + key + "'"};
                return *found;
            };
            if (!field("rank").is_number_unsigned() || !field("world_size").is_number_unsigned() ||
                !field("job").is_string() || !field("session").is_string() ||
                !field("nonce").is_string())
                throw Rejection{"hello has fields of the wrong type"};
            const std::uint64_t claimed_rank = field("rank").get<std::uint64_t>();
            const std::uint64_t world_size = field("world_size").get<std::uint64_t>();
            const std::string job = field("job").get<std::string>();
            const std::string session = field("session").get<std::string>();
            const std::string client_nonce = field("nonce").get<std::string>();
            const std::string who =
                "rank " + std::to_string(claimed_rank) + " at " + connection->peer();
            connection->set_peer(who);
            if (job != settings.job)
                throw Rejection{who + " belongs to job '" + job.substr(0, 64) +
                                "', this rendezvous serves job '" + settings.job + "'"};
            if (world_size != settings.world_size)
                throw Rejection{who + " expects world size " + std::to_string(world_size) +
                                ", this rendezvous has world size " +
                                std::to_string(settings.world_size)};
            if (claimed_rank >= settings.world_size)
                throw Rejection{"rank " + std::to_string(claimed_rank) + " at " +
                                connection->peer() + " is out of range for world size " +
                                std::to_string(settings.world_size)};

            const std::string server_nonce = make_nonce();
            const std::string server_hello =
                encode_hello(nlohmann::json{{"nonce", server_nonce}}.dump());
            co_await connection->write_frame(server_hello);
            sent_hello = true;

            const nlohmann::json proof = co_await connection->read_message("proof");
            const std::string expected = make_proof(
                settings.token, rendezvous_client_label,
                {settings.job, std::to_string(claimed_rank), session, client_nonce, server_nonce});
            if (!proof.contains("proof") || !proof["proof"].is_string() ||
                !proofs_match(expected, proof["proof"].get<std::string>()))
                throw Rejection{who + " failed to prove the job token (wrong RDMACHAN_JOB_TOKEN?)"};
            connection->set_size_cap(authenticated_frame_size_cap);
            const std::string server_proof = make_proof(
                settings.token, rendezvous_server_label,
                {settings.job, std::to_string(claimed_rank), session, client_nonce, server_nonce});
            const nlohmann::json accepted = {{"type", "accepted"}, {"proof", server_proof}};
            co_await connection->write_message(accepted);

            const nlohmann::json registration = co_await connection->read_message("register");
            Endpoint endpoint;
            std::vector<PackedRcEntry> rc_entries;
            try {
                if (!registration.contains("endpoint")) throw Error("register lacks 'endpoint'");
                if (!registration.contains("rc")) throw Error("register lacks 'rc'");
                from_json(registration["endpoint"], endpoint);
                // Protocol 2 carries the RC entries as compact triples beside the endpoint.
                std::vector<RcEntry> compact = parse_compact_rc_entries(registration["rc"]);
                endpoint.rc.insert(endpoint.rc.end(), compact.begin(), compact.end());
                validate(endpoint);
                rc_entries = index_rc_entries(endpoint, settings.world_size);
            } catch (const Error& error) {
                throw Rejection{who + " sent an invalid endpoint: " + error.what()};
            }
            if (endpoint.rank != claimed_rank || to_hex_u64(endpoint.session) != session)
                throw Rejection{who + " sent an endpoint for rank " +
                                std::to_string(endpoint.rank) + " session " +
                                to_hex_u64(endpoint.session) + ", not its own (session " + session +
                                ")"};
            if (phase != Phase::gathering)
                throw Rejection{
                    who + " arrived after the rendezvous " +
                    (phase == Phase::failed ? "failed: " + failure : std::string("completed"))};
            if (const auto& existing = registered[claimed_rank])
                throw Rejection{"rank " + std::to_string(claimed_rank) +
                                " is already registered (session " + to_hex_u64(*existing) +
                                "); " + connection->peer() + " with session " + session +
                                " claims it too"};
            rank = static_cast<std::uint32_t>(claimed_rank);
            registered[*rank] = endpoint.session;
            row_text[*rank] = table_row_text(endpoint);
            rc_for_peer[*rank] = std::move(rc_entries);
            ++registered_count;
            {
                std::lock_guard lock(mutex);
                registered_so_far = registered_count;
            }
            registered_signal.notify_all();
            if (registered_count == settings.world_size) publish_table();

            co_await wait_for(table_event, Phase::table_sent);
            if (phase == Phase::failed) throw Rejection{failure};
            // At most a few tables exist at once: at 4,096 ranks each is most of a megabyte.
            while (tables_in_flight >= max_tables_in_flight && phase != Phase::failed) {
                try {
                    co_await table_slot_event.async_wait(asio::use_awaitable);
                } catch (const boost::system::system_error&) {
                    // Woken by cancel_one(): a table finished; look again.
                }
            }
            if (phase == Phase::failed) throw Rejection{failure};
            ++tables_in_flight;
            std::exception_ptr write_failure;
            try {
                co_await connection->write_frame(table_for(*rank));
            } catch (...) {
                write_failure = std::current_exception();
            }
            --tables_in_flight;
            table_slot_event.cancel_one();
            if (write_failure) std::rethrow_exception(write_failure);

            co_await connection->read_message("barrier");
            in_barrier[*rank] = true;
            if (++barrier_count == settings.world_size) {
                phase = Phase::released;
                release_event.cancel();
            }
            co_await wait_for(release_event, Phase::released);
            if (phase == Phase::failed) throw Rejection{failure};
            const nlohmann::json release = {{"type", "release"}};
            co_await connection->write_message(release);
            if (++released_count == settings.world_size) finish({});
            co_return;
        } catch (const Rejection& reason) {
            rejection = reason.message;
        } catch (const Error& error) {
            rejection = error.what();
        }
        // A rank that had registered and leaves before its release (killed, crashed, cut off)
        // can never enter the barrier: fail everyone now, naming it, instead of at the deadline.
        if (rank && phase == Phase::table_sent)
            fail(name() + ": rank " + std::to_string(*rank) + " left before the barrier (" + rejection + ")");
        // A failed rendezvous was logged once already; a rejected peer is logged here.
        if (phase != Phase::failed || rejection != failure)
            detail::logger().warn("{}: rejected {}: {}", name(), connection->peer(), rejection);
        const std::string error_frame =
            sent_hello ? nlohmann::json{{"type", "error"}, {"message", rejection}}.dump()
                       : encode_hello(nlohmann::json{{"error", rejection}}.dump());
        try {
            co_await connection->write_frame(error_frame);
        } catch (const Error&) {
            // The peer is gone; the log line above already names it.
        }
        connection->close();
    }

    void publish_table() {
        phase = Phase::table_sent;
        table_event.cancel();
        detail::logger().debug("{}: all {} ranks registered", name(), settings.world_size);
    }

    // {"type":"table","rows":[...]} for `recipient`: each rank's pre-serialized row around the
    // RC entry it made for `recipient` (or none).
    std::string table_for(std::uint32_t recipient) const {
        std::size_t size = 64;
        for (const TableRowText& text : row_text) size += text.prefix.size() + text.suffix.size() + 24;
        std::string frame;
        frame.reserve(size);
        frame += R"({"type":"table","rows":[)";
        for (std::uint32_t rank = 0; rank < settings.world_size; ++rank) {
            if (rank != 0) frame += ',';
            frame += row_text[rank].prefix;
            const std::vector<PackedRcEntry>& entries = rc_for_peer[rank];
            if (recipient < entries.size() && entries[recipient].present) {
                const RcEntry entry{recipient, entries[recipient].qpn, entries[recipient].psn};
                append_table_rc(frame, &entry);
            } else {
                append_table_rc(frame, nullptr);
            }
            frame += row_text[rank].suffix;
        }
        frame += "]}";
        return frame;
    }

    void on_deadline() {
        std::vector<std::uint32_t> missing;
        std::string what;
        if (phase == Phase::gathering) {
            for (std::uint32_t rank = 0; rank < settings.world_size; ++rank)
                if (!registered[rank]) missing.push_back(rank);
            what = "ranks that never arrived: ";
        } else {
            for (std::uint32_t rank = 0; rank < settings.world_size; ++rank)
                if (!in_barrier[rank]) missing.push_back(rank);
            what = missing.empty() ? "not every rank received the release"
                                   : "ranks that never entered the barrier: ";
        }
        fail(name() + ": deadline of " + std::to_string(settings.timeout.count()) + " ms expired; " + what +
             format_ranks(missing) +
             (accept_failure.empty() ? std::string() : " (accepting connections failed: " + accept_failure + ")"));
    }

    // Ends the rendezvous for everyone with `why`: waiting ranks are woken and sent it.
    void fail(std::string why) {
        if (phase == Phase::failed) return;
        failure = std::move(why);
        detail::logger().error("{}", failure);
        phase = Phase::failed;
        table_event.cancel();
        release_event.cancel();
        table_slot_event.cancel();
        boost::system::error_code ignored;
        acceptor.close(ignored);
        // Give waiting ranks a moment to receive the error, then drop everyone.
        deadline_timer.expires_after(std::chrono::milliseconds(200));
        deadline_timer.async_wait([this](boost::system::error_code) { finish(failure); });
    }

    void finish(const std::string& error) {
        boost::system::error_code ignored;
        acceptor.close(ignored);
        deadline_timer.cancel();
        table_event.cancel();
        release_event.cancel();
        table_slot_event.cancel();
        for (auto& connection : connections) connection->close();
        std::lock_guard lock(mutex);
        if (finished) return;
        finished = true;
        final_error = error;
        finished_signal.notify_all();
    }
};

RendezvousServer::RendezvousServer(RendezvousServerSettings settings)
    : state_(std::make_unique<State>()) {
    State& state = *state_;
    state.settings = std::move(settings);
    if (state.settings.world_size == 0)
        throw Error("RendezvousServer: world size 0 for job '" + state.settings.job + "'");
    state.registered.resize(state.settings.world_size);
    state.row_text.resize(state.settings.world_size);
    state.rc_for_peer.resize(state.settings.world_size);
    state.in_barrier.resize(state.settings.world_size);
    try {
        const tcp::endpoint endpoint(asio::ip::make_address(state.settings.bind_address),
                                     state.settings.port);
        state.acceptor.open(endpoint.protocol());
        state.acceptor.set_option(tcp::acceptor::reuse_address(true));
        state.acceptor.bind(endpoint);
        state.acceptor.listen(asio::socket_base::max_listen_connections);
        state.port = state.acceptor.local_endpoint().port();
        state.listening_on = describe(state.acceptor.local_endpoint());
    } catch (const boost::system::system_error& error) {
        throw Error("RendezvousServer: cannot listen on " + state.settings.bind_address + ":" +
                    std::to_string(state.settings.port) + " for job '" + state.settings.job +
                    "': " + error.code().message());
    }
    state.table_event.expires_at(asio::steady_timer::time_point::max());
    state.release_event.expires_at(asio::steady_timer::time_point::max());
    state.table_slot_event.expires_at(asio::steady_timer::time_point::max());
}

RendezvousServer::~RendezvousServer() {
    if (state_->thread.joinable()) {
        state_->io.stop();
        state_->thread.join();
    }
}

std::uint16_t RendezvousServer::port() const {
    return state_->port;
}

void RendezvousServer::start() {
    State& state = *state_;
    if (state.thread.joinable())
        throw Error("RendezvousServer::start: " + state.name() + " already started");
    asio::co_spawn(state.io, state.accept_loop(), asio::detached_t{});
    state.deadline_timer.expires_after(state.settings.timeout);
    state.deadline_timer.async_wait([&state](boost::system::error_code error) {
        if (!error) state.on_deadline();
    });
    state.thread = std::thread([&state] { state.io.run(); });
}

bool RendezvousServer::wait_registered(std::uint32_t count, std::chrono::milliseconds timeout) {
    State& state = *state_;
    std::unique_lock lock(state.mutex);
    return state.registered_signal.wait_for(
        lock, timeout, [&state, count] { return state.registered_so_far >= count; });
}

void RendezvousServer::wait() {
    State& state = *state_;
    if (!state.thread.joinable())
        throw Error("RendezvousServer::wait: " + state.name() + " was not started");
    std::unique_lock lock(state.mutex);
    // The deadline timer guarantees `finished`, at the latest shortly after the deadline.
    state.finished_signal.wait(lock, [&state] { return state.finished; });
    if (!state.final_error.empty()) throw Error(state.final_error);
}

}  // namespace rdmachan
