// DC set-up as plain values: the exact ibv_qp_attr + mask for a DC initiator's
// INIT, RTR and RTS and a DC target's INIT and RTR (mlx5-facts.md §2, from UCX's
// uct_dc_mlx5_iface_dci_connect and the kernel's mlx5_ib_modify_dct). Unlike RC, neither side
// names a remote queue pair here: a DCI learns its target per work request (the address
// vector), and a DCT accepts any initiator holding its key. Pure, so the masks are unit-tested.
#pragma once

#include "transport/verbs/connection.hpp"

namespace rdmachan::verbs {

// DCI: INIT = STATE|PKEY_INDEX|PORT (no access flags: a DCI only sends).
QueuePairTransition make_dc_initiator_init_transition(const ConnectionParameters& parameters);
// DCI: RTR = STATE|PATH_MTU|AV; the AV carries only the port (ib_core wants a valid
// port_num) and the service level, routing comes with each work request.
QueuePairTransition make_dc_initiator_ready_to_receive_transition(const ConnectionParameters& parameters);
// DCI: RTS = STATE|SQ_PSN|TIMEOUT|RETRY_CNT|RNR_RETRY|MAX_QP_RD_ATOMIC.
QueuePairTransition make_dc_initiator_ready_to_send_transition(const ConnectionParameters& parameters);
// DCT: INIT = STATE|PKEY_INDEX|PORT|ACCESS_FLAGS.
QueuePairTransition make_dc_target_init_transition(const ConnectionParameters& parameters);
// DCT: RTR = STATE|MIN_RNR_TIMER|AV|PATH_MTU; the AV's GRH fields (source GID index, hop
// limit, traffic class) become the DCT's own addressing. A DCT has no RTS; its number exists
// only once it is in RTR.
QueuePairTransition make_dc_target_ready_to_receive_transition(const ConnectionParameters& parameters);

}  // namespace rdmachan::verbs
