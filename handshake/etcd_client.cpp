#include "handshake/etcd_client.hpp"

#include <algorithm>
#include <thread>

#include "handshake/connection.hpp"

namespace rdmachan::handshake {

HttpAnswer post_once(const EtcdAddress& address, const std::string& ca_file, const std::string& target,
                     std::string body, const std::string& token, StoreDeadline deadline) {
    auto answer = std::make_shared<HttpAnswer>();
    // Arguments by value: after a timeout the suspended coroutine outlives this call's locals
    // until the io_context below is destroyed.
    auto exchange = [](EtcdAddress address, std::string ca_file, std::string target, std::string body,
                       std::string token, std::shared_ptr<HttpAnswer> answer) -> Task<void> {
        HttpConnection connection(std::move(address), std::move(ca_file));
        co_await connection.connect();
        *answer = co_await connection.post(std::move(target), std::move(body), std::move(token));
    };
    asio::io_context io;
    if (!run_until(io, exchange(address, ca_file, target, std::move(body), token, answer), deadline))
        throw EtcdDeadlinePassed("");
    return std::move(*answer);
}

namespace {

// What went wrong before the final failure, for its message: etcd refusing connections, say,
// before the deadline passed.
std::string earlier(const std::string& last_failure) {
    return last_failure.empty() ? std::string() : " (earlier: " + last_failure + ")";
}

// One wording however the deadline is met: between attempts, or with one under way (the
// authentication, or the request itself).
[[noreturn]] void deadline_passed(const AnswerReader& reader, const std::string& under_way,
                                  const std::string& last_failure) {
    throw Error(reader.context() + ": no answer by the deadline" + (under_way.empty() ? "" : " " + under_way) +
                earlier(last_failure));
}

}  // namespace

bool refuses_token(const HttpAnswer& answer) {
    if (answer.status == 401) return true;
    // etcd's gateway answers an invalid token with gRPC code 16 (Unauthenticated) or the text.
    return answer.status != 200 && (answer.body.find("\"code\":16") != std::string::npos ||
                                    answer.body.find("invalid auth token") != std::string::npos);
}

EtcdClient::EtcdClient(EtcdSettings settings)
    : settings_(std::move(settings)), address_(parse_etcd_address(settings_.endpoint)) {
    if (settings_.user.empty() != settings_.password.empty())
        throw Error(address_.name + ": a user needs a password and a password a user");
}

std::string EtcdClient::context(const char* operation, std::string_view key) const {
    std::string text = address_.name + ": " + operation;
    if (!key.empty() || std::string_view(operation) != "grant") {
        text += " '";
        for (char character : key.substr(0, 200)) text += (character >= 0x20 && character < 0x7f) ? character : '?';
        text += "'";
    }
    return text;
}

nlohmann::json EtcdClient::call(const std::string& target, const nlohmann::json& request, const AnswerReader& reader,
                                StoreDeadline deadline) {
    std::chrono::milliseconds pause(20);
    std::string last_failure;
    bool token_refreshed = false;
    for (;;) {
        HttpAnswer answer;
        try {
            const std::string current = token(deadline);
            answer = post_once(address_, settings_.ca_file, target, request.dump(), current, deadline);
            if (refuses_token(answer) && !settings_.user.empty() && !token_refreshed) {
                forget_token(current);
                token_refreshed = true;
                continue;
            }
        } catch (const EtcdUnreachable& failure) {
            // etcd not up yet, or restarting: worth another try while the deadline allows.
            last_failure = failure.what();
            const auto now = std::chrono::steady_clock::now();
            if (now >= deadline) deadline_passed(reader, "", last_failure);
            std::this_thread::sleep_for(std::min<std::chrono::steady_clock::duration>(pause, deadline - now));
            pause = std::min(pause * 2, std::chrono::milliseconds(500));
            if (std::chrono::steady_clock::now() >= deadline) deadline_passed(reader, "", last_failure);
            continue;
        } catch (const EtcdDeadlinePassed& failure) {
            deadline_passed(reader, failure.what(), last_failure);
        } catch (const Error& failure) {
            throw Error(reader.context() + ": " + failure.what() + earlier(last_failure));
        }
        if (answer.status != 200) throw Error(reader.context() + ": etcd refused: " + describe_refusal(answer.status, answer.body));
        return reader.parse(answer.body);
    }
}

std::string EtcdClient::token(StoreDeadline deadline) {
    if (settings_.user.empty()) return {};
    {
        std::lock_guard lock(token_mutex_);
        if (!token_.empty()) return token_;
    }
    std::string fresh = authenticate(deadline);
    std::lock_guard lock(token_mutex_);
    token_ = fresh;
    return fresh;
}

void EtcdClient::forget_token(const std::string& refused) {
    std::lock_guard lock(token_mutex_);
    if (token_ == refused) token_.clear();
}

std::string EtcdClient::authenticate(StoreDeadline deadline) {
    const AnswerReader reader(address_.name + ": authenticate as '" + settings_.user + "'", "");
    const nlohmann::json request = {{"name", settings_.user}, {"password", settings_.password}};
    HttpAnswer answer;
    try {
        answer = post_once(address_, settings_.ca_file, "/v3/auth/authenticate", request.dump(), "", deadline);
    } catch (const EtcdUnreachable& failure) {
        // Kept apart: the caller tries again while its deadline allows (a watch, at once).
        throw EtcdUnreachable(reader.context() + ": " + failure.what());
    } catch (const EtcdDeadlinePassed&) {
        throw EtcdDeadlinePassed("while authenticating as '" + settings_.user + "'");
    } catch (const Error& failure) {
        throw Error(reader.context() + ": " + failure.what());
    }
    if (answer.status != 200) throw Error(reader.context() + ": etcd refused: " + describe_refusal(answer.status, answer.body));
    const nlohmann::json parsed = reader.parse(answer.body);
    const auto token = parsed.find("token");
    if (token == parsed.end()) reader.refuse("token", "is missing");
    if (!token->is_string() || token->get_ref<const std::string&>().empty()) reader.refuse("token", "is not a non-empty string");
    const std::string& text = token->get_ref<const std::string&>();
    // It goes into an HTTP header: nothing that could end the line or the header.
    if (text.size() > 4096 || std::any_of(text.begin(), text.end(), [](char c) { return c < 0x21 || c > 0x7e; }))
        reader.refuse("token", "holds characters a header cannot carry");
    return text;
}

}  // namespace rdmachan::handshake
