// Work-request lists as the receive vectors write them ("wr_list"), turned into the project's
// requests with the storage their SGE pointers refer to.
#pragma once

#include <nlohmann/json.hpp>
#include <vector>

#include "tools/golden_check/hex.hpp"
#include "transport/mlx5/work_request.hpp"

namespace rdmachan::golden {

struct ReceiveRequests {
    std::vector<mlx5::ReceiveWorkRequest> requests;
    std::vector<std::vector<mlx5::ScatterGatherElement>> elements;
};

inline mlx5::ScatterGatherElement scatter_gather_element(const nlohmann::json& element) {
    return {number(element.at("addr")), static_cast<std::uint32_t>(number(element.at("length"))),
            static_cast<std::uint32_t>(number(element.at("lkey")))};
}

// Each entry: wr_id, num_sge, sg_list of {addr, length, lkey}.
inline ReceiveRequests receive_requests(const nlohmann::json& wr_list) {
    ReceiveRequests result;
    result.elements.reserve(wr_list.size());
    for (const nlohmann::json& wr : wr_list) {
        std::vector<mlx5::ScatterGatherElement> elements;
        for (const nlohmann::json& element : wr.at("sg_list"))
            elements.push_back(scatter_gather_element(element));
        result.elements.push_back(std::move(elements));
        mlx5::ReceiveWorkRequest request;
        request.wr_id = number(wr.at("wr_id"));
        request.num_sge = static_cast<std::uint32_t>(number(wr.at("num_sge")));
        request.sg_list = result.elements.back().data();
        result.requests.push_back(request);
    }
    return result;
}

}  // namespace rdmachan::golden
