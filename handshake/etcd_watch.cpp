#include "handshake/etcd_watch.hpp"

#include <algorithm>
#include <condition_variable>
#include <mutex>
#include <optional>
#include <thread>

#include "handshake/crypto.hpp"

namespace rdmachan::handshake {
namespace {

// A line of the stream longer than this is not a watch message of ours: the watch fails rather
// than buffer without end.
constexpr std::size_t line_size_cap = 64u << 20;
// How long one (re)connection may take before it is abandoned and tried again.
constexpr std::chrono::seconds attempt_limit(5);

class EtcdWatch final : public StoreWatch {
  public:
    EtcdWatch(std::shared_ptr<EtcdClient> client, std::string full_prefix, std::int64_t from_revision)
        : client_(std::move(client)),
          full_prefix_(std::move(full_prefix)),
          reader_(client_->context("watch", full_prefix_), client_->settings().key_prefix),
          next_revision_(from_revision) {}

    ~EtcdWatch() override {
        io_.stop();
        if (thread_.joinable()) thread_.join();
    }

    void start(StoreDeadline deadline) {
        asio::co_spawn(io_, run(), [this](std::exception_ptr failure) {
            if (failure) fail("the watch's thread stopped on an unexpected error");
        });
        thread_ = std::thread([this] { io_.run(); });
        std::unique_lock lock(mutex_);
        if (!started_.wait_until(lock, deadline, [this] { return established_ || failed_; })) {
            const std::string reason = last_failure_.empty() ? "no answer" : last_failure_;
            lock.unlock();
            throw Error(reader_.context() + ": not accepted by the deadline (" + reason + ")");
        }
        if (failed_) throw Error(last_failure_);
    }

    std::vector<StoreEvent> poll() override {
        std::lock_guard lock(mutex_);
        std::vector<StoreEvent> events;
        events.swap(events_);
        return events;
    }

    bool wait(std::chrono::steady_clock::time_point until) override {
        std::unique_lock lock(mutex_);
        return arrived_.wait_until(lock, until, [this] { return !events_.empty(); });
    }

  private:
    // The create request, from the revision after the last one delivered.
    std::string create_request() const {
        nlohmann::json create = {{"key", base64_encode(full_prefix_)},
                                 {"range_end", base64_encode(prefix_range_end(full_prefix_))}};
        if (next_revision_ > 0) create["start_revision"] = std::to_string(next_revision_);
        return nlohmann::json{{"create_request", create}}.dump();
    }

    void fail(const std::string& why) {
        std::lock_guard lock(mutex_);
        if (failed_) return;
        failed_ = true;
        last_failure_ = why;
        StoreEvent event;
        event.kind = StoreEvent::Kind::failed;
        event.failure = why;
        events_.push_back(std::move(event));
        started_.notify_all();
        arrived_.notify_all();
    }

    void note_transient(const std::string& why) {
        std::lock_guard lock(mutex_);
        last_failure_ = reader_.context() + ": " + why;
    }

    // Takes one message; false when the watch is over.
    bool take(const WatchMessage& message) {
        if (message.canceled || message.compact_revision > 0) {
            fail(reader_.context() + ": etcd cancelled the watch" +
                 (message.compact_revision > 0
                      ? " (revision " + std::to_string(next_revision_) + " was compacted; the oldest kept is " +
                            std::to_string(message.compact_revision) + ")"
                      : "") +
                 (message.cancel_reason.empty() ? "" : ": " + message.cancel_reason));
            return false;
        }
        std::lock_guard lock(mutex_);
        if (message.created) {
            // From "now": later reconnections resume after the revision etcd started at.
            if (next_revision_ == 0) next_revision_ = message.revision + 1;
            established_ = true;
            started_.notify_all();
        }
        for (const StoreEvent& event : message.events) {
            // A reconnection's first messages may repeat a revision already delivered.
            if (event.revision < next_revision_) continue;
            events_.push_back(event);
        }
        if (!message.events.empty()) {
            next_revision_ = std::max(next_revision_, message.events.back().revision + 1);
            arrived_.notify_all();
        }
        return true;
    }

