#include "tests/libmlx5/differential_queues.hpp"

#include <infiniband/mlx5dv.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>

#include "tests/libmlx5/fake_uverbs.hpp"
#include "transport/mlx5/wqe_layout.hpp"

namespace rdmachan::libmlx5_instructions {
namespace {

struct Opcodes {
    ibv_wr_opcode verbs;
    mlx5::SendOpcode ours;
};
constexpr Opcodes kOpcodes[] = {
    {IBV_WR_RDMA_WRITE, mlx5::SendOpcode::rdma_write},
    {IBV_WR_RDMA_WRITE_WITH_IMM, mlx5::SendOpcode::rdma_write_with_immediate},
    {IBV_WR_SEND, mlx5::SendOpcode::send},
    {IBV_WR_SEND_WITH_IMM, mlx5::SendOpcode::send_with_immediate},
    {IBV_WR_RDMA_READ, mlx5::SendOpcode::rdma_read},
    {IBV_WR_ATOMIC_CMP_AND_SWP, mlx5::SendOpcode::atomic_compare_and_swap},
    {IBV_WR_ATOMIC_FETCH_AND_ADD, mlx5::SendOpcode::atomic_fetch_and_add},
};

constexpr std::uint32_t kMaxChain = 4;

}  // namespace

Memory aligned(std::vector<std::uint8_t>& storage, std::size_t length) {
    storage.assign(length + 64, 0);
    const auto address = reinterpret_cast<std::uintptr_t>(storage.data());
    return {storage.data() + ((64 - address % 64) % 64), length};
}

std::string open_differential_queues(DifferentialQueues& queues, const ibv_qp_cap& wanted, bool signal_all,
                                     std::uint32_t shared_receive_wr) {
    std::string error;
    queues.device = open_fake_mlx5(1024, error);
    if (!error.empty()) return error;
    queues.caps = wanted;
    if (shared_receive_wr != 0) {
        ibv_srq_init_attr attributes{};
        attributes.attr.max_wr = shared_receive_wr;
        attributes.attr.max_sge = wanted.max_recv_sge;
        queues.srq = ibv_create_srq(queues.device.pd, &attributes);
        if (queues.srq == nullptr) return "ibv_create_srq failed";
        queues.srq_max_sge = attributes.attr.max_sge;  // as granted
        queues.caps.max_recv_wr = 0;
        queues.caps.max_recv_sge = 0;
    }
    queues.qp = create_rts_queue_pair(queues.device, queues.caps, error, signal_all, queues.srq);
    if (queues.qp == nullptr) return error;
    return mirror_queues(queues, signal_all, false);
}

std::string open_differential_dci(DifferentialQueues& queues, const ibv_qp_cap& wanted) {
    std::string error;
    queues.device = open_fake_mlx5(1024, error);
    if (!error.empty()) return error;
    queues.caps = wanted;
    queues.qp = create_rts_dc_initiator(queues.device, queues.caps, error);
    if (queues.qp == nullptr) return error;
    return mirror_queues(queues, false, true);
}

std::string open_differential_memory_keys(DifferentialQueues& queues, const ibv_qp_cap& wanted) {
    std::string error;
    queues.device = open_fake_mlx5(1024, error);
    if (!error.empty()) return error;
    queues.caps = wanted;
    queues.qp = create_rts_memory_key_queue_pair(queues.device, queues.caps, error);
    if (queues.qp == nullptr) return error;
    return mirror_queues(queues, false, false);
}

std::string mirror_queues(DifferentialQueues& queues, bool signal_all, bool dc_initiator) {
    queues.user_index = fake_kernel().user_index;
    mlx5dv_qp qp{};
    mlx5dv_cq cq{};
    mlx5dv_obj object{};
    object.qp.in = queues.qp;
    object.qp.out = &qp;
    object.cq.in = queues.device.cq;
    object.cq.out = &cq;
    if (mlx5dv_init_obj(&object, MLX5DV_OBJ_QP | MLX5DV_OBJ_CQ) != 0) return "mlx5dv_init_obj failed";
    if (qp.sq.stride != 64 || (cq.cqe_size != 64 && cq.cqe_size != 128)) return "unexpected send stride or CQE size";
    queues.send_wqe_count = qp.sq.wqe_cnt;
    queues.receive_wqe_count = qp.rq.wqe_cnt;
    queues.receive_stride = qp.rq.stride;
    queues.cqe_count = cq.cqe_cnt;
    queues.cqe_size = cq.cqe_size;
    queues.their_send = {static_cast<std::uint8_t*>(qp.sq.buf), static_cast<std::size_t>(qp.sq.wqe_cnt) * 64};
    queues.their_receive = {static_cast<std::uint8_t*>(qp.rq.buf), static_cast<std::size_t>(qp.rq.wqe_cnt) * qp.rq.stride};
    queues.their_completions = {static_cast<std::uint8_t*>(cq.buf), static_cast<std::size_t>(cq.cqe_cnt) * cq.cqe_size};
    queues.their_doorbell_record = reinterpret_cast<std::uint32_t*>(qp.dbrec);
    queues.their_cq_doorbell_record = reinterpret_cast<std::uint32_t*>(cq.dbrec);
    queues.their_blueflame = static_cast<std::uint8_t*>(qp.bf.reg);
    queues.blueflame_size = qp.bf.size;

    queues.our_send = aligned(queues.send_memory, queues.their_send.length);
    queues.our_receive = aligned(queues.receive_memory, queues.their_receive.length);
    queues.our_completions = aligned(queues.completion_memory, queues.their_completions.length);
    // The CQ ring starts as libmlx5 initialised it (every entry invalid, owned by hardware).
    std::memcpy(queues.our_completions.bytes, queues.their_completions.bytes, queues.their_completions.length);
    queues.our_blueflame = aligned(queues.register_memory, 2 * static_cast<std::size_t>(qp.bf.size)).bytes;
    queues.send_wr_ids.assign(qp.sq.wqe_cnt, 0);
    queues.send_wqe_ends.assign(qp.sq.wqe_cnt, 0);
    queues.send_umr_opcodes.assign(qp.sq.wqe_cnt, 0);
    queues.receive_wr_ids.assign(std::max<std::uint32_t>(qp.rq.wqe_cnt, 1), 0);

    mlx5::SendQueueRing send_ring;
    send_ring.buffer = queues.our_send.bytes;
    send_ring.wqe_count = qp.sq.wqe_cnt;
    send_ring.qpn = queues.qp->qp_num;
    send_ring.doorbell_record = queues.our_doorbell_record;
    send_ring.blueflame_register = queues.our_blueflame;
    send_ring.blueflame_size = qp.bf.size;
    mlx5::SendQueueConfig send_config;
    send_config.max_sge = queues.caps.max_send_sge;
    send_config.max_inline_data = queues.caps.max_inline_data;
    send_config.signal_all = signal_all;
    send_config.dc_initiator = dc_initiator;
    queues.send = mlx5::SendQueue(send_ring, {queues.send_wr_ids.data(), queues.send_wqe_ends.data(), 0, 0, queues.send_umr_opcodes.data()}, send_config);
    mlx5::ReceiveQueueRing receive_ring;
    receive_ring.buffer = queues.our_receive.bytes;
    receive_ring.wqe_count = qp.rq.wqe_cnt;
    receive_ring.stride = qp.rq.stride;
    receive_ring.doorbell_record = queues.our_doorbell_record;
    queues.receive = mlx5::ReceiveQueue(receive_ring, queues.receive_wr_ids.data(), {});
    mlx5::CompletionQueueRing completion_ring;
    completion_ring.buffer = queues.our_completions.bytes;
    completion_ring.cqe_count = cq.cqe_cnt;
    completion_ring.cqe_size = cq.cqe_size;
    completion_ring.cqn = cq.cqn;
    completion_ring.doorbell_record = queues.our_cq_doorbell_record;
    queues.completions = mlx5::CompletionQueue(completion_ring);
    queues.target.send = &queues.send.tracking();
    queues.target.send_wqe_count = qp.sq.wqe_cnt;
    queues.target.receive = &queues.receive;
    if (queues.srq != nullptr) {
        mlx5dv_srq srq{};
        mlx5dv_obj srq_object{};
        srq_object.srq.in = queues.srq;
        srq_object.srq.out = &srq;
        if (mlx5dv_init_obj(&srq_object, MLX5DV_OBJ_SRQ) != 0) return "mlx5dv_init_obj of the SRQ failed";
        // A fresh SRQ's free list runs from WQE 0 (head) to the last WQE (tail).
        queues.srq_wqe_count = srq.tail + 1;
        queues.srq_stride = srq.stride;
        queues.their_shared_receive = {static_cast<std::uint8_t*>(srq.buf), static_cast<std::size_t>(queues.srq_wqe_count) * srq.stride};
        queues.their_srq_doorbell_record = reinterpret_cast<std::uint32_t*>(srq.dbrec);
        queues.our_shared_receive = aligned(queues.shared_receive_memory, queues.their_shared_receive.length);
        std::memcpy(queues.our_shared_receive.bytes, queues.their_shared_receive.bytes, queues.their_shared_receive.length);
        queues.shared_receive_wr_ids.assign(queues.srq_wqe_count, 0);
        mlx5::SharedReceiveQueueRing ring;
        ring.buffer = queues.our_shared_receive.bytes;
        ring.wqe_count = queues.srq_wqe_count;
        ring.stride = srq.stride;
        ring.srqn = srq.srqn;
        ring.doorbell_record = queues.our_srq_doorbell_record;
        queues.shared_receive = mlx5::SharedReceiveQueue(ring, queues.shared_receive_wr_ids.data(), srq.head, srq.tail);
        queues.target.receive = nullptr;
        queues.target.shared_receive = &queues.shared_receive;
    }
    return {};
}

SendChain random_send_chain(std::mt19937_64& random, const ibv_qp_cap& caps, const std::vector<std::uint8_t>& payload) {
    SendChain chain;
    auto below = [&](std::uint64_t bound) { return bound == 0 ? 0 : random() % bound; };
    const std::uint32_t count = 1 + static_cast<std::uint32_t>(below(kMaxChain));
    chain.verbs.resize(count);
    chain.ours.resize(count);
    // Sized once: the requests point into these vectors.
    chain.verbs_elements.reserve(static_cast<std::size_t>(count) * (caps.max_send_sge + 1));
    chain.our_elements.reserve(static_cast<std::size_t>(count) * (caps.max_send_sge + 1));
    for (std::uint32_t i = 0; i < count; ++i) {
        const Opcodes& opcode = kOpcodes[below(std::size(kOpcodes))];
        const bool atomic = opcode.ours == mlx5::SendOpcode::atomic_compare_and_swap ||
                            opcode.ours == mlx5::SendOpcode::atomic_fetch_and_add;
        const bool carries_data = opcode.ours != mlx5::SendOpcode::rdma_read && !atomic;
        ibv_send_wr& wr = chain.verbs[i];
        wr = {};
        wr.wr_id = random();
        wr.opcode = opcode.verbs;
        std::uint32_t elements = static_cast<std::uint32_t>(below(caps.max_send_sge + 1));
        if (below(40) == 0) elements = caps.max_send_sge + 1;
        if (atomic && below(8) != 0) elements = 1;
        if (below(3) == 0) wr.send_flags |= IBV_SEND_SIGNALED;
        if (below(4) == 0) wr.send_flags |= IBV_SEND_SOLICITED;
        if (below(6) == 0) wr.send_flags |= IBV_SEND_FENCE;
        const bool inline_data = carries_data && below(3) == 0;
        if (inline_data) wr.send_flags |= IBV_SEND_INLINE;
        // Inline: lengths that land around max_inline_data in total.
        const std::uint32_t length_bound = inline_data ? caps.max_inline_data / (elements == 0 ? 1 : elements) + 24 : 5000;
        const std::size_t first = chain.verbs_elements.size();
        for (std::uint32_t e = 0; e < elements; ++e) {
            std::uint32_t length = static_cast<std::uint32_t>(below(length_bound + 1));
            if (atomic) length = 8;
            const std::uint64_t offset = below(payload.size() - std::min<std::size_t>(length, payload.size()) + 1);
            const std::uint64_t address =
                inline_data ? reinterpret_cast<std::uintptr_t>(payload.data()) + offset : (random() & 0xffffffffffffull);
            chain.verbs_elements.push_back({address, length, static_cast<std::uint32_t>(random())});
            chain.our_elements.push_back({address, length, chain.verbs_elements.back().lkey});
        }
        wr.sg_list = elements == 0 ? nullptr : &chain.verbs_elements[first];
        wr.num_sge = static_cast<int>(elements);
        wr.imm_data = static_cast<std::uint32_t>(random());
        wr.wr.rdma.remote_addr = random();
        wr.wr.rdma.rkey = static_cast<std::uint32_t>(random());
        if (atomic) {
            wr.wr.atomic.remote_addr = random() & ~7ull;
            wr.wr.atomic.rkey = static_cast<std::uint32_t>(random());
            wr.wr.atomic.compare_add = random();
            wr.wr.atomic.swap = random();
        }
        wr.next = i + 1 < count ? &chain.verbs[i + 1] : nullptr;

        mlx5::SendWorkRequest& request = chain.ours[i];
        request.wr_id = wr.wr_id;
        request.opcode = opcode.ours;
        request.flags = ((wr.send_flags & IBV_SEND_SIGNALED) != 0 ? mlx5::kSendSignaled : 0) |
                        ((wr.send_flags & IBV_SEND_SOLICITED) != 0 ? mlx5::kSendSolicited : 0) |
                        ((wr.send_flags & IBV_SEND_FENCE) != 0 ? mlx5::kSendFence : 0) |
                        ((wr.send_flags & IBV_SEND_INLINE) != 0 ? mlx5::kSendInline : 0);
        request.sg_list = elements == 0 ? nullptr : &chain.our_elements[first];
        request.num_sge = elements;
        // The immediate goes on the wire as imm_data's bytes; ours is the number they spell.
        request.immediate = __builtin_bswap32(wr.imm_data);
        if (atomic) {
            request.remote_addr = wr.wr.atomic.remote_addr;
            request.rkey = wr.wr.atomic.rkey;
            request.compare_add = wr.wr.atomic.compare_add;
            request.swap = wr.wr.atomic.swap;
        } else {
            request.remote_addr = wr.wr.rdma.remote_addr;
            request.rkey = wr.wr.rdma.rkey;
        }
        chain.description += std::string(i == 0 ? "" : ", ") + "opcode " + std::to_string(static_cast<int>(opcode.verbs)) +
                             " sge " + std::to_string(elements) + " flags " + std::to_string(wr.send_flags);
    }
    return chain;
}

ReceiveChain random_receive_chain(std::mt19937_64& random, const ibv_qp_cap& caps) {
    ReceiveChain chain;
    auto below = [&](std::uint64_t bound) { return bound == 0 ? 0 : random() % bound; };
    const std::uint32_t count = 1 + static_cast<std::uint32_t>(below(3));
    chain.verbs.resize(count);
    chain.ours.resize(count);
    chain.verbs_elements.reserve(static_cast<std::size_t>(count) * (caps.max_recv_sge + 1));
    chain.our_elements.reserve(static_cast<std::size_t>(count) * (caps.max_recv_sge + 1));
    for (std::uint32_t i = 0; i < count; ++i) {
        std::uint32_t elements = static_cast<std::uint32_t>(below(caps.max_recv_sge + 1));
        if (below(30) == 0) elements = caps.max_recv_sge + 1;
        const std::size_t first = chain.verbs_elements.size();
        for (std::uint32_t e = 0; e < elements; ++e) {
            // Zero-length elements now and then: libmlx5 leaves them out of the WQE.
            const std::uint32_t length = below(5) == 0 ? 0 : static_cast<std::uint32_t>(below(1u << 20));
            chain.verbs_elements.push_back({random() & 0xffffffffffffull, length, static_cast<std::uint32_t>(random())});
            chain.our_elements.push_back({chain.verbs_elements.back().addr, length, chain.verbs_elements.back().lkey});
        }
        ibv_recv_wr& wr = chain.verbs[i];
        wr = {};
        wr.wr_id = random();
        wr.sg_list = elements == 0 ? nullptr : &chain.verbs_elements[first];
        wr.num_sge = static_cast<int>(elements);
        wr.next = i + 1 < count ? &chain.verbs[i + 1] : nullptr;
        chain.ours[i].wr_id = wr.wr_id;
        chain.ours[i].sg_list = elements == 0 ? nullptr : &chain.our_elements[first];
        chain.ours[i].num_sge = elements;
    }
    return chain;
}

long first_posted_difference(DifferentialQueues& queues, std::uint32_t first_wqebb, std::uint8_t poison) {
    for (std::uint32_t wqebb = first_wqebb; wqebb != queues.send.tracking().producer_index; ++wqebb) {
        const std::size_t at = static_cast<std::size_t>(wqebb & (queues.send_wqe_count - 1)) * 64;
        const long difference = first_difference(queues.their_send.bytes + at, queues.our_send.bytes + at, 64, poison);
        if (difference >= 0) return static_cast<long>(at) + difference;
    }
    return -1;
}

void poison_send_side(DifferentialQueues& queues, std::uint8_t poison) {
    const std::size_t register_bytes = 2 * static_cast<std::size_t>(queues.blueflame_size);
    std::memset(queues.their_send.bytes, poison, queues.their_send.length);
    std::memset(queues.our_send.bytes, poison, queues.our_send.length);
    std::memset(queues.their_blueflame, poison, register_bytes);
    std::memset(queues.our_blueflame, poison, register_bytes);
}

std::string send_side_difference(DifferentialQueues& queues, std::uint32_t first_wqebb, std::uint8_t poison,
                                 bool compare_register) {
    if (queues.their_doorbell_record[1] != queues.our_doorbell_record[1]) return "the send doorbell records differ";
    const long at = first_posted_difference(queues, first_wqebb, poison);
    if (at >= 0)
        return "WQEBB " + std::to_string(at / 64) + " byte " + std::to_string(at % 64) + ": libmlx5 " +
               hex_around(queues.their_send.bytes, at, queues.their_send.length) + ", ours " +
               hex_around(queues.our_send.bytes, at, queues.our_send.length);
    if (!compare_register) return {};
    const std::size_t register_bytes = 2 * static_cast<std::size_t>(queues.blueflame_size);
    const long register_at = first_difference(queues.their_blueflame, queues.our_blueflame, register_bytes, poison);
    if (register_at >= 0)
        return "register byte " + std::to_string(register_at) + ": libmlx5 " +
               hex_around(queues.their_blueflame, register_at, register_bytes) + ", ours " +
               hex_around(queues.our_blueflame, register_at, register_bytes);
    return {};
}

bool blueflame_written(const DifferentialQueues& queues, std::uint8_t poison) {
    for (std::uint32_t half = 0; half < 2; ++half) {
        const std::uint8_t* bytes = queues.their_blueflame + static_cast<std::size_t>(half) * queues.blueflame_size;
        for (std::uint32_t i = 8; i < queues.blueflame_size; ++i)
            if (bytes[i] != poison) return true;
    }
    return false;
}

bool crosses_ring_end(const DifferentialQueues& queues, std::uint32_t first_wqebb, std::uint32_t end_wqebb) {
    return (first_wqebb & (queues.send_wqe_count - 1)) + (end_wqebb - first_wqebb) > queues.send_wqe_count;
}

std::uint32_t last_wqe_start(const DifferentialQueues& queues, std::uint32_t first_wqebb, std::uint32_t wqes) {
    std::uint32_t start = first_wqebb;
    std::uint32_t last = start;
    const std::uint32_t mask = queues.send_wqe_count - 1;
    for (std::uint32_t i = 0; i < wqes; ++i) {
        last = start;
        const std::uint8_t* ctrl = queues.their_send.bytes + static_cast<std::size_t>(start & mask) * 64;
        start += ((ctrl[7] & 0x3f) * 16 + 63) / 64;
    }
    return last;
}

bool retire_posted(DifferentialQueues& queues, std::uint32_t& cqes, std::uint32_t first_wqebb, std::uint32_t wqes) {
    if (wqes == 0) return true;
    const std::uint32_t last = last_wqe_start(queues, first_wqebb, wqes);
    const std::uint8_t* ctrl = queues.their_send.bytes + static_cast<std::size_t>(last & (queues.send_wqe_count - 1)) * 64;
    write_requester_cqe(cqes++, queues.qp->qp_num, ctrl[3], last);
    ibv_wc completion{};
    if (ibv_poll_cq(queues.device.cq, 1, &completion) != 1) return false;
    queues.send.tracking().consumer_index = queues.send.tracking().producer_index;
    return true;
}

void write_cqe_to_both(DifferentialQueues& queues, std::uint32_t index, std::uint8_t* cqe, std::uint8_t opcode_and_flags) {
    const std::size_t at = static_cast<std::size_t>(index & (queues.cqe_count - 1)) * queues.cqe_size + (queues.cqe_size - 64);
    const std::uint8_t owner = (index / queues.cqe_count) & 1;
    cqe[mlx5::kCqeOpOwn] = static_cast<std::uint8_t>(opcode_and_flags | owner);
    for (std::uint8_t* ring : {queues.their_completions.bytes, queues.our_completions.bytes}) {
        std::memcpy(ring + at, cqe, 63);
        std::atomic_ref<std::uint8_t>(ring[at + 63]).store(cqe[mlx5::kCqeOpOwn], std::memory_order_release);
    }
}

std::string poll_both_once(DifferentialQueues& queues, std::uint32_t capacity, std::uint8_t poison, ibv_wc* theirs,
                           mlx5::Completion* ours, std::uint32_t& count) {
    auto resolve = [&queues](std::uint32_t qpn, std::uint32_t) -> mlx5::CompletionTarget* {
        return qpn == queues.qp->qp_num ? &queues.target : nullptr;
    };
    std::memset(theirs, poison, sizeof(ibv_wc) * capacity);
    const int their_count = ibv_poll_cq(queues.device.cq, static_cast<int>(capacity), theirs);
    count = queues.completions.poll(ours, capacity, resolve);
    if (their_count < 0 || static_cast<std::uint32_t>(their_count) != count)
        return "poll of " + std::to_string(capacity) + ": libmlx5 returned " + std::to_string(their_count) + ", ours " +
               std::to_string(count);
    if (queues.their_cq_doorbell_record[0] != queues.our_cq_doorbell_record[0]) return "CQ doorbell records differ";
    return {};
}

std::string post_difference(const std::string& what, int their_result, std::uint32_t their_posted, int our_result,
                            std::uint32_t our_posted) {
    if (their_result == our_result && their_posted == our_posted) return {};
    return what + ": libmlx5 returned " + std::to_string(their_result) + " after accepting " + std::to_string(their_posted) +
           ", ours " + std::to_string(our_result) + " after " + std::to_string(our_posted);
}

long first_difference(const std::uint8_t* theirs, const std::uint8_t* ours, std::size_t length, std::uint8_t poison) {
    for (std::size_t i = 0; i < length; ++i)
        if (theirs[i] != poison && theirs[i] != ours[i]) return static_cast<long>(i);
    return -1;
}

std::string hex_around(const std::uint8_t* bytes, long at, std::size_t length) {
    std::string text;
    const std::size_t from = static_cast<std::size_t>(at) / 16 * 16;
    char piece[4];
    for (std::size_t i = from; i < from + 16 && i < length; ++i) {
        std::snprintf(piece, sizeof piece, "%02x", bytes[i]);
        text += piece;
    }
    return text;
}

}  // namespace rdmachan::libmlx5_instructions
