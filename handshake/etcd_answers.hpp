// Reading etcd's JSON answers. Every field used is checked for presence, type and range before it
// is used: a garbled or hostile answer is an rdmachan::Error naming the call and the field, never
// a crash or a wrong value. etcd's gateway follows proto3's JSON mapping: 64-bit integers arrive as
// decimal strings, bytes as base64, and fields at their default value (0, empty) are left out.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "handshake/membership_store.hpp"

namespace rdmachan::handshake {

class AnswerReader {
  public:
    // `context` names the call, e.g. "etcd http://127.0.0.1:2379: get 'members/3'"; `key_prefix`
    // is stripped from every key read.
    AnswerReader(std::string context, std::string key_prefix);

    const std::string& context() const { return context_; }
    [[noreturn]] void refuse(const std::string& field, const std::string& why) const;

    // The answer's text as a JSON object.
    nlohmann::json parse(std::string_view body) const;
    // The header's revision (required, at least 1).
    std::int64_t header_revision(const nlohmann::json& answer, const std::string& path = "") const;
    // A proto3 int64: a decimal string or a JSON integer; absent is 0 unless `required`.
    std::int64_t integer(const nlohmann::json& object, const std::string& path, const char* field,
                         bool required = false) const;
    // Base64 bytes; absent is empty.
    std::string bytes(const nlohmann::json& object, const std::string& path, const char* field) const;
    bool boolean(const nlohmann::json& object, const std::string& path, const char* field) const;
    // A key under the store's prefix, returned without it.
    std::string key(const nlohmann::json& object, const std::string& path) const;
    // A range answer's entries ("kvs").
    std::vector<StoreEntry> entries(const nlohmann::json& answer) const;

  private:
    const nlohmann::json* member(const nlohmann::json& object, const std::string& path, const char* field) const;

    std::string context_;
    std::string key_prefix_;
};

// One message of a watch's stream ({"result": {...}}).
struct WatchMessage {
    bool created = false;
    bool canceled = false;
    std::int64_t compact_revision = 0;
    std::string cancel_reason;
    std::int64_t revision = 0;
    std::vector<StoreEvent> events;
};
WatchMessage read_watch_message(const AnswerReader& reader, std::string_view line);

// The gateway's refusal ({"error", "message", "code"}) as one line; any other body as its size.
std::string describe_refusal(unsigned status, std::string_view body);

// The key that ends a prefix's range: the prefix with its last byte below 0xff raised by one
// ("\0" for an empty prefix: every key).
std::string prefix_range_end(std::string_view prefix);

}  // namespace rdmachan::handshake
