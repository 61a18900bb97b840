// RC connection set-up as plain values: what each side publishes (RcEndpoint), what the local
// side chooses (ConnectionParameters), and the exact ibv_qp_attr + mask for INIT, RTR and RTS.
// Building the attributes is pure so the masks are unit-tested without a device.
#pragma once

#include <infiniband/verbs.h>

#include <cstdint>

#include "transport/verbs/port.hpp"

namespace rdmachan::verbs {

// What the peer needs from us (and we from it): the handshake carries it.
struct RcEndpoint {
    std::uint32_t qpn = 0;
    std::uint32_t psn = 0;  // 24 bits: the first PSN this side sends with
    std::uint16_t lid = 0;  // InfiniBand; 0 on RoCE
    Gid gid{};              // RoCE (and IB across subnets)
    std::uint32_t mtu = 0;  // bytes; the path MTU is the smaller of both sides' active MTU
};

// Local choices. No defaults for the port, MTU or PSN: they depend on the device and on the
// peer, so the caller passes them (a hard-coded port 1 / MTU 4096 / PSN 0 is a classic bug).
struct ConnectionParameters {
    std::uint8_t port_num = 0;        // required, from 1
    std::uint32_t path_mtu = 0;       // required, bytes (256..4096)
    std::uint32_t send_psn = 0;       // the local RcEndpoint::psn
    bool use_global_routing = false;  // RoCE: always (GIDs are mandatory); IB: across subnets
    std::uint8_t source_gid_index = 0;
    std::uint16_t pkey_index = 0;
    unsigned access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
                            IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;
    std::uint8_t hop_limit = 64;
    std::uint8_t traffic_class = 0;
    std::uint8_t service_level = 0;
    // IB spec encodings (ibv_modify_qp(3)): timeout 4.096 us * 2^timeout; rnr 7 = infinite
    // retries; min_rnr_timer 12 = 0.64 ms.
    std::uint8_t timeout = 14;
    std::uint8_t retry_count = 7;
    std::uint8_t rnr_retry = 7;
    std::uint8_t min_rnr_timer = 12;
    std::uint8_t max_read_atomic = 1;       // outstanding reads/atomics we initiate
    std::uint8_t max_dest_read_atomic = 1;  // outstanding reads/atomics we accept
};

struct QueuePairTransition {
    ibv_qp_attr attributes{};
    int mask = 0;
};

// Each throws VerbsError (EINVAL) naming the bad value: port 0, an MTU verbs cannot express,
// a PSN wider than 24 bits.
QueuePairTransition make_init_transition(const ConnectionParameters& parameters);
QueuePairTransition make_ready_to_receive_transition(const ConnectionParameters& parameters,
                                                     const RcEndpoint& remote);
QueuePairTransition make_ready_to_send_transition(const ConnectionParameters& parameters);

}  // namespace rdmachan::verbs
