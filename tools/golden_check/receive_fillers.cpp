#include "tools/golden_check/receive_fillers.hpp"

#include <algorithm>
#include <regex>
#include <vector>

namespace rdmachan::golden {
namespace {

namespace mlx5 = rdmachan::mlx5;

struct ReceiveFillers {
    std::uint32_t count = 0;
    std::uint32_t per_call = 1;
    mlx5::ScatterGatherElement element{};
};

std::optional<ReceiveFillers> parse_receive_fillers(const std::string& text) {
    static const std::regex pattern(
        R"(^(\d+) filler WRs \(1 SGE \{(0x[0-9a-fA-F]+), len (\d+), lkey (0x[0-9a-fA-F]+)\}\) posted with ibv_post_recv, (\d+) per call$)");
    std::smatch match;
    if (!std::regex_match(text, match, pattern)) return std::nullopt;
    ReceiveFillers fillers;
    fillers.count = static_cast<std::uint32_t>(std::stoul(match[1].str()));
    fillers.element.addr = std::stoull(match[2].str(), nullptr, 16);
    fillers.element.length = static_cast<std::uint32_t>(std::stoul(match[3].str()));
    fillers.element.lkey = static_cast<std::uint32_t>(std::stoul(match[4].str(), nullptr, 16));
    fillers.per_call = static_cast<std::uint32_t>(std::stoul(match[5].str()));
    if (fillers.per_call == 0) return std::nullopt;
    return fillers;
}

CaseResult unreproduced(const std::string& why) {
    return CaseResult::unsupported("inputs.before_capture not reproduced: " + why);
}

}  // namespace

std::optional<CaseResult> replay_receive_fillers(const std::string& text, mlx5::ReceiveQueue& queue,
                                                 std::uint32_t head_before,
                                                 std::uint32_t tail_before) {
    const std::optional<ReceiveFillers> fillers = parse_receive_fillers(text);
    if (!fillers.has_value()) return unreproduced("not a form this tool replays");
    if (fillers->count > head_before)
        return unreproduced("rq_before's head counts fewer receives than its fillers");
    const std::uint32_t wqe_count = queue.ring().wqe_count;
    const std::uint32_t first = head_before - fillers->count;
    if (head_before - tail_before > wqe_count) {
        return unreproduced("rq_before holds more receives outstanding than its ring");
    }
    // Receives outstanding since before the fillers (tail at or before the first filler) stay
    // so; otherwise the last emulated completion came after a call, at tail_before, and any
    // earlier one was where a call would not have fitted without it.
    const bool completed_between = static_cast<std::int32_t>(tail_before - first) > 0;
    queue.set_counters(first, completed_between ? first : tail_before);
    for (std::uint32_t posted = 0; posted < fillers->count;) {
        const std::uint32_t batch = std::min(fillers->per_call, fillers->count - posted);
        if (completed_between && queue.outstanding() + batch > wqe_count)
            queue.set_counters(queue.head(), queue.head());
        std::vector<mlx5::ReceiveWorkRequest> requests(batch);
        for (std::uint32_t i = 0; i < batch; ++i) {
            requests[i].wr_id = 0xf0000000u + posted + i;
            requests[i].num_sge = 1;
            requests[i].sg_list = &fillers->element;
        }
        if (queue.post(requests.data(), batch, nullptr) != mlx5::PostResult::ok) {
            return CaseResult::mismatch("a filler receive (inputs.before_capture) was refused");
        }
        posted += batch;
        if (completed_between && queue.head() == tail_before)
            queue.set_counters(queue.head(), queue.head());
    }
    if (queue.tail() != tail_before) {
        return unreproduced(
            "rq_before's tail is not where completions emulated between calls (rq.tail = rq.head) "
            "can leave it");
    }
    return std::nullopt;
}

}  // namespace rdmachan::golden
