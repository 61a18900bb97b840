// N processes, one MultiChannel each. Every rank holds a rows x N matrix of 8-byte elements;
// column q is what rank q wants from it. Each rank registers, for every other rank q, a memory
// layout over its column q (MemoryLayout::strided: one element every row), tells q its remote
// region as JSON over the channel, and then gathers its own column from every other rank with
// one RDMA read per peer (gather_read), checking every element.
//
//   multi_channel_column_gather [ranks] [rows] [rc|dc]
//
// In DC mode each rank's layouts serve its DC target: the peers' DC initiators read through them.
//
// The parent process plays the launcher (local_ranks.hpp), as in multi_channel_all_to_all.cpp.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "rdmachan/error.hpp"
#include "rdmachan/multi_channel.hpp"

#include "local_ranks.hpp"

namespace {

constexpr std::uint32_t kMessageBytes = 256;  // one remote region as JSON

std::uint64_t element(std::uint32_t owner, std::uint32_t row, std::uint32_t column) {
    return std::uint64_t{owner + 1} << 40 | std::uint64_t{row} << 16 | column;
}

int run_rank(const rdmachan::RendezvousSettings& settings, std::uint32_t rows, rdmachan::MultiChannelMode mode) {
    const std::uint32_t rank = settings.rank;
    const std::uint32_t ranks = settings.world_size;
    std::vector<std::uint64_t> matrix(static_cast<std::size_t>(rows) * ranks);
    for (std::uint32_t row = 0; row < rows; ++row)
        for (std::uint32_t column = 0; column < ranks; ++column) matrix[row * ranks + column] = element(rank, row, column);
    // [gathered column from each rank][outgoing messages][incoming messages][done markers]
    const std::size_t gathered_bytes = static_cast<std::size_t>(ranks) * rows * 8;
    std::vector<std::uint8_t> scratch(gathered_bytes + 2 * ranks * kMessageBytes);
    rdmachan::PreparedMultiChannel prepared =
        rdmachan::MultiChannelBuilder(rdmachan::ChannelBuilder().deadline(std::chrono::seconds(20)))
            .rank(rank)
            .world_size(ranks)
            .mode(mode)
            .build();
    rdmachan::MemoryRegion matrix_region = prepared.register_memory(matrix.data(), matrix.size() * 8);
    rdmachan::MemoryRegion scratch_region = prepared.register_memory(scratch.data(), scratch.size());
    rdmachan::MultiChannel channels = std::move(prepared).connect(settings);

    auto outgoing = [&](std::uint32_t peer) { return scratch_region.slice(gathered_bytes + peer * kMessageBytes, kMessageBytes); };
    auto incoming = [&](std::uint32_t peer) {
        return scratch_region.slice(gathered_bytes + (ranks + peer) * kMessageBytes, kMessageBytes);
    };
    // Receives for every other rank's message, then for its "done" (a receive WQE is consumed in
    // order, so the message lands in the first).
    std::vector<rdmachan::PeerTransfer> messages_in, done_in, messages_out, done_out;
    for (std::uint32_t peer = 0; peer < ranks; ++peer) {
        if (peer == rank) continue;
        messages_in.push_back({peer, incoming(peer), {}});
        done_in.push_back({peer, scratch_region.slice(0, 0), {}});
    }
    rdmachan::PendingMultiWork arriving = channels.post_gather_receive(messages_in);
    rdmachan::PendingMultiWork finishing = channels.post_gather_receive(done_in);

    // One layout per reader: column `peer` of this rank's matrix, 8 bytes every row.
    std::vector<rdmachan::MemoryRegion> columns;
    for (std::uint32_t peer = 0; peer < ranks; ++peer) {
        if (peer == rank) continue;
        columns.push_back(channels.register_layout(
            rdmachan::MemoryLayout::strided(matrix_region, peer * 8ull, 8, ranks * 8, rows), rdmachan::Access::remote_read));
        const std::string text = nlohmann::json(columns.back().remote()).dump();
        std::memcpy(outgoing(peer).bytes(), text.c_str(), text.size() + 1);
        if (text.size() + 1 > kMessageBytes) throw rdmachan::Error("the layout's JSON does not fit a message: " + text);
        messages_out.push_back({peer, scratch_region.slice(gathered_bytes + peer * kMessageBytes, text.size() + 1), {}});
    }
    const rdmachan::MultiResult sent = channels.scatter_send(messages_out);
    const rdmachan::MultiResult arrived = arriving.wait();
    if (!sent.ok() || !arrived.ok()) {
        std::fprintf(stderr, "rank %u: exchanging the layouts failed:\n%s%s\n", rank, sent.message().c_str(), arrived.message().c_str());
        return 1;
    }
    // One read per peer: its column `rank`, gathered by the peer's NIC (here: its device).
    std::vector<rdmachan::PeerTransfer> reads;
    for (std::uint32_t peer = 0; peer < ranks; ++peer) {
        if (peer == rank) continue;
        const auto remote = nlohmann::json::parse(reinterpret_cast<const char*>(incoming(peer).bytes())).get<rdmachan::RemoteMemoryRegion>();
        reads.push_back({peer, scratch_region.slice(static_cast<std::uint64_t>(peer) * rows * 8, rows * 8ull), remote});
    }
    const rdmachan::MultiResult read = channels.gather_read(reads);
    if (!read.ok()) {
        std::fprintf(stderr, "rank %u: gather_read failed:\n%s\n", rank, read.message().c_str());
        return 1;
    }
    int wrong = 0;
    for (std::uint32_t peer = 0; peer < ranks; ++peer) {
        if (peer == rank) continue;
        for (std::uint32_t row = 0; row < rows; ++row) {
            std::uint64_t value;
            std::memcpy(&value, scratch.data() + (static_cast<std::size_t>(peer) * rows + row) * 8, 8);
            if (value != element(peer, row, rank) && wrong++ < 5) {
                std::fprintf(stderr, "rank %u: row %u of rank %u's column is %llx, expected %llx\n", rank, row, peer,
                             static_cast<unsigned long long>(value), static_cast<unsigned long long>(element(peer, row, rank)));
            }
        }
    }
    // Nobody leaves (and frees its matrix) before every reader is done with it.
    for (std::uint32_t peer = 0; peer < ranks; ++peer) {
        if (peer != rank) done_out.push_back({peer, scratch_region.slice(0, 0), {}});
    }
    const rdmachan::MultiResult done = channels.scatter_send(done_out);
    const rdmachan::MultiResult finished = finishing.wait();
    if (!done.ok() || !finished.ok()) {
        std::fprintf(stderr, "rank %u: the closing exchange failed:\n%s%s\n", rank, done.message().c_str(), finished.message().c_str());
        return 1;
    }
    if (wrong != 0) return 1;
    std::printf("rank %u: gathered column %u from %u ranks (%u rows each, one read per rank), all verified (device %s)\n",
                rank, rank, ranks - 1, rows, channels.device_name().c_str());
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    const std::uint32_t ranks = argc > 1 ? static_cast<std::uint32_t>(std::strtoul(argv[1], nullptr, 10)) : 4;
    const std::uint32_t rows = argc > 2 ? static_cast<std::uint32_t>(std::strtoul(argv[2], nullptr, 10)) : 256;
    const std::string mode_name = argc > 3 ? argv[3] : "rc";
    const rdmachan::MultiChannelMode mode =
        mode_name == "dc" ? rdmachan::MultiChannelMode::dynamically_connected : rdmachan::MultiChannelMode::reliable_connected;
    if (ranks < 2 || ranks > 16 || rows < 1 || rows > 4096 || (mode_name != "rc" && mode_name != "dc")) {
        std::fprintf(stderr, "usage: multi_channel_column_gather [ranks 2..16] [rows 1..4096] [rc|dc]\n");
        return 2;
    }
    examples::LocalRanks launcher(ranks, "multi_channel_column_gather");
    launcher.start([rows, mode](const rdmachan::RendezvousSettings& settings) { return run_rank(settings, rows, mode); });
    int failures = launcher.rendezvous();
    failures += launcher.wait_all();
    if (failures != 0) {
        std::fprintf(stderr, "multi_channel_column_gather: %d failure(s)\n", failures);
        return 1;
    }
    std::printf("multi_channel_column_gather: %u ranks (%s) each gathered a %u-row column from every other rank, one read "
                "per peer, every element verified\n",
                ranks, mode_name.c_str(), rows);
    return 0;
}
