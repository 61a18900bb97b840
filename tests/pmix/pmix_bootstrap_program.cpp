// Run under mpirun by CTest (tests/pmix/CMakeLists.txt): one scenario of the PMIx bootstrap per
// invocation. Ranks that use the library check what happened and exit 0 only when it is what the
// scenario expects; the rank that misbehaves does so with PMIx calls of its own (this program),
// not through any hook in the library.
//   exchange --mode rc|dc    build without rank/world size, connect(), read every peer's buffer
//   wrong-identity           a rank or world size that disagrees with PMIx is refused, naming both
//   skip-put                 rank 1 fences but never publishes: the others name rank 1 and the key
//   skip-fence               rank 1 never reaches the fence: the others name the deadline
//   wrong-type               rank 1 publishes its rows as a number: the others name the
//                            rank, the key and the type
//   not-json                 rank 1 publishes a row that is not JSON: the others name the
//                            rank and the key
//   not-a-row                rank 1 publishes a string that is not in the row keys' form: the
//                            others name the rank and the key
//   rc-block-without-entry   rank 1 publishes RC rows whose blocks of RC entries hold none for
//                            the reader: the others name rank 1, themselves and the key
//   rc-block-not-array       rank 1 publishes RC rows whose entries are not a JSON array: the
//                            others name rank 1 and the key
//   mixed-modes              rank 1 connects in DC mode, the others in RC: every rank names the
//                            key it missed and says that the modes may differ
//   init-fails               (outside any launcher) PMIx_Init fails: the error names its code
#include <pmix.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "handshake/pmix_bootstrap.hpp"
#include "handshake/rendezvous_table.hpp"
#include "rdmachan/multi_channel.hpp"

