// N-peer rendezvous for MultiChannel: every rank sends its endpoint to one server, which waits
// for all ranks, sends each rank the table it needs, then runs a barrier so nobody moves queue
// pairs to RTR/RTS before every endpoint is known. Rank i's table holds every rank's endpoint
// with its `rc` cut down to the entry that rank made for i (so bytes per rank grow linearly
// with the world size). With peer replacement the server stays for the life of the job and
// each rank keeps its connection to hear of failed ranks and of the processes that replace them
// (PeerReplacement). The ranks of one host share one copy of the table: the server sends it to
// one of them, which publishes it, and the host's others read that copy after checking it
// against the server's digest (RendezvousSettings::share_table_per_host). Wire protocol
// (version 3, which still serves version-2 clients): handshake/README.md.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "rdmachan/endpoint.hpp"

namespace rdmachan {

struct RendezvousServerSettings {
    std::string bind_address = "127.0.0.1";  // the server listens only here
    std::uint16_t port = 0;                  // 0: the system picks one, see port()
    std::uint32_t world_size = 0;
    std::string job;                           // every rank must name the same job
    std::string token;                         // every rank must prove it knows this (never sent)
    std::chrono::milliseconds timeout{30000};  // from start() to the end of the barrier
    // Peer replacement: the server keeps every rank's connection after the release and runs
    // for the life of the job (wait() returns after the first release; the destructor stops
    // it), so a process that replaces a rank whose process died can register again. Every
    // rank must then enable it too (RendezvousSettings::replacement). `timeout` also bounds
    // each replacement: the live ranks must reconnect it within that time.
    bool replacement = false;
};

// Accepts the ranks in any order on one io_context and one thread. Usable standalone (a tool
// calls run()) or in-process by rank 0 (start(), then wait()).
class RendezvousServer {
  public:
    // Binds and listens; throws rdmachan::Error naming the address and port on failure.
    explicit RendezvousServer(RendezvousServerSettings settings);
    ~RendezvousServer();  // stops the server if still running and joins its thread
    RendezvousServer(const RendezvousServer&) = delete;
    RendezvousServer& operator=(const RendezvousServer&) = delete;

    std::uint16_t port() const;
    void start();  // runs on its own thread; the deadline starts now
    // Blocks until every rank left the barrier (returns) or the rendezvous failed: throws
    // rdmachan::Error, e.g. listing the ranks that never arrived.
    void wait();
    // Blocks until at least `count` ranks have registered or `timeout` has passed; returns
    // whether they have (progress reports, and tests that need one rank registered first).
    bool wait_registered(std::uint32_t count, std::chrono::milliseconds timeout);
    void run() {
        start();
        wait();
    }

