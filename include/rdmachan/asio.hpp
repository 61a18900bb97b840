// Boost.Asio for Channel and MultiChannel: every operation as an asynchronous operation that
// any completion token completes (a callback, use_future, use_awaitable, deferred), driven by
// an io_context through the channel's completion events. Header-only and optional: the library
// is built without it; include it where Boost.Asio 1.74 or later is available.
//
//   boost::asio::io_context io;
//   rdmachan::asio::AsyncChannel channel(io, std::move(connected));  // owns the channel from now on
//   boost::asio::co_spawn(io, [&]() -> boost::asio::awaitable<void> {
//       rdmachan::WorkResult sent = co_await channel.async_send(region.slice(0, 64), boost::asio::use_awaitable);
//       if (!sent) std::puts(sent.error().message().c_str());  // names the operation, peer and status
//   }, boost::asio::detached);
//   io.run();
//
// Completion signature: void(boost::system::error_code, WorkResult), or MultiResult for the
// multi-peer operations and PendingMultiWork. The error_code is set only when the wait was given
// up: boost::asio::error::operation_aborted, after a cancellation or when the AsyncChannel was
// destroyed (the result is then a failure whose error says `cancelled`). What the RDMA operation
// did, a dead peer, an access error or the deadline included, is a completed wait: the error_code
// is clear and the result carries the error, naming the peer, as everywhere in the data path.
// So `co_await` (use_awaitable) returns the WorkResult and throws boost::system::system_error
// only for operation_aborted; use_future gives a std::future<WorkResult>.
//
// What drives it: one posix::stream_descriptor per AsyncChannel over a duplicate of the
// channel's native_handle(), shared by all its operations. When an operation starts, or the
// descriptor becomes readable, every pending operation is polled once, the channel is armed,
// and the descriptor waited for (async_wait, wait_read); a completion found by the poll after
// the arm is delivered at once, so an event taken by another thread of the io_context before
// the wait was queued is not lost. The io_context runs anything else beside it; handlers run
// on their associated executors (by default the AsyncChannel's), never on a thread of the
// library. On a device without completion events (native_handle() -1) a 50 us timer polls.
//
// Each async_ call posts its work at once, as channel().post_... would (so arguments the channel
// refuses throw rdmachan::Error there, as everywhere in the library), then waits for it
// asynchronously: the wait starts at the call for a callback or use_future, at co_await for
// use_awaitable, when launched for deferred. An awaitable or deferred operation dropped without
// being awaited is a PendingWork dropped: it waits for its completion (channel.hpp).
//
// Cancellation. Work posted to a NIC cannot be taken back: a cancelled operation stays posted,
// and the AsyncChannel keeps it and takes its completion when it comes (the device may still
// read or write the memory until then; a cancelled receive consumes the next message the peer
// sends). The handler gets operation_aborted at once, so the channel stays usable for the next
// operations. cancel() does this for every pending operation (every Boost version); with Boost
// 1.77 or later each operation also follows its handler's cancellation slot, for terminal and
// partial cancellation (e.g. `co_await (op || timer.async_wait(use_awaitable))`, or
// bind_cancellation_slot). Total cancellation (no side effects) is not possible and is ignored.
// Destroying an AsyncChannel aborts what is pending the same way, takes each completion that is
// there and fails the queue pair of the rest (PendingWork::flush, as destroying a channel with
// work outstanding does), then destroys the channel: it neither blocks nor leaves the device
// holding memory.
//
// Boost versions: 1.74 to 1.76: callbacks, use_future, use_awaitable and cancel(). 1.77 and
// later: per-operation cancellation slots too. 1.80 and later: boost::asio::deferred works like
// any token (nothing here depends on it). The library uses Boost.Asio itself for its TCP
// exchanges (connect(), the rendezvous): build it with the Boost the application uses, as two
// versions in one process share symbols.
//
// Threading: as for the channel, one thread at a time. Run the io_context on one thread, or give
// the AsyncChannel a strand as its executor; cancel from that thread too. While asynchronous
// operations are pending, the channel's blocking calls and PendingWork::wait would take the
// completion events this descriptor waits for: use the asynchronous forms. A completion that
// nobody takes (work of your own left unpolled) keeps arm() from arming: the AsyncChannel then
// polls again after the io_context's other work instead of sleeping, until it is taken.
// Operations take their memory from a small cache of the AsyncChannel's, so repeated
// operations allocate nothing once warm (the handler's associated allocator is not used).
#pragma once

