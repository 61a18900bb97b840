// rdmachan::asio's engine room (include rdmachan/asio.hpp, not this): the pending operations of
// one AsyncChannel or AsyncMultiChannel, and the loop that polls, arms and waits for them.
#pragma once

#include <unistd.h>

#include <array>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/associated_executor.hpp>
#include <boost/asio/dispatch.hpp>
#include <boost/asio/error.hpp>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/version.hpp>
#if BOOST_VERSION >= 107700
#include <boost/asio/associated_cancellation_slot.hpp>
#include <boost/asio/cancellation_type.hpp>
#endif

#include "rdmachan/channel.hpp"
#include "rdmachan/multi_channel.hpp"

namespace rdmachan::asio::detail {

// Memory for operations: blocks of the sizes freed last, kept for the next operation of the
// same handler type.
class OperationMemory {
public:
    OperationMemory() = default;
    OperationMemory(const OperationMemory&) = delete;
    OperationMemory& operator=(const OperationMemory&) = delete;
    ~OperationMemory() {
        for (std::size_t i = 0; i < count_; ++i) ::operator delete(blocks_[i].memory);
    }
    void* allocate(std::size_t size) {
        for (std::size_t i = 0; i < count_; ++i) {
            if (blocks_[i].size != size) continue;
            void* memory = blocks_[i].memory;
            blocks_[i] = blocks_[--count_];
            return memory;
        }
        return ::operator new(size);
    }
    void deallocate(void* memory, std::size_t size) noexcept {
        if (count_ == blocks_.size()) {
            ::operator delete(memory);
            return;
        }
        blocks_[count_++] = {memory, size};
    }

private:
    struct Block {
        void* memory = nullptr;
        std::size_t size = 0;
    };
    std::array<Block, 8> blocks_{};
    std::size_t count_ = 0;
};

// Memory for the descriptor's (or the timer's) wait, one at a time, as that wait's associated
// allocator: Boost.Asio 1.74 recycles one block per thread for every operation, which the wait
// and a completion posted beside it would take turns to allocate. Apart from OperationMemory
// because Asio frees it on the thread that completed the wait, before the handler runs on the
// AsyncChannel's executor; that handler starts the next wait, so the two never meet.
class WaitMemory {
public:
    WaitMemory() = default;
    WaitMemory(const WaitMemory&) = delete;
    WaitMemory& operator=(const WaitMemory&) = delete;
    ~WaitMemory() { ::operator delete(block_); }
    void* allocate(std::size_t size) {
        if (block_ != nullptr && size_ == size) return std::exchange(block_, nullptr);
        return ::operator new(size);
    }
    void deallocate(void* memory, std::size_t size) noexcept {
        if (block_ != nullptr) {
            ::operator delete(memory);
            return;
        }
        block_ = memory;
        size_ = size;
    }

private:
    void* block_ = nullptr;
    std::size_t size_ = 0;
};

template <typename T>
class WaitAllocator {
public:
    using value_type = T;
    explicit WaitAllocator(WaitMemory& memory) noexcept : memory_(&memory) {}
    template <typename U>
    WaitAllocator(const WaitAllocator<U>& other) noexcept : memory_(other.memory()) {}
    T* allocate(std::size_t count) { return static_cast<T*>(memory_->allocate(count * sizeof(T))); }
    void deallocate(T* pointer, std::size_t count) noexcept { memory_->deallocate(pointer, count * sizeof(T)); }
    WaitMemory* memory() const noexcept { return memory_; }
    template <typename U>
    bool operator==(const WaitAllocator<U>& other) const noexcept {
        return memory_ == other.memory();
    }

private:
    WaitMemory* memory_;
};

class CoreBase;

// One pending asynchronous operation, linked into its AsyncChannel's list.
class PendingOperation {
public:
    PendingOperation* previous = nullptr;
    PendingOperation* next = nullptr;
    bool linked = false;
    // Polls the work once; true when its result is there (kept until complete()).
    virtual bool poll() = 0;
    // Frees the operation and hands its result to the handler through the handler's executor:
    // dispatch (it may run here) or post (it never does; an initiating function must not).
    virtual void complete(bool may_run_here) = 0;
    // Frees the operation, leaves its work with the core (still posted), and posts the handler
    // with operation_aborted.
    virtual void abort(CoreBase& core) = 0;

protected:
    ~PendingOperation() = default;
};

// What operations need of their AsyncChannel, whatever its channel type.
class CoreBase {
public:
    virtual ~CoreBase() = default;
    virtual void park(PendingWork work) = 0;
    virtual void park(PendingMultiWork work) = 0;
    virtual WorkResult cancelled(Operation operation, std::optional<std::uint32_t> peer) = 0;
    virtual MultiResult cancelled(const PendingMultiWork& work) = 0;
    OperationMemory& memory() { return memory_; }

