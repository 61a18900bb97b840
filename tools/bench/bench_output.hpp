// rdmachan-bench's output: perftest-like tables, JSON, CSV.
#pragma once

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

#include "tools/bench/bench_run.hpp"

namespace bench {

nlohmann::json to_json(const RankOutcome& outcome);
RankOutcome outcome_from_json(const nlohmann::json& json);
std::string format_table(const Options& options, const RankOutcome& outcome);
std::string format_csv(const RankOutcome& outcome);

}  // namespace bench