#include <utility>  // Boost 1.74's awaitable.hpp uses std::exchange without including <utility>

// Boost 1.74 recognizes C++20 coroutines only in GCC; clang with libstdc++'s <coroutine> works
// the same way once Asio is told so before it reads its configuration (as handshake/asio.hpp
// does): with clang and Boost 1.74, include this header before Boost.Asio's for use_awaitable,
// or define both macros on the command line, which no include order can undo.
#if defined(__clang__) && defined(__cpp_impl_coroutine) && !defined(BOOST_ASIO_HAS_CO_AWAIT)
#define BOOST_ASIO_HAS_CO_AWAIT 1
#define BOOST_ASIO_HAS_STD_COROUTINE 1
#endif

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <type_traits>
#include <utility>

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/async_result.hpp>
#include <boost/asio/execution_context.hpp>
#include <boost/version.hpp>

#include "rdmachan/channel.hpp"
#include "rdmachan/detail/asio_core.hpp"
#include "rdmachan/multi_channel.hpp"

namespace rdmachan::asio {

using WorkSignature = void(boost::system::error_code, WorkResult);
using MultiSignature = void(boost::system::error_code, MultiResult);

// Whether this Boost follows per-operation cancellation slots.
inline constexpr bool kCancellationSlots = BOOST_VERSION >= 107700;

namespace detail {

template <typename ChannelType>
class AsyncBase {
public:
    using executor_type = boost::asio::any_io_executor;

    AsyncBase(const executor_type& executor, ChannelType channel)
        : core_(std::make_shared<Core<ChannelType>>(executor, std::move(channel))) {}
    AsyncBase(AsyncBase&&) noexcept = default;
    AsyncBase& operator=(AsyncBase&& other) noexcept {
        if (this != &other) {
            if (core_ != nullptr) core_->close();
            core_ = std::move(other.core_);
        }
        return *this;
    }
    ~AsyncBase() {
        if (core_ != nullptr) core_->close();
    }

    executor_type get_executor() { return core().executor(); }
    // The channel, for everything else: registering memory, counters, the blocking calls while
    // nothing asynchronous is pending.
    ChannelType& channel() { return core().channel(); }

    // Gives up the wait of every pending operation: each handler gets operation_aborted; the
    // work stays posted and its completion is taken when it comes.
    void cancel() { core().cancel_all(); }

    // Waits for work posted on this channel (channel().post_...), taking the handle over.
    template <BOOST_ASIO_COMPLETION_TOKEN_FOR(WorkSignature) Token>
    auto async_wait(PendingWork work, Token&& token) {
        return wait_for<WorkSignature>(std::forward<Token>(token), std::move(work));
    }

protected:
    Core<ChannelType>& core() {
        if (core_ == nullptr) throw Error("rdmachan::asio: this AsyncChannel was moved from");
        return *core_;
    }
    // The asynchronous wait for work just posted.
    template <typename Signature, typename Token, typename Work>
    auto wait_for(Token&& token, Work work, std::optional<std::uint32_t> peer = std::nullopt) {
        return boost::asio::async_initiate<Token, Signature>(
            [state = &core()](auto handler, Work work, std::optional<std::uint32_t> peer) {
                state->start(std::move(handler), std::move(work), peer);
            },
            token, std::move(work), peer);
    }

private:
    std::shared_ptr<Core<ChannelType>> core_;
};

}  // namespace detail

// A Channel in an io_context: owns the channel, and its completion descriptor there.
class AsyncChannel : public detail::AsyncBase<Channel> {
public:
    AsyncChannel(const executor_type& executor, Channel channel) : AsyncBase(executor, std::move(channel)) {}
    template <typename Context, std::enable_if_t<std::is_convertible_v<Context&, boost::asio::execution_context&>, int> = 0>
    AsyncChannel(Context& context, Channel channel) : AsyncBase(context.get_executor(), std::move(channel)) {}

