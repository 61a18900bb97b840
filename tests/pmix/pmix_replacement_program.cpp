// Peer replacement under the PMIx bootstrap, run by tests/pmix/run_replacement_mpirun.sh under
// `mpirun --enable-recovery` (which keeps the job alive when a rank dies, and exits 0 whatever
// its ranks return: so each process writes its verdict to a file in --results, and the script
// counts them). A victim dies by SIGKILL once mpirun's PMIx server let go of its PMIx connection
// (die_after_launcher.hpp says why). Scenarios (the victim is rank 1; rank 0 starts the
// replacements):
//   replace --mode rc|dc [--twice]  the victim is killed mid-run; rank 0 sees it fail and starts
//       a new process for its rank (MultiChannel::spawn_replacement); every survivor reconnects
//       it while its writes to the other survivors go on; then everyone writes, sends and
//       receives with everyone, and every byte of every buffer is checked. --twice: the
//       replacement is killed after its exchange and replaced again.
//   disabled   connect() without replacement: the victim's failure is reported from the queue
//              pairs, and reconnect and spawn_replacement say replacement is not enabled
//   stale      after the victim died, an announcement of its rank with its old session is
//              published (raw PMIx): every survivor's reconnect refuses it as stale
//   live       a replacement is started for rank 1, which is alive: it is refused, naming why,
//              and no survivor hears of it
//   impostor   an announcement of live rank 2 is published (raw PMIx): rank 2 refuses it, and no
//              application hears of it
#include <pmix.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "handshake/hex.hpp"
#include "handshake/pmix_bootstrap.hpp"
#include "handshake/pmix_replacement.hpp"
#include "rdmachan/multi_channel.hpp"
#include "tests/multi_channel/replacement_layout.hpp"
#include "tests/pmix/die_after_launcher.hpp"

