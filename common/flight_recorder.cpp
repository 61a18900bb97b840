// The flight recorder's ring and its dump (see flight_recorder.hpp for why it exists).
//
// Each slot is a small seqlock: a writer claims a sequence number with one atomic increment,
// marks its slot as being written (stamp 0), stores the fields and publishes the stamp
// (sequence + 1) with a release store. A dump reads a slot's stamp, its fields, then the stamp
// again, and prints the slot only when both stamps are the one expected: a slot overwritten
// while it was read is left out, never printed torn. Every field is an atomic word (relaxed:
// plain stores on x86), so a dump running beside writers is race-free under ThreadSanitizer too.
#include "common/flight_recorder.hpp"

#include <fcntl.h>
#include <pthread.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <algorithm>
#include <cerrno>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "common/flight_events.hpp"

namespace rdmachan::flight {
namespace ring_detail {
std::uint64_t now_ticks() noexcept;
}
namespace {

using ring_detail::now_ticks;

std::atomic<std::uint32_t> automatic_dumps{0};
std::atomic<std::uint32_t> files_written{0};

// Read once when the library is loaded; recording is on before that.
struct Settings {
    bool off = false;
    std::uint32_t automatic_dump_limit = 4;
    Settings() {
        if (const char* value = std::getenv("RDMACHAN_FLIGHT_RECORDER"); value != nullptr && std::strcmp(value, "off") == 0) off = true;
        if (const char* value = std::getenv("RDMACHAN_FLIGHT_RECORD_DUMPS"); value != nullptr) {
            automatic_dump_limit = static_cast<std::uint32_t>(std::strtoul(value, nullptr, 10));
        }
        ring_detail::ring.recording_off = off;
        // A forked child is a new thread with its parent's thread-local id: forget it, so the
        // child's first event learns its own (multi-process tests fork their ranks).
        ::pthread_atfork(nullptr, nullptr, [] { ring_detail::thread_word = 0; });
    }
};
const Settings settings;

std::uint64_t monotonic_nanoseconds() noexcept {
    timespec now{};
    ::clock_gettime(CLOCK_MONOTONIC, &now);
    return static_cast<std::uint64_t>(now.tv_sec) * 1000000000ull + static_cast<std::uint64_t>(now.tv_nsec);
}

// The calibration's first point, taken when the library is loaded.
struct Epoch {
    std::uint64_t ticks = now_ticks();
    std::uint64_t nanoseconds = monotonic_nanoseconds();
};
const Epoch epoch;

// Output through a fixed buffer and write(2): no allocation, no lock (stdio has one).
class Writer {
public:
    explicit Writer(int descriptor) : descriptor_(descriptor) {}
    ~Writer() { flush(); }
    Writer(const Writer&) = delete;
    Writer& operator=(const Writer&) = delete;
    void print(const char* format, ...) __attribute__((format(printf, 2, 3))) {
        if (sizeof buffer_ - used_ < 512) flush();
        va_list arguments;
        va_start(arguments, format);
        const int written = std::vsnprintf(buffer_ + used_, sizeof buffer_ - used_, format, arguments);
        va_end(arguments);
        if (written > 0) used_ += std::min<std::size_t>(static_cast<std::size_t>(written), sizeof buffer_ - used_ - 1);
    }
    void flush() {
        std::size_t offset = 0;
        while (offset < used_) {
            const ssize_t written = ::write(descriptor_, buffer_ + offset, used_ - offset);
            if (written < 0 && errno == EINTR) continue;
            if (written <= 0) break;
            offset += static_cast<std::size_t>(written);
        }
        used_ = 0;
    }

private:
    int descriptor_;
    std::size_t used_ = 0;
    char buffer_[8192];
};

void print_field(Writer& out, const FieldDescription& field, std::uint64_t value) {
    switch (field.format) {
        case FieldFormat::none: return;
        case FieldFormat::decimal: out.print(" %s=%llu", field.name, static_cast<unsigned long long>(value)); return;
        case FieldFormat::hex: out.print(" %s=0x%llx", field.name, static_cast<unsigned long long>(value)); return;
        case FieldFormat::text:
            out.print(" %s=\"%s\"", field.name, value == 0 ? "" : reinterpret_cast<const char*>(value));
            return;
        case FieldFormat::named: out.print(" %s=%s", field.name, field.namer != nullptr ? field.namer(value) : "?"); return;
    }
}

// An event no layer registered (a record from a newer build): its number and every field in hex.
void print_unknown(Writer& out, std::uint16_t event, const std::uint64_t* fields) {
    out.print(" unknown event=%u", static_cast<unsigned>(event));
    const char names[] = "abcde";
    for (int i = 0; i < 5; ++i) out.print(" %c=0x%llx", names[i], static_cast<unsigned long long>(fields[i]));
}

// The directory dumps go to: $RDMACHAN_FLIGHT_RECORD_DIR, else $TMPDIR, else /tmp; created when
// missing. Returns false when it cannot be made.
bool make_directory(char* directory, std::size_t size) {
    const char* chosen = std::getenv("RDMACHAN_FLIGHT_RECORD_DIR");
    if (chosen == nullptr || *chosen == '\0') chosen = std::getenv("TMPDIR");
    if (chosen == nullptr || *chosen == '\0') chosen = "/tmp";
    if (std::snprintf(directory, size, "%s", chosen) >= static_cast<int>(size)) return false;
    for (char* slash = directory + 1;; ++slash) {
        const bool end = *slash == '\0';
        if (*slash == '/' || end) {
            const char saved = *slash;
            *slash = '\0';
            if (::mkdir(directory, 0755) != 0 && errno != EEXIST) return false;
            *slash = saved;
        }
        if (end) return true;
    }
}

}  // namespace

namespace ring_detail {

constinit Ring ring;
constinit thread_local std::uint64_t thread_word __attribute__((tls_model("initial-exec"))) = 0;

std::uint64_t learn_thread_word() noexcept {
    thread_word = static_cast<std::uint64_t>(static_cast<std::uint32_t>(::syscall(SYS_gettid))) << 32;
    return thread_word;
}

// Time: the TSC where there is one (one instruction, no system call), converted to
// CLOCK_MONOTONIC when dumped, so records of several processes can be merged by time.
std::uint64_t now_ticks() noexcept {
#if defined(__x86_64__)
    return __builtin_ia32_rdtsc();
#else
    timespec now{};
    ::clock_gettime(CLOCK_MONOTONIC, &now);
    return static_cast<std::uint64_t>(now.tv_sec) * 1000000000ull + static_cast<std::uint64_t>(now.tv_nsec);
#endif
}

}  // namespace ring_detail

using ring_detail::ring;
using ring_detail::Slot;

std::uint64_t recorded() noexcept { return ring.next_sequence.load(std::memory_order_relaxed); }

void dump_to_descriptor(int descriptor, const char* reason) noexcept {
    Writer out(descriptor);
    const std::uint64_t end = ring.next_sequence.load(std::memory_order_acquire);
    const std::uint64_t begin = end > kCapacity ? end - kCapacity : 0;
    // The second calibration point: ticks to CLOCK_MONOTONIC nanoseconds.
    const std::uint64_t ticks_now = now_ticks();
    const std::uint64_t nanoseconds_now = monotonic_nanoseconds();
    const double nanoseconds_per_tick = ticks_now > epoch.ticks
                                            ? static_cast<double>(nanoseconds_now - epoch.nanoseconds) /
                                                  static_cast<double>(ticks_now - epoch.ticks)
                                            : 1.0;
    out.print("rdmachan flight record of pid %d: %s\n", static_cast<int>(::getpid()), reason);
    out.print("%llu events recorded, the last %llu kept (oldest first)%s; time: CLOCK_MONOTONIC seconds; "
              "thread: Linux thread id\n",
              static_cast<unsigned long long>(end), static_cast<unsigned long long>(end - begin),
              settings.off ? " (recording is off: RDMACHAN_FLIGHT_RECORDER=off)" : "");
    std::uint64_t printed = 0;
    for (std::uint64_t sequence = begin; sequence < end; ++sequence) {
        const Slot& slot = ring.slots[sequence & (kCapacity - 1)];
        const std::uint64_t stamp = slot.words[0].load(std::memory_order_acquire);
        std::uint64_t words[8];
        for (int i = 1; i < 8; ++i) words[i] = slot.words[i].load(std::memory_order_relaxed);
        std::atomic_thread_fence(std::memory_order_acquire);
        if (stamp != sequence + 1 || slot.words[0].load(std::memory_order_relaxed) != stamp) continue;  // overwritten or unfinished
        const auto event = static_cast<std::uint16_t>(words[2] & 0xffff);
        const DescribedEvent described = describe(event);
        const double when = static_cast<double>(epoch.nanoseconds) +
                            static_cast<double>(static_cast<std::int64_t>(words[1] - epoch.ticks)) * nanoseconds_per_tick;
        out.print("#%llu %.6f tid %u", static_cast<unsigned long long>(sequence), when / 1e9, static_cast<unsigned>(words[2] >> 32));
        if (described.event != nullptr) {
            out.print(" %s.%s", described.layer, described.event->name);
            for (int i = 0; i < 5; ++i) print_field(out, described.event->fields[i], words[3 + i]);
        } else {
            print_unknown(out, event, words + 3);
        }
        out.print("\n");
        ++printed;
    }
    out.print("end of flight record (%llu events printed)\n", static_cast<unsigned long long>(printed));
}

bool dump_to_new_file(const char* reason, char* path, std::uint32_t path_size) noexcept {
    char directory[512];
    if (!make_directory(directory, sizeof directory)) {
        std::snprintf(path, path_size, "cannot create the flight-record directory %s: %s", directory, std::strerror(errno));
        return false;
    }
    // Files of one test run share a prefix (RDMACHAN_FLIGHT_RECORD_RUN, set by the test main and
    // inherited by the processes it starts), so a run can keep or remove all of them.
    const char* run = std::getenv("RDMACHAN_FLIGHT_RECORD_RUN");
    const int pid = static_cast<int>(::getpid());
    const unsigned number = files_written.fetch_add(1) + 1;
    if (run != nullptr && *run != '\0') {
        std::snprintf(path, path_size, "%s/flight-%s-%d-%u.txt", directory, run, pid, number);
    } else {
        std::snprintf(path, path_size, "%s/flight-%d-%u.txt", directory, pid, number);
    }
    const int descriptor = ::open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (descriptor < 0) {
        const int error = errno;
        char failed[512];
        std::snprintf(failed, sizeof failed, "%s", path);
        std::snprintf(path, path_size, "cannot create %s: %s", failed, std::strerror(error));
        return false;
    }
    dump_to_descriptor(descriptor, reason);
    ::close(descriptor);
    return true;
}

void dump_automatically(const char* reason) noexcept {
    if (automatic_dumps.fetch_add(1) >= settings.automatic_dump_limit) return;
    char copied[256];
    std::snprintf(copied, sizeof copied, "%s", reason);
    char path[640];
    const bool written = dump_to_new_file(copied, path, sizeof path);
    Writer out(STDERR_FILENO);
    if (written) out.print("rdmachan: flight record (%s) written to %s\n", copied, path);
    else out.print("rdmachan: flight record (%s) not written: %s\n", copied, path);
}

}  // namespace rdmachan::flight
