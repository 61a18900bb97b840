#include "tools/golden_check/capture/capture_memory.hpp"

#include <arpa/inet.h>

#include <cstring>
#include <stdexcept>

namespace rdmachan::golden::capture {

using nlohmann::json;

std::string hex(const void* bytes, std::size_t length) {
    static const char digits[] = "0123456789abcdef";
    std::string text;
    const auto* data = static_cast<const std::uint8_t*>(bytes);
    for (std::size_t i = 0; i < length; ++i) {
        text += digits[data[i] >> 4];
        text += digits[data[i] & 15];
    }
    return text;
}

std::string hex_number(std::uint64_t value) {
    char text[32];
    std::snprintf(text, sizeof text, "0x%llx", static_cast<unsigned long long>(value));
    return text;
}

json written_region(const void* bytes, std::size_t length, std::uint8_t poison) {
    const auto* data = static_cast<const std::uint8_t*>(bytes);
    std::string mask;
    for (std::size_t i = 0; i < length; ++i) mask += data[i] != poison ? "ff" : "00";
    return {{"bytes_hex", hex(bytes, length)}, {"written_mask_hex", mask}};
}

json merge_runs(const json& first, const json& second) {
    if (first.is_null()) return second;
    if (first.is_object() && second.is_object()) {
        json merged = first;
        for (auto& entry : merged.items()) {
            if (second.contains(entry.key()))
                entry.value() = merge_runs(entry.value(), second.at(entry.key()));
        }
        if (merged.contains("written_mask_hex") && second.contains("written_mask_hex")) {
            std::string mask = merged.at("written_mask_hex").get<std::string>();
            const std::string other = second.at("written_mask_hex").get<std::string>();
            for (std::size_t i = 0; i < mask.size() && i < other.size(); i += 2) {
                if (other.compare(i, 2, "ff") == 0) mask.replace(i, 2, "ff");
            }
            merged["written_mask_hex"] = mask;
        }
        return merged;
    }
    if (first.is_array() && second.is_array() && first.size() == second.size()) {
        json merged = json::array();
        for (std::size_t i = 0; i < first.size(); ++i)
            merged.push_back(merge_runs(first[i], second[i]));
        return merged;
    }
    return first;
}

json completion_fields(const ibv_wc& wc, std::uint8_t poison) {
    auto written = [&](const void* field, std::size_t size) {
        const auto* bytes = static_cast<const std::uint8_t*>(field);
        for (std::size_t i = 0; i < size; ++i)
            if (bytes[i] != poison) return true;
        return false;
    };
    auto field = [&](const auto& value) -> json {
        return written(&value, sizeof value) ? json(static_cast<std::uint64_t>(value))
                                             : json(nullptr);
    };
    json fields;
    fields["wr_id"] =
        written(&wc.wr_id, sizeof wc.wr_id) ? json(hex_number(wc.wr_id)) : json(nullptr);
    fields["status"] = field(wc.status);
    fields["opcode"] = field(wc.opcode);
    fields["vendor_err"] = field(wc.vendor_err);
    fields["byte_len"] = field(wc.byte_len);
    if (written(&wc.imm_data, sizeof wc.imm_data)) {
        fields["imm_data_or_invalidated_rkey"] = {{"bytes_hex", hex(&wc.imm_data, 4)},
                                                  {"imm_data_be32toh", ntohl(wc.imm_data)},
                                                  {"invalidated_rkey", wc.invalidated_rkey}};
    } else {
        fields["imm_data_or_invalidated_rkey"] = nullptr;
    }
    fields["qp_num"] = field(wc.qp_num);
    fields["src_qp"] = field(wc.src_qp);
    fields["wc_flags"] = field(wc.wc_flags);
    fields["pkey_index"] = field(wc.pkey_index);
    fields["slid"] = field(wc.slid);
    fields["sl"] = field(wc.sl);
    fields["dlid_path_bits"] = field(wc.dlid_path_bits);
    return fields;
}

ReceiveCounters::ReceiveCounters(ibv_qp* qp, std::uint32_t wqe_count, std::uint32_t wqe_shift,
                                 std::uint32_t head, std::uint32_t tail) {
    // struct mlx5_qp holds the ibv_qp near its start and both work queues within a few hundred
    // bytes after it.
    auto* first =
        reinterpret_cast<std::uint32_t*>(reinterpret_cast<std::uintptr_t>(qp) & ~std::uintptr_t{3});
    int found = 0;
    for (std::uint32_t* words = first; words < first + 1024; ++words) {
        if (words[0] == wqe_count && words[1] == wqe_count && words[2] == head &&
            words[3] == tail && words[5] == words[6] &&
            static_cast<std::uint32_t>(words[7]) == wqe_shift) {
            words_ = words;
            ++found;
        }
    }
    if (found != 1)
        throw std::runtime_error("libmlx5's receive-queue counters not found exactly once");
}

}  // namespace rdmachan::golden::capture
