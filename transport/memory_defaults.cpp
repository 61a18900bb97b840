// allocate_memory for devices whose memory needs nothing special: anonymous pages, registered.
#include <sys/mman.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "rdmachan/error.hpp"
#include "transport/device_interface.hpp"

namespace rdmachan::transport {
namespace {

// Deregisters first, then unmaps: the device never holds a registration of unmapped memory.
struct AllocatedMemory {
    Registration registration;
    void* memory = nullptr;
    std::size_t bytes = 0;
    ~AllocatedMemory() {
        registration.owner.reset();
        ::munmap(memory, bytes);
    }
};

}  // namespace

Registration ProtectionDomain::allocate_memory(std::size_t length, std::uint32_t access) {
    if (length == 0) throw Error("allocate_memory: length is 0");
    constexpr std::size_t kPage = 4096;
    if (length > ~std::size_t{0} - kPage) throw Error("allocate_memory: length " + std::to_string(length) + " is too large");
    const std::size_t bytes = (length + kPage - 1) & ~(kPage - 1);
    // Whole pages of their own: a registration pins pages, and these share none with the heap.
    void* memory = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (memory == MAP_FAILED) {
        throw Error("allocate_memory: mapping " + std::to_string(length) + " bytes failed: " + std::strerror(errno));
    }
    auto allocated = std::make_shared<AllocatedMemory>();
    allocated->memory = memory;
    allocated->bytes = bytes;
    allocated->registration = register_memory(memory, length, access);  // on a throw, ~AllocatedMemory unmaps
    Registration registration;
    registration.lkey = allocated->registration.lkey;
    registration.rkey = allocated->registration.rkey;
    registration.data = static_cast<std::uint8_t*>(memory);
    // Ends the inner registration; the pages stay mapped until the owner goes.
    registration.deregister = allocated->registration.deregister;
    registration.owner = std::move(allocated);
    return registration;
}

}  // namespace rdmachan::transport
