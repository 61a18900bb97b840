// What mlx5-golden-capture reads out of the installed libmlx5 to write capture-shaped cases:
// hex and written masks of memory it poisoned, the ibv_wc fields libmlx5 wrote, and the
// receive-queue counters libmlx5 keeps to itself (struct mlx5_wq in providers/mlx5/mlx5.h:
// wqe_cnt, max_post, head, tail, cur_post, max_gs, qp_state_max_gs, wqe_shift, in that order).
#pragma once

#include <infiniband/verbs.h>

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

namespace rdmachan::golden::capture {

std::string hex(const void* bytes, std::size_t length);
std::string hex_number(std::uint64_t value);

// {"bytes_hex", "written_mask_hex"}: a byte counts as written where it is not `poison`. A case
// runs twice with different poisons and merge_runs() joins the masks, so a byte written with
// one run's poison value is still found.
nlohmann::json written_region(const void* bytes, std::size_t length, std::uint8_t poison);

// Run 1's case with every written_mask_hex the union of both runs', and every field null in
// run 1 (not written: it held run 1's poison) taken from run 2.
nlohmann::json merge_runs(const nlohmann::json& first, const nlohmann::json& second);

// The ibv_wc as the golden vectors record it: each field, or null where it still holds the
// poison the array was filled with before the poll.
nlohmann::json completion_fields(const ibv_wc& wc, std::uint8_t poison);

// libmlx5's receive-queue counters of `qp`, found by their values (the queue's wqe_cnt and
// wqe_shift, head and tail as the caller knows them): the only way to emulate a completion as
// the golden harness did (rq.tail = rq.head). Throws if they are not found exactly once.
class ReceiveCounters {
  public:
    ReceiveCounters(ibv_qp* qp, std::uint32_t wqe_count, std::uint32_t wqe_shift,
                    std::uint32_t head, std::uint32_t tail);
    std::uint32_t head() const { return words_[2]; }
    std::uint32_t tail() const { return words_[3]; }
    void set_tail(std::uint32_t tail) { words_[3] = tail; }

  private:
    std::uint32_t* words_ = nullptr;  // wqe_cnt, max_post, head, tail, ...
};

}  // namespace rdmachan::golden::capture