    template <BOOST_ASIO_COMPLETION_TOKEN_FOR(WorkSignature) Token>
    auto async_send(const LocalSlice& local, Token&& token) {
        return async_send(local, std::nullopt, std::forward<Token>(token));
    }
    template <BOOST_ASIO_COMPLETION_TOKEN_FOR(WorkSignature) Token>
    auto async_send(const LocalSlice& local, std::optional<std::uint32_t> immediate, Token&& token) {
        return wait_for<WorkSignature>(std::forward<Token>(token), channel().post_send(local, immediate));
    }
    template <BOOST_ASIO_COMPLETION_TOKEN_FOR(WorkSignature) Token>
    auto async_receive(const LocalSlice& local, Token&& token) {
        return wait_for<WorkSignature>(std::forward<Token>(token), channel().post_receive(local));
    }
    template <BOOST_ASIO_COMPLETION_TOKEN_FOR(WorkSignature) Token>
    auto async_write(const LocalSlice& local, const RemoteMemoryRegion& remote, Token&& token) {
        return async_write(local, remote, std::nullopt, std::forward<Token>(token));
    }
    template <BOOST_ASIO_COMPLETION_TOKEN_FOR(WorkSignature) Token>
    auto async_write(const LocalSlice& local, const RemoteMemoryRegion& remote, std::optional<std::uint32_t> immediate,
                     Token&& token) {
        return wait_for<WorkSignature>(std::forward<Token>(token), channel().post_write(local, remote, immediate));
    }
    template <BOOST_ASIO_COMPLETION_TOKEN_FOR(WorkSignature) Token>
    auto async_read(const LocalSlice& local, const RemoteMemoryRegion& remote, Token&& token) {
        return wait_for<WorkSignature>(std::forward<Token>(token), channel().post_read(local, remote));
    }
    template <BOOST_ASIO_COMPLETION_TOKEN_FOR(WorkSignature) Token>
    auto async_fetch_and_add(const LocalSlice& result, const RemoteMemoryRegion& remote, std::uint64_t add, Token&& token) {
        return wait_for<WorkSignature>(std::forward<Token>(token), channel().post_fetch_and_add(result, remote, add));
    }
    template <BOOST_ASIO_COMPLETION_TOKEN_FOR(WorkSignature) Token>
    auto async_compare_and_swap(const LocalSlice& result, const RemoteMemoryRegion& remote, std::uint64_t compare,
                                std::uint64_t swap, Token&& token) {
        return wait_for<WorkSignature>(std::forward<Token>(token), channel().post_compare_and_swap(result, remote, compare, swap));
    }
    template <BOOST_ASIO_COMPLETION_TOKEN_FOR(WorkSignature) Token>
    auto async_execute(const WorkBatch& batch, Token&& token) {
        return wait_for<WorkSignature>(std::forward<Token>(token), channel().post_batch(batch));
    }
};

// A MultiChannel in an io_context: owns it, and its completion descriptor (one for all peers).
class AsyncMultiChannel : public detail::AsyncBase<MultiChannel> {
public:
    AsyncMultiChannel(const executor_type& executor, MultiChannel channel) : AsyncBase(executor, std::move(channel)) {}
    template <typename Context, std::enable_if_t<std::is_convertible_v<Context&, boost::asio::execution_context&>, int> = 0>
    AsyncMultiChannel(Context& context, MultiChannel channel) : AsyncBase(context.get_executor(), std::move(channel)) {}

    using AsyncBase::async_wait;
    template <BOOST_ASIO_COMPLETION_TOKEN_FOR(MultiSignature) Token>
    auto async_wait(PendingMultiWork work, Token&& token) {
        return wait_for<MultiSignature>(std::forward<Token>(token), std::move(work));
    }

