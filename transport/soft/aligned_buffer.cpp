// Ring memory of the software device (aligned_buffer.hpp).
#include "transport/soft/aligned_buffer.hpp"

#include <cstdlib>
#include <cstring>
#include <string>

#include "transport/soft/device.hpp"
#include "transport/soft/shared_arena.hpp"

namespace rdmachan::soft {
namespace {

std::uint8_t* allocate_zeroed_pages(std::size_t requested) {
    const std::size_t rounded = requested == 0 ? 4096 : (requested + 4095) & ~std::size_t{4095};
    auto* data = static_cast<std::uint8_t*>(std::aligned_alloc(4096, rounded));
    if (data == nullptr) {
        throw SoftDeviceError("software device: cannot allocate " + std::to_string(requested) +
                              " bytes of ring memory");
    }
    std::memset(data, 0, rounded);
    return data;
}

}  // namespace

AlignedBuffer::AlignedBuffer(std::size_t requested)
    : data(allocate_zeroed_pages(requested)), size(requested) {}

AlignedBuffer::AlignedBuffer(std::size_t requested, SharedArena& from) : size(requested) {
    if (const std::optional<std::uint64_t> offset = from.allocate(requested)) {
        data = from.base() + *offset;  // zeroed by the arena
        arena = &from;
        arena_offset = *offset + 1;
        return;
    }
    data = allocate_zeroed_pages(requested);
}

AlignedBuffer::~AlignedBuffer() {
    if (arena != nullptr) {
        arena->release(arena_offset - 1, size);
    } else {
        std::free(data);
    }
}

}  // namespace rdmachan::soft
