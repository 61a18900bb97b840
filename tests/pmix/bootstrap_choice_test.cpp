// Choosing the MultiChannel bootstrap (include/rdmachan/bootstrap.hpp), with made-up environments.
#include <doctest/doctest.h>

#include <map>
#include <string>

#include "rdmachan/bootstrap.hpp"
#include "rdmachan/error.hpp"
#include "rdmachan/multi_channel.hpp"
#include "tests/handshake/fake_environment.hpp"

namespace {

using rdmachan::test::FakeEnvironment;

std::string error_of(rdmachan::Bootstrap requested, const FakeEnvironment& environment) {
    try {
        (void)rdmachan::choose_bootstrap(requested, environment.lookup());
    } catch (const rdmachan::Error& error) {
        return error.what();
    }
    return "";
}

}  // namespace

TEST_CASE("bootstrap names parse, and a bad one names the variable and the value") {
    CHECK(rdmachan::parse_bootstrap("auto", "X") == rdmachan::Bootstrap::automatic);
    CHECK(rdmachan::parse_bootstrap("tcp", "X") == rdmachan::Bootstrap::tcp);
    CHECK(rdmachan::parse_bootstrap("pmix", "X") == rdmachan::Bootstrap::pmix);
    CHECK(rdmachan::parse_bootstrap("etcd", "X") == rdmachan::Bootstrap::etcd);
    CHECK(std::string(rdmachan::to_string(rdmachan::Bootstrap::automatic)) == "auto");
    CHECK(std::string(rdmachan::to_string(rdmachan::Bootstrap::etcd)) == "etcd");
    const FakeEnvironment environment{{{"RDMACHAN_BOOTSTRAP", "pmi"}}};
    const std::string text = error_of(rdmachan::Bootstrap::automatic, environment);
    CHECK(text.find("RDMACHAN_BOOTSTRAP='pmi'") != std::string::npos);
    CHECK(text.find("auto, tcp, pmix or etcd") != std::string::npos);
    // Checked even when the builder's explicit choice makes the variable moot.
    CHECK(error_of(rdmachan::Bootstrap::tcp, environment).find("RDMACHAN_BOOTSTRAP='pmi'") != std::string::npos);
}

TEST_CASE("etcd is chosen only when asked for, by the builder or RDMACHAN_BOOTSTRAP") {
    const rdmachan::BootstrapChoice built = rdmachan::choose_bootstrap(rdmachan::Bootstrap::etcd, FakeEnvironment{}.lookup());
    CHECK(built.bootstrap == rdmachan::Bootstrap::etcd);
    CHECK(built.explicit_choice);
    const FakeEnvironment asked{{{"RDMACHAN_BOOTSTRAP", "etcd"}}};
    const rdmachan::BootstrapChoice from_variable = rdmachan::choose_bootstrap(rdmachan::Bootstrap::automatic, asked.lookup());
    CHECK(from_variable.bootstrap == rdmachan::Bootstrap::etcd);
    CHECK(from_variable.reason == "RDMACHAN_BOOTSTRAP=etcd");
    // RDMACHAN_ETCD alone does not choose it: automatic stays TCP or PMIx.
    const FakeEnvironment store_only{{{"RDMACHAN_ETCD", "http://127.0.0.1:2379"}}};
    CHECK(rdmachan::choose_bootstrap(rdmachan::Bootstrap::automatic, store_only.lookup()).bootstrap == rdmachan::Bootstrap::tcp);
}

TEST_CASE("a PMIx launcher is recognised by its variables") {
    CHECK_FALSE(rdmachan::started_by_pmix_launcher(FakeEnvironment{}.lookup()));
    CHECK_FALSE(rdmachan::started_by_pmix_launcher(FakeEnvironment{{{"OMPI_COMM_WORLD_RANK", "0"}}}.lookup()));
    CHECK(rdmachan::started_by_pmix_launcher(FakeEnvironment{{{"PMIX_RANK", "3"}}}.lookup()));
    CHECK(rdmachan::started_by_pmix_launcher(FakeEnvironment{{{"PMIX_NAMESPACE", "job"}}}.lookup()));
    CHECK(rdmachan::started_by_pmix_launcher(FakeEnvironment{{{"PMIX_SERVER_URI41", "x;tcp4://127.0.0.1:1"}}}.lookup()));
    CHECK_FALSE(rdmachan::started_by_pmix_launcher(FakeEnvironment{{{"PMIX_RANK", ""}}}.lookup()));
}

