// UMR WQEs against libmlx5 itself: an RC queue pair of the installed libmlx5 configures indirect
// memory keys that libmlx5 created (mlx5dv_create_mkey, answered by the fake kernel's DEVX
// CREATE_MKEY, fake_uverbs.cpp) with random list layouts (mlx5dv_wr_mr_list) and interleaved
// layouts (mlx5dv_wr_mr_interleaved: repeat counts, byte counts and skips), invalidates them
// (ibv_wr_local_inv), and posts RDMA writes and sends between them, through the ibv_wr_* API;
// SendQueue posts the same requests (configure_memory_key, local_invalidate). Every byte libmlx5
// wrote into the WQEs posted, the doorbell record and the register must agree, the fence libmlx5
// puts on the request after a UMR WQE included. Only requests both accept are chained; a
// request that may be refused (too many entries for the key or for the queue's inline space)
// is posted alone, and then both must refuse it for the same reason (libmlx5_refusals.hpp: too
// many entries, whether the key's or the inline room's limit was passed) or both take it. What a
// run reached is required by count (Coverage): each kind of request, both layouts past each
// limit, the fence after a UMR WQE, BlueFlame posts and ring wraps.
//
// Not generated, where we differ from libmlx5 v44 on purpose (docs/ARCHITECTURE.md): interleaved
// byte counts or strides above 16 bits, which libmlx5 truncates silently and we refuse
// (transport/mlx5/umr_segments.hpp); list layouts of 2 GiB or more in all, whose length libmlx5
// v44 sums in an int (fixed in rdma-core e23cb0a72; we write the 64-bit sum).
#include <doctest/doctest.h>
#include <infiniband/mlx5dv.h>
#include <infiniband/verbs.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "tests/libmlx5/coverage.hpp"
#include "tests/libmlx5/differential_queues.hpp"
#include "tests/libmlx5/libmlx5_refusals.hpp"
#include "tools/golden_check/post_errno.hpp"
#include "transport/mlx5/wqe_layout.hpp"

