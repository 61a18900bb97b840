// Memory layouts on the engine: an indirect key from the device, configured by a UMR
// work request on the engine's LayoutQueuePair, handed out as a zero-based MemoryRegion.
// Control path only: it allocates, throws and waits, as register_memory does.
#include <string>
#include <vector>

#include "rdmachan/error.hpp"
#include "src/engine.hpp"
#include "src/registered.hpp"
#include "transport/mlx5/umr_segments.hpp"

namespace rdmachan {

class EngineLayoutAccess {
public:
    static MemoryRegion make(std::shared_ptr<void> owner, std::size_t length, std::uint32_t lkey, std::uint32_t rkey) {
        auto registered = std::make_shared<detail::Registered>();
        registered->owner = std::move(owner);  // no early deregistration: the key goes with the last copy
        return MemoryRegion(std::move(registered), nullptr, length, lkey, rkey, true);
    }
    static const std::vector<LocalSlice>& slices(const MemoryLayout& layout) { return layout.slices_; }
    static const MemoryLayout::Strided& strided(const MemoryLayout& layout) { return layout.strided_; }
    static bool is_strided(const MemoryLayout& layout) { return layout.is_strided_; }
};

namespace {

std::uint8_t key_access(Access access) {
    const auto bits = static_cast<std::uint32_t>(access);
    std::uint8_t result = 0;
    if ((bits & static_cast<std::uint32_t>(Access::local_write)) != 0) result |= mlx5::kMemoryKeyLocalWrite;
    if ((bits & static_cast<std::uint32_t>(Access::remote_read)) != 0) result |= mlx5::kMemoryKeyRemoteRead;
    if ((bits & static_cast<std::uint32_t>(Access::remote_write)) != 0) result |= mlx5::kMemoryKeyRemoteWrite;
    if ((bits & static_cast<std::uint32_t>(Access::remote_atomic)) != 0) result |= mlx5::kMemoryKeyAtomic;
    return result;
}

}  // namespace

namespace detail {

MemoryRegion Engine::register_layout(const MemoryLayout& layout, Access access) {
    const std::string call = "register_layout";
    const bool strided = EngineLayoutAccess::is_strided(layout);
    const std::vector<LocalSlice>& slices = EngineLayoutAccess::slices(layout);
    const std::uint32_t entries = strided ? 1u : static_cast<std::uint32_t>(slices.size());
    if (entries == 0) throw Error(call + ": the layout has no slices");
    const std::uint32_t limit = mlx5::umr_max_entries(strided, settings_.max_inline_data);
    if (entries > limit) {
        throw Error(call + ": " + std::to_string(entries) + " entries; a queue pair with max_inline_data " +
                    std::to_string(settings_.max_inline_data) + " carries at most " + std::to_string(limit) +
                    " (ChannelSettings::max_inline_data)");
    }
    transport::IndirectKeyRegistration key = domain_->create_indirect_key(entries);

    std::vector<mlx5::ScatterGatherElement> list;
    mlx5::InterleavedEntry pattern;
    mlx5::MemoryKeyLayout description;
    description.mkey = key.lkey;
    description.max_entries = key.max_entries;
    description.access = key_access(access);
    description.num_entries = entries;
    std::uint64_t length = 0;
    if (strided) {
        const MemoryLayout::Strided& shape = EngineLayoutAccess::strided(layout);
        pattern = {shape.addr, shape.block_length, shape.stride - shape.block_length, shape.lkey};
        description.interleaved = &pattern;
        description.repeat_count = shape.repeat_count;
        length = std::uint64_t{shape.block_length} * shape.repeat_count;
    } else {
        for (const LocalSlice& slice : slices) {
            list.push_back({slice.addr(), slice.length(), slice.lkey()});
            length += slice.length();
        }
        description.list = list.data();
    }
    mlx5::SendWorkRequest request;
    request.opcode = mlx5::SendOpcode::configure_memory_key;
    request.flags = mlx5::kSendInline;
    request.layout = &description;
    layouts_.configure(request, call);
    return EngineLayoutAccess::make(std::move(key.owner), length, key.lkey, key.rkey);
}

}  // namespace detail
}  // namespace rdmachan
