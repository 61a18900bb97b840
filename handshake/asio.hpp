// Boost.Asio with C++20 coroutines, included one way everywhere in handshake/.
#pragma once

#include <utility>  // Boost 1.74's awaitable.hpp uses std::exchange without including <utility>

// Boost 1.74 recognizes coroutines only in GCC and in clang's old experimental form; clang with
// libstdc++'s <coroutine> works the same way as GCC once told so.
#if defined(__clang__) && defined(__cpp_impl_coroutine) && !defined(BOOST_ASIO_HAS_CO_AWAIT)
#define BOOST_ASIO_HAS_CO_AWAIT 1
#define BOOST_ASIO_HAS_STD_COROUTINE 1
#endif

#include <boost/asio/awaitable.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/connect.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>

namespace rdmachan::handshake {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;
template <typename T>
using Task = asio::awaitable<T>;

}  // namespace rdmachan::handshake
