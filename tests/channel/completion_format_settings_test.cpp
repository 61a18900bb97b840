// The completion-format settings (CQE compression, scatter-to-CQE): the builder keeps them and
// refuses values that name nothing, and a device that cannot give one refuses the channel when it
// is built, naming the setting, rather than running without it.
#include <doctest/doctest.h>

#include <cstdlib>
#include <string>

#include "rdmachan/channel.hpp"
#include "rdmachan/multi_channel.hpp"
#include "tests/soft/scoped_environment.hpp"

using rdmachan::ChannelBuilder;
using rdmachan::CqeCompression;

namespace {

// The message build() threw, or "" when it built.
std::string build_refusal(const ChannelBuilder& builder) {
    try {
        rdmachan::PreparedChannel prepared = builder.build();
        return "";
    } catch (const rdmachan::Error& error) {
        return error.what();
    }
}

bool contains(const std::string& text, const std::string& part) {
    return text.find(part) != std::string::npos;
}

}  // namespace

TEST_CASE("completion formats are off unless asked for, and the builder keeps what was asked") {
    ::unsetenv("RDMACHAN_CQE_COMPRESSION");  // this case checks the defaults themselves
    ::unsetenv("RDMACHAN_SCATTER_TO_CQE");
    CHECK(ChannelBuilder().settings().cqe_compression == CqeCompression::off);
    CHECK_FALSE(ChannelBuilder().settings().scatter_to_cqe);
    const ChannelBuilder builder =
        ChannelBuilder().cqe_compression(CqeCompression::checksum).scatter_to_cqe(true);
    CHECK(builder.settings().cqe_compression == CqeCompression::checksum);
    CHECK(builder.settings().scatter_to_cqe);
    CHECK(std::string(rdmachan::to_string(CqeCompression::checksum_stride_index)) ==
          "checksum_stride_index");
}

TEST_CASE("a CQE compression value that names no format is refused by name") {
    try {
        ChannelBuilder().cqe_compression(static_cast<CqeCompression>(9));
        FAIL("accepted");
    } catch (const rdmachan::Error& error) {
        CHECK(contains(error.what(), "cqe_compression: 9"));
    }
}

TEST_CASE("the software device builds channels with CQE compression in every format") {
    for (CqeCompression format :
         {CqeCompression::hash, CqeCompression::checksum, CqeCompression::checksum_stride_index}) {
        CAPTURE(rdmachan::to_string(format));
        CHECK(build_refusal(ChannelBuilder().device("soft").cqe_compression(format)) == "");
    }
}

TEST_CASE("RDMACHAN_CQE_COMPRESSION sets the builders' default, a value given to the builder wins") {
    const rdmachan::test::Environment compression("RDMACHAN_CQE_COMPRESSION", "checksum");
    CHECK(ChannelBuilder().settings().cqe_compression == CqeCompression::checksum);
    CHECK(rdmachan::MultiChannelBuilder().settings().cqe_compression == CqeCompression::checksum);
    CHECK(ChannelBuilder().cqe_compression(CqeCompression::off).settings().cqe_compression == CqeCompression::off);
    // Settings given whole are the caller's own: the environment does not change them.
    CHECK(ChannelBuilder(rdmachan::ChannelSettings{}).settings().cqe_compression == CqeCompression::off);
}

TEST_CASE("an RDMACHAN_CQE_COMPRESSION that names no format is refused, naming the variable") {
    const rdmachan::test::Environment compression("RDMACHAN_CQE_COMPRESSION", "zip");
    try {
        ChannelBuilder builder;
        FAIL("accepted");
    } catch (const rdmachan::Error& error) {
        CHECK(contains(error.what(), "RDMACHAN_CQE_COMPRESSION = 'zip'"));
    }
}

TEST_CASE("the software device builds channels with scatter-to-CQE") {
    CHECK(build_refusal(ChannelBuilder().device("soft").scatter_to_cqe(true)) == "");
}

TEST_CASE("RDMACHAN_SCATTER_TO_CQE sets the builders' default; a value other than 0 or 1 is refused by name") {
    {
        const rdmachan::test::Environment scatter("RDMACHAN_SCATTER_TO_CQE", "1");
        CHECK(ChannelBuilder().settings().scatter_to_cqe);
        CHECK(rdmachan::MultiChannelBuilder().settings().scatter_to_cqe);
        CHECK_FALSE(ChannelBuilder().scatter_to_cqe(false).settings().scatter_to_cqe);
    }
    const rdmachan::test::Environment scatter("RDMACHAN_SCATTER_TO_CQE", "yes");
    try {
        ChannelBuilder builder;
        FAIL("accepted");
    } catch (const rdmachan::Error& error) {
        CHECK(contains(error.what(), "RDMACHAN_SCATTER_TO_CQE = 'yes'"));
    }
}

TEST_CASE("with both formats off the software device builds the channel") {
    CHECK(build_refusal(ChannelBuilder().device("soft")) == "");
}

TEST_CASE("DC mode refuses scatter-to-CQE, naming the setting") {
    std::string refusal;
    try {
        rdmachan::MultiChannelBuilder(ChannelBuilder().device("soft").scatter_to_cqe(true))
            .rank(0)
            .world_size(2)
            .mode(rdmachan::MultiChannelMode::dynamically_connected)
            .build();
    } catch (const rdmachan::Error& error) {
        refusal = error.what();
    }
    CAPTURE(refusal);
    CHECK(contains(refusal, "scatter_to_cqe: DC mode"));
}
