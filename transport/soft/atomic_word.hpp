// The one atomic operation the software device performs on a 64-bit word, shared by the
// responder and the zero-hop path: both must run the same instruction on the same memory for
// each to be atomic with respect to the other (transport/soft/README.md "Zero-hop atomics").
#pragma once

#include <cstdint>

#include "transport/soft/wire.hpp"

namespace rdmachan::soft {

// Fetch-and-add or compare-and-swap on `word`, with the request's operands in the responder's
// host byte order; returns the word's original value, which the response carries.
inline std::uint64_t perform_atomic(std::uint64_t* word, const wire::Request& request, bool fetch_and_add) {
    if (fetch_and_add) return __atomic_fetch_add(word, request.compare_add, __ATOMIC_SEQ_CST);
    std::uint64_t original = request.compare_add;
    __atomic_compare_exchange_n(word, &original, request.swap, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
    return original;
}

}  // namespace rdmachan::soft
