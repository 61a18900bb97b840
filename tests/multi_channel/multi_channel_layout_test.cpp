// Memory layouts through MultiChannel, RC and DC, several ranks in one process on the
// software device: every rank registers one strided layout per reader (the reader's column of
// its matrix) and publishes it as JSON; the others gather their column with one read per peer
// and scatter a new one with one write per peer, at the three levels (blocking, scoped,
// unpolled); a list layout is the local side of reads, writes and sends; in DC the layouts'
// keys are set up on a queue pair of the engine's own and serve the DC target and initiators.
// Every element of every matrix is compared with a model after each step.
#include <doctest/doctest.h>

#include <cstring>
#include <string>
#include <vector>

#include "rdmachan/error.hpp"
#include "rdmachan/multi_channel.hpp"

using namespace rdmachan;

namespace {

constexpr std::uint32_t kRanks = 3;
constexpr std::uint32_t kRows = 24;  // a matrix of kRows x kRanks 8-byte elements per rank

std::uint64_t element(std::uint32_t writer, std::uint32_t row, std::uint32_t column) {
    return std::uint64_t{writer + 1} << 40 | std::uint64_t{row} << 16 | column;
}

struct World {
    std::vector<MultiChannel> ranks;
    std::vector<std::vector<std::uint64_t>> matrix;   // by rank
    std::vector<std::vector<std::uint64_t>> expected; // the model of each matrix
    std::vector<std::vector<std::uint64_t>> scratch;  // by rank: kRanks columns of kRows, then as much again
    std::vector<MemoryRegion> matrix_regions;
    std::vector<MemoryRegion> scratch_regions;
    // column_layouts[owner][reader]: the owner's column `reader` as a layout; remote_columns the
    // same as the reader learned it (through JSON).
    std::vector<std::vector<MemoryRegion>> column_layouts;
    std::vector<std::vector<RemoteMemoryRegion>> remote_columns;

    void check_matrices() {
        for (std::uint32_t rank = 0; rank < kRanks; ++rank) {
            std::uint32_t differing = 0;
            for (std::size_t i = 0; i < matrix[rank].size(); ++i) differing += matrix[rank][i] != expected[rank][i];
            const std::string whose = "rank " + std::to_string(rank) + "'s matrix";
            INFO(whose);
            CHECK(differing == 0);
        }
    }
};

World make_world(MultiChannelMode mode) {
    World world;
    world.matrix.resize(kRanks);
    world.scratch.resize(kRanks);
    std::vector<PreparedMultiChannel> prepared;
    std::vector<Endpoint> table;
    for (std::uint32_t rank = 0; rank < kRanks; ++rank) {
        prepared.push_back(MultiChannelBuilder(ChannelBuilder().deadline(std::chrono::seconds(10)))
                               .rank(rank)
                               .world_size(kRanks)
                               .mode(mode)
                               .dc_initiators(2)
                               .build());
        world.matrix[rank].resize(kRows * kRanks);
        for (std::uint32_t row = 0; row < kRows; ++row)
            for (std::uint32_t column = 0; column < kRanks; ++column) world.matrix[rank][row * kRanks + column] = element(rank, row, column);
        world.scratch[rank].assign(2 * kRanks * kRows, 0);
        world.matrix_regions.push_back(prepared.back().register_memory(world.matrix[rank].data(), world.matrix[rank].size() * 8));
        world.scratch_regions.push_back(prepared.back().register_memory(world.scratch[rank].data(), world.scratch[rank].size() * 8));
        prepared.back().publish_region("matrix", world.matrix_regions.back());
        table.push_back(nlohmann::json(prepared.back().endpoint()).get<Endpoint>());
    }
    for (std::uint32_t rank = 0; rank < kRanks; ++rank) world.ranks.push_back(std::move(prepared[rank]).handshake(table));
    world.expected = world.matrix;
    // One layout per reader, published as JSON (here handed over in the process).
    world.column_layouts.resize(kRanks);
    world.remote_columns.assign(kRanks, std::vector<RemoteMemoryRegion>(kRanks));
    for (std::uint32_t owner = 0; owner < kRanks; ++owner) {
        for (std::uint32_t reader = 0; reader < kRanks; ++reader) {
            world.column_layouts[owner].push_back(world.ranks[owner].register_layout(
                MemoryLayout::strided(world.matrix_regions[owner], reader * 8ull, 8, kRanks * 8, kRows)));
            const std::string published = nlohmann::json(world.column_layouts[owner].back().remote()).dump();
            world.remote_columns[owner][reader] = nlohmann::json::parse(published).get<RemoteMemoryRegion>();
        }
    }
    return world;
}

MultiChannelMode mode_of_subcase(bool dc) { return dc ? MultiChannelMode::dynamically_connected : MultiChannelMode::reliable_connected; }

// The column each reader gathered into its scratch (peer by peer) against the owners' models.
void check_gathered(World& world, std::uint32_t reader) {
    for (std::uint32_t owner = 0; owner < kRanks; ++owner) {
        if (owner == reader) continue;
        std::uint32_t differing = 0;
        for (std::uint32_t row = 0; row < kRows; ++row)
            differing += world.scratch[reader][owner * kRows + row] != world.expected[owner][row * kRanks + reader];
        const std::string which = "rank " + std::to_string(reader) + " gathering from rank " + std::to_string(owner);
        INFO(which);
        CHECK(differing == 0);
    }
}

}  // namespace

