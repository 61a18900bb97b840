#include "handshake/etcd_answers.hpp"

#include <charconv>

#include "handshake/crypto.hpp"
#include "rdmachan/error.hpp"

namespace rdmachan::handshake {
namespace {

std::string joined(const std::string& path, const char* field) {
    return path.empty() ? std::string(field) : path + "." + field;
}

// A bounded, printable rendering of text from the network for an error message.
std::string printable(std::string_view text) {
    std::string shown;
    for (char character : text.substr(0, 120))
        shown += (character >= 0x20 && character < 0x7f) ? character : '?';
    if (text.size() > 120) shown += "...";
    return shown;
}

}  // namespace

AnswerReader::AnswerReader(std::string context, std::string key_prefix)
    : context_(std::move(context)), key_prefix_(std::move(key_prefix)) {}

void AnswerReader::refuse(const std::string& field, const std::string& why) const {
    throw Error(context_ + ": answer field '" + field + "' " + why);
}

nlohmann::json AnswerReader::parse(std::string_view body) const {
    nlohmann::json answer = nlohmann::json::parse(body, nullptr, false);
    if (answer.is_discarded() || !answer.is_object())
        throw Error(context_ + ": the answer is not a JSON object (" + std::to_string(body.size()) +
                    " bytes: '" + printable(body) + "')");
    return answer;
}

const nlohmann::json* AnswerReader::member(const nlohmann::json& object, const std::string& path,
                                           const char* field) const {
    if (!object.is_object()) refuse(path, "is not an object");
    const auto found = object.find(field);
    return found == object.end() || found->is_null() ? nullptr : &*found;
}

std::int64_t AnswerReader::integer(const nlohmann::json& object, const std::string& path, const char* field,
                                   bool required) const {
    const nlohmann::json* value = member(object, path, field);
    if (value == nullptr) {
        if (required) refuse(joined(path, field), "is missing");
        return 0;
    }
    if (value->is_number_integer()) {
        if (value->is_number_unsigned() && value->get<std::uint64_t>() > static_cast<std::uint64_t>(INT64_MAX))
            refuse(joined(path, field), "is out of range");
        return value->get<std::int64_t>();
    }
    if (!value->is_string()) refuse(joined(path, field), "is not an integer");
    const std::string& text = value->get_ref<const std::string&>();
    std::int64_t number = 0;
    const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), number);
    if (text.empty() || error != std::errc() || end != text.data() + text.size())
        refuse(joined(path, field), "is not a decimal integer ('" + printable(text) + "')");
    return number;
}

std::string AnswerReader::bytes(const nlohmann::json& object, const std::string& path, const char* field) const {
    const nlohmann::json* value = member(object, path, field);
    if (value == nullptr) return {};
    if (!value->is_string()) refuse(joined(path, field), "is not a base64 string");
    auto decoded = base64_decode(value->get_ref<const std::string&>());
    if (!decoded) refuse(joined(path, field), "is not valid base64");
    return std::move(*decoded);
}

bool AnswerReader::boolean(const nlohmann::json& object, const std::string& path, const char* field) const {
    const nlohmann::json* value = member(object, path, field);
    if (value == nullptr) return false;
    if (!value->is_boolean()) refuse(joined(path, field), "is not a boolean");
    return value->get<bool>();
}

std::int64_t AnswerReader::header_revision(const nlohmann::json& answer, const std::string& path) const {
    const nlohmann::json* header = member(answer, path, "header");
    if (header == nullptr) refuse(joined(path, "header"), "is missing");
    if (!header->is_object()) refuse(joined(path, "header"), "is not an object");
    const std::int64_t revision = integer(*header, joined(path, "header"), "revision", true);
    if (revision < 1) refuse(joined(path, "header.revision"), "is below 1");
    return revision;
}

std::string AnswerReader::key(const nlohmann::json& object, const std::string& path) const {
    std::string key = bytes(object, path, "key");
    if (!key.starts_with(key_prefix_)) refuse(joined(path, "key"), "is outside the key prefix '" + key_prefix_ + "'");
    return key.substr(key_prefix_.size());
}

