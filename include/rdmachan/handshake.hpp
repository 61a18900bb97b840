// The pairwise exchange for Channel, and the negotiation rules both exchanges share.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>

#include "rdmachan/endpoint.hpp"

namespace rdmachan {

struct PairwiseSettings {
    enum class Role { listen, connect };
    Role role = Role::listen;
    std::string address = "127.0.0.1";  // listen: the only address bound; connect: the host
    std::uint16_t port = 0;             // listen with 0: the system picks, see on_listening
    std::function<void(std::uint16_t)> on_listening;  // called once listening, with the port
    std::function<void()> on_connect_refused;  // connect: after each failed attempt, before the retry
    std::string token;                                // both sides prove it; never sent
    std::chrono::milliseconds timeout{30000};         // one deadline for the whole exchange
};

// Called by exchange_pairwise with the peer's endpoint once the peer has proven the job token;
// when it returns, this side is ready for the peer's requests (for a channel: its queue pair is
// in RTR). An exception from it ends the exchange on both sides: the peer is told its message.
using PairwiseReady = std::function<void(const Endpoint& theirs)>;

// Listens (accepting until one peer proves the token) or connects (retrying until the
// listener is up), then swaps endpoints. Throws rdmachan::Error naming the peer and the
// reason, or the deadline. With `make_ready`, neither side returns before both have run it:
// the listener runs it before it sends its endpoint, the connector before it confirms, so
// whatever either side sends once this returns finds the other ready (a request reaching a
// queue pair not yet in RTR is dropped and costs the sender its retries).
Endpoint exchange_pairwise(const PairwiseSettings& settings, const Endpoint& mine);
Endpoint exchange_pairwise(const PairwiseSettings& settings, const Endpoint& mine, const PairwiseReady& make_ready);

// The lowest of both sides' MTU and the local port's active MTU; throws on non-verbs sizes.
std::uint32_t negotiate_mtu(std::uint32_t local, std::uint32_t remote, std::uint32_t port_active);
std::uint32_t random_psn();         // 24 bits; these three from OpenSSL's generator
std::uint64_t random_dc_key();      // for a job that did not set one
std::uint64_t random_session_id();  // never 0
}  // namespace rdmachan
