// One copy of the rendezvous table per host (protocol 3): the ranks of a host share the copy one
// of them published; a copy that is corrupted, truncated, unsealed or unreachable is refused
// with the rank and host named, and that rank receives its own; a rank that cannot publish
// leaves the others to receive their own; a protocol-2 client is still served.
#include <doctest/doctest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <fcntl.h>

#include <atomic>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "common/host_identity.hpp"
#include "handshake/authentication.hpp"
#include "handshake/frame.hpp"
#include "handshake/hex.hpp"
#include "handshake/rendezvous_protocol.hpp"
#include "handshake/rendezvous_table.hpp"
#include "rdmachan/error.hpp"
#include "rdmachan/rendezvous.hpp"
#include "handshake/table_directory.hpp"
#include "tests/handshake/raw_client.hpp"
#include "tests/handshake/rendezvous_support.hpp"

using namespace std::chrono_literals;
using rdmachan::RendezvousTableSource;
using rdmachan::test::predictable_endpoint;
using rdmachan::test::RawClient;

namespace {

constexpr const char* host_job = "job-H";
constexpr const char* host_token = "host-token";


// Each rank's endpoint with only the RC entry it made for `recipient`, every row in place.
bool table_matches(const std::vector<rdmachan::Endpoint>& table, std::uint32_t world_size, std::uint32_t recipient) {
    if (table.size() != world_size) return false;
    for (std::uint32_t rank = 0; rank < world_size; ++rank)
        if (!(table[rank] == rdmachan::test::as_received_by(predictable_endpoint(rank, world_size), recipient)))
            return false;
    return true;
}

struct RankResult {
    bool table_right = false;
    bool has_directory = false;    // on demand: the table came with a DC directory
    bool directory_right = false;  // and its every record is right
    RendezvousTableSource source;
    std::uint64_t bytes_received = 0;
    std::string error;
};

// on_demand: Rendezvous::exchange_view, every row decoded from the view afterwards.
RankResult run_rank(std::uint16_t port, std::uint32_t rank, std::uint32_t world_size, bool share = true,
                    bool on_demand = false) {
    RankResult result;
    try {
        rdmachan::RendezvousSettings settings =
            rdmachan::test::rendezvous_settings(port, rank, world_size, host_job, host_token, 30000ms);
        settings.share_table_per_host = share;
        rdmachan::Rendezvous session(settings);
        if (on_demand) {
            const auto view = session.exchange_view(predictable_endpoint(rank, world_size));
            result.source = session.table_source();
            result.bytes_received = session.bytes_received();
            session.barrier();
            std::vector<rdmachan::Endpoint> table;
            for (std::uint32_t peer = 0; peer < view->size(); ++peer) table.push_back(view->endpoint(peer));
            result.table_right = table_matches(table, world_size, rank);
            result.has_directory = !view->dc_directory().empty();
            if (!result.has_directory) return result;
            const rdmachan::handshake::DirectoryView directory(view->dc_directory(), world_size, ~std::size_t{0});
            result.directory_right = true;
            for (std::uint32_t peer = 0; peer < world_size; ++peer) {
                const rdmachan::Endpoint expected = predictable_endpoint(peer, world_size);
                const rdmachan::handshake::DirectoryRecord record = directory.record(peer);
                result.directory_right = result.directory_right && record.has_target && !record.has_initiators &&
                                         record.session == expected.session && record.lid == expected.port.lid &&
                                         record.gid == expected.port.gid && record.dctn == expected.dc[0].dctn &&
                                         record.key == expected.dc[0].dc_key;
            }
            return result;
        }
        const auto table = session.exchange(predictable_endpoint(rank, world_size));
        result.source = session.table_source();
        result.bytes_received = session.bytes_received();
        session.barrier();
        result.table_right = table_matches(table, world_size, rank);
    } catch (const rdmachan::Error& error) {
        result.error = error.what();
    }
    return result;
}


// Real ranks first..world_size-1 in threads of this process; join() waits for them.
class RealRanks {
  public:
    RealRanks(std::uint16_t port, std::uint32_t first, std::uint32_t world_size, bool share = true,
              bool on_demand = false)
        : results_(world_size) {
        for (std::uint32_t rank = first; rank < world_size; ++rank)
            threads_.emplace_back([this, port, rank, world_size, share, on_demand] {
                results_[rank] = run_rank(port, rank, world_size, share, on_demand);
            });
    }
    ~RealRanks() { join(); }
    const std::vector<RankResult>& join() {
        for (auto& thread : threads_)
            if (thread.joinable()) thread.join();
        return results_;
    }