namespace {

using namespace std::chrono_literals;

int failed(const std::string& what) {
    std::fprintf(stderr, "pmix_bootstrap_program: FAILED: %s\n", what.c_str());
    return 1;
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

rdmachan::MultiChannelBuilder builder(std::chrono::milliseconds deadline, const std::string& mode = "rc") {
    rdmachan::ChannelBuilder channel = rdmachan::ChannelBuilder().device("soft").deadline(deadline);
    return rdmachan::MultiChannelBuilder(channel)
        .bootstrap(rdmachan::Bootstrap::pmix)
        .mode(mode == "dc" ? rdmachan::MultiChannelMode::dynamically_connected
                           : rdmachan::MultiChannelMode::reliable_connected);
}

// This process's PMIx identity, straight from libpmix (the misbehaving rank and the fences
// around each scenario). The constructor fences once every rank is initialized: with Open MPI
// 4.1.4 / PMIx 4.2.2, a rank whose PMIx_Init is still under way while another rank finalizes and
// exits with status 0 can wait in PMIx_Init forever (seen about once in 40 runs of a plain C
// program that only calls PMIx_Init and PMIx_Finalize; never with this fence in 60 runs).
struct RawPmix {
    pmix_proc_t self{};
    RawPmix() {
        if (const pmix_status_t status = PMIx_Init(&self, nullptr, 0); status != PMIX_SUCCESS) {
            throw std::runtime_error(std::string("test's own PMIx_Init: ") + PMIx_Error_string(status));
        }
        fence(false);
    }
    ~RawPmix() { PMIx_Finalize(nullptr, 0); }
    void fence(bool collect) const {
        pmix_proc_t everyone;
        PMIX_LOAD_PROCID(&everyone, self.nspace, PMIX_RANK_WILDCARD);
        // With a deadline: a rank that failed and left never arrives.
        pmix_info_t info[2];
        bool collect_data = collect;
        int seconds = 60;
        PMIX_INFO_LOAD(&info[0], PMIX_COLLECT_DATA, &collect_data, PMIX_BOOL);
        PMIX_INFO_LOAD(&info[1], PMIX_TIMEOUT, &seconds, PMIX_INT);
        if (const pmix_status_t status = PMIx_Fence(&everyone, 1, info, 2); status != PMIX_SUCCESS) {
            throw std::runtime_error(std::string("test's own PMIx_Fence: ") + PMIx_Error_string(status));
        }
    }
};

int exchange(const std::string& mode) {
    const RawPmix raw;
    rdmachan::PreparedMultiChannel prepared = builder(30s, mode).build();
    if (prepared.rank() != raw.self.rank) return failed("the builder's rank is not PMIx's");
    if (prepared.bootstrap().bootstrap != rdmachan::Bootstrap::pmix) return failed("the bootstrap is not PMIx");
    const std::uint32_t rank = prepared.rank();
    const std::uint32_t world = prepared.world_size();
    // Every rank's buffer holds its rank before connect(); after the barrier every peer's does.
    std::vector<std::uint64_t> memory(1 + world, 0);
    memory[0] = 0x5e5e000000000000ull | rank;
    rdmachan::MemoryRegion region = prepared.register_memory(memory.data(), memory.size() * sizeof(std::uint64_t));
    prepared.publish_region("buffer", region);
    rdmachan::MultiChannel channels = std::move(prepared).connect();
    std::vector<rdmachan::PeerTransfer> reads;
    for (std::uint32_t peer = 0; peer < world; ++peer) {
        reads.push_back({peer, region.slice((1 + peer) * sizeof(std::uint64_t), sizeof(std::uint64_t)),
                         channels.remote_region(peer, "buffer").region.slice(0, sizeof(std::uint64_t))});
    }
    const rdmachan::MultiResult result = channels.gather_read(reads);
    if (!result.ok()) return failed("gather_read: " + result.message());
    for (std::uint32_t peer = 0; peer < world; ++peer) {
        if (memory[1 + peer] != (0x5e5e000000000000ull | peer)) {
            return failed("rank " + std::to_string(rank) + " read a wrong value from rank " + std::to_string(peer));
        }
    }
    raw.fence(false);  // nobody leaves while a peer may still read its buffer
    std::printf("rank %u of %u (%s): connected through PMIx, read all %u peers\n", rank, world, mode.c_str(), world);
    return 0;
}

// A rank or a world size that disagrees with PMIx is refused, naming both.
int wrong_identity() {
    const RawPmix raw;
    const std::uint32_t rank = raw.self.rank;
    auto refused = [&](rdmachan::MultiChannelBuilder candidate, const std::string& set, const std::string& says) {
        try {
            (void)candidate.build();
        } catch (const rdmachan::Error& error) {
            const std::string text = error.what();
            if (!contains(text, set) || !contains(text, says)) return failed("unexpected error: " + text);
            std::printf("rank %u: expected error: %s\n", rank, text.c_str());
            return 0;
        }
        return failed("'" + set + "' that disagrees with PMIx was accepted");
    };
    const std::uint32_t other_rank = rank == 0 ? 1 : 0;
    int status = refused(builder(10s).world_size(1000), "world_size 1000 was set", "PMIx says the job has");
    status |= refused(builder(10s).rank(other_rank), "rank " + std::to_string(other_rank) + " was set",
                      "PMIx says this process is rank " + std::to_string(rank));
    raw.fence(false);  // nobody finalizes before every rank has checked
    return status;
}

// Ranks other than 1 run connect() and must fail with every one of `expected` in the message.
int expect_connect_failure(const std::vector<std::string>& expected, std::chrono::milliseconds deadline,
                           const std::string& mode = "rc") {
    try {
        rdmachan::PreparedMultiChannel prepared = builder(deadline, mode).build();
        (void)std::move(prepared).connect();
    } catch (const rdmachan::Error& error) {
        const std::string text = error.what();
        for (const std::string& part : expected) {
            if (!contains(text, part)) return failed("unexpected error (without '" + part + "'): " + text);
        }
        std::printf("expected error: %s\n", text.c_str());
        return 0;
    }
    return failed("connect() succeeded although rank 1 misbehaved");
}

int skip_put() {
    const RawPmix raw;
    if (raw.self.rank == 1) {
        raw.fence(true);  // the exchange's fence, with nothing published
        return 0;
    }
    return expect_connect_failure({"rank 1 never published key '" + rdmachan::detail::pmix_row_key(1) + "."}, 20s);
}

std::uint32_t job_size(const pmix_proc_t& self);

// A key rank 1 publishes, and its value; a string value's bytes are `text`.
struct PublishedValue {
    std::string key;
    pmix_value_t value;
    std::string text;
};
using PublishedValues = std::vector<PublishedValue>;

PublishedValue string_value(std::string key, std::string text) {
    PublishedValue published{std::move(key), {}, std::move(text)};
    PMIX_VALUE_CONSTRUCT(&published.value);
    published.value.type = PMIX_STRING;
    return published;
}

// Rank 1 publishes `values_for(world size)` as they are, commits them and joins the exchange's
// fence; the others must fail with `expected`.
int publish_instead(PublishedValues (*values_for)(std::uint32_t world), const std::vector<std::string>& expected) {
    const RawPmix raw;
    if (raw.self.rank == 1) {
        for (PublishedValue& published : values_for(job_size(raw.self))) {
            if (published.value.type == PMIX_STRING) published.value.data.string = published.text.data();  // PMIx_Put copies it
            if (const pmix_status_t status = PMIx_Put(PMIX_GLOBAL, published.key.c_str(), &published.value);
                status != PMIX_SUCCESS) {
                return failed(std::string("test's own PMIx_Put: ") + PMIx_Error_string(status));
            }
        }
        if (const pmix_status_t status = PMIx_Commit(); status != PMIX_SUCCESS) {
            return failed(std::string("test's own PMIx_Commit: ") + PMIx_Error_string(status));
        }
        raw.fence(true);
        return 0;
    }
    return expect_connect_failure(expected, 20s);
}

// Every RC row key of a job of `world` ranks, each holding `text`.
PublishedValues rows_of_rank_one(std::uint32_t world, const std::string& text) {
    PublishedValues values;
    const std::uint32_t block_size = rdmachan::detail::pmix_rc_block_size(world);
    for (std::uint32_t block = 0; block * block_size < world; ++block) {
        values.push_back(string_value(rdmachan::detail::pmix_row_block_key(1, block), text));
    }
    return values;
}

// Rank 1's row as the library writes it, before and after its RC part, followed by `entries`.
std::string row_of_rank_one_with(const std::string& entries) {
    rdmachan::Endpoint endpoint;
    endpoint.rank = 1;
    const rdmachan::handshake::TableRowText row = rdmachan::handshake::table_row_text(endpoint);
    return row.prefix + "\n" + row.suffix + "\n" + entries;
}

// The key each reader misses names rank 1 and a row key; which block depends on the reader.
std::string from_rank_one_key() { return "key '" + rdmachan::detail::pmix_row_key(1) + "."; }

int rc_block_without_entry() {
    return publish_instead([](std::uint32_t world) { return rows_of_rank_one(world, row_of_rank_one_with("[]")); },
                           {from_rank_one_key(), "' from rank 1 holds 0 RC entries, none for rank "});
}

int rc_block_not_array() {
    return publish_instead(
        [](std::uint32_t world) { return rows_of_rank_one(world, row_of_rank_one_with("{\"peer\": 0, \"qpn\": 1}")); },
        {from_rank_one_key(), "' from rank 1: its RC entries are not a JSON array of [] or [qpn, psn]"});
}

int wrong_type() {
    return publish_instead(
        [](std::uint32_t world) {
            PublishedValues values = rows_of_rank_one(world, "");
            for (PublishedValue& published : values) {
                published.value.type = PMIX_UINT32;
                published.value.data.uint32 = 4711;
            }
            return values;
        },
        {"rank 1 published " + from_rank_one_key(), "' as PMIX_UINT32, not a string"});
}

int not_json() {
    // Rows in the form, whose JSON is cut short: the scanner refuses it, and the JSON reader names it.
    return publish_instead(
        [](std::uint32_t world) {
            const std::string block = "[" + std::string("[1,1],[1,1],[1,1],[1,1],[1,1],[1,1],[1,1],[1,1]") + "]";
            return rows_of_rank_one(world, "[1,\"00\n,\n" + block);
        },
        {"the value of " + from_rank_one_key(), "' from rank 1 is not JSON"});
}

int not_a_row() {
    return publish_instead(
        [](std::uint32_t world) { return rows_of_rank_one(world, "{\"version\": 2, \"rank\": 1}"); },
        {from_rank_one_key(), "' from rank 1 is not a table row in the form of this rdmachan"});
}

// Rank 1 in DC mode, the others in RC: each side misses the other's keys and says why it may be.
int mixed_modes() {
    const RawPmix raw;
    if (raw.self.rank == 1) {
        return expect_connect_failure({"never published key '" + rdmachan::detail::pmix_row_key(1) + "'",
                                       "a rank in RC mode publishes only RC block keys"},
                                      20s, "dc");
    }
    return expect_connect_failure({"rank 1 never published " + from_rank_one_key(),
                                   "a rank in DC mode publishes no RC block keys"},
                                  20s, "rc");
}

// The ranks that expect the fence's deadline tell rank 1 they saw it through a file each (named
// by the job's namespace, so concurrent jobs do not meet): rank 1 must stay out of the fence, and
// in the job, until then, and a file is the one channel left that involves no fence.
std::filesystem::path seen_deadline_marker(const pmix_proc_t& self, std::uint32_t rank) {
    return std::filesystem::temp_directory_path() /
           ("rdmachan-skip-fence-" + std::string(self.nspace) + "-" + std::to_string(rank));
}

std::uint32_t job_size(const pmix_proc_t& self) {
    pmix_proc_t job;
    PMIX_LOAD_PROCID(&job, self.nspace, PMIX_RANK_WILDCARD);
    pmix_value_t* value = nullptr;
    if (PMIx_Get(&job, PMIX_JOB_SIZE, nullptr, 0, &value) != PMIX_SUCCESS || value == nullptr) {
        throw std::runtime_error("test's own PMIx_Get(PMIX_JOB_SIZE) failed");
    }
    const std::uint32_t size = value->data.uint32;
    PMIX_VALUE_RELEASE(value);
    return size;
}

int skip_fence() {
    const RawPmix raw;
    constexpr auto deadline = 2s;
    if (raw.self.rank == 1) {
        // Never reaches the fence; leaves once every other rank has seen its deadline (or after a
        // minute, as a failure: a rank that never reports has hung or crashed).
        const std::uint32_t world = job_size(raw.self);
        const auto give_up = std::chrono::steady_clock::now() + 60s;
        for (std::uint32_t rank = 0; rank < world; ++rank) {
            if (rank == 1) continue;
            while (!std::filesystem::exists(seen_deadline_marker(raw.self, rank))) {
                if (std::chrono::steady_clock::now() > give_up) {
                    return failed("rank " + std::to_string(rank) + " did not report its deadline within 60 s");
                }
                std::this_thread::sleep_for(10ms);
            }
            std::filesystem::remove(seen_deadline_marker(raw.self, rank));
        }
        return 0;
    }
    const int status =
        expect_connect_failure({"the fence exchanging endpoints did not complete within its deadline ("}, deadline);
    std::ofstream(seen_deadline_marker(raw.self, raw.self.rank)) << status << '\n';
    return status;
}

int init_fails() {
    try {
        (void)builder(5s).build();
    } catch (const rdmachan::Error& error) {
        const std::string text = error.what();
        const std::string code = PMIx_Error_string(PMIX_ERR_UNREACH);
        if (!contains(text, "PMIx_Init failed: " + code) || !contains(text, "bootstrap(pmix)")) {
            return failed("unexpected error: " + text);
        }
        std::printf("expected error: %s\n", text.c_str());
        return 0;
    }
    return failed("PMIx_Init succeeded with no launcher");
}

}  // namespace

int main(int argc, char** argv) {
    const std::string scenario = argc > 1 ? argv[1] : "";
    const std::string mode = argc > 3 && std::strcmp(argv[2], "--mode") == 0 ? argv[3] : "rc";
    try {
        if (scenario == "exchange") return exchange(mode);
        if (scenario == "wrong-identity") return wrong_identity();
        if (scenario == "skip-put") return skip_put();
        if (scenario == "skip-fence") return skip_fence();
        if (scenario == "wrong-type") return wrong_type();
        if (scenario == "not-json") return not_json();
        if (scenario == "not-a-row") return not_a_row();
        if (scenario == "mixed-modes") return mixed_modes();
        if (scenario == "rc-block-without-entry") return rc_block_without_entry();
        if (scenario == "rc-block-not-array") return rc_block_not_array();
        if (scenario == "init-fails") return init_fails();
    } catch (const std::exception& error) {
        return failed(error.what());
    }
    std::fprintf(stderr, "usage: pmix_bootstrap_program exchange [--mode rc|dc] | wrong-identity | skip-put | "
                         "skip-fence | init-fails\n");
    return 2;
}