  private:
    struct State;
    std::unique_ptr<State> state_;
};

// Whether a rank takes part in peer replacement (handshake/README.md, "Peer replacement").
enum class PeerReplacement {
    disabled,             // today's rendezvous: the connection closes after the barrier
    enabled,              // a rank of the first rendezvous; stays connected to hear of replacements
    replace_failed_rank,  // this process takes over `rank`, whose process has gone
};

// What the rendezvous server told a watching rank (Rendezvous::poll_events).
struct RendezvousEvent {
    enum class Kind {
        failed,       // `rank`'s process (session `session`) closed its connection: it has gone
        replacement,  // a process with session `session` replaces `rank`; its endpoint as for exchange()
        ready,        // the replacement `session` of `rank` connected every queue pair: usable now
    };
    Kind kind = Kind::failed;
    std::uint32_t rank = 0;
    std::uint64_t session = 0;
    Endpoint endpoint;  // replacement only
};

struct RendezvousSettings {
    std::string host = "127.0.0.1";  // the server's address (name or IP)
    std::uint16_t port = 0;
    std::uint32_t rank = 0;
    std::uint32_t world_size = 0;
    std::string job;
    std::string token;
    // One deadline for connect (with retries), exchange and barrier, counted from construction.
    std::chrono::milliseconds timeout{30000};
    // Rank 0 hosts the server in-process, bound to `host` (port 0: see Rendezvous::port()).
    bool serve_in_process = false;
    // Peer replacement; the server must run with RendezvousServerSettings::replacement. With an
    // in-process server (rank 0) that server dies with rank 0, so rank 0 cannot be replaced:
    // run the server apart (a launcher, or a process of its own) to replace any rank.
    PeerReplacement replacement = PeerReplacement::disabled;
    // Protocol 3: the ranks of a host (same boot, user, network and PID namespaces) share one copy
    // of the table. A rank that cannot use the host's copy receives its own and logs why
    // (Rendezvous::table_source). false: this rank always receives its own.
    bool share_table_per_host = true;
};

// How a rank obtained the table (Rendezvous::table_source, after exchange()).
struct RendezvousTableSource {
    enum class Kind {
        own_copy,            // received from the server
        published_for_host,  // received, and published for the host's other ranks
        host_copy,           // read from the copy another rank of this host published
    };
    Kind kind = Kind::own_copy;
    std::uint64_t host_copy_bytes = 0;  // host_copy: the bytes read from it
    // Why the host's copy was refused, or why publishing it failed (then the host's other ranks
    // receive their own): the error naming this rank and host. Empty when nothing failed.
    std::string refused;
};

// The table as Rendezvous::exchange_view() gives it: each rank's endpoint decoded only when it
// is asked for, so a rank that uses a few peers of thousands parses only theirs. Safe to read
// from several threads at once (nothing in it changes after exchange_view returned).
class RendezvousTableView {
  public:
    virtual ~RendezvousTableView() = default;
    virtual std::uint32_t size() const = 0;
    // Rank `rank`'s endpoint, as exchange() gives it (its rc holding the entry that rank made for
    // this one, if any). Throws rdmachan::Error naming the rank when its row is invalid.
    virtual Endpoint endpoint(std::uint32_t rank) const = 0;
    // The table's DC directory (handshake/README.md, "The DC directory"), read in place; empty
    // when the server sent none (a protocol-2 server, or a rank that shares no table).
    virtual std::string_view dc_directory() const = 0;
};

class Rendezvous {
  public:
    explicit Rendezvous(RendezvousSettings settings);
    ~Rendezvous();
    Rendezvous(const Rendezvous&) = delete;
    Rendezvous& operator=(const Rendezvous&) = delete;

    // Registers `mine` (its rank and session must match the settings' rank and this process)
    // and returns every rank's endpoint, indexed by rank. Each endpoint's `rc` holds only the
    // entry that rank made for this rank (empty if it made none, e.g. in DC mode); everything
    // else (port, session, device, dc, dci, regions) is as that rank registered it. Throws rdmachan::Error naming the
    // server and the reason (rejection, deadline, protocol error).
    std::vector<Endpoint> exchange(const Endpoint& mine);
    // The same exchange, the table kept as the bytes received (or the host's copy, mapped) and
    // decoded on demand. Instead of exchange(), not after it.
    std::shared_ptr<const RendezvousTableView> exchange_view(const Endpoint& mine);
    // Returns once every rank has entered the barrier; on the same connection as exchange().
    // With replacement the connection stays open afterwards (poll_events).
    void barrier();

    // With replacement enabled, after barrier(): the events the server sent since the last
    // call, without blocking. Throws rdmachan::Error naming the server when the connection to
    // it was lost.
    std::vector<RendezvousEvent> poll_events();
    // Tells the server this rank connected the replacement `session` of rank `peer`; RC: the
    // queue pair it made for it (`entry`), which the replacement connects to.
    void acknowledge_replacement(std::uint32_t peer, std::uint64_t session, const std::optional<RcEntry>& entry);

    // The port the client connects to (the in-process server's chosen port on rank 0).
    std::uint16_t port() const;
    // Bytes received from the server so far (frame headers included); for measurements.
    std::uint64_t bytes_received() const;
    const RendezvousTableSource& table_source() const;

  private:
    struct State;
    std::unique_ptr<State> state_;
};

// exchange() then barrier(): the table, once every rank has it.
std::vector<Endpoint> rendezvous(const RendezvousSettings& settings, const Endpoint& mine);

}  // namespace rdmachan
