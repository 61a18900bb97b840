// The flight recorder's inside: one ring per process of the last kCapacity events of the
// software device, the channel core and the handshake, fixed-size records, always on. A rare
// failure that leaves no trace cannot be found, and logging changes the timing enough to hide
// it; recording an event costs a few stores. The public side (dump) is
// include/rdmachan/flight_recorder.hpp.
//
// The recorder knows no layer's events: each layer declares its own enum (a 16-bit number range
// of its own) beside its code and registers the names the dump prints (common/flight_events.hpp).
//
// record() is called on the data path: it never allocates, locks or throws. dump_automatically()
// runs on an error path of the data path (an error completion, a passed deadline): it neither
// allocates, locks nor throws either (a stack buffer and write(2)).
#pragma once

#include <atomic>
#include <concepts>
#include <cstdint>
#include <type_traits>

namespace rdmachan::flight {

// A layer's event enum: its numbers are what a record stores (event 0 is never used).
template <typename LayerEvent>
concept EventEnum = std::is_enum_v<LayerEvent> && std::same_as<std::underlying_type_t<LayerEvent>, std::uint16_t>;

inline constexpr std::uint32_t kCapacity = 4096;  // a power of two

// The ring, for record() below (inline: a call through the PLT and its register saves cost more
// than the record itself). Each slot is a small seqlock, see flight_recorder.cpp.
namespace ring_detail {
struct alignas(64) Slot {
    // 0: stamp (sequence + 1; 0 while written), 1: time, 2: thread << 32 | event, 3-7: fields.
    std::atomic<std::uint64_t> words[8];
};
// Everything record() reads or claims but the thread's id, in one object: code in a shared
// library reaches each of its global variables through one GOT load, so one object costs one
// load per event where three variables cost three.
struct Ring {
    bool recording_off = false;  // RDMACHAN_FLIGHT_RECORDER=off, read when the library is loaded
    std::atomic<std::uint64_t> next_sequence{0};
    Slot slots[kCapacity];
};
extern Ring ring;
// The thread's Linux id where record() stores it, shifted into the upper half of word 2 (so an
// event costs an OR, not a shift as well); 0 until the thread's first event learns it.
// initial-exec: a load from the thread pointer, not a call to __tls_get_addr.
// constinit: no dynamic initialisation, so no TLS wrapper call where it is read.
extern constinit thread_local std::uint64_t thread_word __attribute__((tls_model("initial-exec")));
std::uint64_t learn_thread_word() noexcept;  // the first event of a thread: one system call
std::uint64_t now_ticks() noexcept;
}  // namespace ring_detail

// Records one event. Lock-free (one atomic increment claims a slot), never allocates, never
// throws; a no-op when RDMACHAN_FLIGHT_RECORDER=off. Always inlined: left to itself GCC keeps
// one out-of-line copy, called through the PLT.
template <EventEnum LayerEvent>
[[gnu::always_inline]] inline void record(LayerEvent event, std::uint64_t a = 0, std::uint64_t b = 0, std::uint64_t c = 0, std::uint64_t d = 0,
                   std::uint64_t e = 0) noexcept {
    using namespace ring_detail;
    Ring& state = ring;
    if (state.recording_off) [[unlikely]]
        return;
    std::uint64_t thread = thread_word;
    if (thread == 0) [[unlikely]]
        thread = learn_thread_word();
    const std::uint64_t sequence = state.next_sequence.fetch_add(1, std::memory_order_relaxed);
    Slot& slot = state.slots[sequence & (kCapacity - 1)];
    slot.words[0].store(0, std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_release);
#if defined(__x86_64__)
    slot.words[1].store(__builtin_ia32_rdtsc(), std::memory_order_relaxed);
#else
    slot.words[1].store(now_ticks(), std::memory_order_relaxed);
#endif
    slot.words[2].store(thread | static_cast<std::uint16_t>(event), std::memory_order_relaxed);
    slot.words[3].store(a, std::memory_order_relaxed);
    slot.words[4].store(b, std::memory_order_relaxed);
    slot.words[5].store(c, std::memory_order_relaxed);
    slot.words[6].store(d, std::memory_order_relaxed);
    slot.words[7].store(e, std::memory_order_relaxed);
    slot.words[0].store(sequence + 1, std::memory_order_release);
}

// A text field: the pointer of a string literal (or other static storage).
inline std::uint64_t text(const char* literal) noexcept { return reinterpret_cast<std::uint64_t>(literal); }

// Writes the ring into a new file of the flight-record directory and says so on stderr, for an
// error completion or a passed deadline; at most RDMACHAN_FLIGHT_RECORD_DUMPS times per process
// (default 4, 0 = never), so a test that fails on purpose a thousand times writes four files.
// `reason` is copied before anything else happens. No allocation, lock or exception.
void dump_automatically(const char* reason) noexcept;

// Writes the ring to `descriptor` under a header naming `reason`. No allocation, lock or
// exception; events recorded meanwhile may appear or not.
void dump_to_descriptor(int descriptor, const char* reason) noexcept;

// Writes the ring into a new file of the flight-record directory; `path` (size `path_size`)
// receives its name. Returns false (and `path` says why) when it could not be written.
bool dump_to_new_file(const char* reason, char* path, std::uint32_t path_size) noexcept;

// How many events were recorded since the process started (the ring keeps the last kCapacity).
std::uint64_t recorded() noexcept;

}  // namespace rdmachan::flight
