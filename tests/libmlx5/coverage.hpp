// What a random differential run reached, counted by kind, and the least each kind must reach:
// a generator that stops producing a kind (an opcode never picked, a refusal never provoked, a
// ring that never wraps) fails the run, instead of the run passing with less than it claims.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace rdmachan::libmlx5_instructions {

class Coverage {
  public:
    void count(const std::string& kind, std::uint32_t times = 1) { counts_[kind] += times; }
    std::uint32_t operator[](const std::string& kind) const {
        const auto found = counts_.find(kind);
        return found == counts_.end() ? 0 : found->second;
    }
    // "kind: count, at least minimum" for each kind short of its minimum; empty when none is.
    std::string shortfalls(
        const std::vector<std::pair<std::string, std::uint32_t>>& minimums) const {
        std::string text;
        for (const auto& [kind, minimum] : minimums)
            if ((*this)[kind] < minimum)
                text += (text.empty() ? "" : "; ") + kind + ": " + std::to_string((*this)[kind]) +
                        ", at least " + std::to_string(minimum) + " required";
        return text;
    }
    // Every kind counted, for the log.
    std::string summary() const {
        std::string text;
        for (const auto& [kind, times] : counts_)
            text += (text.empty() ? "" : ", ") + kind + " " + std::to_string(times);
        return text;
    }

  private:
    std::map<std::string, std::uint32_t> counts_;
};

}  // namespace rdmachan::libmlx5_instructions
