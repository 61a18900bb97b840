#include "examples/demo/elastic_member.hpp"

#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "examples/demo/monotonic_time.hpp"
#include "examples/demo/slice_pattern.hpp"
#include "rdmachan/multi_channel.hpp"

namespace demo {
namespace {

using Clock = std::chrono::steady_clock;

// One event for the launcher, stamped.
void tell_launcher(nlohmann::json event) {
    event["at_ns"] = monotonic_ns();
    std::printf("%s\n", event.dump().c_str());
    std::fflush(stdout);
}

bool told_to_leave() {
    char byte = 0;
    return ::read(STDIN_FILENO, &byte, 1) >= 0;  // a byte, or the launcher is gone (0: end of file)
}

}  // namespace

int run_elastic_member(const Options& options) {
    const Workload& workload = options.workload;
    try {
        ::fcntl(STDIN_FILENO, F_SETFL, ::fcntl(STDIN_FILENO, F_GETFL) | O_NONBLOCK);
        // Below etcd's priority: in a deployment etcd has machines of its own; here it shares the
        // cores with every member, each busy writing, and would be starved by them.
        ::setpriority(PRIO_PROCESS, 0, 5);
        rdmachan::ChannelBuilder channel_builder;
        channel_builder.deadline(std::chrono::seconds(5));
        if (workload.device != "auto") channel_builder.device(workload.device);
        rdmachan::MultiChannelBuilder builder(channel_builder);
        builder.world_size(kElasticCapacity)
            .bootstrap(rdmachan::Bootstrap::etcd)
            .mode(workload.mode == "dc" ? rdmachan::MultiChannelMode::dynamically_connected
                                        : rdmachan::MultiChannelMode::reliable_connected);
        rdmachan::PreparedMultiChannel prepared = builder.build();
        const std::uint64_t size = workload.size;
        std::vector<std::uint8_t> inbox(kElasticCapacity * size, 0);
        std::vector<std::uint8_t> outbox(size, 0);
        std::vector<std::uint8_t> readback(size, 0);
        const rdmachan::MemoryRegion inbox_region = prepared.register_memory(inbox.data(), inbox.size());
        const rdmachan::MemoryRegion outbox_region = prepared.register_memory(outbox.data(), outbox.size());
        const rdmachan::MemoryRegion readback_region = prepared.register_memory(readback.data(), readback.size());
        prepared.publish_region("inbox", inbox_region);
        tell_launcher({{"event", "joining"}});
        rdmachan::MembershipSettings settings;
        settings.lease_ttl = std::chrono::seconds(2);
        rdmachan::MultiChannel channel = std::move(prepared).join(settings);
        const std::uint32_t me = channel.rank();
        tell_launcher({{"event", "ready"}, {"id", me}});

        auto report_events = [&] {
            for (const rdmachan::PeerEvent& event : channel.poll_peer_events()) {
                tell_launcher({{"event", std::string(rdmachan::to_string(event.kind))}, {"id", me}, {"peer", event.peer},
                      {"reason", event.reason}});
            }
        };
        // An operation on a member that then left or failed (its queue pair failed, or its lease
        // ran out) was cut short by it; one on a member that stays healthy, after its lease had
        // time to run out, is an error of this run.
        auto went_away = [&](std::uint32_t peer) {
            const auto until = Clock::now() + settings.lease_ttl + std::chrono::seconds(2);
            for (;;) {
                report_events();
                const std::vector<std::uint32_t> members = channel.members();
                if (std::find(members.begin(), members.end(), peer) == members.end() || !channel.healthy(peer)) return true;
                if (Clock::now() >= until) return false;
                std::this_thread::sleep_for(std::chrono::milliseconds(1));
            }
        };
        std::uint64_t verified = 0;     // bytes written, read back and found equal
        std::uint64_t corrupted = 0;    // bytes read back that differ
        std::uint64_t cut = 0;          // operations that failed because their peer went
        std::uint64_t window_bytes = 0;
        auto window_start = Clock::now();
        // Until the launcher says so, or is gone (its end of the pipe closed): no time limit of its
        // own, as a service member has none.
        for (std::uint32_t round = 0; !told_to_leave(); ++round) {
            report_events();
            for (std::uint32_t peer : channel.members()) {
                // Changes are taken between every two peers' operations, as a service's event loop
                // takes them between requests: a joiner waits for no member's whole round.
                report_events();
                // A failed pair waits for its member to go (or to be connected again).
                if (!channel.healthy(peer)) continue;
                const SlicePattern pattern(me, peer, round);
                pattern.fill(outbox.data(), size);
                rdmachan::RemoteMemoryRegion slot;
                try {
                    slot = channel.remote_region(peer, "inbox").region.slice(me * size, size);
                } catch (const rdmachan::Error&) {
                    ++cut;  // it went between members() and here
                    continue;
                }
                const rdmachan::WorkResult written = channel.write(peer, outbox_region.slice(0, size), slot);
                const rdmachan::WorkResult read =
                    written.ok() ? channel.read(peer, readback_region.slice(0, size), slot) : written;
                if (!read.ok()) {
                    if (!went_away(peer)) {
                        throw std::runtime_error("member " + std::to_string(peer) + ": " + read.error().message());
                    }
                    ++cut;
                    continue;
                }
                const std::uint64_t first = pattern.first_difference(readback.data(), size);
                if (first != size) {
                    corrupted += size - first;
                    tell_launcher({{"event", "corrupted"}, {"id", me}, {"peer", peer}, {"round", round}, {"offset", first}});
                } else {
                    verified += size;
                }
                window_bytes += 2 * size;
            }
            if (Clock::now() - window_start >= std::chrono::milliseconds(100)) {
                tell_launcher({{"event", "traffic"}, {"id", me}, {"bytes", window_bytes}});
                window_bytes = 0;
                window_start = Clock::now();
            }
        }
        const auto leave_started = Clock::now();
        const rdmachan::LeaveResult left = channel.leave();
        tell_launcher({{"event", "left_service"},
              {"id", me},
              {"released", left.released},
              {"unanswered", left.unanswered},
              {"leave_ms", std::chrono::duration<double, std::milli>(Clock::now() - leave_started).count()}});
        tell_launcher({{"event", "result"}, {"id", me}, {"verified", verified}, {"corrupted", corrupted}, {"cut", cut}});
        return corrupted == 0 ? 0 : 1;
    } catch (const std::exception& error) {
        tell_launcher({{"event", "error"}, {"error", error.what()}});
        std::fprintf(stderr, "rdmachan-demo elastic member: %s\n", error.what());
        return 1;
    }
}

}  // namespace demo
