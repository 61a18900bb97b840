// The responder's answers on their way out: each goes on the connection its request came on, or,
// for a request this device sent itself, into the loopback queue the progress thread reads.
// Answers leave in the order of their requests.
//
// Acknowledgement coalescing. An RC responder may answer several plain RDMA writes (no
// immediate) of one QP with one ACK of the last: an ACK of a PSN acknowledges every request
// before it (IB spec 9.7.5.1.1). While the device handles one connection's input (a read turn),
// the ACK of each plain write there replaces the one held for the same QP; another QP's ACK, any
// other answer, or the turn's end sends the held one first. Only to peers whose hello says they
// take coalesced ACKs (an older device gets one per write).
//
// While a caller of Device::progress() reads (caller_progress.cpp), a turn's held ACK is not sent
// at its end but deferred to the end of the caller's whole poll: the caller first sees what the
// frames wrote and can answer within the same exchange.
//
// Which ACK a connection holds is the connection's own (Connection::holds_acknowledgement); whose
// turn it is and which connections wait for the deferred send is this type's. Under the device
// mutex.
#pragma once

#include <array>
#include <cstdint>
#include <deque>
#include <vector>

#include "transport/soft/wire.hpp"

namespace rdmachan::soft {

struct Connection;
class PeerLinks;
struct DeviceStatistics;

// Frames this device sends to itself (requests of a QP connected to one of its own, and their
// answers), handled by the progress thread in order.
using LoopbackFrames = std::deque<std::vector<std::uint8_t>>;

class Answers {
public:
    // `gid` and `lid`: this device's address, which tells an answer to itself (set once the
    // device listens, before any request).
    Answers(PeerLinks& links, LoopbackFrames& loopback, DeviceStatistics& statistics, const std::array<std::uint8_t, 16>& gid,
            const std::uint16_t& lid)
        : links_(links), loopback_(loopback), statistics_(statistics), gid_(gid), lid_(lid) {}

    // Sends the answer, after the ACK the connection holds.
    void respond(Connection& connection, const wire::Response& response, const void* payload = nullptr,
                 std::uint32_t payload_length = 0);
    // The ACK of a plain RDMA write: held within the connection's read turn, else sent at once.
    void respond_coalescing(Connection& connection, const wire::Response& response);

    // A read turn of `connection` begins and ends: its held ACK goes at the end, or waits for
    // send_deferred while deferring.
    void begin_turn(Connection& connection) { turn_ = &connection; }
    void end_turn(Connection& connection);
    // Set while a caller of progress() reads.
    void set_deferring(bool deferring) { deferring_ = deferring; }
    // Sends the ACKs held past their turns.
    void send_deferred();
    // Forgets the deferred connections that closed (their ACKs go nowhere).
    void forget_closed();

private:
    void send_held(Connection& connection);

    PeerLinks& links_;
    LoopbackFrames& loopback_;
    DeviceStatistics& statistics_;
    const std::array<std::uint8_t, 16>& gid_;
    const std::uint16_t& lid_;
    Connection* turn_ = nullptr;  // only the connection being read holds its ACKs
    bool deferring_ = false;
    std::vector<Connection*> deferred_;
};

}  // namespace rdmachan::soft