namespace {

using namespace rdmachan;
using namespace std::chrono_literals;

constexpr std::uint32_t kVictim = 1;
constexpr auto kPhaseDeadline = 60s;

struct Options {
    std::string scenario;
    std::string mode = "rc";
    std::filesystem::path results;
    std::string program;
    bool twice = false;
    std::uint32_t generation = 1;  // 1: the job's first processes; 2, 3: replacements
};

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// The verdict of this process, as a file the script counts.
int verdict(const Options& options, const std::string& role, std::uint32_t rank, const std::string& failure) {
    const std::string name = role + "-rank" + std::to_string(rank) + "-pid" + std::to_string(getpid()) +
                             (failure.empty() ? ".ok" : ".failed");
    std::ofstream(options.results / name) << (failure.empty() ? "ok" : failure) << "\n";
    if (!failure.empty()) std::fprintf(stderr, "pmix_replacement_program: %s rank %u FAILED: %s\n", role.c_str(), rank, failure.c_str());
    return failure.empty() ? 0 : 1;
}

struct Failure : std::runtime_error {
    using std::runtime_error::runtime_error;
};
void expect(bool condition, const std::string& what) {
    if (!condition) throw Failure("expected " + what);
}

using replacement_test::kSlice;
using replacement_test::pattern;

// replacement_layout.hpp's buffer, then [tokens in: world x 8][token out 8].
struct Layout : replacement_test::Layout {
    std::size_t token(std::uint32_t peer) const { return end() + peer * 8; }
    std::size_t token_out() const { return token(world); }
    std::size_t size() const { return token(world + 1); }
};

MultiChannelBuilder builder(const std::string& mode) {
    ChannelBuilder channel = ChannelBuilder().device("soft").max_send_wr(64).max_recv_wr(64).deadline(30s);
    return MultiChannelBuilder(channel).bootstrap(Bootstrap::pmix).mode(
        mode == "dc" ? MultiChannelMode::dynamically_connected : MultiChannelMode::reliable_connected);
}

struct Process {
    MultiChannel channels;
    std::vector<std::uint8_t> memory;
    MemoryRegion region;
    std::uint32_t rank = 0;
    std::uint32_t world = 0;
};

Process start(const std::string& mode, PeerReplacement replacement) {
    PreparedMultiChannel prepared = builder(mode).build();
    const std::uint32_t rank = prepared.rank();
    const std::uint32_t world = prepared.world_size();
    std::vector<std::uint8_t> memory(Layout{{world}}.size(), 0);
    MemoryRegion region = prepared.register_memory(memory.data(), memory.size());
    prepared.publish_region("buffer", region);
    MultiChannel channels = replacement == PeerReplacement::disabled ? std::move(prepared).connect()
                                                                      : std::move(prepared).connect(replacement);
    return Process{std::move(channels), std::move(memory), std::move(region), rank, world};
}

std::vector<std::uint32_t> everyone_but(std::uint32_t world, std::uint32_t a, std::uint32_t b) {
    std::vector<std::uint32_t> peers;
    for (std::uint32_t peer = 0; peer < world; ++peer)
        if (peer != a && peer != b) peers.push_back(peer);
    return peers;
}

std::vector<PeerTransfer> write_shares(Process& self, std::uint32_t round, const std::vector<std::uint32_t>& peers) {
    const Layout layout{{self.world}};
    std::vector<PeerTransfer> shares;
    for (std::uint32_t peer : peers) {
        const PeerRemoteMemoryRegion remote = self.channels.remote_region(peer, "buffer");
        shares.push_back({peer, self.region.slice(layout.out(round), kSlice), remote.region.slice(layout.in(round, self.rank), kSlice)});
    }
    return shares;
}

// After a replacement: a write to every peer, a message to and from every peer, then every byte
// checked. `generation`: this process's; `victim_generation`: that of the victim's rank's holder.
// The survivors and the replacement belong to two PMIx namespaces, so no fence spans them: they
// meet through their queue pairs. A peer's write, message and token go in that order on one
// queue pair, so its token's arrival means its write and message landed; a send that finds no
// receive posted yet waits (RNR retries, without end by default) until the peer posts it.
void exchange_with_everyone(Process& self, std::uint32_t generation, std::uint32_t victim_generation) {
    const Layout layout{{self.world}};
    const std::uint32_t rank = self.rank;
    std::uint8_t* bytes = self.memory.data();
    for (std::size_t index = 0; index < kSlice; ++index) bytes[layout.out(2) + index] = pattern(rank, generation, 2, index);
    const std::vector<std::uint32_t> peers = everyone_but(self.world, rank, rank);
    std::vector<PendingWork> messages;
    std::vector<PendingWork> tokens;
    for (std::uint32_t peer : peers) {
        messages.push_back(self.channels.post_receive(peer, self.region.slice(layout.message(peer), 8)));
        tokens.push_back(self.channels.post_receive(peer, self.region.slice(layout.token(peer), 8)));
    }
    const MultiResult written = self.channels.scatter_write(write_shares(self, 2, peers));
    expect(written.ok(), "round 2's writes to every peer succeed: " + written.message());
    std::memset(bytes + layout.message_out(), 0, 8);
    bytes[layout.message_out()] = static_cast<std::uint8_t>(rank + 1);
    bytes[layout.message_out() + 1] = static_cast<std::uint8_t>(generation);
    auto send_to_everyone = [&](std::size_t offset, const char* what) {
        for (std::uint32_t peer : peers) {
            const WorkResult sent = self.channels.send(peer, self.region.slice(offset, 8));
            expect(sent.ok(), std::string(what) + " to rank " + std::to_string(peer) + " is sent" +
                                  (sent.ok() ? "" : ": " + sent.error().message()));
        }
    };
    send_to_everyone(layout.message_out(), "a message");
    send_to_everyone(layout.token_out(), "a token");
    for (PendingWork& message : messages) {
        const WorkResult received = message.wait();
        expect(received.ok() && received.completion().bytes == 8, "a message from every peer");
    }
    for (PendingWork& token : tokens) expect(token.wait().ok(), "a token from every peer: its write and message landed");
    for (std::size_t index = 0; index < layout.end(); ++index) {
        const std::uint8_t expected = layout.expected(index, rank, generation, kVictim, victim_generation);
        expect(bytes[index] == expected, "byte " + std::to_string(index) + " to be " + std::to_string(expected) + ", it is " +
                                             std::to_string(bytes[index]));
    }
    // Nobody moves on (a replacement killed, a survivor writing round 1 again) before everyone
    // has checked: a second token round.
    tokens.clear();
    for (std::uint32_t peer : peers) tokens.push_back(self.channels.post_receive(peer, self.region.slice(layout.token(peer), 8)));
    send_to_everyone(layout.token_out(), "a closing token");
    for (PendingWork& token : tokens) expect(token.wait().ok(), "a closing token from every peer");
}

std::vector<std::string> replacement_command(const Options& options, std::uint32_t generation) {
    std::vector<std::string> command{options.program, "replace", "--mode", options.mode, "--results", options.results.string(),
                                     "--generation", std::to_string(generation)};
    if (options.twice) command.push_back("--twice");
    return command;
}

// A survivor while the victim's rank is dead: its writes to the other survivors go on; rank 0
// starts the replacement once it saw the failure; every survivor reconnects it when told, and
// returns once it is connected.
void await_replacement(Process& self, const Options& options, std::uint32_t next_generation) {
    const std::vector<PeerTransfer> survivors = write_shares(self, 1, everyone_but(self.world, self.rank, kVictim));
    const std::vector<PeerTransfer> to_victim = write_shares(self, 1, {kVictim});
    bool failed = false, available = false, refused_while_connecting = false, connected = false, spawned = false;
    const auto until = std::chrono::steady_clock::now() + kPhaseDeadline;
    while (!connected) {
        expect(std::chrono::steady_clock::now() < until, "the replacement connected before the deadline");
        const MultiResult others = self.channels.scatter_write(survivors);
        expect(others.ok(), "writes to the other survivors succeed throughout: " + others.message());
        if (!available) {
            const MultiResult victim = self.channels.scatter_write(to_victim);
            if (!victim.ok()) expect(contains(victim.message(), "rank " + std::to_string(kVictim)), "the error names the killed rank");
        }
        for (const PeerEvent& event : self.channels.poll_peer_events()) {
            expect(event.peer == kVictim, "events name only the killed rank");
            if (event.kind == PeerEvent::Kind::failed) {
                failed = true;
                std::fprintf(stderr, "rank %u: rank %u failed: %s\n", self.rank, event.peer, event.reason.c_str());
            } else if (event.kind == PeerEvent::Kind::replacement_available) {
                expect(failed, "the failure is reported before the replacement");
                expect(event.session != self.channels.peer_session(kVictim), "the replacement has a new session");
                available = true;
                self.channels.reconnect(kVictim);
                const MultiResult early = self.channels.scatter_write(to_victim);
                expect(!early.ok() && contains(early.message(), "replacement is not connected yet"),
                       "a write to the replacement before it is connected fails, naming why");
                refused_while_connecting = true;
            } else {
                expect(available, "connected after available");
                connected = true;
            }
        }
        if (failed && !spawned && self.rank == 0) {
            const std::string job = self.channels.spawn_replacement(kVictim, replacement_command(options, next_generation));
            std::fprintf(stderr, "rank 0: started the replacement of rank %u as namespace %s\n", kVictim, job.c_str());
            spawned = true;
        }
        std::this_thread::sleep_for(1ms);
    }
    expect(refused_while_connecting, "the replacement was refused until connected");
    expect(self.channels.healthy_peers().size() == self.world, "every peer healthy again");
}

// A PMIx fence of `procs` with a deadline: a rank that failed and left never arrives, and a fence
// without PMIX_TIMEOUT would then wait for it until ctest's timeout, with no verdict written.
constexpr int kFenceSeconds = 60;
bool fence(const pmix_proc_t* procs, std::size_t count) {
    pmix_info_t info;
    int seconds = kFenceSeconds;
    PMIX_INFO_LOAD(&info, PMIX_TIMEOUT, &seconds, PMIX_INT);
    const pmix_status_t status = PMIx_Fence(procs, count, &info, 1);
    PMIX_INFO_DESTRUCT(&info);
    if (status != PMIX_SUCCESS) std::fprintf(stderr, "pmix_replacement_program: PMIx_Fence: %s\n", PMIx_Error_string(status));
    return status == PMIX_SUCCESS;
}

// Round 1 with everyone, then (all ranks) a PMIx fence, after which the victim dies.
void first_round(Process& self, const pmix_proc_t& raw) {
    const Layout layout{{self.world}};
    for (std::size_t index = 0; index < kSlice; ++index) self.memory[layout.out(1) + index] = pattern(self.rank, 1, 1, index);
    const MultiResult first = self.channels.scatter_write(write_shares(self, 1, everyone_but(self.world, self.rank, self.rank)));
    expect(first.ok(), "round 1's writes succeed: " + first.message());
    pmix_proc_t everyone;
    PMIX_LOAD_PROCID(&everyone, raw.nspace, PMIX_RANK_WILDCARD);
    expect(fence(&everyone, 1), "the fence after round 1");
}

// Nothing may be reported about any peer.
// Waits until the watch of the launcher's data store has finished two rounds after now: the
// second began after this call, so whatever was in the store by now has been looked at, and any
// event it made is waiting in poll_peer_events.
void wait_for_a_whole_round(Process& self) {
    const std::uint64_t now = detail::peer_watch_rounds(self.channels);
    const auto until = std::chrono::steady_clock::now() + kPhaseDeadline;
    while (detail::peer_watch_rounds(self.channels) < now + 2) {
        expect(std::chrono::steady_clock::now() < until, "the watch looked at the data store twice before the deadline");
        std::this_thread::sleep_for(10ms);
    }
}

void expect_no_event(Process& self) {
    for (const PeerEvent& event : self.channels.poll_peer_events()) {
        expect(false, "no event (got " + std::string(to_string(event.kind)) + " for rank " + std::to_string(event.peer) + ")");
    }
}

// Polls for events (there must be none) until `done`, within the phase's deadline.
void quiet_until(Process& self, const std::function<bool()>& done, const std::string& what) {
    const auto until = std::chrono::steady_clock::now() + kPhaseDeadline;
    while (!done()) {
        expect(std::chrono::steady_clock::now() < until, what + " before the deadline");
        expect_no_event(self);
        std::this_thread::sleep_for(10ms);
    }
    expect_no_event(self);
}

// A fence of every first process, once none will write to another again.
void fence_everyone(const pmix_proc_t& raw) {
    pmix_proc_t everyone;
    PMIX_LOAD_PROCID(&everyone, raw.nspace, PMIX_RANK_WILDCARD);
    expect(fence(&everyone, 1), "the closing fence");
}

// A fence of the first processes without the victim (dead), so none leaves while another still
// writes to it.
void fence_survivors(const pmix_proc_t& raw, std::uint32_t world) {
    std::vector<pmix_proc_t> survivors;
    for (std::uint32_t rank : everyone_but(world, kVictim, kVictim)) {
        pmix_proc_t proc;
        PMIX_LOAD_PROCID(&proc, raw.nspace, rank);
        survivors.push_back(proc);
    }
    expect(fence(survivors.data(), survivors.size()), "the survivors' closing fence");
}

// The test's own PMIx handle (reference counted with the library's), fenced once every rank is
// initialized (tests/pmix/pmix_bootstrap_program.cpp says why).
struct RawPmix {
    pmix_proc_t self{};
    RawPmix() {
        if (PMIx_Init(&self, nullptr, 0) != PMIX_SUCCESS) throw std::runtime_error("test's own PMIx_Init failed");
        pmix_proc_t everyone;
        PMIX_LOAD_PROCID(&everyone, self.nspace, PMIX_RANK_WILDCARD);
        if (!fence(&everyone, 1)) throw std::runtime_error("test's own PMIx_Fence failed");
    }
    ~RawPmix() { PMIx_Finalize(nullptr, 0); }
};

int first_generation(const Options& options) {
    const RawPmix raw;
    const std::uint32_t rank = raw.self.rank;
    try {
        Process self = start(options.mode, PeerReplacement::enabled);
        first_round(self, raw.self);
        if (rank == kVictim) pmix_test::die_after_launcher_let_go();
        await_replacement(self, options, 2);
        exchange_with_everyone(self, 1, 2);
        if (options.twice) {
            await_replacement(self, options, 3);
            exchange_with_everyone(self, 1, 3);
        }
        return verdict(options, "survivor", rank, {});
    } catch (const std::exception& error) {
        return verdict(options, "survivor", rank, error.what());
    }
}

int replacement(const Options& options) {
    std::uint32_t rank = kVictim;
    const std::string role = "replacement" + std::to_string(options.generation);
    try {
        Process self = start(options.mode, PeerReplacement::replace_failed_rank);
        rank = self.rank;
        expect(rank == kVictim, "the replacement takes rank " + std::to_string(kVictim));
        expect(self.channels.healthy_peers().size() == self.world, "every peer healthy");
        exchange_with_everyone(self, options.generation, options.generation);
        if (options.generation == 2 && options.twice) {
            verdict(options, role, rank, {});
            pmix_test::die_after_launcher_let_go();  // gone too, after a completed exchange
        }
        return verdict(options, role, rank, {});
    } catch (const std::exception& error) {
        return verdict(options, role, rank, error.what());
    }
}

// Replacement disabled: the failure comes from the queue pairs; reconnect and spawn_replacement
// say replacement is not enabled.
int disabled(const Options& options) {
    const RawPmix raw;
    const std::uint32_t rank = raw.self.rank;
    try {
        Process self = start(options.mode, PeerReplacement::disabled);
        first_round(self, raw.self);
        if (rank == kVictim) pmix_test::die_after_launcher_let_go();
        const std::vector<PeerTransfer> to_victim = write_shares(self, 1, {kVictim});
        bool failed = false;
        const auto until = std::chrono::steady_clock::now() + kPhaseDeadline;
        while (!failed) {
            expect(std::chrono::steady_clock::now() < until, "the victim's failure reported before the deadline");
            (void)self.channels.scatter_write(to_victim);
            for (const PeerEvent& event : self.channels.poll_peer_events()) {
                expect(event.kind == PeerEvent::Kind::failed && event.peer == kVictim, "only the victim's failure is reported");
                failed = true;
            }
            std::this_thread::sleep_for(1ms);
        }
        const auto error_of = [](auto&& call) -> std::string {
            try {
                call();
            } catch (const Error& error) {
                return error.what();
            }
            return "no error";
        };
        const std::string reconnect = error_of([&] { self.channels.reconnect(kVictim); });
        expect(contains(reconnect, "peer replacement is not enabled"), "reconnect says replacement is not enabled: " + reconnect);
        const std::string spawn = error_of([&] { (void)self.channels.spawn_replacement(kVictim, {options.program}); });
        expect(contains(spawn, "peer replacement is not enabled"), "spawn_replacement says so: " + spawn);
        const MultiResult others = self.channels.scatter_write(write_shares(self, 1, everyone_but(self.world, self.rank, kVictim)));
        expect(others.ok(), "writes to the other survivors still succeed: " + others.message());
        fence_survivors(raw.self, self.world);
        return verdict(options, "survivor", rank, {});
    } catch (const std::exception& error) {
        return verdict(options, "survivor", rank, error.what());
    }
}

// Publishes (raw PMIx, as another process could) announcement 1 of `announced_rank` carrying
// the endpoint that rank published at the job's start, with `session`.
void publish_announcement(const pmix_proc_t& raw, std::uint32_t announced_rank, std::uint64_t session) {
    pmix_proc_t owner;
    PMIX_LOAD_PROCID(&owner, raw.nspace, announced_rank);
    pmix_value_t* value = nullptr;
    // The scenarios that publish announcements (stale, impostor) run in RC mode (CMakeLists.txt).
    const std::string row_key = detail::pmix_common_row_key(1, true);
    expect(PMIx_Get(&owner, row_key.c_str(), nullptr, 0, &value) == PMIX_SUCCESS && value != nullptr &&
               value->type == PMIX_STRING,
           "rank " + std::to_string(announced_rank) + "'s published row");
    const std::string row = detail::pmix_row_for(value->data.string, std::nullopt, raw.rank, row_key);
    PMIX_VALUE_RELEASE(value);
    Endpoint endpoint = handshake::parse_table_row(nlohmann::json::parse(row), announced_rank, raw.rank);
    endpoint.session = session;
    const auto expires = std::chrono::duration_cast<std::chrono::milliseconds>(
        (std::chrono::system_clock::now() + 5s).time_since_epoch()).count();
    nlohmann::json announcement = {{"rank", announced_rank}, {"session", handshake::to_hex_u64(session)},
                                   {"namespace", raw.nspace}, {"expires_unix_ms", expires}};
    to_json(announcement["endpoint"], endpoint);
    const std::string text = announcement.dump();
    pmix_info_t info;
    const std::string key = detail::pmix_announcement_key(raw.nspace, 1, 1);
    PMIX_INFO_LOAD(&info, key.c_str(), text.c_str(), PMIX_STRING);
    expect(PMIx_Publish(&info, 1) == PMIX_SUCCESS, "the announcement is published");
    PMIX_INFO_DESTRUCT(&info);
}

// After the victim died, rank 0 publishes (raw PMIx) an announcement of its rank carrying the
// endpoint it published at the job's start, old session included: a stale endpoint.
int stale(const Options& options) {
    const RawPmix raw;
    const std::uint32_t rank = raw.self.rank;
    try {
        Process self = start(options.mode, PeerReplacement::enabled);
        first_round(self, raw.self);
        if (rank == kVictim) pmix_test::die_after_launcher_let_go();
        const std::uint64_t old_session = self.channels.peer_session(kVictim);
        if (rank == 0) {
            // Once the launcher knows the victim died: the survivors offer an announcement only
            // for a rank whose process ended, and ignore one that came too early for good.
            const std::shared_ptr<detail::PmixSession> session = detail::PmixSession::open(detail::PmixSession::Clock::now() + kPhaseDeadline);
            const auto until = std::chrono::steady_clock::now() + kPhaseDeadline;
            while (!session->process_state(raw.self.nspace, kVictim).ended) {
                expect(std::chrono::steady_clock::now() < until, "the launcher saw the victim end before the deadline");
                std::this_thread::sleep_for(5ms);
            }
            publish_announcement(raw.self, kVictim, old_session);
        }
        bool refused = false;
        const auto until = std::chrono::steady_clock::now() + kPhaseDeadline;
        while (!refused) {
            expect(std::chrono::steady_clock::now() < until, "the stale announcement arrived before the deadline");
            for (const PeerEvent& event : self.channels.poll_peer_events()) {
                if (event.kind != PeerEvent::Kind::replacement_available) continue;
                expect(event.session == old_session, "the announcement carries the old session");
                try {
                    self.channels.reconnect(kVictim);
                    expect(false, "reconnect refuses a stale endpoint");
                } catch (const Error& error) {
                    expect(contains(error.what(), "refused as stale") && contains(error.what(), handshake::to_hex_u64(old_session)),
                           std::string("the refusal names the stale session: ") + error.what());
                }
                refused = true;
            }
            std::this_thread::sleep_for(1ms);
        }
        // Nothing was connected: the victim's rank is still its dead process.
        const MultiResult victim = self.channels.scatter_write(write_shares(self, 1, {kVictim}));
        expect(!victim.ok() && contains(victim.message(), "rank " + std::to_string(kVictim)),
               "a write to the victim still fails, naming it");
        fence_survivors(raw.self, self.world);
        return verdict(options, "survivor", rank, {});
    } catch (const std::exception& error) {
        return verdict(options, "survivor", rank, error.what());
    }
}

// A replacement started for rank 1, which is alive: refused by the launcher's process table
// before it announces itself; the survivors never hear of it.
int live(const Options& options) {
    const RawPmix raw;
    const std::uint32_t rank = raw.self.rank;
    try {
        Process self = start(options.mode, PeerReplacement::enabled);
        if (rank == 0) {
            (void)self.channels.spawn_replacement(kVictim, {options.program, "live-replacement", "--results", options.results.string()});
        }
        // Every rank waits until the replacement gave its verdict, watching for events.
        quiet_until(
            self,
            [&] {
                for (const auto& entry : std::filesystem::directory_iterator(options.results)) {
                    if (entry.path().filename().string().starts_with("live-replacement")) return true;
                }
                return false;
            },
            "the replacement of a live rank gave its verdict");
        wait_for_a_whole_round(self);  // an announcement would have been seen
        expect_no_event(self);
        expect(self.channels.healthy_peers().size() == self.world, "every rank healthy");
        fence_everyone(raw.self);
        return verdict(options, "survivor", rank, {});
    } catch (const std::exception& error) {
        return verdict(options, "survivor", rank, error.what());
    }
}

// Rank 0 publishes an announcement of rank 2, which is alive, with a new session (as a confused
// or hostile process could): rank 2 refuses it in the data store, and nobody's application hears
// of it, since the launcher says rank 2's process runs.
int impostor(const Options& options) {
    const RawPmix raw;
    const std::uint32_t rank = raw.self.rank;
    constexpr std::uint32_t kAlive = 2;
    try {
        Process self = start(options.mode, PeerReplacement::enabled);
        const std::filesystem::path refused_marker = options.results / "refusal-seen";
        if (rank == 0) {
            publish_announcement(raw.self, kAlive, 0x5eed000000000002ull);
            const std::string key = detail::pmix_acknowledgement_key(raw.self.nspace, 1, 1, kAlive);
            const std::shared_ptr<detail::PmixSession> session = detail::PmixSession::open(detail::PmixSession::Clock::now() + kPhaseDeadline);
            std::string refusal;
            quiet_until(
                self,
                [&] {
                    if (const auto found = session->lookup({key}); found[0]) refusal = *found[0];
                    return !refusal.empty();
                },
                "rank 2's refusal");
            expect(contains(refusal, "\"refused\"") && contains(refusal, "rank 2 is alive"), "rank 2 refused it: " + refusal);
            wait_for_a_whole_round(self);  // an offer would have come
            expect_no_event(self);
            std::ofstream(refused_marker) << refusal << "\n";
        } else {
            quiet_until(self, [&] { return std::filesystem::exists(refused_marker); }, "rank 0 saw the refusal");
        }
        expect(self.channels.healthy_peers().size() == self.world, "every rank healthy");
        fence_everyone(raw.self);
        return verdict(options, "survivor", rank, {});
    } catch (const std::exception& error) {
        return verdict(options, "survivor", rank, error.what());
    }
}

int live_replacement(const Options& options) {
    try {
        (void)start(options.mode, PeerReplacement::replace_failed_rank);
        return verdict(options, "live-replacement", kVictim, "the replacement of a live rank was accepted");
    } catch (const Error& error) {
        const std::string text = error.what();
        const bool named = contains(text, "rank 1 is alive") && contains(text, "only a rank whose process ended is replaced");
        return verdict(options, "live-replacement", kVictim, named ? "" : "unexpected error: " + text);
    }
}

}  // namespace

