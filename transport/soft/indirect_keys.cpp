// Indirect memory keys: creating and destroying them, and executing the UMR WQEs that configure
// and invalidate them (the WQE on its send queue, then its effect on the key). Translating an
// access through one is MemoryTranslation::translate's (memory_translation.cpp). The UMR bytes are
// decoded here from wqe_layout.hpp offsets, apart from the encoder (umr_segments.hpp), as the
// rest of the device decodes WQEs; transport/mlx5/README.md "UMR WQEs" has the layouts and
// their sources.
#include <cstring>
#include <random>
#include <string>

#include "common/logger.hpp"
#include "transport/mlx5/byte_order.hpp"
#include "transport/mlx5/work_request.hpp"
#include "transport/mlx5/wqe_layout.hpp"
#include "transport/soft/device_core.hpp"
#include "transport/soft/send_ring_bytes.hpp"

namespace rdmachan::soft {
using namespace rdmachan::mlx5;

IndirectKey::~IndirectKey() {
    DeviceCore& core = domain_->device()->core();
    std::lock_guard lock(core.mutex);
    core.translation.remove_indirect_key(key_);
}

std::shared_ptr<IndirectKey> Device::create_indirect_key(const std::shared_ptr<ProtectionDomain>& domain,
                                                         std::uint32_t max_entries) {
    if (domain == nullptr || domain->device().get() != this) {
        throw SoftDeviceError("create_indirect_key: the protection domain belongs to another device");
    }
    if (max_entries == 0 || max_entries > kMaxIndirectEntries) {
        throw SoftDeviceError("create_indirect_key: max_entries = " + std::to_string(max_entries) + " (1 to " +
                              std::to_string(kMaxIndirectEntries) + ")");
    }
    // As _mlx5dv_create_mkey: the capacity rounded up to a multiple of 4, the key created free
    // with tag 0 (lkey = rkey = index << 8).
    const std::uint32_t capacity = (max_entries + 3) / 4 * 4;
    std::lock_guard lock(core_->mutex);
    const std::uint32_t key = core_->translation.allocate_key_index() << 8;
    IndirectKeyState state;
    state.protection_domain = domain->handle();
    state.max_entries = capacity;
    core_->translation.add_indirect_key(key, std::move(state));
    return std::shared_ptr<IndirectKey>(new IndirectKey(domain, key, capacity));
}

bool Requester::execute_umr(QueuePairContext& queue_pair, std::uint32_t index, const std::uint8_t* control) {
    const SendQueueRing& ring = queue_pair.send_ring;
    const std::size_t wqe_offset = static_cast<std::size_t>(index & (ring.wqe_count - 1)) * kSendWqeBasicBlockSize;
    const std::uint32_t ds = load_big32(control + kCtrlQpnDs) & kMaxDs;
    const std::uint32_t wqebbs = (ds * kSegmentUnit + kSendWqeBasicBlockSize - 1) / kSendWqeBasicBlockSize;
    const std::uint16_t wqe_counter = static_cast<std::uint16_t>(index);
    // Completions come in order: the UMR waits until the requests before it were answered.
    if (!queue_pair.in_flight.empty()) {
        queue_pair.umr_waits_for_answers = true;
        return false;
    }
    queue_pair.umr_waits_for_answers = false;
    auto fail = [&](std::uint8_t syndrome, const std::string& why) {
        completions.write_error(*queue_pair.send_cq, queue_pair, true, wqe_counter, kOpcodeUmr, syndrome);
        queue_pair.executed += wqebbs;
        detail::logger().info("software device {}: QP {}: UMR WQE {} refused: {}", owner.name(), queue_pair.qpn,
                              wqe_counter, why);
        move_to_error(queue_pair, "UMR WQE refused");
        return false;
    };
    if (queue_pair.transport != Transport::reliable_connected) return fail(kSyndromeLocalQpOperation, "not an RC QP");
    if (ds < kUmrHeaderUnits) return fail(kSyndromeLocalQpOperation, "ds " + std::to_string(ds) + " below the UMR headers");

    if (const auto refusal = translation.apply_umr(queue_pair.protection_domain, load_big32(control + kCtrlImmediate), ring,
                                                   wqe_offset, ds)) {
        return fail(refusal->syndrome, refusal->why);
    }
    if ((control[kCtrlFmCeSe] & kCtrlCqUpdate) != 0) {
        completions.write_requester(*queue_pair.send_cq, queue_pair, wqe_counter, kOpcodeUmr, 0);
    }
    queue_pair.executed += wqebbs;
    return true;
}

std::optional<MemoryTranslation::Refusal> MemoryTranslation::apply_umr(std::uint32_t protection_domain, std::uint32_t key,
                                                                       const SendQueueRing& ring, std::size_t wqe_offset,
                                                                       std::uint32_t ds) {
    auto fail = [](std::uint8_t syndrome, std::string why) { return Refusal{syndrome, std::move(why)}; };
    std::uint8_t umr_control[kUmrControlSegmentSize];
    std::uint8_t mkey_context[kMkeyContextSegmentSize];
    copy_from_send_ring(ring, wqe_offset + kControlSegmentSize, umr_control, sizeof umr_control);
    copy_from_send_ring(ring, wqe_offset + kSendWqeBasicBlockSize, mkey_context, sizeof mkey_context);
    auto found = indirect_keys_.find(key);
    if (found == indirect_keys_.end() || found->second.protection_domain != protection_domain) {
        return fail(kSyndromeLocalProtection, "key 0x" + std::to_string(key) + " is no indirect key of the QP's protection domain");
    }
    IndirectKeyState& state = found->second;
    const std::uint64_t mask = load_big64(umr_control + kUmrMkeyMask);
    const bool frees = (mask & kUmrMaskFree) != 0 && (mkey_context[kMkeyFree] & kMkeyFreeFlag) != 0;
    if (frees) {
        // LOCAL_INV: from now on the key translates nothing.
        state.configured = false;
        state.entries.clear();
        state.length = 0;
    } else {
        const std::uint32_t translation_bytes = load_big16(umr_control + kUmrKlmOctowords) * kSegmentUnit;
        if ((umr_control[kUmrFlags] & kUmrFlagInline) == 0 || (mask & kUmrMaskLength) == 0 ||
            kUmrHeaderUnits * kSegmentUnit + translation_bytes > ds * kSegmentUnit) {
            return fail(kSyndromeLocalQpOperation, "a key configuration without inline translations of the size ds gives");
        }
        if ((load_big32(mkey_context + kMkeyQpnMkey) & 0xff) != (key & 0xff)) {
            return fail(kSyndromeLocalProtection, "the mkey context's tag differs from the key's");
        }
        std::vector<std::uint8_t> translation(translation_bytes);
        copy_from_send_ring(ring, wqe_offset + kUmrHeaderUnits * kSegmentUnit, translation.data(), translation.size());
        const std::uint64_t length = load_big64(mkey_context + kMkeyLength);
        const std::uint8_t access = mkey_context[kMkeyAccessFlags];
        const std::uint32_t slots = translation_bytes / kUmrEntrySize;

        IndirectKeyState next;
        next.protection_domain = state.protection_domain;
        next.max_entries = state.max_entries;
        next.configured = true;
        next.access = access;
        next.length = length;
        // A repeat block header has op 0x400 where a list entry has its lkey, and its own length
        // rule; both must hold for the translation to be read as interleaved.
        if (slots >= 1 && load_big32(translation.data() + 4) == kRepeatBlockOp) {
            const std::uint32_t count = load_big16(translation.data() + 14);
            const std::uint32_t pattern = load_big32(translation.data());
            const std::uint32_t repeat = load_big32(translation.data() + 8);
            next.interleaved = count + 1 <= slots && std::uint64_t{pattern} * repeat == length;
            if (next.interleaved) {
                next.repeat_count = repeat;
                next.pattern_bytes = pattern;
                for (std::uint32_t i = 1; i <= count; ++i) {
                    const std::uint8_t* entry = translation.data() + i * kUmrEntrySize;
                    next.entries.push_back({load_big32(entry + 4), load_big64(entry + 8), load_big16(entry + 2),
                                            load_big16(entry)});
                }
            }
        }
        if (!next.interleaved) {
            for (std::uint32_t i = 0; i < slots; ++i) {
                const std::uint8_t* entry = translation.data() + i * kUmrEntrySize;
                IndirectEntry parsed{load_big32(entry + 4), load_big64(entry + 8), load_big32(entry), 0};
                if (parsed.key == 0 && parsed.addr == 0 && parsed.byte_count == 0) continue;  // padding
                next.entries.push_back(parsed);
            }
        }
        if (next.entries.size() > state.max_entries) {
            return fail(kSyndromeLocalQpOperation, std::to_string(next.entries.size()) + " entries, the key holds " +
                                                       std::to_string(state.max_entries));
        }
        // Each entry: a region of this protection domain (not another indirect key), the whole
        // span the pattern touches inside it, and every right the key grants.
        const std::uint32_t needed = region_access_for_key(access);
        std::uint64_t total = 0;
        std::uint32_t pattern_check = 0;
        for (std::size_t i = 0; i < next.entries.size(); ++i) {
            const IndirectEntry& entry = next.entries[i];
            total += entry.byte_count;
            pattern_check += entry.byte_count;
            if (entry.byte_count == 0) continue;
            if (next.interleaved && entry.stride < entry.byte_count) {
                return fail(kSyndromeLocalQpOperation, "entry " + std::to_string(i) + ": stride below byte_count");
            }
            const std::uint64_t span = next.interleaved && next.repeat_count > 1
                                           ? std::uint64_t{entry.stride} * (next.repeat_count - 1) + entry.byte_count
                                           : entry.byte_count;
            if (next.interleaved && next.repeat_count == 0) continue;
            auto region = regions_.find(entry.key);
            if (region == regions_.end() || region->second.protection_domain != protection_domain) {
                return fail(kSyndromeLocalProtection, "entry " + std::to_string(i) + ": key is no region of the QP's protection domain");
            }
            if (!region->second.admits(protection_domain, entry.addr, span, 0)) {
                return fail(kSyndromeLocalProtection, "entry " + std::to_string(i) + ": outside its region");
            }
            if ((region->second.access & needed) != needed) {
                return fail(kSyndromeLocalProtection, "entry " + std::to_string(i) + ": its region lacks an access right the key grants");
            }
        }
        const std::uint64_t expected_length = next.interleaved ? std::uint64_t{pattern_check} * next.repeat_count : total;
        if (expected_length != length) {
            return fail(kSyndromeLocalQpOperation, "length " + std::to_string(length) + " differs from the entries' " +
                                                       std::to_string(expected_length));
        }
        state = std::move(next);
    }
    return std::nullopt;
}

}  // namespace rdmachan::soft