TEST_CASE("layouts across peers, one per peer: gather_read and scatter_write at the three levels, RC and DC") {
    bool dc = false;
    SUBCASE("RC") { dc = false; }
    SUBCASE("DC") { dc = true; }
    World world = make_world(mode_of_subcase(dc));
    // RC: one per peer; DC: the initiators and the target; and the one that configured every layout.
    CHECK(world.ranks[0].queue_pair_count() == (dc ? 2u + 1u : kRanks) + 1u);
    CHECK(world.remote_columns[1][0].addr == 0);
    CHECK(world.remote_columns[1][0].length == kRows * 8);

    // Blocking: each rank gathers its column from every other rank, one read per peer.
    for (std::uint32_t reader = 0; reader < kRanks; ++reader) {
        std::vector<PeerTransfer> reads;
        for (std::uint32_t owner = 0; owner < kRanks; ++owner) {
            if (owner == reader) continue;
            reads.push_back({owner, world.scratch_regions[reader].slice(owner * kRows * 8ull, kRows * 8), world.remote_columns[owner][reader]});
        }
        const MultiResult result = world.ranks[reader].gather_read(reads);
        INFO(result.message());
        REQUIRE(result.ok());
        check_gathered(world, reader);
    }

    // Unpolled: each rank scatters a new column into every other rank's layout for it.
    std::vector<PendingMultiWork> writes;
    for (std::uint32_t writer = 0; writer < kRanks; ++writer) {
        for (std::uint32_t owner = 0; owner < kRanks; ++owner) {
            for (std::uint32_t row = 0; row < kRows; ++row) {
                world.scratch[writer][kRanks * kRows + owner * kRows + row] = element(10 + writer, row, owner);
                if (owner != writer) world.expected[owner][row * kRanks + writer] = element(10 + writer, row, owner);
            }
        }
        std::vector<PeerTransfer> shares;
        for (std::uint32_t owner = 0; owner < kRanks; ++owner) {
            if (owner == writer) continue;
            shares.push_back({owner, world.scratch_regions[writer].slice((kRanks + owner) * kRows * 8ull, kRows * 8),
                              world.remote_columns[owner][writer]});
        }
        writes.push_back(world.ranks[writer].post_scatter_write(shares));
    }
    for (PendingMultiWork& work : writes) {
        const MultiResult result = work.wait();
        INFO(result.message());
        CHECK(result.ok());
    }
    world.check_matrices();  // each written column changed, every other element as it was

    // Scoped: gather the new columns; half of each from the middle of the layout.
    for (std::uint32_t reader = 0; reader < kRanks; ++reader) {
        std::fill(world.scratch[reader].begin(), world.scratch[reader].begin() + kRanks * kRows, 0);
        world.ranks[reader].scope([&](MultiScope& scope) {
            std::vector<PeerTransfer> reads;
            for (std::uint32_t owner = 0; owner < kRanks; ++owner) {
                if (owner == reader) continue;
                reads.push_back({owner, world.scratch_regions[reader].slice(owner * kRows * 8ull + kRows * 4, kRows * 4),
                                 world.remote_columns[owner][reader].slice(kRows * 4, kRows * 4)});
            }
            const MultiResult result = scope.post_gather_read(reads).wait();
            INFO(result.message());
            REQUIRE(result.ok());
        });
        for (std::uint32_t owner = 0; owner < kRanks; ++owner) {
            if (owner == reader) continue;
            for (std::uint32_t row = 0; row < kRows; ++row) {
                const std::uint64_t expected = row < kRows / 2 ? 0 : world.expected[owner][row * kRanks + reader];
                CHECK(world.scratch[reader][owner * kRows + row] == expected);
            }
        }
    }
}

