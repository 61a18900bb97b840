// Writes CQEs as the hardware writes them: requester, responder and error CQEs, data placed in
// the CQE for scatter-to-CQE, and, within a read turn, the CQEs for compressed CQs held and then
// written as compressed sessions where they can be (held_completions.hpp). A CQ whose receives a
// same-host peer may complete is written under the receive lock (published_table.hpp), unless
// the responder already holds it. Runs under the device mutex.
#pragma once

#include <cstdint>

#include "transport/soft/held_completions.hpp"
#include "transport/soft/published_table.hpp"
#include "transport/soft/same_host.hpp"

namespace rdmachan::soft {

class Device;
struct CompletionQueueContext;
struct DeviceStatistics;
struct QueuePairContext;

class CompletionWriter {
public:
    // `receive_lock_held`: the responder's mark that it holds the receive lock already.
    CompletionWriter(const Device& owner, DeviceStatistics& statistics, PublishedTable& table,
                     const bool& receive_lock_held);
    // On the TCP path (RDMACHAN_SOFT_TRANSPORT=tcp) no peer writes this device's CQEs.
    void set_transport_mode(TransportMode mode) { transport_mode_ = mode; }

    // `inline_data` (byte_count bytes), when not null, goes into the CQE (scatter-to-CQE).
    void write_requester(CompletionQueueContext& cq, const QueuePairContext& queue_pair, std::uint16_t wqe_counter,
                         std::uint8_t wqe_opcode, std::uint32_t byte_count, const std::uint8_t* inline_data = nullptr);
    void write_error(CompletionQueueContext& cq, const QueuePairContext& queue_pair, bool requester,
                     std::uint16_t wqe_counter, std::uint8_t wqe_opcode, std::uint8_t syndrome);
    void write_responder(CompletionQueueContext& cq, const QueuePairContext& queue_pair, std::uint8_t cqe_opcode,
                         std::uint16_t wqe_counter, std::uint32_t byte_count, std::uint32_t immediate,
                         std::uint32_t source_qpn, std::uint16_t source_lid, bool global_route, bool solicited,
                         const std::uint8_t* inline_data = nullptr);
    // Scatter-to-CQE, as a ConnectX does it for a QP created with it: whether `length` bytes
    // (a received send, a read's or an atomic's answer) go into a CQE of `cq` rather than into
    // the WQE's buffers (up to 32 bytes in a 64-byte CQE, 64 in a 128-byte one).
    static bool fits_in_cqe(const CompletionQueueContext& cq, std::uint32_t length);

    // A read turn: the CQEs for compressed CQs written meanwhile are held. begin_turn returns
    // whether this call opened the turn (a turn may be open already); end_turn(that) writes what
    // was held and closes it.
    bool begin_turn();
    void end_turn(bool began);

private:
    std::uint8_t* claim(CompletionQueueContext& cq);
    void publish(CompletionQueueContext& cq, std::uint8_t* cqe64, std::uint8_t cqe_opcode, bool solicited,
                 std::uint8_t format = 0);
    // Where a CQE for `cq` is built: a held slot during a read turn for a compressed CQ
    // (`held` set), else the ring's next entry (nullptr: the CQ overran). finish() publishes the
    // latter.
    std::uint8_t* begin(CompletionQueueContext& cq, std::uint8_t cqe_opcode, bool solicited, bool& held,
                        bool may_hold = true);
    void finish(CompletionQueueContext& cq, std::uint8_t* cqe64, std::uint8_t cqe_opcode, bool solicited, bool held,
                std::uint8_t format = 0);
    // Puts scatter-to-CQE data into the CQE being written, over what the first 32 bytes of a
    // 64-byte one held, or in the 64 bytes before the mlx5_cqe64 of a 128-byte one. Returns the
    // CQE's format (1 or 2).
    static std::uint8_t place_in_cqe(const CompletionQueueContext& cq, std::uint8_t* cqe64, const std::uint8_t* data,
                                     std::uint32_t length);
    // Writes the CQEs held in this turn, runs that can as compressed sessions.
    void write_held();
    // Whether a same-host peer may write CQEs into `cq` (a receive CQ published for zero-hop
    // receives), which no device on the TCP path only lets happen.
    bool peers_may_write(const CompletionQueueContext& cq) const;

    const Device& owner_;
    DeviceStatistics& statistics_;
    PublishedTable& table_;
    const bool& receive_lock_held_;
    TransportMode transport_mode_ = TransportMode::automatic;
    HeldCompletions held_;
};

}  // namespace rdmachan::soft
