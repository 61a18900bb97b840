// elastic_service: a sharded store whose members find each other through etcd, join while it
// runs, and leave. Each member holds a shard; every member reads a piece of every other
// member's shard (one gather_read across the members) round after round, checking what it read.
// Member 1 leaves half-way; a latecomer joins after it and claims the id it freed.
//
//   elastic_service [members] [rc|dc]     (default 3 rc)
//
// etcd: RDMACHAN_ETCD, or one started on loopback for the run (Debian's etcd-server). Each member
// is a process of its own, as in a service; the exit status is 0 when every member read only
// what the other members' shards hold and saw the changes it lived through.
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "examples/demo/local_etcd.hpp"
#include "rdmachan/multi_channel.hpp"

namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

constexpr std::uint32_t kCapacity = 16;
constexpr std::size_t kShardBytes = 4096;
constexpr std::size_t kPieceBytes = 256;

std::uint8_t shard_byte(std::uint32_t id, std::size_t index) { return static_cast<std::uint8_t>(id * 37 + index * 11 + 5); }

// One member: claims `id`, reads from every member until `lifetime` has passed, then leaves.
// Returns its exit status.
int run_member(rdmachan::MultiChannelMode mode, std::uint32_t id, std::chrono::milliseconds lifetime) {
    rdmachan::MultiChannelBuilder builder(rdmachan::ChannelBuilder().deadline(5s));
    // The id to claim (without rank(), join() takes the lowest free one). Claimed here because
    // the shard's contents depend on it, and a member's peers may read it as soon as they have
    // seen it join: what a member publishes must be ready before join().
    builder.world_size(kCapacity).mode(mode).bootstrap(rdmachan::Bootstrap::etcd).rank(id);
    rdmachan::PreparedMultiChannel prepared = builder.build();
    std::vector<std::uint8_t> shard(kShardBytes);
    std::vector<std::uint8_t> pieces(kCapacity * kPieceBytes);
    const rdmachan::MemoryRegion shard_region = prepared.register_memory(shard.data(), shard.size());
    const rdmachan::MemoryRegion pieces_region = prepared.register_memory(pieces.data(), pieces.size());
    for (std::size_t index = 0; index < kShardBytes; ++index) shard[index] = shard_byte(id, index);
    prepared.publish_region("shard", shard_region);

    rdmachan::MembershipSettings settings;
    settings.lease_ttl = 2s;
    rdmachan::MultiChannel members = std::move(prepared).join(settings);
    const std::uint32_t me = members.rank();
    std::printf("member %u: joined, %zu members\n", me, members.members().size());

    std::uint64_t pieces_checked = 0;
    std::uint32_t changes_seen = 0;
    const auto until = Clock::now() + lifetime;
    while (Clock::now() < until) {
        for (const rdmachan::PeerEvent& event : members.poll_peer_events()) {
            std::printf("member %u: %s %u%s%s\n", me, std::string(rdmachan::to_string(event.kind)).c_str(), event.peer,
                        event.reason.empty() ? "" : ": ", event.reason.c_str());
            ++changes_seen;
        }
        // A piece of every member's shard, at an offset that moves each round.
        const std::size_t offset = (pieces_checked * 64) % (kShardBytes - kPieceBytes);
        std::vector<rdmachan::PeerTransfer> reads;
        for (std::uint32_t peer : members.members()) {
            reads.push_back({peer, pieces_region.slice(peer * kPieceBytes, kPieceBytes),
                             members.remote_region(peer, "shard").region.slice(offset, kPieceBytes)});
        }
        const rdmachan::MultiResult result = members.gather_read(reads);
        for (const rdmachan::PeerResult& read : result.results()) {
            // A member that left between members() and the read fails its share: it is gone.
            if (!read.result.ok()) continue;
            for (std::size_t index = 0; index < kPieceBytes; ++index) {
                if (pieces[read.peer * kPieceBytes + index] != shard_byte(read.peer, offset + index)) {
                    std::fprintf(stderr, "member %u: byte %zu of member %u's shard is wrong\n", me, offset + index, read.peer);
                    return 1;
                }
            }
            ++pieces_checked;
        }
        std::this_thread::sleep_for(5ms);
    }
    const rdmachan::LeaveResult left = members.leave();
    std::printf("member %u: left after checking %llu pieces; %zu members released it, %zu did not answer\n", me,
                static_cast<unsigned long long>(pieces_checked), left.released.size(), left.unanswered.size());
    return pieces_checked > 0 && changes_seen > 0 && left.ok() ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
    const std::uint32_t count = argc > 1 ? static_cast<std::uint32_t>(std::atoi(argv[1])) : 3;
    const rdmachan::MultiChannelMode mode = argc > 2 && std::string(argv[2]) == "dc"
                                                ? rdmachan::MultiChannelMode::dynamically_connected
                                                : rdmachan::MultiChannelMode::reliable_connected;
    if (count < 2 || count > 8) {
        std::fprintf(stderr, "usage: elastic_service [members: 2 to 8] [rc|dc]\n");
        return 2;
    }
    std::unique_ptr<demo::LocalEtcd> local;
    if (const char* etcd = std::getenv("RDMACHAN_ETCD"); etcd == nullptr || *etcd == '\0') {
        try {
            local = std::make_unique<demo::LocalEtcd>();
        } catch (const std::exception& error) {
            std::fprintf(stderr, "elastic_service: %s\n", error.what());
            return 2;
        }
        ::setenv("RDMACHAN_ETCD", local->endpoint().c_str(), 1);
    }
    // This run's keys only, whatever else the etcd holds.
    ::setenv("RDMACHAN_ETCD_PREFIX", ("elastic-service/" + std::to_string(::getpid()) + "/").c_str(), 1);

    // Member i joins at i * 300 ms; member 1 leaves after 1.5 s; the latecomer joins at 2.5 s, or
    // once member 1 is gone if that is later;
    // the others stay until 4.5 s.
    std::vector<pid_t> children;
    auto start = [&](std::uint32_t id, std::chrono::milliseconds lifetime) {
        const pid_t child = ::fork();
        if (child == 0) {
            std::fflush(stdout);
            int status = 1;
            try {
                status = run_member(mode, id, lifetime);
            } catch (const std::exception& error) {
                std::fprintf(stderr, "member: %s\n", error.what());
            }
            std::fflush(stdout);
            ::_exit(status);
        }
        children.push_back(child);
    };
    const auto began = Clock::now();
    for (std::uint32_t index = 0; index < count; ++index) {
        std::this_thread::sleep_until(began + index * 300ms);
        const auto leaves_at = index == 1 ? began + index * 300ms + 1500ms : began + 4500ms;
        start(index, std::chrono::duration_cast<std::chrono::milliseconds>(leaves_at - Clock::now()));
    }
    int failures = 0;
    const auto reap = [&failures](pid_t child) {
        int status = 0;
        ::waitpid(child, &status, 0);
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) ++failures;
    };
    // The latecomer claims the id member 1 freed: only once member 1's leave() has returned (it
    // waits for the others to release it, longer on a loaded machine), since an id is held by
    // one process at a time and join() refuses one still held.
    std::this_thread::sleep_until(began + 2500ms);
    reap(children[1]);
    start(1, 2000ms);

    for (std::size_t index = 0; index < children.size(); ++index) {
        if (index != 1) reap(children[index]);
    }
    std::printf("elastic_service: %zu members, %d failed\n", children.size(), failures);
    return failures == 0 ? 0 : 1;
}