TEST_CASE("a list layout as the local side of read, write and send through MultiChannel, RC and DC") {
    bool dc = false;
    SUBCASE("RC") { dc = false; }
    SUBCASE("DC") { dc = true; }
    World world = make_world(mode_of_subcase(dc));
    // Rank 0's list layout: rows 0-7 of its scratch column area, a zero-length slice, then 16
    // more elements further on: 24 elements, the length of a column.
    const MemoryRegion local = world.ranks[0].register_layout(
        MemoryLayout::list({world.scratch_regions[0].slice(0, 8 * 8), world.scratch_regions[0].slice(300, 0),
                            world.scratch_regions[0].slice(40 * 8, 16 * 8)}),
        Access::local_write);
    auto layout_element = [&](std::uint32_t i) -> std::uint64_t& { return world.scratch[0][i < 8 ? i : 40 + (i - 8)]; };

    // Blocking read, both sides layouts: rank 1's column 0 into the list.
    REQUIRE(world.ranks[0].read(1, local.all(), world.remote_columns[1][0]).ok());
    for (std::uint32_t row = 0; row < kRows; ++row) CHECK(layout_element(row) == world.expected[1][row * kRanks + 0]);

    // Unpolled write, both sides layouts: the list into rank 2's column 0.
    for (std::uint32_t i = 0; i < kRows; ++i) {
        layout_element(i) = element(20, i, 0);
        world.expected[2][i * kRanks + 0] = element(20, i, 0);
    }
    REQUIRE(world.ranks[0].post_write(2, local.all(), world.remote_columns[2][0]).wait().ok());
    // Scoped write from a slice of the layout into a plain remote region (rank 1's matrix).
    const RemoteMemoryRegion matrix_of_1 = world.ranks[0].remote_region(1, "matrix").region;
    world.ranks[0].scope([&](MultiScope& scope) { REQUIRE(scope.post_write(1, local.slice(8 * 8, 2 * 8), matrix_of_1.slice(0, 16)).wait().ok()); });
    world.expected[1][0] = layout_element(8);
    world.expected[1][1] = layout_element(9);
    world.check_matrices();

    // Send gathered from the layout; rank 1 receives into a plain region.
    std::vector<std::uint64_t> landing(kRows + 2, 0);
    const MemoryRegion landing_region = world.ranks[1].register_memory(landing.data(), landing.size() * 8);
    PendingWork receive = world.ranks[1].post_receive(0, landing_region.all());
    REQUIRE(world.ranks[0].send(1, local.all()).ok());
    const WorkResult received = receive.wait();
    REQUIRE(received.ok());
    for (std::uint32_t i = 0; i < kRows; ++i) CHECK(landing[i] == layout_element(i));
    CHECK(landing[kRows] == 0);
}

TEST_CASE("a receive through a layout: scattered by the NIC in RC, refused by name in DC") {
    bool dc = false;
    SUBCASE("RC") { dc = false; }
    SUBCASE("DC") { dc = true; }
    World world = make_world(mode_of_subcase(dc));
    // Rank 1 receives rank 0's message straight into its column 0 (the layout rank 1 made for rank 0).
    for (std::uint32_t row = 0; row < kRows; ++row) world.scratch[0][row] = element(30, row, 0);
    PendingWork receive = world.ranks[1].post_receive(0, world.column_layouts[1][0].all());
    if (!dc) {
        REQUIRE(world.ranks[0].send(1, world.scratch_regions[0].slice(0, kRows * 8)).ok());
        REQUIRE(receive.wait().ok());
        for (std::uint32_t row = 0; row < kRows; ++row) world.expected[1][row * kRanks + 0] = element(30, row, 0);
    } else {
        const WorkResult refused = receive.wait();
        REQUIRE_FALSE(refused.ok());
        CHECK(refused.error().message().find("cannot be a DC receive's target") != std::string::npos);
    }
    world.check_matrices();
}
