// One rank of a rendezvous, as a process of its own, for tests that place ranks in network
// namespaces (netns_host_table_test.sh): it registers a predictable endpoint, checks the table
// it gets, and prints how it got it.
// Usage: rendezvous_rank_program ADDRESS PORT RANK WORLD_SIZE JOB   (token: RDMACHAN_JOB_TOKEN)
// Prints "rank R source=own_copy|published_for_host|host_copy table=right|wrong refused=TEXT";
// exits 0 only when the table is right.
#include <cstdio>
#include <cstdlib>
#include <string>

#include "rdmachan/error.hpp"
#include "rdmachan/rendezvous.hpp"
#include "tests/handshake/rendezvous_support.hpp"

namespace {

const char* kind_name(rdmachan::RendezvousTableSource::Kind kind) {
    switch (kind) {
        case rdmachan::RendezvousTableSource::Kind::own_copy: return "own_copy";
        case rdmachan::RendezvousTableSource::Kind::published_for_host: return "published_for_host";
        case rdmachan::RendezvousTableSource::Kind::host_copy: return "host_copy";
    }
    return "unknown";
}

}  // namespace

int main(int argc, char** argv) {
    const char* token = std::getenv("RDMACHAN_JOB_TOKEN");
    if (argc != 6 || token == nullptr) {
        std::fprintf(stderr, "usage: RDMACHAN_JOB_TOKEN=... rendezvous_rank_program ADDRESS PORT RANK WORLD_SIZE JOB\n");
        return 2;
    }
    rdmachan::RendezvousSettings settings;
    settings.host = argv[1];
    settings.port = static_cast<std::uint16_t>(std::atoi(argv[2]));
    settings.rank = static_cast<std::uint32_t>(std::atoi(argv[3]));
    settings.world_size = static_cast<std::uint32_t>(std::atoi(argv[4]));
    settings.job = argv[5];
    settings.token = token;
    settings.timeout = std::chrono::seconds(60);
    try {
        rdmachan::Rendezvous session(settings);
        const auto table = session.exchange(rdmachan::test::predictable_endpoint(settings.rank, settings.world_size));
        const rdmachan::RendezvousTableSource source = session.table_source();
        session.barrier();
        bool right = table.size() == settings.world_size;
        for (std::uint32_t rank = 0; right && rank < settings.world_size; ++rank)
            right = table[rank] == rdmachan::test::as_received_by(
                                       rdmachan::test::predictable_endpoint(rank, settings.world_size), settings.rank);
        std::printf("rank %u source=%s table=%s refused=%s\n", settings.rank, kind_name(source.kind),
                    right ? "right" : "wrong", source.refused.c_str());
        return right ? 0 : 1;
    } catch (const rdmachan::Error& error) {
        std::fprintf(stderr, "rank %u: %s\n", settings.rank, error.what());
        return 1;
    }
}