    // The operation's wait is given up (cancel(), a cancellation slot): its handler gets
    // operation_aborted; an operation already completing is left to complete.
    void cancel(PendingOperation& operation) {
        if (!operation.linked) return;
        unlink(operation);
        operation.abort(*this);
        if (head_ == nullptr) stop_waiting();
    }

protected:
    void link(PendingOperation& operation) {
        operation.previous = tail_;
        operation.next = nullptr;
        (tail_ != nullptr ? tail_->next : head_) = &operation;
        tail_ = &operation;
        operation.linked = true;
    }
    void unlink(PendingOperation& operation) {
        (operation.previous != nullptr ? operation.previous->next : head_) = operation.next;
        (operation.next != nullptr ? operation.next->previous : tail_) = operation.previous;
        operation.linked = false;
    }
    virtual void stop_waiting() = 0;

    OperationMemory memory_;
    PendingOperation* head_ = nullptr;
    PendingOperation* tail_ = nullptr;
};

template <typename Work>
using ResultOf = std::conditional_t<std::is_same_v<Work, PendingMultiWork>, MultiResult, WorkResult>;

#if BOOST_VERSION >= 107700
// Installed in the handler's cancellation slot: terminal and partial cancellation give up the wait.
struct CancellationRequest {
    CancellationRequest(CoreBase* core, PendingOperation* operation) : core(core), operation(operation) {}
    CoreBase* core;
    PendingOperation* operation;
    void operator()(boost::asio::cancellation_type_t type) const {
        constexpr auto accepted = boost::asio::cancellation_type::terminal | boost::asio::cancellation_type::partial;
        if ((type & accepted) != boost::asio::cancellation_type::none) core->cancel(*operation);
    }
};
#endif

template <typename Handler, typename Work>
class WorkOperation final : public PendingOperation {
public:
    using Result = ResultOf<Work>;
    using HandlerExecutor = boost::asio::associated_executor_t<Handler, boost::asio::any_io_executor>;

    WorkOperation(Handler&& handler, Work&& work, std::optional<std::uint32_t> peer, CoreBase& core,
                  const boost::asio::any_io_executor& io)
        : handler_(std::move(handler)),
          guard_(boost::asio::get_associated_executor(handler_, io)),
          work_(std::move(work)),
          peer_(peer),
          core_(core) {
#if BOOST_VERSION >= 107700
        auto slot = boost::asio::get_associated_cancellation_slot(handler_);
        if (slot.is_connected()) slot.template emplace<CancellationRequest>(&core, this);
#endif
    }

    bool poll() override {
        result_ = work_.poll();
        return result_.has_value();
    }

    void complete(bool may_run_here) override { finish({}, std::move(*result_), may_run_here); }

    void abort(CoreBase& core) override {
        Result result = cancelled(core);
        core.park(std::move(work_));
        finish(boost::asio::error::operation_aborted, std::move(result), false);
    }

private:
    Result cancelled(CoreBase& core) {
        if constexpr (std::is_same_v<Work, PendingMultiWork>) {
            return core.cancelled(work_);
        } else {
            return core.cancelled(work_.operation(), peer_);
        }
    }

    // The memory is freed before the handler runs, so that the handler's next operation can
    // take it.
    void finish(boost::system::error_code error, Result result, bool may_run_here) {
#if BOOST_VERSION >= 107700
        boost::asio::get_associated_cancellation_slot(handler_).clear();
#endif
        Handler handler(std::move(handler_));
        boost::asio::executor_work_guard<HandlerExecutor> guard(std::move(guard_));
        OperationMemory& memory = core_.memory();
        this->~WorkOperation();
        memory.deallocate(this, sizeof(WorkOperation));
        auto call = [handler = std::move(handler), error, result = std::move(result)]() mutable {
            std::move(handler)(error, std::move(result));
        };
        if (may_run_here) {
            boost::asio::dispatch(guard.get_executor(), std::move(call));
        } else {
            boost::asio::post(guard.get_executor(), std::move(call));
        }
    }