namespace {

namespace mlx5 = rdmachan::mlx5;
using namespace rdmachan::libmlx5_instructions;

constexpr std::uint32_t kKeys = 6;

struct Key {
    mlx5dv_mkey* key = nullptr;
    std::uint32_t max_entries = 0;  // as libmlx5 created it (a multiple of 4)
};

enum class Kind { list, interleaved, invalidate, write, send };
constexpr const char* kKindNames[] = {"list layout", "interleaved layout", "local invalidate", "write", "send"};

struct Request {
    Kind kind = Kind::write;
    mlx5::SendWorkRequest ours;
    mlx5::MemoryKeyLayout layout;
    std::vector<ibv_sge> elements;
    std::vector<mlx5::ScatterGatherElement> our_elements;
    std::vector<mlx5dv_mr_interleaved> interleaved;
    std::vector<mlx5::InterleavedEntry> our_interleaved;
    std::uint32_t key = 0, verbs_access = 0, repeat_count = 0, invalidated = 0;
    bool may_be_refused = false;
};

std::uint8_t memory_key_access(std::uint32_t verbs_access) {
    std::uint8_t access = 0;
    if ((verbs_access & IBV_ACCESS_LOCAL_WRITE) != 0) access |= mlx5::kMemoryKeyLocalWrite;
    if ((verbs_access & IBV_ACCESS_REMOTE_READ) != 0) access |= mlx5::kMemoryKeyRemoteRead;
    if ((verbs_access & IBV_ACCESS_REMOTE_WRITE) != 0) access |= mlx5::kMemoryKeyRemoteWrite;
    if ((verbs_access & IBV_ACCESS_REMOTE_ATOMIC) != 0) access |= mlx5::kMemoryKeyAtomic;
    return access;
}

void build(Request& request, std::mt19937_64& random, const std::vector<Key>& keys, const ibv_qp_cap& caps) {
    auto below = [&](std::uint64_t bound) { return bound == 0 ? 0 : random() % bound; };
    request.kind = static_cast<Kind>(below(5));
    mlx5::SendWorkRequest& ours = request.ours;
    ours.wr_id = random();
    ours.flags = (below(3) == 0 ? mlx5::kSendSignaled : 0) | (below(6) == 0 ? mlx5::kSendFence : 0);
    request.key = static_cast<std::uint32_t>(below(keys.size()));
    const Key& key = keys[request.key];
    switch (request.kind) {
        case Kind::list:
        case Kind::interleaved: {
            const bool interleaved = request.kind == Kind::interleaved;
            // Up to the key's entries and the queue's inline room, and now and then one more.
            const std::uint32_t limit = std::min(mlx5::umr_max_entries(interleaved, caps.max_inline_data), key.max_entries);
            std::uint32_t entries = static_cast<std::uint32_t>(below(limit + 1));
            if (below(10) == 0) {
                entries = limit + 1;
                request.may_be_refused = true;
            }
            ours.opcode = mlx5::SendOpcode::configure_memory_key;
            ours.flags |= mlx5::kSendInline;  // libmlx5 configures keys with inline translations only
            request.verbs_access = static_cast<std::uint32_t>(below(16));
            request.layout.mkey = key.key->lkey;
            request.layout.max_entries = key.max_entries;
            request.layout.access = memory_key_access(request.verbs_access);
            request.layout.num_entries = entries;
            request.repeat_count = interleaved ? static_cast<std::uint32_t>(1 + below(1000)) : 0;
            request.layout.repeat_count = request.repeat_count;
            for (std::uint32_t i = 0; i < entries; ++i) {
                const std::uint64_t address = random() & 0xffffffffffffull;
                const auto lkey = static_cast<std::uint32_t>(random());
                if (interleaved) {
                    const auto count = static_cast<std::uint32_t>(below(0x8000));
                    const auto skip = static_cast<std::uint32_t>(below(0x10000 - count));
                    request.interleaved.push_back({address, count, skip, lkey});
                    request.our_interleaved.push_back({address, count, skip, lkey});
                } else {
                    // The list's total below 2^31: libmlx5 v44 sums it in an int (a bug rdma-core
                    // fixed in e23cb0a72, "mlx5: Fix byte_count type in umr_sg_list_create"); we
                    // write the 64-bit sum, as the fix does.
                    const auto length = static_cast<std::uint32_t>(random() % (0x7fffffffu / std::max(entries, 1u)));
                    request.elements.push_back({address, length, lkey});
                    request.our_elements.push_back({address, length, lkey});
                }
            }
            break;
        }
        case Kind::invalidate:
            ours.opcode = mlx5::SendOpcode::local_invalidate;
            request.invalidated = below(2) == 0 ? key.key->rkey : static_cast<std::uint32_t>(random());
            ours.immediate = request.invalidated;
            break;
        case Kind::write:
        case Kind::send: {
            ours.opcode = request.kind == Kind::write ? mlx5::SendOpcode::rdma_write : mlx5::SendOpcode::send;
            ours.remote_addr = random();
            ours.rkey = static_cast<std::uint32_t>(random());
            const auto count = static_cast<std::uint32_t>(below(caps.max_send_sge + 1));
            for (std::uint32_t i = 0; i < count; ++i) {
                const std::uint64_t address = random() & 0xffffffffffffull;
                const auto length = static_cast<std::uint32_t>(below(100000));
                const auto lkey = static_cast<std::uint32_t>(random());
                request.elements.push_back({address, length, lkey});
                request.our_elements.push_back({address, length, lkey});
            }
            ours.num_sge = count;
            break;
        }
    }
}

// Points the request's pointers at its own storage: called once the vector holding the request
// no longer moves. An interleaved layout's array is never null, even with no entries: both
// libmlx5 and our encoder take a null one for a list layout.
void bind(Request& request) {
    if (request.kind == Kind::interleaved) {
        request.interleaved.reserve(1);
        request.our_interleaved.reserve(1);
    }
    mlx5::ScatterGatherElement* elements = request.our_elements.empty() ? nullptr : request.our_elements.data();
    switch (request.kind) {
        case Kind::list:
        case Kind::interleaved:
            request.layout.list = elements;
            request.layout.interleaved = request.kind == Kind::interleaved ? request.our_interleaved.data() : nullptr;
            request.ours.layout = &request.layout;
            break;
        case Kind::write:
        case Kind::send:
            request.ours.sg_list = elements;
            break;
        case Kind::invalidate:
            break;
    }
}

void post_theirs(ibv_qp_ex* qpx, mlx5dv_qp_ex* dv, const std::vector<Key>& keys, Request& request) {
    qpx->wr_id = request.ours.wr_id;
    qpx->wr_flags = ((request.ours.flags & mlx5::kSendSignaled) != 0 ? IBV_SEND_SIGNALED : 0) |
                    ((request.ours.flags & mlx5::kSendFence) != 0 ? IBV_SEND_FENCE : 0) |
                    ((request.ours.flags & mlx5::kSendInline) != 0 ? IBV_SEND_INLINE : 0);
    switch (request.kind) {
        case Kind::list:
            mlx5dv_wr_mr_list(dv, keys[request.key].key, request.verbs_access, static_cast<std::uint16_t>(request.elements.size()),
                              request.elements.data());
            break;
        case Kind::interleaved:
            mlx5dv_wr_mr_interleaved(dv, keys[request.key].key, request.verbs_access, request.repeat_count,
                                     static_cast<std::uint16_t>(request.interleaved.size()), request.interleaved.data());
            break;
        case Kind::invalidate:
            ibv_wr_local_inv(qpx, request.invalidated);
            break;
        case Kind::write:
            ibv_wr_rdma_write(qpx, request.ours.rkey, request.ours.remote_addr);
            ibv_wr_set_sge_list(qpx, request.elements.size(), request.elements.data());
            break;
        case Kind::send:
            ibv_wr_send(qpx);
            ibv_wr_set_sge_list(qpx, request.elements.size(), request.elements.data());
            break;
    }
}

void run(const ibv_qp_cap& wanted, std::uint64_t seed, std::uint32_t calls) {
    std::mt19937_64 random(seed);
    DifferentialQueues queues;
    const std::string error = open_differential_memory_keys(queues, wanted);
    REQUIRE_MESSAGE(error.empty(), error);
    ibv_qp_ex* qpx = ibv_qp_to_qp_ex(queues.qp);
    mlx5dv_qp_ex* dv = mlx5dv_qp_ex_from_ibv_qp_ex(qpx);
    REQUIRE(dv != nullptr);
    std::vector<Key> keys;
    for (std::uint32_t i = 0; i < kKeys; ++i) {
        mlx5dv_mkey_init_attr attributes{};
        attributes.pd = queues.device.pd;
        attributes.create_flags = MLX5DV_MKEY_INIT_ATTR_FLAGS_INDIRECT;
        attributes.max_entries = static_cast<std::uint16_t>(1 + random() % 24);
        Key key;
        key.key = mlx5dv_create_mkey(&attributes);
        REQUIRE_MESSAGE(key.key != nullptr, "mlx5dv_create_mkey failed");
        key.max_entries = attributes.max_entries;  // libmlx5 writes back what it created
        keys.push_back(key);
    }
    INFO("queue: wqe_cnt ", queues.send_wqe_count, ", max_send_sge ", queues.caps.max_send_sge, ", max_inline_data ",
         queues.caps.max_inline_data, "; seed ", seed);
    std::uint32_t cqes = 0;
    Coverage coverage;
    bool umr_last = false;  // the last WQE posted was a UMR WQE: the next owes its fence
    bool completion_opcodes[256] = {};
    for (std::uint32_t call = 0; call < calls; ++call) {
        CAPTURE(call);
        std::vector<Request> requests(1 + random() % 3);
        std::string description;
        for (Request& request : requests) {
            build(request, random, keys, queues.caps);
            description += " kind " + std::to_string(static_cast<int>(request.kind)) + " entries " +
                           std::to_string(request.layout.num_entries) + " of key " + std::to_string(request.key) + " flags " +
                           std::to_string(request.ours.flags >> 24);
        }
        // A request that may be refused goes alone (the ibv_wr_* API then posts nothing at all).
        for (std::size_t i = 0; i < requests.size(); ++i)
            if (requests[i].may_be_refused) {
                requests = {requests[i]};
                break;
            }
        CAPTURE(description);
        std::vector<mlx5::SendWorkRequest> ours;
        for (Request& request : requests) {
            bind(request);
            ours.push_back(request.ours);
        }
        const auto value = static_cast<std::uint8_t>(random());
        poison_send_side(queues, value);
        const std::uint32_t first_wqebb = queues.send.tracking().producer_index;

        ibv_wr_start(qpx);
        for (Request& request : requests) post_theirs(qpx, dv, keys, request);
        const int their_result = ibv_wr_complete(qpx);
        std::uint32_t posted = 0;
        const mlx5::PostResult our_result = queues.send.post(ours.data(), static_cast<std::uint32_t>(ours.size()), &posted);
        // Only a request posted alone may be refused; the ibv_wr_* API then takes nothing.
        Refusal expected{static_cast<std::uint32_t>(requests.size()), mlx5::PostResult::ok};
        const Request& first = requests.front();
        if (first.may_be_refused) {
            const bool interleaved = first.kind == Kind::interleaved;
            const mlx5::PostResult reason = libmlx5_layout_refusal(interleaved, first.layout.num_entries,
                                                                   keys[first.key].max_entries, queues.caps.max_inline_data);
            if (reason != mlx5::PostResult::ok) expected = {0, reason};
        }
        const std::string derivation = check_derivation(expected, their_result, their_result == 0 ? static_cast<std::uint32_t>(requests.size()) : 0,
                                                        static_cast<std::uint32_t>(requests.size()), rdmachan::golden::send_errno_of);
        REQUIRE_MESSAGE(derivation.empty(), derivation);
        const std::string refusal = refusal_difference(expected, our_result, posted);
        REQUIRE_MESSAGE(refusal.empty(), refusal);
        if (their_result != 0) {
            // Which limit the entries passed: the key's, or the queue's inline room.
            const bool key_limit = first.layout.num_entries > keys[first.key].max_entries;
            coverage.count(std::string("refusal: ") + reason_name(expected.reason) + ", " + kKindNames[static_cast<int>(first.kind)] +
                           (key_limit ? ", the key's limit" : ", the inline room"));
            continue;
        }
        REQUIRE(posted == requests.size());
        const std::string difference = send_side_difference(queues, first_wqebb, value, true);
        REQUIRE_MESSAGE(difference.empty(), difference);
        for (const Request& request : requests) {
            coverage.count(kKindNames[static_cast<int>(request.kind)]);
            if (umr_last) coverage.count("fence owed after a UMR WQE");
            umr_last = request.kind == Kind::list || request.kind == Kind::interleaved || request.kind == Kind::invalidate;
        }
        if (blueflame_written(queues, value)) coverage.count("BlueFlame post");
        if (crosses_ring_end(queues, first_wqebb, queues.send.tracking().producer_index)) coverage.count("ring wrap");
        // Its completion, decoded by both: a UMR WQE's opcode comes from what was posted
        // (LOCAL_INV, or MLX5DV_WC_UMR for a key configuration), not from the CQE.
        const std::uint32_t last = last_wqe_start(queues, first_wqebb, posted);
        std::uint8_t cqe[64] = {};
        const std::uint8_t wqe_opcode = queues.their_send.bytes[static_cast<std::size_t>(last & (queues.send_wqe_count - 1)) * 64 + 3];
        name_cqe(cqe, queues.user_index, static_cast<std::uint32_t>(wqe_opcode) << 24 | queues.qp->qp_num, last);
        write_cqe_to_both(queues, cqes++, cqe, mlx5::kCqeRequester << 4);
        ibv_wc theirs{};
        mlx5::Completion our_completion;
        REQUIRE(ibv_poll_cq(queues.device.cq, 1, &theirs) == 1);
        REQUIRE(queues.completions.poll(&our_completion, 1, [&queues](std::uint32_t, std::uint32_t) { return &queues.target; }) == 1);
        REQUIRE(theirs.status == IBV_WC_SUCCESS);
        REQUIRE(our_completion.status == mlx5::CompletionStatus::success);
        REQUIRE(theirs.wr_id == our_completion.wr_id);
        REQUIRE(static_cast<std::uint32_t>(theirs.opcode) == static_cast<std::uint32_t>(our_completion.opcode));
        completion_opcodes[static_cast<std::uint8_t>(our_completion.opcode)] = true;
    }
    MESSAGE(calls, " random chains on wqe_cnt ", queues.send_wqe_count, ", max_inline_data ", queues.caps.max_inline_data, ": ",
            coverage.summary());
    // The coverage claimed above, by count; a refusal by the key's limit wherever some key holds
    // fewer entries than the inline room.
    std::vector<std::pair<std::string, std::uint32_t>> minimums = {
        {"list layout", calls / 5},
        {"interleaved layout", calls / 5},
        {"local invalidate", calls / 5},
        {"write", calls / 5},
        {"send", calls / 5},
        {"fence owed after a UMR WQE", calls / 5},
        {"BlueFlame post", calls / 20},
        {"ring wrap", calls / 400},
        {"refusal: too many entries, list layout, the inline room", calls / 400},
        {"refusal: too many entries, interleaved layout, the inline room", calls / 400},
    };
    for (const bool interleaved : {false, true}) {
        const std::uint32_t room = mlx5::umr_max_entries(interleaved, queues.caps.max_inline_data);
        bool key_binds = false;
        for (const Key& key : keys) key_binds = key_binds || key.max_entries < room;
        if (key_binds)
            minimums.push_back({std::string("refusal: too many entries, ") + (interleaved ? "interleaved" : "list") +
                                    " layout, the key's limit",
                                calls / 400});
    }
    const std::string missing = coverage.shortfalls(minimums);
    CHECK_MESSAGE(missing.empty(), missing);
    // Every kind of last request was completed and decoded alike.
    CHECK(completion_opcodes[static_cast<std::uint8_t>(mlx5::CompletionOpcode::memory_key_configured)]);
    CHECK(completion_opcodes[static_cast<std::uint8_t>(mlx5::CompletionOpcode::local_invalidate)]);
    CHECK(completion_opcodes[static_cast<std::uint8_t>(mlx5::CompletionOpcode::rdma_write)]);
    CHECK(completion_opcodes[static_cast<std::uint8_t>(mlx5::CompletionOpcode::send)]);
}

}  // namespace

TEST_CASE("UMR WQEs (key layouts, invalidations and the fence after them) are what the installed libmlx5 writes") {
    ibv_qp_cap caps{};
    caps.max_send_wr = 64;
    caps.max_send_sge = 4;
    caps.max_inline_data = 256;
    caps.max_recv_wr = 1;
    caps.max_recv_sge = 1;
    run(caps, 31, 20000);
    caps.max_send_wr = 16;
    caps.max_send_sge = 2;
    caps.max_inline_data = 60;
    run(caps, 32, 20000);
}