  private:
    std::vector<RankResult> results_;
    std::vector<std::thread> threads_;
};

// Rank `rank` played by hand up to its registration, speaking protocol `version`, claiming
// `host` (none when empty).
void register_by_hand(RawClient& client, std::uint32_t rank, std::uint32_t world_size, const std::string& host,
                      std::uint32_t version = rdmachan::handshake::protocol_version) {
    using namespace rdmachan::handshake;
    const rdmachan::Endpoint endpoint = predictable_endpoint(rank, world_size);
    const std::string session = to_hex_u64(endpoint.session);
    const std::string client_nonce = "00112233445566778899aabbccddeeff";
    nlohmann::json hello = {{"rank", rank},   {"world_size", world_size}, {"job", host_job},
                            {"session", session}, {"nonce", client_nonce}};
    if (!host.empty()) hello["host"] = host;
    client.send(encode_hello(hello.dump(), version, 2));
    const Hello reply = decode_hello(client.receive(), "server");
    const std::string server_nonce = nlohmann::json::parse(reply.body).at("nonce").get<std::string>();
    client.send(nlohmann::json{{"type", "proof"},
                               {"proof", make_proof(host_token, rendezvous_client_label,
                                                    {host_job, std::to_string(rank), session, client_nonce,
                                                     server_nonce})}}
                    .dump());
    REQUIRE(nlohmann::json::parse(client.receive()).at("type") == "accepted");
    rdmachan::Endpoint without_rc = endpoint;
    without_rc.rc.clear();
    client.send(nlohmann::json{{"type", "register"}, {"endpoint", without_rc}, {"rc", compact_rc_entries(endpoint.rc)}}
                    .dump());
}


// A memfd holding `bytes`, sealed when asked: what a hostile or broken rank could publish.
int memfd_holding(const std::string& bytes, bool sealed) {
    const int fd = ::memfd_create("test-table", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    REQUIRE(fd >= 0);
    REQUIRE(::write(fd, bytes.data(), bytes.size()) == static_cast<ssize_t>(bytes.size()));
    if (sealed) REQUIRE(::fcntl(fd, F_ADD_SEALS, F_SEAL_WRITE | F_SEAL_SHRINK | F_SEAL_GROW) == 0);
    return fd;
}

std::string this_host() {
    // Any text names a host for the server; the real ranks send common/host_identity.hpp's key,
    // and a hand-played rank on the same host must send the same to share with them.
    return rdmachan::detail::host_key(rdmachan::detail::this_host_identity());
}

rdmachan::RendezvousServerSettings host_server_settings(std::uint32_t world_size) {
    return {"127.0.0.1", 0, world_size, host_job, host_token, 30000ms};
}

// A world whose ranks 1..N-1 are real and rank 0 is played by hand (`hand`), registered last:
// the last rank to register reaches the table first, so on one host it is asked to publish.
struct HandPlayedRankZero {
    rdmachan::RendezvousServer server;
    RealRanks real;
    std::optional<RawClient> hand;
    HandPlayedRankZero(std::uint32_t world_size, const std::string& host, std::uint32_t version)
        : server(host_server_settings(world_size)), real((server.start(), server.port()), 1, world_size) {
        REQUIRE(server.wait_registered(world_size - 1, 20000ms));
        hand.emplace(server.port());
        register_by_hand(*hand, 0, world_size, host, version);
    }
};

}  // namespace

TEST_CASE("the ranks of one host read the one copy one of them published, every table right") {
    constexpr std::uint32_t world_size = 6;
    rdmachan::RendezvousServer server(host_server_settings(world_size));
    server.start();
    RealRanks ranks(server.port(), 0, world_size);
    const std::vector<RankResult>& results = ranks.join();
    CHECK_NOTHROW(server.wait());
    std::uint32_t published = 0;
    std::uint32_t read_shared = 0;
    std::uint64_t publisher_bytes = 0;
    for (std::uint32_t rank = 0; rank < world_size; ++rank) {
        CAPTURE(rank);
        CAPTURE(results[rank].error);
        CHECK(results[rank].table_right);
        CHECK(results[rank].source.refused.empty());
        if (results[rank].source.kind == RendezvousTableSource::Kind::published_for_host) {
            ++published;
            publisher_bytes = results[rank].bytes_received;
        }
        if (results[rank].source.kind == RendezvousTableSource::Kind::host_copy) {
            ++read_shared;
            CHECK(results[rank].source.host_copy_bytes > 0);
        }
    }
    CHECK(published == 1);
    CHECK(read_shared == world_size - 1);
    // Only the publisher received the table; the others received their header and RC entries.
    for (std::uint32_t rank = 0; rank < world_size; ++rank)
        if (results[rank].source.kind == RendezvousTableSource::Kind::host_copy)
            CHECK(results[rank].bytes_received * 2 < publisher_bytes);
}

// Without sharing a rank speaks protocol 2's form, which has no directory: a DC MultiChannel then
// decodes the whole table, as before.
TEST_CASE("exchange_view: every row decoded on demand is exchange()'s, and the DC directory is read in place") {
    constexpr std::uint32_t world_size = 5;
    for (const bool share : {true, false}) {
        CAPTURE(share);
        rdmachan::RendezvousServer server(host_server_settings(world_size));
        server.start();
        RealRanks ranks(server.port(), 0, world_size, share, true);
        const std::vector<RankResult>& results = ranks.join();
        CHECK_NOTHROW(server.wait());
        std::uint32_t read_shared = 0;
        for (std::uint32_t rank = 0; rank < world_size; ++rank) {
            CAPTURE(rank);
            CAPTURE(results[rank].error);
            CHECK(results[rank].table_right);
            CHECK(results[rank].has_directory == share);
            if (share) CHECK(results[rank].directory_right);
            if (results[rank].source.kind == RendezvousTableSource::Kind::host_copy) ++read_shared;
        }
        CHECK(read_shared == (share ? world_size - 1 : 0));
    }
}

TEST_CASE("with sharing turned off every rank receives its own copy") {
    constexpr std::uint32_t world_size = 4;
    rdmachan::RendezvousServer server(host_server_settings(world_size));
    server.start();
    RealRanks ranks(server.port(), 0, world_size, false);
    CHECK_NOTHROW(server.wait());
    for (const RankResult& result : ranks.join()) {
        CAPTURE(result.error);
        CHECK(result.table_right);
        CHECK(result.source.kind == RendezvousTableSource::Kind::own_copy);
    }
}

TEST_CASE("a host's copy that is corrupted, truncated, unsealed or unreachable is refused, naming rank and host") {
    // Rank 1 is a real rank; rank 0, played by hand, registers last and so is asked to publish
    // (the last rank to register reaches the table first), and publishes a bad copy.
    struct Case {
        const char* name;
        const char* refusal;
    };
    const Case cases[] = {
        {"corrupted", "its SHA-256 differs from the server's"},
        {"another job's", "its SHA-256 differs from the server's"},
        {"truncated", "(truncated or grown)"},
        {"unsealed", "not sealed against writing and resizing"},
        {"unreachable", "cannot open it"},
    };
    for (const Case& bad : cases) {
        CAPTURE(bad.name);
        constexpr std::uint32_t world_size = 2;
        HandPlayedRankZero world(world_size, this_host(), rdmachan::handshake::protocol_version);
        RawClient& leader = *world.hand;
        const nlohmann::json header = nlohmann::json::parse(leader.receive());
        CHECK(header.at("type") == "table_header");
        CHECK(header.at("share") == true);
        const std::string table = leader.receive();
        REQUIRE(table.rfind(R"({"type":"table","rows":[)", 0) == 0);
        const std::string directory = leader.receive();
        REQUIRE(directory.rfind("RDCDIR01", 0) == 0);
        // What a rank publishes: the table, then its DC directory.
        std::string published = table + directory;
        bool sealed = true;
        const std::string name = bad.name;
        if (name == "corrupted") published[table.size() / 2] ^= 1;
        if (name == "another job's") {
            const auto at = published.find("5e55");
            REQUIRE(at != std::string::npos);
            published[at] = '6';  // another session: the same size, other bytes
        }
        if (name == "truncated") published.resize(published.size() - 10);
        if (name == "unsealed") sealed = false;
        const int fd = memfd_holding(published, sealed);
        const int named_fd = name == "unreachable" ? 999999 : fd;
        leader.send(nlohmann::json{{"type", "shared"}, {"pid", ::getpid()}, {"fd", named_fd}}.dump());
        leader.send(R"({"type":"barrier"})");
        CHECK(nlohmann::json::parse(leader.receive()).at("type") == "release");
        const RankResult real = world.real.join()[1];
        ::close(fd);
        CAPTURE(real.error);
        CAPTURE(real.source.refused);
        CHECK(real.table_right);
        CHECK(real.source.kind == RendezvousTableSource::Kind::own_copy);
        CHECK(real.source.refused.find("rank 1 of job 'job-H' on host ") == 0);
        CHECK(real.source.refused.find("refused the host's shared job table") != std::string::npos);
        CHECK(real.source.refused.find(bad.refusal) != std::string::npos);
        CHECK_NOTHROW(world.server.wait());
    }
}

TEST_CASE("when the publishing rank cannot share, the host's other ranks receive their own") {
    constexpr std::uint32_t world_size = 3;
    HandPlayedRankZero world(world_size, this_host(), rdmachan::handshake::protocol_version);
    RawClient& leader = *world.hand;
    CHECK(nlohmann::json::parse(leader.receive()).at("share") == true);
    CHECK(!leader.receive().empty());                      // the table
    CHECK(leader.receive().rfind("RDCDIR01", 0) == 0);   // its DC directory
    leader.send(R"({"type":"shared","error":"no memfd on this test's host"})");
    leader.send(R"({"type":"barrier"})");
    CHECK(nlohmann::json::parse(leader.receive()).at("type") == "release");
    const std::vector<RankResult>& results = world.real.join();
    CHECK_NOTHROW(world.server.wait());
    for (std::uint32_t rank = 1; rank < world_size; ++rank) {
        CAPTURE(results[rank].error);
        CHECK(results[rank].table_right);
        CHECK(results[rank].source.kind == RendezvousTableSource::Kind::own_copy);
    }
}

TEST_CASE("a protocol-2 client is served its own table, RC entries in its rows") {
    constexpr std::uint32_t world_size = 2;
    HandPlayedRankZero world(world_size, "", 2);
    RawClient& old = *world.hand;
    const std::string frame = old.receive();
    std::vector<rdmachan::Endpoint> table;
    REQUIRE(rdmachan::handshake::scan_table(frame, world_size, 0, table));
    CHECK(table_matches(table, world_size, 0));
    CHECK(table[1].rc.size() == 1);  // the entry rank 1 made for rank 0, in its row
    old.send(R"({"type":"barrier"})");
    CHECK(nlohmann::json::parse(old.receive()).at("type") == "release");
    const RankResult real = world.real.join()[1];
    CAPTURE(real.error);
    CHECK(real.table_right);
    CHECK_NOTHROW(world.server.wait());
}