    Handler handler_;
    boost::asio::executor_work_guard<HandlerExecutor> guard_;
    Work work_;
    std::optional<Result> result_;
    std::optional<std::uint32_t> peer_;
    CoreBase& core_;
};

// An AsyncChannel's state, where its operations and the descriptor's handlers find it: on the
// heap, so the AsyncChannel can move, and kept by those handlers until they have run.
template <typename ChannelType>
class Core final : public CoreBase, public std::enable_shared_from_this<Core<ChannelType>> {
public:
    Core(const boost::asio::any_io_executor& executor, ChannelType channel)
        : channel_(std::move(channel)), descriptor_(executor), timer_(executor) {
        const int handle = channel_->native_handle();
        if (handle < 0) return;
        const int duplicate = ::dup(handle);  // the channel keeps its own; Asio closes this one
        if (duplicate < 0) throw Error(std::string("rdmachan::asio: dup of the completion descriptor: ") + std::strerror(errno));
        boost::system::error_code error;
        descriptor_.assign(duplicate, error);
        if (error) {
            ::close(duplicate);
            throw Error("rdmachan::asio: the completion descriptor in the io_context: " + error.message());
        }
        events_ = true;
    }
    ~Core() override { close(); }

    ChannelType& channel() {
        if (!channel_.has_value()) throw Error("rdmachan::asio: the channel was closed");
        return *channel_;
    }
    boost::asio::any_io_executor executor() { return descriptor_.get_executor(); }

    template <typename Work, typename Handler>
    void start(Handler&& handler, Work work, std::optional<std::uint32_t> peer = std::nullopt) {
        if constexpr (std::is_same_v<Work, PendingMultiWork>) {
            if (work.size() == 0) {  // no shares, nothing posted: complete as wait() would
                boost::asio::post(boost::asio::get_associated_executor(handler, executor()),
                                  [handler = std::move(handler)]() mutable {
                                      std::move(handler)(boost::system::error_code(), MultiResult());
                                  });
                return;
            }
        }
        using Operation = WorkOperation<std::decay_t<Handler>, Work>;
        static_assert(alignof(Operation) <= __STDCPP_DEFAULT_NEW_ALIGNMENT__);
        void* memory = memory_.allocate(sizeof(Operation));
        Operation* operation = nullptr;
        try {
            operation = new (memory) Operation(std::move(handler), std::move(work), peer, *this, executor());
        } catch (...) {
            memory_.deallocate(memory, sizeof(Operation));
            throw;
        }
        link(*operation);
        pump(false);
    }

    void cancel_all() {
        while (head_ != nullptr) cancel(*head_);
    }

    // The AsyncChannel goes: abort what is pending, take or fail the work, destroy the channel.
    void close() {
        if (closed_) return;
        closed_ = true;
        while (head_ != nullptr) {
            PendingOperation& operation = *head_;
            unlink(operation);
            operation.abort(*this);
        }
        for (PendingWork& work : parked_) {
            if (work.pending()) (void)work.flush();
        }
        for (PendingMultiWork& work : parked_multi_) (void)work.flush();
        parked_.clear();
        parked_multi_.clear();
        boost::system::error_code ignored;
        descriptor_.close(ignored);
        timer_.cancel();
        channel_.reset();
    }

    void park(PendingWork work) override { parked_.push_back(std::move(work)); }
    void park(PendingMultiWork work) override { parked_multi_.push_back(std::move(work)); }

    WorkResult cancelled(Operation operation, std::optional<std::uint32_t> peer) override {
        WorkError error;
        error.operation = operation;
        error.cancelled = true;
        error.peer = peer_name(peer);
        return WorkResult::failure(std::move(error));
    }

