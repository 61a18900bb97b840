// What rdmachan::asio adds over a blocking wait, in instructions, under callgrind (counting only
// the measured_* functions on the calling thread, as scripts/instruction_counts.sh does):
//
//   valgrind --tool=callgrind --collect-atstart=no --toggle-collect='*measured_*'
//            asio_instruction_benchmark --mode M [--operations N]      (one command line)
//
// Each mode takes N RDMA writes' completions on the software device, the completion already
// there when counted (the write has landed and 1 ms more passed, uncounted), and counts:
//   wait:      PendingWork::wait()
//   initiate:  AsyncChannel::async_wait from a handler inside io_context::run(): its poll and the
//              post of the completion handler (the scheduler running that handler is not counted)
//   round:     async_wait, io_context::restart() and run() from outside run(), until the handler
//              has run: the whole asynchronous path, with Boost.Asio's per-run() set-up and (outside
//              run(), where Asio 1.74 recycles nothing) an allocation and a free of the posted handler
// Divide the total by N. Natively (no --mode: all three) it is a functional check of the paths.
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

#include "tests/asio/asio_test_support.hpp"
#include "tests/mlx5/measured_function.hpp"

using namespace rdmachan;
namespace net = boost::asio;

namespace {

struct Delivered {
    int* count;
    void operator()(boost::system::error_code error, WorkResult result) const { *count += !error && result.ok(); }
};

MEASURED_FUNCTION WorkResult measured_wait(PendingWork& work) { return work.wait(); }

// The initiate mode's rounds, all inside one io_context::run(): each completion handler starts
// the next round, as an application's would (Boost.Asio recycles its memory per run()).
struct Chain;
struct ChainHandler {
    Chain* chain;
    void operator()(boost::system::error_code error, WorkResult result) const;
};

MEASURED_FUNCTION void measured_async_wait(asio::AsyncChannel& channel, PendingWork& work, ChainHandler handler) {
    channel.async_wait(std::move(work), handler);
}

MEASURED_FUNCTION void measured_round(net::io_context& io, asio::AsyncChannel& channel, PendingWork& work, Delivered handler) {
    channel.async_wait(std::move(work), handler);
    io.restart();
    io.run();
}

// Posts a write and returns once it has landed and 1 ms more has passed (uncounted).
PendingWork landed_write(asio::AsyncChannel& channel, const MemoryRegion& local, const MemoryRegion& remote, std::uint32_t round) {
    auto* source = static_cast<std::uint32_t*>(local.data());
    auto* target = static_cast<volatile std::uint32_t*>(remote.data());
    *source = round + 1;
    PendingWork work = channel.channel().post_write(local.slice(0, 4096), remote.remote(0, 4096));
    while (*target != round + 1) std::this_thread::yield();
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    return work;
}

struct Chain {
    asio::AsyncChannel& channel;
    const MemoryRegion& local;
    const MemoryRegion& remote;
    int operations;
    int delivered = 0;
    int round = -1;  // the first, uncounted
    void step() {
        PendingWork work = landed_write(channel, local, remote, static_cast<std::uint32_t>(round + 1));
        if (round < 0) {
            channel.async_wait(std::move(work), ChainHandler{this});
        } else {
            measured_async_wait(channel, work, ChainHandler{this});
        }
    }
};

void ChainHandler::operator()(boost::system::error_code error, WorkResult result) const {
    chain->delivered += !error && result.ok();
    if (++chain->round < chain->operations) chain->step();
}


// Takes `operations` completions (plus one uncounted first) through `mode`; false if one failed.
bool run(const std::string& mode, int operations) {
    net::io_context io;
    test::ChannelPair pair = test::connect_pair();
    asio::AsyncChannel a(io, std::move(pair.a));
    MemoryRegion local = a.channel().allocate_memory(4096);
    MemoryRegion remote = pair.b.allocate_memory(4096);
    int delivered = 0;
    const Delivered handler{&delivered};
    for (int round = -1; round < operations; ++round) {
        const auto index = static_cast<std::uint32_t>(round + 1);
        if (mode == "wait") {
            PendingWork work = landed_write(a, local, remote, index);
            delivered += round < 0 ? work.wait().ok() : measured_wait(work).ok();
        } else if (mode == "round") {
            PendingWork work = landed_write(a, local, remote, index);
            if (round < 0) {
                a.async_wait(std::move(work), handler);
                io.restart();
                io.run();
            } else {
                measured_round(io, a, work, handler);
            }
        } else {
            Chain chain{a, local, remote, operations};
            net::post(io, [&chain] { chain.step(); });
            io.run();
            delivered = chain.delivered;
            break;
        }
    }
    if (delivered != operations + 1) {
        std::fprintf(stderr, "asio_instruction_benchmark: mode %s: %d of %d completions delivered successfully\n", mode.c_str(),
                     delivered, operations + 1);
        return false;
    }
    std::printf("asio_instruction_benchmark: mode %s, %d operations, all delivered\n", mode.c_str(), operations);
    return true;
}

}  // namespace

int main(int argc, char** argv) {
    std::string mode = "all";
    int operations = 1000;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (std::strcmp(argv[i], "--mode") == 0) mode = argv[i + 1];
        if (std::strcmp(argv[i], "--operations") == 0) operations = std::atoi(argv[i + 1]);
    }
    if ((mode != "all" && mode != "wait" && mode != "initiate" && mode != "round") || operations < 1) {
        std::fprintf(stderr, "usage: asio_instruction_benchmark [--mode all|wait|initiate|round] [--operations N]\n");
        return 2;
    }
    bool ok = true;
    for (const char* each : {"wait", "initiate", "round"}) {
        if (mode == "all" || mode == each) ok = run(each, operations) && ok;
    }
    return ok ? 0 : 1;
}
