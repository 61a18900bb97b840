#include "transport/soft/held_completions.hpp"

#include <cstring>

#include "transport/mlx5/barriers.hpp"
#include "transport/mlx5/byte_order.hpp"
#include "transport/mlx5/compressed_session.hpp"
#include "transport/soft/completion_ring.hpp"

namespace rdmachan::soft {

using namespace rdmachan::mlx5;

HeldCompletion& HeldCompletions::add(CompletionQueueContext& cq, std::uint8_t cqe_opcode, bool solicited) {
    HeldCompletion& held = held_.emplace_back();
    held.cq = &cq;
    held.cqe_opcode = cqe_opcode;
    held.solicited = solicited;
    return held;
}

namespace {

bool compressible(const HeldCompletion& completion) {
    if (completion.solicited) return false;
    switch (completion.cqe_opcode) {
        case kCqeRequester:
        case kCqeResponderWriteImmediate:
        case kCqeResponderSend:
        case kCqeResponderSendImmediate:
            return true;
        default:
            return false;
    }
}

// Whether `next`, the `position`th CQE after `first`, can be a mini CQE of first's session: a
// requester CQE names the same QP and user index (its WQE counter, WQE opcode and byte count
// travel in the mini CQE); a responder CQE equals the first in every byte but the byte count and
// the WQE counter, which is the first's plus its position (the decoder counts it so).
bool joins(const HeldCompletion& first, const HeldCompletion& next, std::uint32_t position) {
    if (next.cq != first.cq || next.cqe_opcode != first.cqe_opcode || !compressible(next)) return false;
    if (first.cqe_opcode == kCqeRequester) {
        return (load_big32(next.cqe + kCqeSopDropQpn) & 0xffffff) == (load_big32(first.cqe + kCqeSopDropQpn) & 0xffffff) &&
               std::memcmp(next.cqe + kCqeSrqnUserIndex, first.cqe + kCqeSrqnUserIndex, 4) == 0;
    }
    if (load_big16(next.cqe + kCqeWqeCounter) != static_cast<std::uint16_t>(load_big16(first.cqe + kCqeWqeCounter) + position)) {
        return false;
    }
    return std::memcmp(next.cqe, first.cqe, kCqeByteCount) == 0 &&
           std::memcmp(next.cqe + kCqeByteCount + 4, first.cqe + kCqeByteCount + 4, kCqeWqeCounter - kCqeByteCount - 4) == 0;
}

}  // namespace

std::uint32_t HeldCompletions::session_length(const HeldCompletion* first, std::uint32_t count) {
    if (!compressible(*first)) return 1;
    const std::uint32_t most = count < kMaxSession ? count : kMaxSession;
    std::uint32_t length = 1;
    while (length < most && joins(*first, first[length], length)) ++length;
    return length;
}

void write_session(const CompletionRingView& ring, const HeldCompletion* first, std::uint32_t count) {
    const std::uint32_t start = ring.producer_index();
    // Mini CQEs 0-7 go into the entry after the title, 8k to 8k + 7 into the session's entry 8k:
    // each array entry is written whole (its op_own byte is a mini CQE's last byte).
    for (std::uint32_t array = 0; array * kMiniCqesPerEntry < count; ++array) {
        std::uint8_t bytes[kCqeSize64] = {};
        for (std::uint32_t slot = 0; slot < kMiniCqesPerEntry; ++slot) {
            const std::uint32_t position = array * kMiniCqesPerEntry + slot;
            if (position >= count) break;
            const std::uint8_t* cqe = first[position].cqe;
            std::uint8_t* mini = bytes + slot * kMiniCqeSize;
            if (first->cqe_opcode == kCqeRequester) {
                std::memcpy(mini + kMiniCqeWqeCounter, cqe + kCqeWqeCounter, 2);
                mini[kMiniCqeWqeOpcode] = cqe[kCqeSopDropQpn];  // the WQE opcode byte
            }
            std::memcpy(mini + kMiniCqeByteCount, cqe + kCqeByteCount, 4);
        }
        const std::uint32_t entry = start + (array == 0 ? 1 : array * kMiniCqesPerEntry);
        std::memcpy(ring.entry_at(entry), bytes, kCqeSize64);
    }
    // The title: what the CQEs share (the first's fields), the count in byte_cnt, format 3.
    std::uint8_t* title = ring.entry_at(start);
    std::memcpy(title, first->cqe, kCqeOpOwn);
    store_big32(title + kCqeByteCount, count);
    ring.make_visible(title, first->cqe_opcode, false, kCqeFormatCompressed);
    ring.advance(count);
    ring.raise_event(first->cqe_opcode, false);
}

}  // namespace rdmachan::soft