std::vector<StoreEntry> AnswerReader::entries(const nlohmann::json& answer) const {
    std::vector<StoreEntry> entries;
    const nlohmann::json* kvs = member(answer, "", "kvs");
    if (kvs == nullptr) return entries;
    if (!kvs->is_array()) refuse("kvs", "is not an array");
    entries.reserve(kvs->size());
    for (std::size_t index = 0; index < kvs->size(); ++index) {
        const std::string path = "kvs[" + std::to_string(index) + "]";
        const nlohmann::json& kv = (*kvs)[index];
        if (!kv.is_object()) refuse(path, "is not an object");
        StoreEntry entry;
        entry.key = key(kv, path);
        entry.value = bytes(kv, path, "value");
        entry.modified_revision = integer(kv, path, "mod_revision", true);
        if (entry.modified_revision < 1) refuse(path + ".mod_revision", "is below 1");
        entry.lease = integer(kv, path, "lease");
        entries.push_back(std::move(entry));
    }
    return entries;
}

WatchMessage read_watch_message(const AnswerReader& reader, std::string_view line) {
    const nlohmann::json message = reader.parse(line);
    if (const auto error = message.find("error"); error != message.end())
        throw Error(reader.context() + ": etcd ended the watch: " +
                    printable(error->is_object() && error->contains("message") && (*error)["message"].is_string()
                                  ? (*error)["message"].get<std::string>()
                                  : error->dump()));
    const auto result = message.find("result");
    if (result == message.end()) reader.refuse("result", "is missing");
    if (!result->is_object()) reader.refuse("result", "is not an object");
    WatchMessage watch;
    watch.revision = reader.header_revision(*result, "result");
    watch.created = reader.boolean(*result, "result", "created");
    watch.canceled = reader.boolean(*result, "result", "canceled");
    watch.compact_revision = reader.integer(*result, "result", "compact_revision");
    if (const auto reason = result->find("cancel_reason"); reason != result->end()) {
        if (!reason->is_string()) reader.refuse("result.cancel_reason", "is not a string");
        watch.cancel_reason = printable(reason->get<std::string>());
    }
    const auto events = result->find("events");
    if (events == result->end() || events->is_null()) return watch;
    if (!events->is_array()) reader.refuse("result.events", "is not an array");
    for (std::size_t index = 0; index < events->size(); ++index) {
        const std::string path = "result.events[" + std::to_string(index) + "]";
        const nlohmann::json& event = (*events)[index];
        if (!event.is_object()) reader.refuse(path, "is not an object");
        StoreEvent store_event;
        if (const auto type = event.find("type"); type != event.end() && !type->is_null()) {
            if (*type == "DELETE")
                store_event.kind = StoreEvent::Kind::removed;
            else if (*type != "PUT")
                reader.refuse(path + ".type", "is neither PUT nor DELETE");
        }
        const auto kv = event.find("kv");
        if (kv == event.end()) reader.refuse(path + ".kv", "is missing");
        if (!kv->is_object()) reader.refuse(path + ".kv", "is not an object");
        store_event.key = reader.key(*kv, path + ".kv");
        store_event.revision = reader.integer(*kv, path + ".kv", "mod_revision", true);
        if (store_event.revision < 1) reader.refuse(path + ".kv.mod_revision", "is below 1");
        if (!watch.events.empty() && store_event.revision < watch.events.back().revision)
            reader.refuse(path + ".kv.mod_revision", "goes back in time");
        if (store_event.kind == StoreEvent::Kind::put) {
            store_event.value = reader.bytes(*kv, path + ".kv", "value");
            store_event.lease = reader.integer(*kv, path + ".kv", "lease");
        }
        watch.events.push_back(std::move(store_event));
    }
    return watch;
}

std::string describe_refusal(unsigned status, std::string_view body) {
    const nlohmann::json answer = nlohmann::json::parse(body, nullptr, false);
    std::string text = "HTTP status " + std::to_string(status);
    if (answer.is_object()) {
        const auto message = answer.find("message");
        if (message != answer.end() && message->is_string()) text += ": " + printable(message->get<std::string>());
        const auto code = answer.find("code");
        if (code != answer.end() && code->is_number_integer()) text += " (code " + std::to_string(code->get<std::int64_t>()) + ")";
        return text;
    }
    return text + " (" + std::to_string(body.size()) + " bytes: '" + printable(body) + "')";
}

std::string prefix_range_end(std::string_view prefix) {
    std::string end(prefix);
    while (!end.empty() && static_cast<unsigned char>(end.back()) == 0xff) end.pop_back();
    if (end.empty()) return std::string(1, '\0');
    end.back() = static_cast<char>(static_cast<unsigned char>(end.back()) + 1);
    return end;
}

}  // namespace rdmachan::handshake