    // Per peer.
    template <BOOST_ASIO_COMPLETION_TOKEN_FOR(WorkSignature) Token>
    auto async_send(std::uint32_t peer, const LocalSlice& local, Token&& token) {
        return async_send(peer, local, std::nullopt, std::forward<Token>(token));
    }
    template <BOOST_ASIO_COMPLETION_TOKEN_FOR(WorkSignature) Token>
    auto async_send(std::uint32_t peer, const LocalSlice& local, std::optional<std::uint32_t> immediate, Token&& token) {
        return wait_for<WorkSignature>(std::forward<Token>(token), channel().post_send(peer, local, immediate), peer);
    }
    template <BOOST_ASIO_COMPLETION_TOKEN_FOR(WorkSignature) Token>
    auto async_receive(std::uint32_t peer, const LocalSlice& local, Token&& token) {
        return wait_for<WorkSignature>(std::forward<Token>(token), channel().post_receive(peer, local), peer);
    }
    template <BOOST_ASIO_COMPLETION_TOKEN_FOR(WorkSignature) Token>
    auto async_write(std::uint32_t peer, const LocalSlice& local, const RemoteMemoryRegion& remote, Token&& token) {
        return async_write(peer, local, remote, std::nullopt, std::forward<Token>(token));
    }
    template <BOOST_ASIO_COMPLETION_TOKEN_FOR(WorkSignature) Token>
    auto async_write(std::uint32_t peer, const LocalSlice& local, const RemoteMemoryRegion& remote,
                     std::optional<std::uint32_t> immediate, Token&& token) {
        return wait_for<WorkSignature>(std::forward<Token>(token), channel().post_write(peer, local, remote, immediate), peer);
    }
    template <BOOST_ASIO_COMPLETION_TOKEN_FOR(WorkSignature) Token>
    auto async_read(std::uint32_t peer, const LocalSlice& local, const RemoteMemoryRegion& remote, Token&& token) {
        return wait_for<WorkSignature>(std::forward<Token>(token), channel().post_read(peer, local, remote), peer);
    }
    template <BOOST_ASIO_COMPLETION_TOKEN_FOR(WorkSignature) Token>
    auto async_fetch_and_add(std::uint32_t peer, const LocalSlice& result, const RemoteMemoryRegion& remote, std::uint64_t add,
                             Token&& token) {
        return wait_for<WorkSignature>(std::forward<Token>(token), channel().post_fetch_and_add(peer, result, remote, add), peer);
    }
    template <BOOST_ASIO_COMPLETION_TOKEN_FOR(WorkSignature) Token>
    auto async_compare_and_swap(std::uint32_t peer, const LocalSlice& result, const RemoteMemoryRegion& remote,
                                std::uint64_t compare, std::uint64_t swap, Token&& token) {
        return wait_for<WorkSignature>(std::forward<Token>(token), channel().post_compare_and_swap(peer, result, remote, compare, swap), peer);
    }
    template <BOOST_ASIO_COMPLETION_TOKEN_FOR(WorkSignature) Token>
    auto async_execute(std::uint32_t peer, const WorkBatch& batch, Token&& token) {
        return wait_for<WorkSignature>(std::forward<Token>(token), channel().post_batch(peer, batch), peer);
    }

    // Across peers.
    template <BOOST_ASIO_COMPLETION_TOKEN_FOR(MultiSignature) Token>
    auto async_scatter_send(std::span<const PeerTransfer> shares, Token&& token) {
        return async_scatter_send(shares, std::nullopt, std::forward<Token>(token));
    }
    template <BOOST_ASIO_COMPLETION_TOKEN_FOR(MultiSignature) Token>
    auto async_scatter_send(std::span<const PeerTransfer> shares, std::optional<std::uint32_t> immediate, Token&& token) {
        return wait_for<MultiSignature>(std::forward<Token>(token), channel().post_scatter_send(shares, immediate));
    }
    template <BOOST_ASIO_COMPLETION_TOKEN_FOR(MultiSignature) Token>
    auto async_scatter_write(std::span<const PeerTransfer> shares, Token&& token) {
        return async_scatter_write(shares, std::nullopt, std::forward<Token>(token));
    }
    template <BOOST_ASIO_COMPLETION_TOKEN_FOR(MultiSignature) Token>
    auto async_scatter_write(std::span<const PeerTransfer> shares, std::optional<std::uint32_t> immediate, Token&& token) {
        return wait_for<MultiSignature>(std::forward<Token>(token), channel().post_scatter_write(shares, immediate));
    }
    template <BOOST_ASIO_COMPLETION_TOKEN_FOR(MultiSignature) Token>
    auto async_gather_receive(std::span<const PeerTransfer> shares, Token&& token) {
        return wait_for<MultiSignature>(std::forward<Token>(token), channel().post_gather_receive(shares));
    }
    template <BOOST_ASIO_COMPLETION_TOKEN_FOR(MultiSignature) Token>
    auto async_gather_read(std::span<const PeerTransfer> shares, Token&& token) {
        return wait_for<MultiSignature>(std::forward<Token>(token), channel().post_gather_read(shares));
    }
    template <BOOST_ASIO_COMPLETION_TOKEN_FOR(MultiSignature) Token>
    auto async_multicast_send(std::span<const std::uint32_t> peers, const LocalSlice& local, Token&& token) {
        return async_multicast_send(peers, local, std::nullopt, std::forward<Token>(token));
    }
    template <BOOST_ASIO_COMPLETION_TOKEN_FOR(MultiSignature) Token>
    auto async_multicast_send(std::span<const std::uint32_t> peers, const LocalSlice& local,
                              std::optional<std::uint32_t> immediate, Token&& token) {
        return wait_for<MultiSignature>(std::forward<Token>(token), channel().post_multicast_send(peers, local, immediate));
    }
};

}  // namespace rdmachan::asio
