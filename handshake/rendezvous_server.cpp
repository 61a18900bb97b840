#include <sys/resource.h>

#include <condition_variable>
#include <deque>
#include <list>
#include <map>
#include <mutex>
#include <optional>
#include <thread>

#include "handshake/authentication.hpp"
#include "handshake/connection.hpp"
#include "handshake/crypto.hpp"
#include "handshake/hex.hpp"
#include "handshake/rendezvous_protocol.hpp"
#include "handshake/rendezvous_table.hpp"
#include "handshake/table_directory.hpp"
#include "rdmachan/error.hpp"
#include "rdmachan/rendezvous.hpp"
#include "common/logger.hpp"

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

// A rank's hello names its host in at most this many characters (common/host_identity.hpp's key
// is 72).
constexpr std::size_t max_host_key_size = 128;
// table_for(no_recipient): every row without an RC entry, the table a host shares.
constexpr std::uint32_t no_recipient = 0xffffffff;

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
    // Protocol 3, one copy of the table per host: the table every rank of a host reads, with no
    // RC entries in its rows (each rank receives those apart), built once when the last rank
    // registered, and its digest, which a reader checks the host's copy against.
    std::string common_table;
    // Its DC directory (handshake/table_directory.hpp), sent and shared after it; the digest
    // covers both.
    std::string common_directory;
    Digest common_digest{};
    std::vector<DirectoryEntry> directory_entries;  // per registered rank
    struct HostShare {
        enum class State { unclaimed, publishing, shared, unavailable } state = State::unclaimed;
        std::uint32_t pid = 0;  // where the publishing rank holds the copy (shared)
        std::int32_t fd = -1;
    };
    std::map<std::string, HostShare> hosts;  // by host key (the client's hello field 'host')
    asio::steady_timer host_event{io};      // cancel(): a host's copy was shared or is unavailable
    std::vector<bool> in_barrier;
    std::uint32_t barrier_count = 0;
    std::uint32_t released_count = 0;
    std::string failure;
    std::string accept_failure;

    // Peer replacement (settings.replacement). After the release every rank keeps its
    // connection as a watch: the server sends it events through its outbox (one writer per
    // connection, so events from different coroutines never interleave on the stream) and reads
    // its acknowledgements. A watch that closes is a rank whose process has gone.
    struct Watcher {
        std::shared_ptr<FramedConnection> connection;
        std::deque<std::string> outbox;
        asio::steady_timer wake;
        std::uint64_t session = 0;
        bool closed = false;
        explicit Watcher(asio::io_context& io) : wake(io) {
            wake.expires_at(asio::steady_timer::time_point::max());
        }
    };
    std::vector<std::shared_ptr<Watcher>> watchers;  // by rank; null: not watching (gone)
    std::vector<std::vector<std::uint64_t>> past_sessions;  // by rank: sessions replaced
    // A replacement in progress: the live ranks that have not reconnected it yet.
    struct Replacing {
        std::uint64_t session = 0;
        std::vector<bool> waiting_for;
        std::uint32_t remaining = 0;
        std::shared_ptr<asio::steady_timer> event;
    };
    std::vector<std::optional<Replacing>> replacing;  // by rank
    bool released_all = false;  // under mutex: wait() returns once the first release is done  // the last reason accept() failed, for the deadline's report

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
            // Peer replacement (an optional capability since protocol 2): "watch" for a rank of the
            // first rendezvous, "replace" for a process taking over a rank whose process died.
            std::string role;
            if (auto found = body.find("replacement"); found != body.end()) {
                if (!found->is_string() || (*found != "watch" && *found != "replace"))
                    throw Rejection{"hello field 'replacement' must be \"watch\" or \"replace\""};
                role = found->get<std::string>();
            }
            // Protocol 3: the host the rank runs on, so that its ranks can share one copy of the
            // table. Absent (an older client, or sharing turned off): the rank receives its own.
            std::string host;
            if (auto found = body.find("host"); found != body.end() && hello.version >= 3) {
                if (!found->is_string() || found->get_ref<const std::string&>().size() > max_host_key_size)
                    throw Rejection{"hello field 'host' must be a string of at most " +
                                    std::to_string(max_host_key_size) + " characters"};
                host = found->get<std::string>();
            }
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
            if (!role.empty() && !settings.replacement)
                throw Rejection{who + " asks for peer replacement ('" + role +
                                "'), but this rendezvous server was started without it "
                                "(RendezvousServerSettings::replacement)"};
            if (role.empty() && settings.replacement)
                throw Rejection{who + " did not enable peer replacement, which this job's rendezvous "
                                      "runs with (RendezvousSettings::replacement)"};

            const std::string server_nonce = make_nonce();
            nlohmann::json server_body = {{"nonce", server_nonce}};
            if (settings.replacement) server_body["replacement"] = true;
            const std::string server_hello = encode_hello(server_body.dump());
            co_await connection->write_frame(server_hello);
            sent_hello = true;

            const nlohmann::json proof = co_await connection->read_message("proof");
            // With replacement the role is proven too: an eavesdropper cannot turn a watch into
            // a replacement.
            const std::string rank_text = std::to_string(claimed_rank);
            const std::string expected = rendezvous_proof(settings.token, rendezvous_client_label, settings.job,
                                                          rank_text, session, client_nonce, server_nonce, role);
            if (!proof.contains("proof") || !proof["proof"].is_string() ||
                !proofs_match(expected, proof["proof"].get<std::string>()))
                throw Rejection{who + " failed to prove the job token (wrong RDMACHAN_JOB_TOKEN?)"};
            connection->set_size_cap(authenticated_frame_size_cap);
            const std::string server_proof = rendezvous_proof(settings.token, rendezvous_server_label, settings.job, rank_text,
                                                         session, client_nonce, server_nonce, role);
            const nlohmann::json accepted = {{"type", "accepted"}, {"proof", server_proof}};
            co_await connection->write_message(accepted);
            if (role == "replace") {
                co_await serve_replacement(connection, static_cast<std::uint32_t>(claimed_rank), session, who);
                co_return;
            }

            Endpoint endpoint;
            std::vector<PackedRcEntry> rc_entries;
            read_registration(co_await connection->read_message("register"), claimed_rank, session, who,
                              endpoint, rc_entries);
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
            directory_entries[*rank] = directory_entry(endpoint);
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
            if (!host.empty()) {
                co_await send_host_table(*connection, *rank, host);
            } else {
                co_await send_own_table(*connection, *rank);
            }

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
            if (++released_count == settings.world_size) {
                if (!settings.replacement) {
                    finish({});
                } else {
                    // The server stays for the life of the job: no deadline any more.
                    deadline_timer.cancel();
                    std::lock_guard lock(mutex);
                    released_all = true;
                    finished_signal.notify_all();
                }
            }
            if (settings.replacement) co_await watch(*rank, connection);
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
        // A server that lives as long as the job (replacement) must not keep every refused one.
        connections.remove(connection);
    }

    // Waits for one of the few table slots: at 4,096 ranks a table is most of a megabyte, and at
    // most max_tables_in_flight of them are being written at once.
    Task<void> write_table_frame(FramedConnection& connection, std::string frame) {
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
            co_await connection.write_frame(std::move(frame));
        } catch (...) {
            write_failure = std::current_exception();
        }
        --tables_in_flight;
        table_slot_event.cancel_one();
        if (write_failure) std::rethrow_exception(write_failure);
    }

    // Protocol 2: the rank's own table, its RC entries in the rows.
    Task<void> send_own_table(FramedConnection& connection, std::uint32_t rank) {
        co_await write_table_frame(connection, table_for(rank));
    }

    // Protocol 3: a table_header with the rank's RC entries, then the common table in one of three
    // ways. The host's first rank here receives it and is asked to publish it for the host; the
    // host's other ranks are told where the published copy is and what it must hold, and
    // receive the table themselves only when they refuse that copy or none was published.
    Task<void> send_host_table(FramedConnection& connection, std::uint32_t rank, const std::string& host) {
        HostShare& share = hosts[host];
        if (share.state == HostShare::State::unclaimed) {
            share.state = HostShare::State::publishing;
            bool published = false;
            try {
                co_await connection.write_frame(table_header(rank, R"("share":true)"));
                co_await write_common_table(connection);
                const nlohmann::json answer = co_await connection.read_message("shared");
                const auto pid = answer.find("pid");
                const auto fd = answer.find("fd");
                if (pid != answer.end() && pid->is_number_unsigned() && pid->get<std::uint64_t>() <= 0xffffffff &&
                    fd != answer.end() && fd->is_number_unsigned() && fd->get<std::uint64_t>() <= 0x7fffffff) {
                    share.pid = pid->get<std::uint32_t>();
                    share.fd = fd->get<std::int32_t>();
                    published = true;
                } else {
                    const auto why = answer.find("error");
                    detail::logger().warn("{}: rank {} could not share the table with its host: {}", name(), rank,
                                          why != answer.end() && why->is_string()
                                              ? why->get<std::string>().substr(0, 300)
                                              : std::string("no reason given"));
                }
            } catch (...) {
                share.state = HostShare::State::unavailable;
                host_event.cancel();
                throw;
            }
            share.state = published ? HostShare::State::shared : HostShare::State::unavailable;
            host_event.cancel();
            co_return;
        }
        while (share.state == HostShare::State::publishing && phase != Phase::failed) {
            try {
                co_await host_event.async_wait(asio::use_awaitable);
            } catch (const boost::system::system_error&) {
                // Cancelled: some host's copy changed state; look again.
            }
        }
        if (phase == Phase::failed) throw Rejection{failure};
        if (share.state != HostShare::State::shared) {
            co_await connection.write_frame(table_header(rank, R"("share":false)"));
            co_await write_common_table(connection);
            co_return;
        }
        const std::string location = R"("shared":{"pid":)" + std::to_string(share.pid) +
                                     R"(,"fd":)" + std::to_string(share.fd) + R"(,"size":)" +
                                     std::to_string(common_table.size() + common_directory.size()) +
                                     R"(,"table_size":)" + std::to_string(common_table.size()) + R"(,"digest":")" +
                                     to_hex(common_digest.data(), common_digest.size()) + "\"}";
        co_await connection.write_frame(table_header(rank, location));
        const nlohmann::json answer = parse_json_object(co_await connection.read_frame(), connection.peer(), "answer");
        const auto type = answer.find("type");
        if (type != answer.end() && *type == "table_read") co_return;
        if (type == answer.end() || *type != "send_table")
            throw Rejection{connection.peer() +
                            " answered the host's shared table with neither 'table_read' nor 'send_table'"};
        const auto why = answer.find("why");
        detail::logger().warn("{}: rank {} receives its own table: {}", name(), rank,
                              why != answer.end() && why->is_string() ? why->get<std::string>().substr(0, 300)
                                                                      : std::string("no reason given"));
        co_await write_common_table(connection);
    }

    // Protocol 3's table as a rank receives it: the common table's frame, then its DC directory's.
    Task<void> write_common_table(FramedConnection& connection) {
        co_await write_table_frame(connection, common_table);
        co_await write_table_frame(connection, common_directory);
    }

    // {"type":"table_header","rc":[[peer,qpn,psn],...],<how>}: the RC entries every rank made
    // for `recipient`, written as text (at 4,096 RC ranks a JSON tree of them per rank was most
    // of the server's time), and how the rank gets the table.
    std::string table_header(std::uint32_t recipient, std::string_view how) const {
        std::string text = R"({"type":"table_header","rc":[)";
        bool first = true;
        for (std::uint32_t peer = 0; peer < settings.world_size; ++peer) {
            const std::vector<PackedRcEntry>& made = rc_for_peer[peer];
            if (recipient >= made.size() || !made[recipient].present) continue;
            if (!first) text += ',';
            first = false;
            text += '[';
            text += std::to_string(peer);
            text += ',';
            text += std::to_string(static_cast<std::uint32_t>(made[recipient].qpn));
            text += ',';
            text += std::to_string(made[recipient].psn);
            text += ']';
        }
        text += "],";
        text += how;
        text += '}';
        return text;
    }

    // The register message of `claimed_rank` as an endpoint and its RC entries by peer;
    // Rejection naming the field or the mismatch.
    void read_registration(const nlohmann::json& registration, std::uint64_t claimed_rank,
                           const std::string& session, const std::string& who, Endpoint& endpoint,
                           std::vector<PackedRcEntry>& rc_entries) const {
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
            throw Rejection{who + " sent an endpoint for rank " + std::to_string(endpoint.rank) +
                            " session " + to_hex_u64(endpoint.session) + ", not its own (session " +
                            session + ")"};
    }

    // Rank `rank`'s row for `recipient`: prefix, the RC entry it made for the recipient, suffix.
    void append_row(std::string& text, std::uint32_t rank, std::uint32_t recipient) const {
        text += row_text[rank].prefix;
        const std::vector<PackedRcEntry>& entries = rc_for_peer[rank];
        if (recipient < entries.size() && entries[recipient].present) {
            const RcEntry entry{recipient, entries[recipient].qpn, entries[recipient].psn};
            append_table_rc(text, &entry);
        } else {
            append_table_rc(text, nullptr);
        }
        text += row_text[rank].suffix;
    }

    void send_event(std::uint32_t rank, std::string frame) {
        const std::shared_ptr<Watcher>& watcher = watchers[rank];
        if (watcher == nullptr || watcher->closed) return;
        watcher->outbox.push_back(std::move(frame));
        watcher->wake.cancel();
    }

    Task<void> write_events(std::shared_ptr<Watcher> watcher) {
        while (!watcher->closed) {
            if (watcher->outbox.empty()) {
                try {
                    co_await watcher->wake.async_wait(asio::use_awaitable);
                } catch (const boost::system::system_error&) {
                    // Woken: an event was queued, or the watch closed.
                }
                continue;
            }
            std::string frame = std::move(watcher->outbox.front());
            watcher->outbox.pop_front();
            try {
                co_await watcher->connection->write_frame(std::move(frame));
            } catch (const Error&) {
                co_return;  // the reader notices the closed stream and reports the rank gone
            }
        }
    }

    // A rank's watch: its acknowledgements of replacements until its connection closes, which
    // tells every other live rank that its process has gone.
    Task<void> watch(std::uint32_t rank, std::shared_ptr<FramedConnection> connection) {
        auto watcher = std::make_shared<Watcher>(io);
        watcher->connection = connection;
        watcher->session = *registered[rank];
        watchers[rank] = watcher;
        asio::co_spawn(io, write_events(watcher), asio::detached_t{});
        std::string why;
        for (;;) {
            nlohmann::json message;
            try {
                message = co_await connection->read_message("reconnected");
            } catch (const Error& error) {
                why = error.what();
                break;
            }
            on_reconnected(rank, message);
        }
        watcher->closed = true;
        watcher->wake.cancel();
        if (watchers[rank] == watcher) watchers[rank] = nullptr;
        detail::logger().warn("{}: rank {} (session {}) has gone: {}", name(), rank,
                              to_hex_u64(watcher->session), why);
        const std::string event = nlohmann::json{{"type", "failed"},
                                                 {"rank", rank},
                                                 {"session", to_hex_u64(watcher->session)}}
                                      .dump();
        for (std::uint32_t other = 0; other < settings.world_size; ++other) {
            if (other != rank) send_event(other, event);
            // A replacement waiting for this rank's acknowledgement waits no more.
            if (replacing[other] && replacing[other]->waiting_for[rank]) {
                replacing[other]->waiting_for[rank] = false;
                if (--replacing[other]->remaining == 0) replacing[other]->event->cancel();
            }
        }
        connection->close();
        connections.remove(connection);
    }

    // {"type":"reconnected","peer":r,"session":"...","rc":[qpn,psn] or []} from `rank`: it
    // connected the replacement of rank r (RC: to the queue pair it names here).
    void on_reconnected(std::uint32_t rank, const nlohmann::json& message) {
        const auto peer = message.find("peer");
        const auto session = message.find("session");
        const auto rc = message.find("rc");
        if (peer == message.end() || !peer->is_number_unsigned() || *peer >= settings.world_size ||
            session == message.end() || !session->is_string() || rc == message.end() || !rc->is_array()) {
            detail::logger().warn("{}: rank {} sent a malformed 'reconnected' message; ignored", name(), rank);
            return;
        }
        const auto replaced = peer->get<std::uint32_t>();
        std::optional<Replacing>& pending = replacing[replaced];
        if (!pending || to_hex_u64(pending->session) != session->get<std::string>()) {
            detail::logger().warn("{}: rank {} reconnected rank {} session {}, which is not the replacement "
                                  "in progress: refused as stale",
                                  name(), rank, replaced, session->get<std::string>().substr(0, 32));
            return;
        }
        if (rc->size() == 2 && (*rc)[0].is_number_unsigned() && (*rc)[1].is_number_unsigned() &&
            replaced < rc_for_peer[rank].size()) {
            rc_for_peer[rank][replaced].qpn = (*rc)[0].get<std::uint32_t>() & 0xffffff;
            rc_for_peer[rank][replaced].psn = (*rc)[1].get<std::uint32_t>() & 0xffffff;
            rc_for_peer[rank][replaced].present = 1;
        }
        if (pending->waiting_for[rank]) {
            pending->waiting_for[rank] = false;
            if (--pending->remaining == 0) pending->event->cancel();
        }
    }

    // The next frame of a connection, read in the background; `event` is cancelled when it is in.
    struct NextFrame {
        bool done = false;
        std::string frame;
        std::string error;
    };
    static Task<void> read_next_frame(std::shared_ptr<FramedConnection> connection, std::shared_ptr<NextFrame> next,
                                      std::shared_ptr<asio::steady_timer> event) {
        try {
            next->frame = co_await connection->read_frame();
        } catch (const Error& error) {
            next->error = error.what();
        }
        next->done = true;
        event->cancel();
    }

    // A process taking over rank `rank`, whose process has gone: it registers, every live rank
    // is told and reconnects it, then it receives its table (with the queue pairs the live
    // ranks made for it), meets them in a barrier and becomes a watcher like the others.
    Task<void> serve_replacement(std::shared_ptr<FramedConnection> connection, std::uint32_t rank,
                                 std::string session, std::string who) {
        if (phase != Phase::released)
            throw Rejection{who + " asks to replace rank " + std::to_string(rank) +
                            ", but the job's first rendezvous has not completed"};
        if (watchers[rank] != nullptr)
            throw Rejection{"rank " + std::to_string(rank) + " is live (session " +
                            to_hex_u64(watchers[rank]->session) +
                            " is connected): a replacement is accepted only for a rank whose process has gone; " +
                            who + " with session " + session + " refused"};
        bool stale = registered[rank] && to_hex_u64(*registered[rank]) == session;
        for (std::uint64_t past : past_sessions[rank]) stale = stale || to_hex_u64(past) == session;
        if (stale)
            throw Rejection{"session " + session + " of rank " + std::to_string(rank) +
                            " is stale: it is a session of rank " + std::to_string(rank) +
                            " that has gone; a replacement must start a new session"};
        if (replacing[rank])
            throw Rejection{"rank " + std::to_string(rank) + " is already being replaced by session " +
                            to_hex_u64(replacing[rank]->session) + "; " + who + " refused"};
        Endpoint endpoint;
        std::vector<PackedRcEntry> rc_entries;
        read_registration(co_await connection->read_message("register"), rank, session, who, endpoint,
                          rc_entries);
        if (watchers[rank] != nullptr || replacing[rank])
            throw Rejection{"rank " + std::to_string(rank) + " came back or is being replaced meanwhile; " + who +
                            " refused"};
        past_sessions[rank].push_back(*registered[rank]);
        registered[rank] = endpoint.session;
        row_text[rank] = table_row_text(endpoint);
        rc_for_peer[rank] = std::move(rc_entries);
        Replacing& pending = replacing[rank].emplace();
        pending.session = endpoint.session;
        pending.waiting_for.assign(settings.world_size, false);
        pending.event = std::make_shared<asio::steady_timer>(io);
        pending.event->expires_after(settings.timeout);
        const std::shared_ptr<asio::steady_timer> event = pending.event;
        detail::logger().info("{}: rank {} is being replaced by session {}", name(), rank, session);
        for (std::uint32_t other = 0; other < settings.world_size; ++other) {
            if (other == rank || watchers[other] == nullptr) continue;
            pending.waiting_for[other] = true;
            ++pending.remaining;
            std::string frame = R"({"type":"replacement","rank":)" + std::to_string(rank) +
                                R"(,"session":")" + session + R"(","row":)";
            append_row(frame, rank, other);
            frame += '}';
            send_event(other, std::move(frame));
        }
        // Its next frame (the barrier, after its table) is read from now on, so that a
        // replacement that leaves while the live ranks reconnect it is noticed at once.
        auto next = std::make_shared<NextFrame>();
        asio::co_spawn(io, read_next_frame(connection, next, event), asio::detached_t{});
        std::exception_ptr failure_inside;
        try {
            const auto deadline = std::chrono::steady_clock::now() + settings.timeout;
            while (replacing[rank]->remaining != 0 && !next->done && std::chrono::steady_clock::now() < deadline) {
                try {
                    co_await event->async_wait(asio::use_awaitable);
                } catch (const boost::system::system_error&) {
                    // Woken: a live rank reconnected it, left, or the replacement's frame came.
                }
            }
            if (next->done)
                throw Rejection{"the replacement of rank " + std::to_string(rank) + " (session " + session +
                                ") left before the live ranks reconnected it" +
                                (next->error.empty() ? std::string() : ": " + next->error)};
            if (replacing[rank]->remaining != 0) {
                std::vector<std::uint32_t> missing;
                for (std::uint32_t other = 0; other < settings.world_size; ++other)
                    if (replacing[rank]->waiting_for[other]) missing.push_back(other);
                throw Rejection{"the replacement of rank " + std::to_string(rank) + " (session " + session +
                                ") was not reconnected within " + std::to_string(settings.timeout.count()) +
                                " ms by ranks " + format_ranks(missing)};
            }
            std::string frame = R"({"type":"table","rows":[)";
            for (std::uint32_t other = 0; other < settings.world_size; ++other) {
                if (other != 0) frame += ',';
                append_row(frame, other, rank);
            }
            frame += "]}";
            co_await connection->write_frame(std::move(frame));
            event->expires_after(settings.timeout);
            const auto barrier_deadline = std::chrono::steady_clock::now() + settings.timeout;
            while (!next->done && std::chrono::steady_clock::now() < barrier_deadline) {
                try {
                    co_await event->async_wait(asio::use_awaitable);
                } catch (const boost::system::system_error&) {
                    // Woken: its frame came (or a stray wake-up; look again).
                }
            }
            if (!next->done)
                throw Rejection{"the replacement of rank " + std::to_string(rank) + " (session " + session +
                                ") did not enter the barrier within " + std::to_string(settings.timeout.count()) +
                                " ms"};
            if (!next->error.empty()) throw Error(next->error);
            connection->parse_message(next->frame, "barrier");
            const nlohmann::json release = {{"type", "release"}};
            co_await connection->write_message(release);
        } catch (...) {
            failure_inside = std::current_exception();
        }
        replacing[rank].reset();
        if (failure_inside) {
            // The live ranks that reconnected it learn that this session has gone too.
            const std::string gone =
                nlohmann::json{{"type", "failed"}, {"rank", rank}, {"session", session}}.dump();
            for (std::uint32_t other = 0; other < settings.world_size; ++other)
                if (other != rank) send_event(other, gone);
            std::rethrow_exception(failure_inside);
        }
        // Its queue pairs are all connected: the live ranks may use it now.
        const std::string ready =
            nlohmann::json{{"type", "ready"}, {"rank", rank}, {"session", session}}.dump();
        for (std::uint32_t other = 0; other < settings.world_size; ++other)
            if (other != rank) send_event(other, ready);
        detail::logger().info("{}: rank {} replaced by session {}", name(), rank, session);
        co_await watch(rank, connection);
    }

    void publish_table() {
        std::vector<std::uint32_t> row_offsets;
        common_table = table_for(no_recipient, &row_offsets);
        common_directory = encode_directory(directory_entries, row_offsets);
        common_digest = sha256(as_bytes(common_table + common_directory));
        phase = Phase::table_sent;
        table_event.cancel();
        detail::logger().debug("{}: all {} ranks registered", name(), settings.world_size);
    }

    // {"type":"table","rows":[...]} for `recipient`: each rank's pre-serialized row around the
    // RC entry it made for `recipient` (or none).
    // `row_offsets`, if given, receives where each row starts in the frame, and one more: one
    // past the byte that ends the last row (the DC directory's row offsets).
    std::string table_for(std::uint32_t recipient, std::vector<std::uint32_t>* row_offsets = nullptr) const {
        std::size_t size = 64;
        for (const TableRowText& text : row_text) size += text.prefix.size() + text.suffix.size() + 24;
        std::string frame;
        frame.reserve(size);
        frame += R"({"type":"table","rows":[)";
        for (std::uint32_t rank = 0; rank < settings.world_size; ++rank) {
            if (rank != 0) frame += ',';
            if (row_offsets != nullptr) row_offsets->push_back(static_cast<std::uint32_t>(frame.size()));
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
        if (row_offsets != nullptr) row_offsets->push_back(static_cast<std::uint32_t>(frame.size() + 1));
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
        host_event.cancel();
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
        host_event.cancel();
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
    state.directory_entries.resize(state.settings.world_size);
    state.rc_for_peer.resize(state.settings.world_size);
    state.in_barrier.resize(state.settings.world_size);
    state.watchers.resize(state.settings.world_size);
    state.past_sessions.resize(state.settings.world_size);
    state.replacing.resize(state.settings.world_size);
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
    state.host_event.expires_at(asio::steady_timer::time_point::max());
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
    // With replacement the server goes on serving after the first release, until destroyed.
    state.finished_signal.wait(lock, [&state] { return state.finished || state.released_all; });
    if (!state.final_error.empty()) throw Error(state.final_error);
}

}  // namespace rdmachan