    // One connection: its stream until it ends. Throws on failure.
    Task<void> follow_stream() {
        const std::string token = client_->token(std::chrono::steady_clock::now() + attempt_limit);
        HttpConnection connection(client_->address(), client_->settings().ca_file);
        // Connecting and etcd's answer to the request are bounded; the stream after it is not
        // (it is quiet while nothing changes; TCP keepalive notices a vanished peer).
        asio::steady_timer attempt_timer(co_await asio::this_coro::executor);
        attempt_timer.expires_after(attempt_limit);
        attempt_timer.async_wait([&connection](boost::system::error_code error) {
            if (!error) connection.close();
        });
        co_await connection.connect();
        std::string request;
        {
            std::lock_guard lock(mutex_);
            request = create_request();
        }
        const unsigned status = co_await connection.post_streamed("/v3/watch", request, token);
        if (status != 200) {
            std::string body;
            for (std::string bytes; body.size() < 4096 && !(bytes = co_await connection.read_some()).empty();)
                body += bytes;
            if (status == 401 || body.find("invalid auth token") != std::string::npos) {
                client_->forget_token(token);
                throw EtcdConnectionLost("etcd refused the token; authenticating again");
            }
            throw Error(reader_.context() + ": etcd refused: " + describe_refusal(status, body));
        }
        std::string pending;
        bool accepted = false;
        for (;;) {
            std::string bytes = co_await connection.read_some();
            if (bytes.empty()) throw EtcdConnectionLost("etcd ended the stream");
            pending += bytes;
            std::size_t start = 0;
            for (std::size_t end; (end = pending.find('\n', start)) != std::string::npos; start = end + 1) {
                const std::string_view line(pending.data() + start, end - start);
                if (line.find_first_not_of(" \r\t") == std::string_view::npos) continue;
                const WatchMessage message = read_watch_message(reader_, line);
                // A token etcd no longer knows (expired, or etcd restarted): etcd accepts the
                // stream and cancels the watch at once; authenticate again and resume.
                if (message.canceled && message.cancel_reason.find("invalid auth token") != std::string::npos) {
                    client_->forget_token(token);
                    throw EtcdConnectionLost("etcd refused the token; authenticating again");
                }
                if (!accepted) {
                    attempt_timer.cancel();
                    accepted = true;
                }
                if (!take(message)) co_return;
            }
            pending.erase(0, start);
            if (pending.size() > line_size_cap)
                throw Error(reader_.context() + ": a message of the stream is over " +
                            std::to_string(line_size_cap) + " bytes");
        }
    }

    Task<void> run() {
        auto executor = co_await asio::this_coro::executor;
        asio::steady_timer pause(executor);
        std::chrono::milliseconds backoff(20);
        for (;;) {
            try {
                co_await follow_stream();
                co_return;  // cancelled by etcd: fail() has said why
            } catch (const EtcdUnreachable& failure) {
                note_transient(failure.what());
            } catch (const EtcdConnectionLost& failure) {
                note_transient(failure.what());
                backoff = std::chrono::milliseconds(20);
            } catch (const EtcdDeadlinePassed& failure) {
                // etcd slow to answer an authentication (just restarted, loaded): tried again.
                note_transient(reader_.context() + ": no answer within " + std::to_string(attempt_limit.count()) + " s " +
                               failure.what());
            } catch (const Error& failure) {
                fail(failure.what());
                co_return;
            }
            pause.expires_after(backoff);
            co_await pause.async_wait(asio::use_awaitable);
            backoff = std::min(backoff * 2, std::chrono::milliseconds(500));
        }
    }

    std::shared_ptr<EtcdClient> client_;
    const std::string full_prefix_;
    const AnswerReader reader_;

    std::mutex mutex_;
    std::condition_variable started_;
    std::condition_variable arrived_;  // an event was queued for poll()
    std::int64_t next_revision_;  // under mutex_
    bool established_ = false;
    bool failed_ = false;
    std::string last_failure_;
    std::vector<StoreEvent> events_;

    // Last: destroyed first, with the coroutine it may still hold, while the members above live.
    asio::io_context io_;
    std::thread thread_;
};

}  // namespace

std::unique_ptr<StoreWatch> start_etcd_watch(std::shared_ptr<EtcdClient> client, std::string full_prefix,
                                             std::int64_t from_revision, StoreDeadline deadline) {
    auto watch = std::make_unique<EtcdWatch>(std::move(client), std::move(full_prefix), from_revision);
    watch->start(deadline);
    return watch;
}

}  // namespace rdmachan::handshake