    MultiResult cancelled(const PendingMultiWork& work) override {
        std::vector<PeerResult> results;
        for (std::uint32_t peer : work.peers()) results.push_back({peer, cancelled(Operation::batch, peer)});
        return MultiResult(std::move(results));
    }

private:
    std::string peer_name(std::optional<std::uint32_t> peer) {
        if (!channel_.has_value()) return {};
        if constexpr (std::is_same_v<ChannelType, MultiChannel>) {
            return peer.has_value() ? channel_->peer_name(*peer) : std::string();
        } else {
            return channel_->peer();
        }
    }

    // Polls, arms and waits until every pending operation has completed; see the header's
    // comment for why a poll follows the arm.
    void pump(bool may_run_here) {
        PendingOperation* done = nullptr;
        PendingOperation* done_tail = nullptr;
        for (;;) {
            const bool progress = poll_all(done, done_tail);
            if (head_ == nullptr) {
                stop_waiting();
                break;
            }
            if (!events_) {
                wait_on_timer();
                break;
            }
            if (!channel_->arm()) {
                if (progress || poll_all(done, done_tail)) continue;
                poll_again_later();  // a completion none of these takes is waiting
                break;
            }
            wait_on_descriptor();
            if (!poll_all(done, done_tail)) break;
        }
        // Handlers last: one may start operations or destroy the AsyncChannel.
        while (done != nullptr) {
            PendingOperation* operation = done;
            done = operation->next;
            operation->complete(may_run_here);
        }
    }

    bool poll_all(PendingOperation*& done, PendingOperation*& done_tail) {
        bool progress = false;
        for (PendingOperation* operation = head_; operation != nullptr;) {
            PendingOperation* next = operation->next;
            if (operation->poll()) {
                unlink(*operation);
                operation->next = nullptr;
                (done_tail != nullptr ? done_tail->next : done) = operation;
                done_tail = operation;
                progress = true;
            }
            operation = next;
        }
        // Cancelled work: its completion is taken when it comes, and then forgotten.
        for (std::size_t i = 0; i < parked_.size();) {
            if (parked_[i].poll().has_value()) {
                parked_[i] = std::move(parked_.back());
                parked_.pop_back();
                progress = true;
            } else {
                ++i;
            }
        }
        for (std::size_t i = 0; i < parked_multi_.size();) {
            if (parked_multi_[i].poll().has_value()) {
                parked_multi_[i] = std::move(parked_multi_.back());
                parked_multi_.pop_back();
                progress = true;
            } else {
                ++i;
            }
        }
        return progress;
    }

    // The handler of the descriptor's and the timer's waits. It keeps the core, and so its
    // memory, alive: Asio frees an operation's memory through a copy of its handler.
    struct Woken {
        using allocator_type = WaitAllocator<void>;
        std::shared_ptr<Core> core;
        bool Core::*flag;
        allocator_type get_allocator() const noexcept { return allocator_type(core->wait_memory_); }
        void operator()(const boost::system::error_code&) const {
            core.get()->*flag = false;
            if (!core->closed_) core->pump(true);
        }
    };

    void wait_on_descriptor() {
        if (waiting_) return;
        waiting_ = true;
        descriptor_.async_wait(boost::asio::posix::stream_descriptor::wait_read, Woken{this->shared_from_this(), &Core::waiting_});
    }

    // Nothing pending: a wait left queued would keep io_context::run() from returning.
    void stop_waiting() override {
        if (!waiting_) return;
        boost::system::error_code ignored;
        descriptor_.cancel(ignored);
    }

    void wait_on_timer() {
        if (timing_) return;
        timing_ = true;
        timer_.expires_after(std::chrono::microseconds(50));
        timer_.async_wait(Woken{this->shared_from_this(), &Core::timing_});
    }

    void poll_again_later() {
        if (retrying_) return;
        retrying_ = true;
        boost::asio::post(executor(), [core = this->shared_from_this()] {
            core->retrying_ = false;
            if (!core->closed_) core->pump(true);
        });
    }

    WaitMemory wait_memory_;  // declared first: destroyed after the waits that use it
    std::optional<ChannelType> channel_;
    boost::asio::posix::stream_descriptor descriptor_;
    boost::asio::steady_timer timer_;
    std::vector<PendingWork> parked_;
    std::vector<PendingMultiWork> parked_multi_;
    bool events_ = false;
    bool waiting_ = false;
    bool timing_ = false;
    bool retrying_ = false;
    bool closed_ = false;
};

}  // namespace rdmachan::asio::detail
