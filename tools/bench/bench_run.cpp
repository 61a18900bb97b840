#include "tools/bench/bench_run.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <deque>
#include <stdexcept>
#include <thread>

#include "rdmachan/multi_channel.hpp"

namespace bench {
namespace {

using Clock = std::chrono::steady_clock;
constexpr auto kPollDeadline = std::chrono::seconds(20);
// How long await_marker polls without giving up the core. A yield is a system call that returns
// after any other runnable thread had its turn: polling through the first microseconds instead
// more than halved the 8-byte write latency on the software device's same-host path (2 CPUs,
// 10,000 iterations, median: 1.04 us when yielding after 64 polls, 0.44 us after 50 us of
// polling; the TCP path's 30-35 us did not move). It costs a core for that long per wait, as
// perftest's and ucx_perftest's busy polling does for the whole run.
constexpr auto kSpinFor = std::chrono::microseconds(50);
// How long a wait yields the core between polls before it sleeps between them (await_marker,
// and the channels' completion waits through ChannelBuilder::backoff).
constexpr auto kYieldFor = std::chrono::milliseconds(1);
// The channels count polls, not time: a yield with another thread to run costs about 1-5 us here,
// so this many last about as long.
constexpr std::uint32_t kYieldPolls = 1000;

struct Context {
    const Options& options;
    std::uint32_t rank;
    rdmachan::MultiChannel& channels;
    rdmachan::MemoryRegion& region;
    std::uint8_t* memory;
    std::uint64_t max_size;
    std::vector<rdmachan::RemoteMemoryRegion> remotes;
    rdmachan::LocalSlice out(std::uint32_t bytes) const { return region.slice(0, bytes); }
    rdmachan::LocalSlice in(std::uint32_t bytes) const { return region.slice(max_size, bytes); }
    rdmachan::LocalSlice control() const { return region.slice(2 * max_size, 8); }
    rdmachan::RemoteMemoryRegion remote_in(std::uint32_t peer, std::uint32_t bytes) const {
        return remotes[peer].slice(max_size, bytes);
    }
};

void require(const rdmachan::WorkResult& result, const char* what) {
    if (!result.ok()) throw std::runtime_error(std::string(what) + ": " + result.error().message());
}

// Waits until the last byte of the incoming slice carries `marker` (written by the peer's RDMA
// write), as perftest's ib_write_lat does.
void await_marker(const Context& context, std::uint32_t bytes, std::uint8_t marker) {
    const std::uint8_t* last = context.memory + context.max_size + bytes - 1;
    // The times run from the 64th poll, the first clock read: a marker found sooner costs none.
    Clock::time_point until{};
    Clock::time_point spin_until{};
    Clock::time_point yield_until{};
    enum class Phase { spin, yield, sleep } phase = Phase::spin;
    for (std::uint32_t polls = 1; __atomic_load_n(last, __ATOMIC_ACQUIRE) != marker; ++polls) {
        // As ucx_perftest's put_lat progresses its worker while it polls: on the software
        // device over TCP this thread then reads the peer's frame itself.
        context.channels.progress();
        // Spin, then yield for up to kYieldFor, then sleep: on a software device the bytes may be
        // moved by a thread that needs a core too (hardware's would not), and this machine may
        // have only two. A yield gives the core to that thread the moment it is runnable; a
        // sleep costs a timer wake-up (50 us of timer slack by default) per wait. The clock is
        // read every 64 polls only.
        if ((polls & 0x3f) == 0) {
            const Clock::time_point now = Clock::now();
            if (until == Clock::time_point{}) {
                until = now + kPollDeadline;
                spin_until = now + kSpinFor;
                yield_until = spin_until + kYieldFor;
            }
            if (now > until) throw std::runtime_error("the peer's write never arrived");
            phase = now < spin_until ? Phase::spin : now < yield_until ? Phase::yield : Phase::sleep;
        }
        if (phase == Phase::yield) {
            std::this_thread::yield();
        } else if (phase == Phase::sleep) {
            std::this_thread::sleep_for(std::chrono::microseconds(5));
        }
    }
}

Row latency_row(const Options& options, std::uint32_t bytes, std::vector<double> samples) {
    Row row;
    row.test = options.test;
    row.mode = options.mode;
    row.peers = options.peers;
    row.bytes = bytes;
    row.iterations = static_cast<std::uint32_t>(samples.size());
    std::sort(samples.begin(), samples.end());
    double sum = 0, squares = 0;
    for (double sample : samples) sum += sample;
    row.t_average = sum / samples.size();
    for (double sample : samples) squares += (sample - row.t_average) * (sample - row.t_average);
    row.t_stdev = std::sqrt(squares / samples.size());
    row.t_min = samples.front();
    row.t_max = samples.back();
    row.t_typical = samples[samples.size() / 2];
    row.t_p99 = samples[std::min(samples.size() - 1, static_cast<std::size_t>(std::ceil(0.99 * samples.size())) - 1)];
    return row;
}

double microseconds(Clock::duration duration) { return std::chrono::duration<double, std::micro>(duration).count(); }

// Rank 0 side of a latency test with rank 1.
Row measure_latency(Context& context, std::uint32_t bytes) {
    const Options& options = context.options;
    std::vector<double> samples;
    samples.reserve(options.iterations);
    for (std::uint32_t iteration = 0; iteration < options.iterations; ++iteration) {
        const std::uint8_t marker = static_cast<std::uint8_t>(iteration % 255 + 1);
        const Clock::time_point start = Clock::now();
        if (options.test == "write") {
            context.memory[bytes - 1] = marker;
            rdmachan::PendingWork write = context.channels.post_write(1, context.out(bytes), context.remote_in(1, bytes));
            await_marker(context, bytes, marker);
            samples.push_back(microseconds(Clock::now() - start) / 2);
            // The write's own completion, outside the sample, before the next write: as
            // ucx_perftest's put ping-pong waits for its one outstanding put before the next.
            require(write.wait(), "write");
        } else if (options.test == "send") {
            rdmachan::PendingWork reply = context.channels.post_receive(1, context.in(bytes));
            require(context.channels.send(1, context.out(bytes)), "send");
            require(reply.wait(), "receive");
            samples.push_back(microseconds(Clock::now() - start) / 2);
        } else {
            require(context.channels.read(1, context.in(bytes), context.remotes[1].slice(0, bytes)), "read");
            samples.push_back(microseconds(Clock::now() - start));
        }
    }
    return latency_row(options, bytes, std::move(samples));
}

// Rank 1 side of a latency test.
void answer_latency(Context& context, std::uint32_t bytes) {
    const Options& options = context.options;
    if (options.test == "read") return;  // reads need nothing from this side
    std::optional<rdmachan::PendingWork> next;
    if (options.test == "send") next = context.channels.post_receive(0, context.in(bytes));
    for (std::uint32_t iteration = 0; iteration < options.iterations; ++iteration) {
        const std::uint8_t marker = static_cast<std::uint8_t>(iteration % 255 + 1);
        if (options.test == "write") {
            await_marker(context, bytes, marker);
            context.memory[bytes - 1] = marker;
            rdmachan::PendingWork write = context.channels.post_write(0, context.out(bytes), context.remote_in(0, bytes));
            require(write.wait(), "write back");
        } else {
            require(next->wait(), "receive");
            if (iteration + 1 < options.iterations) next = context.channels.post_receive(0, context.in(bytes));
            require(context.channels.send(0, context.out(bytes)), "send back");
        }
    }
}

// Rank 0 side of a bandwidth test: batches of `window` requests, one doorbell each, two batches in
// flight per peer, peers taken in turn.
Row measure_bandwidth(Context& context, std::uint32_t bytes) {
    const Options& options = context.options;
    const std::uint32_t peers = options.peers - 1;
    std::deque<std::pair<rdmachan::PendingWork, std::uint32_t>> in_flight;  // batch, its requests
    std::vector<std::pair<Clock::time_point, std::uint32_t>> completions;  // when, how many requests
    completions.reserve(options.iterations / options.window + 2);
    std::uint32_t posted = 0;
    const Clock::time_point start = Clock::now();
    auto complete_oldest = [&] {
        require(in_flight.front().first.wait(), "batch");
        completions.emplace_back(Clock::now(), in_flight.front().second);
        in_flight.pop_front();
    };
    for (std::uint32_t batch_index = 0; posted < options.iterations; ++batch_index) {
        const std::uint32_t peer = 1 + batch_index % peers;
        const std::uint32_t count = std::min(options.window, options.iterations - posted);
        rdmachan::WorkBatch batch;
        for (std::uint32_t i = 0; i < count; ++i) {
            if (options.test == "write") batch.write(context.out(bytes), context.remote_in(peer, bytes));
            if (options.test == "read") batch.read(context.in(bytes), context.remotes[peer].slice(0, bytes));
            if (options.test == "send") batch.send(context.out(bytes));
        }
        if (in_flight.size() >= 2 * peers) complete_oldest();
        in_flight.emplace_back(context.channels.post_batch(peer, batch), count);
        posted += count;
    }
    while (!in_flight.empty()) complete_oldest();
    const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
    // Peak: the best of ten consecutive stretches of the run (by completions), each measured
    // from the end of the one before: one batch alone is too short to time.
    double peak = 0;
    // Batches complete two at a time at most (two in flight per peer), so a stretch holds at
    // least four of them per peer; a run too short for two stretches reports its average.
    const std::size_t stretch = std::max<std::size_t>(4 * peers, completions.size() / 10);
    Clock::time_point stretch_start = start;
    for (std::size_t first = 0; first < completions.size(); first += stretch) {
        const std::size_t end = std::min(completions.size(), first + stretch);
        std::uint64_t requests = 0;
        for (std::size_t index = first; index < end; ++index) requests += completions[index].second;
        const double span = std::chrono::duration<double>(completions[end - 1].first - stretch_start).count();
        if (span > 0) peak = std::max(peak, static_cast<double>(requests) * bytes / span / 1e6);
        stretch_start = completions[end - 1].first;
    }
    Row row;
    row.test = options.test;
    row.bandwidth = true;
    row.mode = options.mode;
    row.peers = options.peers;
    row.bytes = bytes;
    row.iterations = options.iterations;
    row.bw_average = static_cast<double>(bytes) * options.iterations / seconds / 1e6;
    row.bw_peak = std::max(peak, row.bw_average);
    row.message_rate = options.iterations / seconds / 1e6;
    return row;
}

// Another rank's side of a send bandwidth test: receives for its share of the messages.
void answer_bandwidth(Context& context, std::uint32_t bytes) {
    const Options& options = context.options;
    if (options.test != "send") return;
    const std::uint32_t peers = options.peers - 1;
    std::uint32_t mine = 0, posted = 0;
    for (std::uint32_t batch_index = 0; posted < options.iterations; ++batch_index) {
        const std::uint32_t count = std::min(options.window, options.iterations - posted);
        if (1 + batch_index % peers == context.rank) mine += count;
        posted += count;
    }
    std::deque<rdmachan::PendingWork> receives;
    for (std::uint32_t index = 0; index < mine; ++index) {
        if (receives.size() >= 2 * options.window) {
            require(receives.front().wait(), "receive");
            receives.pop_front();
        }
        receives.push_back(context.channels.post_receive(0, context.in(bytes)));
    }
    while (!receives.empty()) {
        require(receives.front().wait(), "receive");
        receives.pop_front();
    }
}

}  // namespace

RankOutcome run_rank(const Options& options, const RankIdentity& identity) {
    const std::uint64_t max_size = *std::max_element(options.sizes.begin(), options.sizes.end());
    const std::size_t memory_bytes = 2 * max_size + 64;
    std::vector<std::uint8_t> heap(options.memory == "heap" ? memory_bytes : 0, 0);
    const std::uint32_t depth = std::max<std::uint32_t>(2 * options.window, 64);
    rdmachan::ChannelBuilder channel = rdmachan::ChannelBuilder()
                                           .device(options.device)
                                           .max_send_wr(depth)
                                           .max_recv_wr(depth)
                                           .min_rnr_timer(1)
                                           .backoff(64, kYieldPolls, std::chrono::microseconds(50))
                                           .wait_mode(options.wait == "event"      ? rdmachan::WaitMode::event
                                                      : options.wait == "adaptive" ? rdmachan::WaitMode::adaptive
                                                                                   : rdmachan::WaitMode::spin)
                                           .deadline(std::chrono::seconds(30));
    rdmachan::PreparedMultiChannel prepared =
        rdmachan::MultiChannelBuilder(channel)
            .rank(identity.rank)
            .world_size(options.peers)
            .mode(options.mode == "dc" ? rdmachan::MultiChannelMode::dynamically_connected
                                       : rdmachan::MultiChannelMode::reliable_connected)
            .build();
    rdmachan::MemoryRegion region = options.memory == "heap" ? prepared.register_memory(heap.data(), heap.size())
                                                             : prepared.allocate_memory(memory_bytes);
    auto* memory = static_cast<std::uint8_t*>(region.data());
    prepared.publish_region("buffer", region);
    rdmachan::RendezvousSettings settings;
    settings.port = identity.rendezvous_port;
    settings.rank = identity.rank;
    settings.world_size = options.peers;
    settings.job = "rdmachan-bench";
    settings.token = identity.token;
    rdmachan::MultiChannel channels = std::move(prepared).connect(settings);

    Context context{options, identity.rank, channels, region, memory, max_size, {}};
    for (std::uint32_t peer = 0; peer < options.peers; ++peer)
        context.remotes.push_back(channels.remote_region(peer, "buffer").region);
    // The warm-up runs the same loops with options.warmup iterations; its figures are dropped.
    Options warmup_options = options;
    warmup_options.iterations = options.warmup;
    Context warmup{warmup_options, identity.rank, channels, region, memory, max_size, context.remotes};

    // Everyone is ready once each answered rank 0's "go" (a send each way); each side clears its
    // memory before, so no marker of an earlier loop is mistaken for a new one.
    auto start_together = [&] {
        std::fill(memory, memory + memory_bytes, 0);
        if (identity.rank == 0) {
            for (std::uint32_t peer = 1; peer < options.peers; ++peer) {
                rdmachan::PendingWork ready = channels.post_receive(peer, context.control());
                require(channels.send(peer, context.control()), "go");
                require(ready.wait(), "ready");
            }
        } else {
            require(channels.receive(0, context.control()), "go");
            require(channels.send(0, context.control()), "ready");
        }
    };
    auto answer = [&](Context& side, std::uint32_t bytes) {
        if (options.bandwidth) {
            answer_bandwidth(side, bytes);
        } else if (identity.rank == 1) {
            answer_latency(side, bytes);
        }
    };

    RankOutcome outcome;
    for (std::uint32_t bytes : options.sizes) {
        if (options.warmup > 0) {
            start_together();
            if (identity.rank == 0) {
                (void)(options.bandwidth ? measure_bandwidth(warmup, bytes) : measure_latency(warmup, bytes));
            } else {
                answer(warmup, bytes);
            }
        }
        start_together();
        if (identity.rank == 0) {
            outcome.rows.push_back(options.bandwidth ? measure_bandwidth(context, bytes) : measure_latency(context, bytes));
            for (std::uint32_t peer = 1; peer < options.peers; ++peer) {
                rdmachan::PendingWork done = channels.post_receive(peer, context.control());
                require(channels.send(peer, context.control()), "end of size");
                require(done.wait(), "end acknowledged");
            }
        } else {
            answer(context, bytes);
            require(channels.receive(0, context.control()), "end of size");
            require(channels.send(0, context.control()), "end acknowledged");
        }
    }
    if (identity.rank == 0)
        for (std::uint32_t peer = 0; peer < options.peers; ++peer) outcome.counters.push_back(channels.counters(peer));
    return outcome;
}

}  // namespace bench
