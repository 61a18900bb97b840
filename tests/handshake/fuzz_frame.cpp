// libFuzzer target: the frame decoder and hello decoder on arbitrary streams, split at a
// fuzzer-chosen point. They may only return frames within the cap or throw rdmachan::Error.
#include <cstdint>
#include <cstdlib>
#include <span>

#include "handshake/frame.hpp"
#include "rdmachan/error.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    if (size == 0) return 0;
    const std::size_t split = data[0] % size;
    constexpr std::size_t cap = 4096;
    rdmachan::handshake::FrameDecoder decoder("fuzzer", cap);
    try {
        decoder.feed(std::span<const std::uint8_t>(data + 1, split > 0 ? split - 1 : 0));
        while (auto frame = decoder.next_frame()) {
            if (frame->size() > cap) std::abort();
            (void)rdmachan::handshake::decode_hello(*frame, "fuzzer");
        }
        decoder.feed(std::span<const std::uint8_t>(data + std::max<std::size_t>(split, 1),
                                                   size - std::max<std::size_t>(split, 1)));
        while (auto frame = decoder.next_frame()) {
            if (frame->size() > cap) std::abort();
            (void)rdmachan::handshake::decode_hello(*frame, "fuzzer");
        }
        decoder.finish();
    } catch (const rdmachan::Error&) {
    }
    return 0;
}
