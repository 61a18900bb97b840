// CQE compression on the software device. While the progress thread handles one connection's
// input (a read turn), the CQEs it writes into a CQ created for compression are held back; at the
// turn's end they are written as a ConnectX with CQE compression writes what completes together:
// a run of successful CQEs of one QP that share every field a mini CQE does not carry becomes one
// session (a title CQE and arrays of 8-byte mini CQEs, the layout transport/mlx5/
// compressed_session.hpp decodes), anything else a plain CQE, in the order they completed.
//
// What is held: requester CQEs and responder CQEs of a send, a send with immediate or a write
// with immediate, in a CQ created compressed that no same-host peer may write: a receive CQ a
// peer's zero-hop receives complete into is written at once, as the receive it completes is
// consumed, under the receive lock (a CQE held past that lock could fall behind a peer's CQE of
// a later receive). On the TCP path no peer writes any CQ. What never joins a session: an error CQE, a CQE that
// asks for a solicited event, a CQE of another QP or opcode, a responder CQE whose other fields
// differ (immediate, source QP, LID) or whose WQE counter is not the next. A session holds at
// most kMaxSession CQEs (a choice here; the decoder takes any size the ring holds). Mini CQEs
// of a responder carry zeros where a ConnectX writes the RX hash or checksum: the device has
// neither, and no ibv_wc field comes from those bytes.
//
// A ConnectX also leaves CQEs uncompressed when the consumer keeps up; here a CQE written outside
// a read turn (a zero-hop completion, a timer's error, a flush) is always plain.
#pragma once

#include <cstdint>
#include <vector>

#include "transport/mlx5/wqe_layout.hpp"

namespace rdmachan::soft {

struct CompletionQueueContext;
struct CompletionRingView;

struct HeldCompletion {
    CompletionQueueContext* cq = nullptr;
    std::uint8_t cqe[mlx5::kCqeSize64] = {};  // the mlx5_cqe64, op_own not yet written
    std::uint8_t cqe_opcode = 0;
    bool solicited = false;
};

class HeldCompletions {
public:
    static constexpr std::uint32_t kMaxSession = 64;
    // At most this many are held: one more writes them all first (a turn holds no more memory).
    static constexpr std::size_t kCapacity = 256;

    HeldCompletions() { held_.reserve(kCapacity); }

    void begin_turn() { turn_open_ = true; }
    bool turn_open() const { return turn_open_; }
    bool full() const { return held_.size() >= kCapacity; }
    // A slot for the next CQE, its bytes cleared; the caller fills it (full() is false).
    HeldCompletion& add(CompletionQueueContext& cq, std::uint8_t cqe_opcode, bool solicited);
    // The held CQEs in order, for the writer; then clear() (and the turn ends with end_turn()).
    const std::vector<HeldCompletion>& held() const { return held_; }
    void clear() { held_.clear(); }
    void end_turn() { turn_open_ = false; }

    // How many CQEs from `first` on (at most `count`, at most kMaxSession) go into one session
    // with it: 1 when it starts none.
    static std::uint32_t session_length(const HeldCompletion* first, std::uint32_t count);

private:
    std::vector<HeldCompletion> held_;
    bool turn_open_ = false;
};

// Writes `count` (2 to kMaxSession) held CQEs of one CQ as a compressed session at the ring's
// producer index: the arrays, then the title, its op_own last (a release store), then the
// producer index moves past all of them. The caller checked that the ring has room for `count`.
void write_session(const CompletionRingView& ring, const HeldCompletion* first, std::uint32_t count);

}  // namespace rdmachan::soft
