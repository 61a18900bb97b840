// A FIFO of indices linked through an array shared by every queue of its kind (an index is in at
// most one such queue at a time): 12 bytes per queue whatever its capacity, so a DC peer costs
// nothing sized by the queue depth (docs/SCALE.md). The links are sized by their owner once
// (no allocation here).
#pragma once

#include <cstdint>
#include <vector>

namespace rdmachan::detail {

class LinkedIndexQueue {
public:
    static constexpr std::uint32_t kNone = ~0u;
    bool empty() const { return count_ == 0; }
    std::uint32_t size() const { return count_; }
    void push(std::vector<std::uint32_t>& links, std::uint32_t item) {
        links[item] = kNone;
        if (count_ == 0) {
            head_ = item;
        } else {
            links[tail_] = item;
        }
        tail_ = item;
        ++count_;
    }
    std::uint32_t pop(const std::vector<std::uint32_t>& links) {
        const std::uint32_t item = head_;
        head_ = links[item];
        --count_;
        return item;
    }

private:
    std::uint32_t head_ = kNone;
    std::uint32_t tail_ = kNone;
    std::uint32_t count_ = 0;
};

}  // namespace rdmachan::detail