int main(int argc, char** argv) {
    Options options;
    options.program = std::filesystem::absolute(argv[0]).string();
    if (argc < 2) {
        std::fprintf(stderr, "usage: %s replace|disabled|stale|live [--mode rc|dc] --results DIR [--twice]\n", argv[0]);
        return 2;
    }
    options.scenario = argv[1];
    for (int index = 2; index < argc; ++index) {
        const std::string argument = argv[index];
        if (argument == "--mode" && index + 1 < argc) options.mode = argv[++index];
        else if (argument == "--results" && index + 1 < argc) options.results = argv[++index];
        else if (argument == "--generation" && index + 1 < argc) options.generation = static_cast<std::uint32_t>(std::stoul(argv[++index]));
        else if (argument == "--twice") options.twice = true;
        else {
            std::fprintf(stderr, "pmix_replacement_program: unknown argument '%s'\n", argument.c_str());
            return 2;
        }
    }
    if (options.results.empty()) {
        std::fprintf(stderr, "pmix_replacement_program: --results DIR is required\n");
        return 2;
    }
    if (options.scenario == "replace") return options.generation == 1 ? first_generation(options) : replacement(options);
    if (options.scenario == "disabled") return disabled(options);
    if (options.scenario == "stale") return stale(options);
    if (options.scenario == "live") return live(options);
    if (options.scenario == "impostor") return impostor(options);
    if (options.scenario == "live-replacement") return live_replacement(options);
    std::fprintf(stderr, "pmix_replacement_program: unknown scenario '%s'\n", options.scenario.c_str());
    return 2;
}
