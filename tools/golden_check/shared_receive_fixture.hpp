// An SRQ laid out for a replay as its creation left it: poisoned WQEs with their next-segment
// links, a poisoned doorbell record, the project's SharedReceiveQueue over them. Shared by the
// srq_wqe and cqe kinds of recv-vectors.json.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <vector>

#include "tools/golden_check/hex.hpp"
#include "transport/mlx5/shared_receive_queue.hpp"

namespace rdmachan::golden {

// What memory a replay fills before a call, so that bytes our queue writes can be told apart.
inline constexpr std::uint8_t kPoison = 0xa5;
inline constexpr std::uint32_t kDoorbellRecordPoison = 0xdeadbeef;

struct SharedReceiveQueueFixture {
    std::vector<std::uint8_t> buffer;
    std::uint32_t doorbell_record = kDoorbellRecordPoison;
    std::vector<std::uint64_t> wr_ids;
    mlx5::SharedReceiveQueue queue;

    SharedReceiveQueueFixture(const nlohmann::json& created, const nlohmann::json& links) {
        const std::uint32_t wqe_count = static_cast<std::uint32_t>(number(created.at("max")));
        const std::uint32_t stride = static_cast<std::uint32_t>(number(created.at("stride_bytes")));
        buffer.assign(static_cast<std::size_t>(wqe_count) * stride, kPoison);
        wr_ids.assign(wqe_count, 0);
        for (std::uint32_t i = 0; i < wqe_count; ++i) {
            mlx5::store_big16(
                buffer.data() + static_cast<std::size_t>(i) * stride + mlx5::kSrqNextWqeIndex,
                static_cast<std::uint16_t>(number(links[i])));
        }
        mlx5::SharedReceiveQueueRing ring{buffer.data(), wqe_count, stride,
                                          static_cast<std::uint32_t>(number(created.at("srqn"))),
                                          &doorbell_record};
        queue = mlx5::SharedReceiveQueue(ring, wr_ids.data(),
                                         static_cast<std::uint32_t>(number(created.at("head"))),
                                         static_cast<std::uint32_t>(number(created.at("tail"))));
        queue.set_counter(static_cast<std::uint16_t>(number(created.at("counter"))));
    }
};

}  // namespace rdmachan::golden
