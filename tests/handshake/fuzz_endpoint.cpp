// libFuzzer target: parse_endpoint must either return a valid endpoint (one that serializes and
// parses back to itself) or throw rdmachan::Error; anything else is a finding.
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "rdmachan/endpoint.hpp"
#include "rdmachan/error.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    const std::string_view text(reinterpret_cast<const char*>(data), size);
    try {
        const rdmachan::Endpoint endpoint = rdmachan::parse_endpoint(text);
        if (!(rdmachan::parse_endpoint(rdmachan::serialize_endpoint(endpoint)) == endpoint))
            std::abort();
    } catch (const rdmachan::Error&) {
    }
    return 0;
}
