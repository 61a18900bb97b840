// Acknowledgement coalescing on the software device. An RC responder may answer several plain
// RDMA writes (no immediate) of one QP with one ACK of the last: an ACK of a PSN acknowledges
// every request before it. While the device handles one connection's input (a read turn), the
// ACK of each plain write there replaces the one held for the same QP; another QP's ACK, any
// other answer, or the turn's end sends the held one first, so answers leave in the order of
// their requests. Only to peers whose hello says they take coalesced ACKs (an older device gets
// one per write).
//
// While a caller of Device::progress() reads (caller_progress.cpp), a turn's held ACK is not sent
// at its end but deferred to the end of the caller's whole poll: the caller first sees what the
// frames wrote and can answer within the same exchange.
//
// The per-connection half (whether one is held, and which) is the connection's own
// (Connection::holds_acknowledgement); this is the device's half: whose turn it is, and which
// connections wait for the deferred send. Under the device mutex.
#pragma once

#include <algorithm>
#include <vector>

namespace rdmachan::soft {

struct Connection;

class HeldAcknowledgements {
  public:
    void begin_turn(Connection& connection) { turn_ = &connection; }
    void end_turn() { turn_ = nullptr; }
    // Only the connection being read holds its ACKs.
    bool in_turn(const Connection& connection) const { return turn_ == &connection; }

    // Set while a caller of progress() reads: a turn's held ACK waits for send_deferred.
    void set_deferring(bool deferring) { deferring_ = deferring; }
    bool deferring() const { return deferring_; }
    void defer(Connection& connection) {
        if (std::find(deferred_.begin(), deferred_.end(), &connection) == deferred_.end()) {
            deferred_.push_back(&connection);
        }
    }
    // Hands every deferred connection to `send` (which sends its held ACK), then forgets them.
    template <typename Send>
    void send_deferred(Send&& send) {
        for (Connection* connection : deferred_) send(*connection);
        deferred_.clear();
    }
    // Forgets the deferred connections `closed` says were closed (their ACKs go nowhere).
    template <typename Closed>
    void forget(Closed&& closed) {
        std::erase_if(deferred_, [&](const Connection* connection) { return closed(*connection); });
    }

  private:
    Connection* turn_ = nullptr;
    bool deferring_ = false;
    std::vector<Connection*> deferred_;
};

}  // namespace rdmachan::soft
