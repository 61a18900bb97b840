// Launcher variables: each launcher alone, precedence, contradictions and malformed values,
// all through a fake environment.
#include "rdmachan/launcher_environment.hpp"

#include <doctest/doctest.h>

#include <map>

#include "rdmachan/error.hpp"
#include "tests/handshake/fake_environment.hpp"

namespace {

using rdmachan::test::FakeEnvironment;

rdmachan::LaunchEnvironment discover(const FakeEnvironment& environment,
                                     const rdmachan::LaunchArguments& arguments = {}) {
    return rdmachan::discover_launch_environment(arguments, environment.lookup());
}

}  // namespace

TEST_CASE("each launcher's variables are understood") {
    struct Case {
        std::map<std::string, std::string> variables;
        const char* rank_source;
        const char* world_size_source;
    };
    const Case cases[] = {
        {{{"RDMACHAN_RANK", "3"}, {"RDMACHAN_WORLD_SIZE", "8"}},
         "RDMACHAN_RANK",
         "RDMACHAN_WORLD_SIZE"},
        {{{"RANK", "3"}, {"WORLD_SIZE", "8"}}, "RANK", "WORLD_SIZE"},
        {{{"SLURM_PROCID", "3"}, {"SLURM_NTASKS", "8"}}, "SLURM_PROCID", "SLURM_NTASKS"},
        {{{"OMPI_COMM_WORLD_RANK", "3"}, {"OMPI_COMM_WORLD_SIZE", "8"}},
         "OMPI_COMM_WORLD_RANK",
         "OMPI_COMM_WORLD_SIZE"},
        {{{"PMI_RANK", "3"}, {"PMI_SIZE", "8"}}, "PMI_RANK", "PMI_SIZE"},
    };
    for (const Case& test : cases) {
        const auto found = discover(FakeEnvironment{test.variables});
        CAPTURE(std::string(test.rank_source));
        CHECK(found.rank == 3u);
        CHECK(found.world_size == 8u);
        CHECK(found.rank_source == test.rank_source);
        CHECK(found.world_size_source == test.world_size_source);
    }
    const auto nothing = discover(FakeEnvironment{});
    CHECK_FALSE(nothing.rank.has_value());
    CHECK_FALSE(nothing.rendezvous_port.has_value());
    CHECK(nothing.rendezvous_host.empty());
}

TEST_CASE("rendezvous address from RDMACHAN_RENDEZVOUS or torchrun's MASTER_ADDR/MASTER_PORT") {
    auto found = discover(FakeEnvironment{{{"MASTER_ADDR", "node7"}, {"MASTER_PORT", "29500"}}});
    CHECK(found.rendezvous_host == "node7");
    CHECK(found.rendezvous_port == 29500);
    CHECK(found.rendezvous_source == "MASTER_ADDR/MASTER_PORT");
    found = discover(FakeEnvironment{{{"RDMACHAN_RENDEZVOUS", "[::1]:4000"},
                                      {"MASTER_ADDR", "node7"},
                                      {"MASTER_PORT", "29500"}}});
    CHECK(found.rendezvous_host == "::1");
    CHECK(found.rendezvous_port == 4000);
    CHECK(found.rendezvous_source == "RDMACHAN_RENDEZVOUS");
    found = discover(FakeEnvironment{{{"RDMACHAN_RENDEZVOUS", "10.0.0.1:4000"}}},
                     {std::nullopt, std::nullopt, "127.0.0.1:5000"});
    CHECK(found.rendezvous_host == "127.0.0.1");
    CHECK(found.rendezvous_port == 5000);
    CHECK(found.rendezvous_source == "argument");
    CHECK_THROWS_WITH_AS(discover(FakeEnvironment{{{"MASTER_ADDR", "node7"}}}),
                         doctest::Contains("MASTER_ADDR is set but MASTER_PORT is not"),
                         rdmachan::Error);
    CHECK_THROWS_WITH_AS(discover(FakeEnvironment{{{"RDMACHAN_RENDEZVOUS", "node7"}}}),
                         "RDMACHAN_RENDEZVOUS=\"node7\" is not host:port", rdmachan::Error);
    CHECK_THROWS_WITH_AS(discover(FakeEnvironment{{{"RDMACHAN_RENDEZVOUS", "node7:70000"}}}),
                         doctest::Contains("RDMACHAN_RENDEZVOUS=\"70000\""), rdmachan::Error);
}

TEST_CASE("explicit arguments beat RDMACHAN_* which beat launcher variables") {
    FakeEnvironment environment{{{"RDMACHAN_RANK", "1"},
                                 {"RDMACHAN_WORLD_SIZE", "4"},
                                 {"RANK", "2"},
                                 {"WORLD_SIZE", "16"},
                                 {"RDMACHAN_JOB_TOKEN", "t0k"}}};
    auto found = discover(environment);
    CHECK(found.rank == 1u);
    CHECK(found.world_size == 4u);
    CHECK(found.job_token == "t0k");
    found = discover(environment, {0u, 2u, std::nullopt});
    CHECK(found.rank == 0u);
    CHECK(found.world_size == 2u);
    CHECK(found.rank_source == "argument");
}

TEST_CASE("contradictions and malformed values are errors naming the variables") {
    CHECK_THROWS_WITH_AS(
        discover(FakeEnvironment{{{"WORLD_SIZE", "8"}, {"SLURM_NTASKS", "4"}, {"RANK", "1"}}}),
        "launcher variables disagree: WORLD_SIZE=8 but SLURM_NTASKS=4", rdmachan::Error);
    CHECK_THROWS_WITH_AS(
        discover(FakeEnvironment{{{"OMPI_COMM_WORLD_RANK", "2"}, {"PMI_RANK", "3"}}}),
        "launcher variables disagree: OMPI_COMM_WORLD_RANK=2 but PMI_RANK=3", rdmachan::Error);
    // Agreeing launchers are fine.
    CHECK(discover(FakeEnvironment{{{"SLURM_PROCID", "2"}, {"PMI_RANK", "2"}}}).rank == 2u);
    CHECK_THROWS_WITH_AS(discover(FakeEnvironment{{{"RANK", "-1"}}}),
                         doctest::Contains("launcher variable RANK=\"-1\" is not a number"),
                         rdmachan::Error);
    CHECK_THROWS_WITH_AS(discover(FakeEnvironment{{{"RDMACHAN_WORLD_SIZE", "8x"}}}),
                         doctest::Contains("RDMACHAN_WORLD_SIZE=\"8x\""), rdmachan::Error);
    CHECK_THROWS_WITH_AS(discover(FakeEnvironment{{{"PMI_RANK", "8"}, {"PMI_SIZE", "8"}}}),
                         "rank 8 from PMI_RANK is not below world size 8 from PMI_SIZE",
                         rdmachan::Error);
    CHECK_THROWS_WITH_AS(discover(FakeEnvironment{{{"SLURM_NTASKS", "0"}}}),
                         "world size 0 from SLURM_NTASKS", rdmachan::Error);
}

TEST_CASE("generated job tokens are long and different") {
    const std::string first = rdmachan::generate_job_token();
    CHECK(first.size() == 64);
    CHECK(first != rdmachan::generate_job_token());
}
