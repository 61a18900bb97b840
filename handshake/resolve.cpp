#include "handshake/resolve.hpp"

#include <charconv>
#include <cstdint>

namespace rdmachan::handshake {

Task<std::vector<tcp::endpoint>> resolve(std::string host, std::string port) {
    std::uint16_t number = 0;
    const auto [end, parsed] = std::from_chars(port.data(), port.data() + port.size(), number);
    if (parsed == std::errc() && end == port.data() + port.size() && !port.empty()) {
        boost::system::error_code not_numeric;
        const asio::ip::address address = asio::ip::make_address(host, not_numeric);
        if (!not_numeric) co_return std::vector<tcp::endpoint>{tcp::endpoint(address, number)};
    }
    tcp::resolver resolver(co_await asio::this_coro::executor);
    const tcp::resolver::results_type results = co_await resolver.async_resolve(host, port, asio::use_awaitable);
    std::vector<tcp::endpoint> endpoints;
    for (const auto& entry : results) endpoints.push_back(entry.endpoint());
    co_return endpoints;
}

}  // namespace rdmachan::handshake
