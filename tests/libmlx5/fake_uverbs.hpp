// The fake uverbs device (fake_uverbs.cpp): what it handed libmlx5, for the tests. "The last" is
// the last one created in the process.
#pragma once

#include <cstdint>
#include <map>

#include "tests/emulated_connectx/qp_state_rules.hpp"

namespace rdmachan::libmlx5_instructions {

class BlueFlameRegisters {
public:
    static constexpr std::uint32_t kMaxRegisters = 512;
    BlueFlameRegisters() = default;
    BlueFlameRegisters(std::uint32_t total, std::uint32_t low_latency);
    // The register a new QP gets, in libmlx5's numbering (four per UAR).
    int allocate();

private:
    std::uint32_t total_ = 0;
    std::uint32_t low_latency_ = 0;
    std::uint32_t users_[kMaxRegisters] = {};
};

struct FakeKernelState {
    std::map<int, BlueFlameRegisters> registers;  // by descriptor: each context has its own
    std::uint64_t cq_buffer = 0;  // the CQ ring libmlx5 allocated (create_cq's buf_addr)
    std::uint32_t cqe_count = 0;
    std::uint32_t cqe_size = 0;
    std::uint32_t cqn = 0;  // the last CQ's
    std::uint32_t next_cqn = 0x80;  // the number the next CQ gets (24 bits); then one more
    std::uint64_t cq_doorbell_record = 0;
    // Completion channels (CREATE_COMP_CHANNEL): a pipe each, libibverbs reading events from the
    // read end (the channel's descriptor), the fake writing them into the other; by the channel's
    // descriptor. close() of the channel closes both.
    std::map<int, int> channel_writers;
    // Every CQ's completion events, by the CQ's kernel handle: the user handle the events name
    // (libibverbs' ibv_cq), the channel it was created with (-1: none) and the events reported so
    // far. DESTROY_CQ drops those still unread from the channel and answers the rest, the events
    // read (libibverbs waits until as many were acknowledged), as the kernel does.
    struct CompletionEvents {
        std::uint64_t user_handle = 0;
        int channel = -1;
        std::uint32_t reported = 0;
    };
    std::map<std::uint32_t, CompletionEvents> completion_events;
    std::uint32_t completion_queues = 0;
    std::uint32_t qpn = 0;  // the last QP's
    std::uint32_t queue_pairs = 0;  // created so far; a QP's kernel handle is its count
    // Every live QP's kind and state, by its kernel handle: MODIFY_QP is judged by the kernel's
    // rules, the ones the emulated ConnectX applies (tests/emulated_connectx/qp_state_rules.hpp),
    // and a refused modify fails libmlx5's call with the kernel's errno.
    struct QueuePairRecord {
        emulated::QueuePairKind kind = emulated::QueuePairKind::reliable_connected;
        ibv_qp_state state = IBV_QPS_RESET;
    };
    std::map<std::uint32_t, QueuePairRecord> queue_pair_records;
    std::uint32_t shared_receive_queues = 0;
    static constexpr std::uint32_t kMaxSharedReceiveQueues = 256;
    std::uint32_t shared_receive_limits[kMaxSharedReceiveQueues][2] = {};  // by handle: max_wr, max_sge
    // Port 1's link layer as QUERY_PORT answers it: IBV_LINK_LAYER_INFINIBAND (1) or
    // IBV_LINK_LAYER_ETHERNET (2), a RoCE port. Set it before the device is opened: libmlx5
    // caches it then.
    std::uint8_t link_layer = 1;
    // RoCE address handles (CREATE_AH, which libmlx5 sends only on an Ethernet port): how many,
    // and the next hop's MAC the last one was answered, which a kernel resolves from the
    // destination GID; here 02:00 and the GID's last four bytes.
    std::uint32_t address_handles = 0;
    std::uint8_t address_handle_mac[6] = {};
    std::uint32_t memory_keys = 0;  // DEVX CREATE_MKEY answered
    std::uint32_t dc_targets = 0;   // DCTs moved to RTR
    std::uint32_t user_index = 0;  // the last QP's, which a CQE of version 1 carries
    std::uint32_t send_wqe_count = 0;
    std::uint64_t qp_doorbell_record = 0;  // [0] receive counter, [1] send counter (big-endian)
    std::uint32_t memory_regions = 0;
    // The UAR pages libmlx5 mapped (doorbell and BlueFlame registers): plain memory here, so the
    // benchmark can read what a post wrote to its register.
    static constexpr int kMaxPages = 32;
    void* pages[kMaxPages] = {};
    std::uint64_t page_lengths[kMaxPages] = {};
    int page_count = 0;
};

FakeKernelState& fake_kernel();

// Reports a completion event of the CQ of kernel handle `cq_handle` (ibv_cq::handle) on its
// completion channel, as the kernel does when an armed CQ gets a CQE: one
// struct ib_uverbs_comp_event_desc naming the CQ, which ibv_get_cq_event reads. False if the CQ
// has no channel.
bool report_completion_event(std::uint32_t cq_handle);

}  // namespace rdmachan::libmlx5_instructions
