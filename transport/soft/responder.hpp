// The responder: what the device does with a request that came for one of its RC QPs or DCTs.
// It finds the target (dropping a request for no QP, one not ready or connected elsewhere, or
// out of sequence, as hardware drops such packets), admits a DC request (DCT in RTR, its key, the
// initiator's PSN), checks the memory the request names against the translation tables,
// performs it, consumes a receive WQE for a send or a write with immediate, writes the responder
// CQE, and answers with ACK, RNR NAK or NAK. The target process never calls in: this runs on its
// device's progress thread (or a caller of progress()), under the device mutex.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "transport/soft/device_objects.hpp"
#include "transport/soft/wire.hpp"

namespace rdmachan::soft {

struct Connection;
class Answers;
class CompletionWriter;
class Device;
struct DeviceStatistics;
class MemoryTranslation;
class PublishedTable;

// What the responder asks of the device when a request breaks an RC QP (a receive it cannot fill
// or whose memory it may not write): the QP goes to ERR, its work flushed.
class ResponderFailures {
public:
    virtual void move_to_error(QueuePairContext& queue_pair, const char* why) = 0;

protected:
    ~ResponderFailures() = default;
};

class Responder {
public:
    using QueuePairTable = std::map<std::uint32_t, std::unique_ptr<QueuePairContext>>;

    // `receive_lock_held`: set while this device holds the receive lock between an answer and its
    // CQE, so that the CQE writers do not take it again (CompletionWriter reads the same flag).
    Responder(const Device& owner, const QueuePairTable& queue_pairs, const MemoryTranslation& translation,
              Answers& answers, CompletionWriter& completions, PublishedTable& published_table, bool& receive_lock_held,
              DeviceStatistics& statistics, ResponderFailures& failures)
        : owner_(owner),
          queue_pairs_(queue_pairs),
          translation_(translation),
          answers_(answers),
          completions_(completions),
          published_table_(published_table),
          receive_lock_held_(receive_lock_held),
          statistics_(statistics),
          failures_(failures) {}

    void handle_request(Connection& connection, const wire::Request& request, const std::uint8_t* payload,
                        std::uint32_t payload_length);

    // Test hook: hold_responder_completions() (device.hpp) holds a responder here, between its
    // answer and its CQE; nothing when it is off.
    static void hold_before_completion();

private:
    // The admission checks of a DCT: in RTR, the DC key, the initiator's PSN sequence.
    void handle_dc_request(Connection& connection, QueuePairContext& target, const wire::Request& request,
                           const std::uint8_t* payload, std::uint32_t payload_length);
    // Performs an admitted request on the responder QP or DCT; `expected_psn` advances when the
    // request is accepted (answered with ACK or NAK, not RNR).
    void perform_request(Connection& connection, QueuePairContext& queue_pair, const wire::Request& request,
                         const std::uint8_t* payload, std::uint32_t payload_length, std::uint32_t& expected_psn);

    // The next receive WQE of the QP's RQ or SRQ, translated, or nothing (receiver not ready).
    struct ReceiveBuffer {
        std::uint16_t wqe_counter = 0;
        std::vector<std::pair<std::uint8_t*, std::uint32_t>> segments;
        bool segments_as_posted = true;  // as InFlight::targets_as_posted
        bool valid = false;
        bool protection_error = false;
        std::uint64_t capacity = 0;
    };
    bool peek_receive(QueuePairContext& queue_pair, ReceiveBuffer& buffer);
    void consume_receive(QueuePairContext& queue_pair);

    const Device& owner_;
    const QueuePairTable& queue_pairs_;
    const MemoryTranslation& translation_;
    Answers& answers_;
    CompletionWriter& completions_;
    PublishedTable& published_table_;
    bool& receive_lock_held_;
    DeviceStatistics& statistics_;
    ResponderFailures& failures_;
};

}  // namespace rdmachan::soft