TEST_CASE("automatic: TCP without a launcher, PMIx under one when built with it") {
    const rdmachan::BootstrapChoice alone = rdmachan::choose_bootstrap(rdmachan::Bootstrap::automatic, FakeEnvironment{}.lookup());
    CHECK(alone.bootstrap == rdmachan::Bootstrap::tcp);
    CHECK_FALSE(alone.explicit_choice);

    const FakeEnvironment launched{{{"PMIX_RANK", "0"}, {"PMIX_NAMESPACE", "job"}}};
    const rdmachan::BootstrapChoice under = rdmachan::choose_bootstrap(rdmachan::Bootstrap::automatic, launched.lookup());
    CHECK_FALSE(under.explicit_choice);
    if (rdmachan::pmix_available()) {
        CHECK(under.bootstrap == rdmachan::Bootstrap::pmix);
    } else {
        CHECK(under.bootstrap == rdmachan::Bootstrap::tcp);
        CHECK(under.reason.find("built without PMIx") != std::string::npos);
    }
}

TEST_CASE("an explicit builder setting wins over RDMACHAN_BOOTSTRAP, which wins over detection") {
    const FakeEnvironment tcp_under_launcher{{{"RDMACHAN_BOOTSTRAP", "tcp"}, {"PMIX_RANK", "0"}}};
    const rdmachan::BootstrapChoice from_variable =
        rdmachan::choose_bootstrap(rdmachan::Bootstrap::automatic, tcp_under_launcher.lookup());
    CHECK(from_variable.bootstrap == rdmachan::Bootstrap::tcp);
    CHECK(from_variable.explicit_choice);
    CHECK(from_variable.reason == "RDMACHAN_BOOTSTRAP=tcp");

    const FakeEnvironment asks_pmix{{{"RDMACHAN_BOOTSTRAP", "pmix"}}};
    const rdmachan::BootstrapChoice builder_tcp = rdmachan::choose_bootstrap(rdmachan::Bootstrap::tcp, asks_pmix.lookup());
    CHECK(builder_tcp.bootstrap == rdmachan::Bootstrap::tcp);
    CHECK(builder_tcp.reason == "MultiChannelBuilder::bootstrap(tcp)");
}

TEST_CASE("asking for PMIx: chosen when built with it, else an error naming libpmix-dev") {
    const FakeEnvironment asks_pmix{{{"RDMACHAN_BOOTSTRAP", "pmix"}}};
    for (const auto& [requested, environment] :
         {std::pair{rdmachan::Bootstrap::pmix, FakeEnvironment{}}, std::pair{rdmachan::Bootstrap::automatic, asks_pmix}}) {
        if (rdmachan::pmix_available()) {
            const rdmachan::BootstrapChoice choice = rdmachan::choose_bootstrap(requested, environment.lookup());
            CHECK(choice.bootstrap == rdmachan::Bootstrap::pmix);
            CHECK(choice.explicit_choice);
        } else {
            const std::string text = error_of(requested, environment);
            CHECK(text.find("unavailable") != std::string::npos);
            CHECK(text.find("built without PMIx") != std::string::npos);
            CHECK(text.find("libpmix-dev") != std::string::npos);
        }
    }
}

TEST_CASE("connect() under the TCP bootstrap says to call connect(RendezvousSettings)") {
    rdmachan::PreparedMultiChannel prepared = rdmachan::MultiChannelBuilder(rdmachan::ChannelBuilder().device("soft"))
                                                  .bootstrap(rdmachan::Bootstrap::tcp)
                                                  .rank(0)
                                                  .world_size(1)
                                                  .build();
    CHECK(prepared.bootstrap().bootstrap == rdmachan::Bootstrap::tcp);
    try {
        (void)std::move(prepared).connect();
        FAIL("connect() without PMIx succeeded");
    } catch (const rdmachan::Error& error) {
        CHECK(std::string(error.what()).find("connect(RendezvousSettings)") != std::string::npos);
    }
}
