// Indirect memory keys between two processes, each with its own software device:
// list and interleaved layouts, with repeat counts and zero-length entries, as the local and as
// the remote side of RDMA write, RDMA read, send and receive; and every refusal (an entry out of
// its region, an entry of another protection domain, a right missing from the entry's region or
// from the key, a use after LOCAL_INV) with the CQE the NIC reports on each side and the target
// memory untouched. After every step both processes' memory is compared byte for byte with a
// model computed here from the layouts alone (the man page's description of mlx5dv_wr_mr_list
// and mlx5dv_wr_mr_interleaved), so bytes outside a pattern are checked as well as those in it.
//
// Each process configures its keys on a second queue pair of the same protection domain,
// connected to itself (as UCC's tl/mlx5 does with its UMR queue pair): a refused UMR work
// request takes that queue pair to ERR, as on a NIC, and leaves the one to the peer usable.
#include <doctest/doctest.h>

#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "tests/soft/child_process.hpp"
#include "tests/soft/soft_endpoint.hpp"
#include "transport/soft/device_core.hpp"

namespace mlx5 = rdmachan::mlx5;
namespace soft = rdmachan::soft;
using rdmachan::test::Address;
using rdmachan::test::ChildProcess;
using rdmachan::test::read_all;
using rdmachan::test::SoftEndpoint;
using rdmachan::test::write_all;

namespace {

// The suite also runs with RDMACHAN_SOFT_TRANSPORT=tcp (its _tcp variant): no payload then moves
// by cross-memory attach.
bool same_host_path_off() {
    const char* transport = std::getenv("RDMACHAN_SOFT_TRANSPORT");
    return transport != nullptr && std::strcmp(transport, "tcp") == 0;
}

constexpr std::uint32_t kBufferSize = 256 * 1024;  // each process's main buffer
constexpr std::uint32_t kCheckedSpan = kBufferSize;  // all of it compared after every step
constexpr std::uint32_t kKeys = 4;
constexpr std::uint32_t kMaxEntries = 8;  // 8 list entries fit a queue pair with max_inline_data 128
constexpr std::uint32_t kPlainKey = ~0u;  // a receive into the plain region
constexpr std::uint32_t kWarmUpOffset = 250000;  // where the parent's first read lands
constexpr std::uint8_t kAllAccess = mlx5::kMemoryKeyLocalWrite | mlx5::kMemoryKeyRemoteRead |
                                    mlx5::kMemoryKeyRemoteWrite | mlx5::kMemoryKeyAtomic;

std::uint8_t initial_byte(std::uint32_t seed, std::size_t i) {
    return static_cast<std::uint8_t>(i * 29 + (i >> 8) * 7 + seed * 101 + 11);
}

// Which registration an entry points into: the process's main buffer (every right), a region of
// another protection domain, or a region of the same domain registered for remote read only.
enum class RegionName : std::uint32_t { main, other_domain, read_only };

struct Entry {
    RegionName region = RegionName::main;
    std::uint32_t offset = 0;
    std::uint32_t length = 0;
    std::uint32_t skip = 0;  // interleaved only
};

struct Layout {
    std::uint32_t repeat_count = 0;  // 0: a list; otherwise interleaved, repeated this often
    std::uint32_t num_entries = 0;
    Entry entries[kMaxEntries];
    std::uint8_t access = kAllAccess;
};

Layout list(std::initializer_list<Entry> entries, std::uint8_t access = kAllAccess) {
    Layout layout;
    for (const Entry& entry : entries) layout.entries[layout.num_entries++] = entry;
    layout.access = access;
    return layout;
}

Layout interleaved(std::uint32_t repeat_count, std::initializer_list<Entry> entries, std::uint8_t access = kAllAccess) {
    Layout layout = list(entries, access);
    layout.repeat_count = repeat_count;
    return layout;
}

// Byte i of the key (zero-based) is main-buffer byte map[i]: a list's entries back to back; an
// interleaved pattern's entries in order, entry e of repetition r at its offset + r × (its
// length + its skip). Computed from the layout alone, apart from the encoder and the device.
std::vector<std::uint32_t> byte_map(const Layout& layout) {
    std::vector<std::uint32_t> map;
    const std::uint32_t repetitions = layout.repeat_count == 0 ? 1 : layout.repeat_count;
    for (std::uint32_t r = 0; r < repetitions; ++r) {
        for (std::uint32_t e = 0; e < layout.num_entries; ++e) {
            const Entry& entry = layout.entries[e];
            const std::uint32_t start = entry.offset + r * (entry.length + entry.skip);
            for (std::uint32_t i = 0; i < entry.length; ++i) map.push_back(start + i);
        }
    }
    return map;
}

std::vector<std::uint32_t> plain(std::uint32_t offset, std::uint32_t length) {
    std::vector<std::uint32_t> map(length);
    for (std::uint32_t i = 0; i < length; ++i) map[i] = offset + i;
    return map;
}

std::vector<std::uint8_t> gather(const std::vector<std::uint8_t>& model, const std::vector<std::uint32_t>& map,
                                 std::uint32_t offset, std::uint32_t length) {
    REQUIRE(offset + length <= map.size());
    std::vector<std::uint8_t> bytes(length);
    for (std::uint32_t i = 0; i < length; ++i) bytes[i] = model.at(map[offset + i]);
    return bytes;
}

void scatter(std::vector<std::uint8_t>& model, const std::vector<std::uint32_t>& map, std::uint32_t offset,
             const std::vector<std::uint8_t>& bytes) {
    REQUIRE(offset + bytes.size() <= map.size());
    for (std::size_t i = 0; i < bytes.size(); ++i) model.at(map[offset + i]) = bytes[i];
}

// Compares a buffer with its model; on a difference names the first byte and counts them all.
void check_memory(const std::uint8_t* actual, const std::vector<std::uint8_t>& expected, const char* whose) {
    std::size_t differing = 0;
    std::size_t first = 0;
    for (std::size_t i = 0; i < expected.size(); ++i) {
        if (actual[i] != expected[i] && differing++ == 0) first = i;
    }
    INFO(std::string(whose) << ": " << differing << " bytes differ, the first at offset " << first << " (is "
               << int(actual[first]) << ", expected " << int(expected[first]) << ")");
    CHECK(differing == 0);
}

// One process's side: its device, a queue pair to the peer over a 256 KiB buffer, a second queue
// pair of the same protection domain connected to itself for UMR work requests, the regions
// refusals are made of, and kKeys indirect keys.
struct Side {
    std::shared_ptr<soft::Device> device = soft::Device::open();
    std::unique_ptr<SoftEndpoint> data;
    std::unique_ptr<SoftEndpoint> control;
    std::shared_ptr<soft::ProtectionDomain> other_domain;
    std::vector<std::uint8_t> other_memory = std::vector<std::uint8_t>(4096);
    std::vector<std::uint8_t> read_only_memory = std::vector<std::uint8_t>(4096);
    std::shared_ptr<soft::MemoryRegion> other_region;
    std::shared_ptr<soft::MemoryRegion> read_only_region;
    std::vector<std::shared_ptr<soft::IndirectKey>> keys;

    explicit Side(std::uint32_t seed) {
        rdmachan::test::EndpointOptions options;
        options.buffer_size = kBufferSize;
        data = std::make_unique<SoftEndpoint>(device, options);
        for (std::uint32_t i = 0; i < kBufferSize; ++i) data->buffer()[i] = initial_byte(seed, i);
        new_control();
        other_domain = device->allocate_protection_domain();
        // Every right, so that only its protection domain can be what a layout naming it lacks.
        other_region = device->register_memory(other_domain, other_memory.data(), other_memory.size(),
                                               soft::kLocalWrite | soft::kRemoteWrite | soft::kRemoteRead | soft::kRemoteAtomic);
        read_only_region = device->register_memory(data->domain_pointer(), read_only_memory.data(), read_only_memory.size(),
                                                   soft::kRemoteRead);
        for (std::uint32_t k = 0; k < kKeys; ++k) keys.push_back(device->create_indirect_key(data->domain_pointer(), kMaxEntries));
    }

    // A fresh UMR queue pair (after a refused UMR took the last one to ERR).
    void new_control() {
        rdmachan::test::EndpointOptions options;
        options.buffer_size = 4096;
        options.max_send_wr = 16;
        options.max_recv_wr = 1;
        control = std::make_unique<SoftEndpoint>(device, options, data->domain_pointer());
        control->connect(control->address());
    }

    std::pair<std::uint64_t, std::uint32_t> region(RegionName name) const {
        switch (name) {
            case RegionName::other_domain: return {reinterpret_cast<std::uint64_t>(other_memory.data()), other_region->lkey()};
            case RegionName::read_only: return {reinterpret_cast<std::uint64_t>(read_only_memory.data()), read_only_region->lkey()};
            case RegionName::main: break;
        }
        return {reinterpret_cast<std::uint64_t>(data->buffer()), data->lkey()};
    }

    // Posts the key configuration on the UMR queue pair and waits for its completion.
    mlx5::Completion configure(std::uint32_t key, const Layout& layout) {
        mlx5::ScatterGatherElement elements[kMaxEntries];
        mlx5::InterleavedEntry pattern[kMaxEntries];
        mlx5::MemoryKeyLayout description;
        description.mkey = keys.at(key)->lkey();
        description.max_entries = keys.at(key)->max_entries();
        description.access = layout.access;
        description.num_entries = layout.num_entries;
        for (std::uint32_t e = 0; e < layout.num_entries; ++e) {
            const Entry& entry = layout.entries[e];
            const auto [base, lkey] = region(entry.region);
            elements[e] = {base + entry.offset, entry.length, lkey};
            pattern[e] = {base + entry.offset, entry.length, entry.skip, lkey};
        }
        if (layout.repeat_count != 0) {
            description.repeat_count = layout.repeat_count;
            description.interleaved = pattern;
        } else {
            description.list = elements;
        }
        mlx5::SendWorkRequest request;
        request.wr_id = 0xc0f;
        request.opcode = mlx5::SendOpcode::configure_memory_key;
        request.flags = mlx5::kSendSignaled | mlx5::kSendInline;
        request.layout = &description;
        REQUIRE(control->post(&request, 1) == mlx5::PostResult::ok);
        const auto completion = control->wait_send();
        REQUIRE(completion.has_value());
        return *completion;
    }

    mlx5::Completion invalidate(std::uint32_t key) {
        mlx5::SendWorkRequest request;
        request.wr_id = 0x1a;
        request.opcode = mlx5::SendOpcode::local_invalidate;
        request.flags = mlx5::kSendSignaled;
        request.immediate = keys.at(key)->rkey();
        REQUIRE(control->post(&request, 1) == mlx5::PostResult::ok);
        const auto completion = control->wait_send();
        REQUIRE(completion.has_value());
        return *completion;
    }
};

// The child's commands and replies, through the pipes.
enum class Op : std::uint32_t { configure, invalidate, receive, take_receive, dump };

struct Command {
    Op op = Op::dump;
    std::uint32_t key = 0;
    Layout layout;
    std::uint32_t offset = 0;   // receive: into the key (zero-based) or the buffer; dump: the buffer
    std::uint32_t length = 0;   // take_receive: how long to wait, in milliseconds
    std::uint64_t wr_id = 0;
};

struct Reply {
    mlx5::CompletionStatus status = mlx5::CompletionStatus::success;
    mlx5::CompletionOpcode opcode = mlx5::CompletionOpcode::send;
    std::uint8_t syndrome = 0;
    std::uint8_t control_failed = 0;  // configure/invalidate: the UMR queue pair went to ERR
    std::uint32_t byte_len = 0;
    std::uint32_t count = 0;          // take_receive: completions found (0 or 1)
    std::uint64_t wr_id = 0;
    std::uint64_t by_reference = 0;   // requests the child's device moved by cross-memory attach so far
};

struct Hello {
    Address address;
    std::uint32_t keys[kKeys];
};

Reply reply_of(const mlx5::Completion& completion) {
    Reply reply;
    reply.status = completion.status;
    reply.opcode = completion.opcode;
    reply.syndrome = completion.syndrome;
    reply.byte_len = completion.byte_len;
    reply.wr_id = completion.wr_id;
    reply.count = 1;
    return reply;
}

// The child: a passive peer that does what the parent's commands say until the pipe closes.
// Exit codes: 0 after the pipe closed, 100+ for a set-up or command failure.
[[noreturn]] void run_child(int from_parent, int to_parent) {
    {
        Side side(2);
        Hello hello{side.data->address(), {}};
        for (std::uint32_t k = 0; k < kKeys; ++k) hello.keys[k] = side.keys[k]->lkey();
        Address parent{};
        if (!write_all(to_parent, &hello, sizeof hello) || !read_all(from_parent, &parent, sizeof parent)) ::_exit(100);
        side.data->connect(parent);
        // Only now may the parent send: a request reaching a QP not yet in RTR is dropped, as on
        // a NIC, and resent after an ACK timeout (half a second here).
        const char ready = 'r';
        if (!write_all(to_parent, &ready, 1)) ::_exit(104);
        Command command;
        while (read_all(from_parent, &command, sizeof command, 60)) {
            Reply reply;
            switch (command.op) {
                case Op::configure:
                case Op::invalidate: {
                    reply = reply_of(command.op == Op::configure ? side.configure(command.key, command.layout)
                                                                 : side.invalidate(command.key));
                    if (side.control->queue_pair().state() == soft::QueuePairState::error) {
                        reply.control_failed = 1;
                        side.new_control();
                    }
                    break;
                }
                case Op::receive: {
                    const mlx5::ScatterGatherElement element =
                        command.key == kPlainKey ? side.data->local(command.offset, command.length)
                                                 : mlx5::ScatterGatherElement{command.offset, command.length, side.keys.at(command.key)->lkey()};
                    if (side.data->post_receive(command.wr_id, element) != mlx5::PostResult::ok) ::_exit(101);
                    break;
                }
                case Op::take_receive: {
                    const auto completion = side.data->wait_receive(std::chrono::milliseconds(command.length));
                    if (completion.has_value()) reply = reply_of(*completion);
                    break;
                }
                case Op::dump: break;
            }
            reply.by_reference = side.device->transfers_by_reference();
            if (!write_all(to_parent, &reply, sizeof reply)) ::_exit(102);
            if (command.op == Op::dump) {
                // The parent asks only after its requests were answered, and the device answers a
                // request after moving its payload, under its mutex; taking that mutex here makes the
                // ordering, which otherwise goes through the parent's process, one ThreadSanitizer sees.
                { std::lock_guard lock(side.device->core().mutex); }
                // The main buffer's range, then the two small regions refusals point into.
                if (!write_all(to_parent, side.data->buffer() + command.offset, command.length) ||
                    !write_all(to_parent, side.other_memory.data(), side.other_memory.size()) ||
                    !write_all(to_parent, side.read_only_memory.data(), side.read_only_memory.size())) {
                    ::_exit(103);
                }
            }
        }
    }
    ::_exit(0);
}

// The parent's view of the child, and its own side.
class Session {
public:
    Session() : child_(ChildProcess::start(run_child)), side_(std::make_unique<Side>(1)), local_(*side_) {
        Hello hello{};
        REQUIRE(read_all(child_->from_child, &hello, sizeof hello));
        const Address mine = local_.data->address();
        REQUIRE(write_all(child_->to_child, &mine, sizeof mine));
        local_.data->connect(hello.address);
        char ready = 0;
        REQUIRE(read_all(child_->from_child, &ready, 1));
        for (std::uint32_t k = 0; k < kKeys; ++k) remote_keys_[k] = hello.keys[k];
        remote_address_ = hello.address;
        local_model.assign(local_.data->buffer(), local_.data->buffer() + kCheckedSpan);
        remote_model.resize(kCheckedSpan);
        for (std::uint32_t i = 0; i < kCheckedSpan; ++i) remote_model[i] = initial_byte(2, i);
        // A first request settles the path to the child (its reply hello comes before the
        // answer): on this host, payloads of 4 KiB and more move by cross-memory attach from now on.
        const mlx5::ScatterGatherElement into = local_.data->local(kWarmUpOffset, 8);
        mlx5::SendWorkRequest read;
        read.opcode = mlx5::SendOpcode::rdma_read;
        read.flags = mlx5::kSendSignaled;
        read.sg_list = &into;
        read.num_sge = 1;
        read.remote_addr = remote_addr(kWarmUpOffset);
        read.rkey = remote_rkey();
        REQUIRE(run(read).status == mlx5::CompletionStatus::success);
        for (std::uint32_t i = 0; i < 8; ++i) local_model[kWarmUpOffset + i] = remote_model[kWarmUpOffset + i];
    }
    // Both devices close at once: each lingers (up to 200 ms) for its peer's end of the stream.
    ~Session() {
        child_->close_pipes();
        side_.reset();
        CHECK(child_->wait(20) == 0);
    }

    Side& local() { return local_; }
    std::uint32_t remote_key(std::uint32_t key) const { return remote_keys_[key]; }
    // The child's main buffer as a plain region.
    std::uint64_t remote_addr(std::uint32_t offset) const { return remote_address_.buffer_addr + offset; }
    std::uint32_t remote_rkey() const { return remote_address_.rkey; }

    Reply remote(Command command) {
        REQUIRE(write_all(child_->to_child, &command, sizeof command));
        Reply reply;
        REQUIRE(read_all(child_->from_child, &reply, sizeof reply));
        return reply;
    }
    Reply configure_remote(std::uint32_t key, const Layout& layout) {
        Command command;
        command.op = Op::configure;
        command.key = key;
        command.layout = layout;
        return remote(command);
    }
    Reply invalidate_remote(std::uint32_t key) {
        Command command;
        command.op = Op::invalidate;
        command.key = key;
        return remote(command);
    }
    void post_remote_receive(std::uint64_t wr_id, std::uint32_t key, std::uint32_t offset, std::uint32_t length) {
        Command command;
        command.op = Op::receive;
        command.key = key;
        command.offset = offset;
        command.length = length;
        command.wr_id = wr_id;
        remote(command);
    }
    Reply take_remote_receive(std::uint32_t milliseconds) {
        Command command;
        command.op = Op::take_receive;
        command.length = milliseconds;
        return remote(command);
    }

    // Both buffers against their models, every byte of the checked span.
    void check_both() {
        Command command;
        command.op = Op::dump;
        command.offset = 0;
        command.length = kCheckedSpan;
        remote(command);
        std::vector<std::uint8_t> remote_bytes(kCheckedSpan);
        REQUIRE(read_all(child_->from_child, remote_bytes.data(), remote_bytes.size()));
        check_memory(remote_bytes.data(), remote_model, "the child's buffer");
        // Nothing ever writes the region of the other protection domain or the read-only one.
        std::vector<std::uint8_t> small_regions(2 * 4096);
        REQUIRE(read_all(child_->from_child, small_regions.data(), small_regions.size()));
        check_memory(small_regions.data(), std::vector<std::uint8_t>(small_regions.size(), 0), "the child's other regions");
        check_memory(local_.data->buffer(), local_model, "the parent's buffer");
    }

    // Posts one request on the queue pair to the child and waits for its completion.
    mlx5::Completion run(const mlx5::SendWorkRequest& request) {
        REQUIRE(local_.data->post(&request, 1) == mlx5::PostResult::ok);
        const auto completion = local_.data->wait_send();
        REQUIRE(completion.has_value());
        return *completion;
    }

    mlx5::ScatterGatherElement local_key_element(std::uint32_t key, std::uint32_t offset, std::uint32_t length) const {
        return {offset, length, local_.keys.at(key)->lkey()};
    }

    std::vector<std::uint8_t> local_model;
    std::vector<std::uint8_t> remote_model;

private:
    std::unique_ptr<ChildProcess> child_;
    std::unique_ptr<Side> side_;
    Side& local_;
    std::uint32_t remote_keys_[kKeys] = {};
    Address remote_address_{};
};

mlx5::SendWorkRequest request_of(mlx5::SendOpcode opcode, const mlx5::ScatterGatherElement* element,
                                 std::uint64_t remote_addr = 0, std::uint32_t rkey = 0) {
    mlx5::SendWorkRequest request;
    request.wr_id = 7;
    request.opcode = opcode;
    request.flags = mlx5::kSendSignaled;
    request.sg_list = element;
    request.num_sge = 1;
    request.remote_addr = remote_addr;
    request.rkey = rkey;
    return request;
}

void require_success(const mlx5::Completion& completion) {
    INFO("status " << std::string(mlx5::to_string(completion.status)) << ", syndrome " << int(completion.syndrome));
    REQUIRE(completion.status == mlx5::CompletionStatus::success);
}

// The child's layouts (offsets in its buffer) and the parent's. Zero-length entries at the
// start, in the middle and at the end; repeat counts from 7 to 600.
const Layout kRemoteList = list({{RegionName::main, 7000, 0}, {RegionName::main, 1000, 10}, {RegionName::main, 5000, 0},
                                 {RegionName::main, 300, 33}, {RegionName::main, 20000, 7}, {RegionName::main, 9000, 0}});
const Layout kRemoteInterleaved =
    interleaved(20, {{RegionName::main, 40000, 6, 10}, {RegionName::main, 60000, 0, 24}, {RegionName::main, 50000, 3, 1}});
// 8 KiB in 512 pieces: past the same-host path's 4 KiB threshold and its 32 segments.
const Layout kRemoteLarge = interleaved(512, {{RegionName::main, 100000, 16, 48}});
const Layout kLocalList =
    list({{RegionName::main, 2000, 0}, {RegionName::main, 3000, 21}, {RegionName::main, 3500, 0}, {RegionName::main, 6000, 29}});
const Layout kLocalInterleaved =
    interleaved(7, {{RegionName::main, 10000, 5, 3}, {RegionName::main, 11000, 0, 5}, {RegionName::main, 12000, 2, 14}});
const Layout kLocalLarge = interleaved(256, {{RegionName::main, 140000, 32, 32}});

}  // namespace

TEST_CASE("two processes: RDMA write and read through list and interleaved keys on either side or both") {
    Session session;
    Side& local = session.local();
    const Layout remote_layouts[3] = {kRemoteList, kRemoteInterleaved, kRemoteLarge};
    const Layout local_layouts[3] = {kLocalList, kLocalInterleaved, kLocalLarge};
    std::vector<std::uint32_t> remote_maps[3];
    std::vector<std::uint32_t> local_maps[3];
    for (std::uint32_t k = 0; k < 3; ++k) {
        const Reply configured = session.configure_remote(k, remote_layouts[k]);
        REQUIRE(configured.status == mlx5::CompletionStatus::success);
        CHECK(configured.opcode == mlx5::CompletionOpcode::memory_key_configured);
        const mlx5::Completion local_configured = local.configure(k, local_layouts[k]);
        REQUIRE(local_configured.status == mlx5::CompletionStatus::success);
        remote_maps[k] = byte_map(remote_layouts[k]);
        local_maps[k] = byte_map(local_layouts[k]);
    }
    REQUIRE(remote_maps[0].size() == 50);
    REQUIRE(remote_maps[1].size() == 180);
    REQUIRE(local_maps[0].size() == 50);
    REQUIRE(local_maps[1].size() == 49);
    REQUIRE(remote_maps[2].size() == 8192);
    REQUIRE(local_maps[2].size() == 8192);
    auto& local_model = session.local_model;
    auto& remote_model = session.remote_model;

    SUBCASE("write: plain region to a remote list key") {
        const mlx5::ScatterGatherElement from = local.data->local(200000, 50);
        require_success(session.run(request_of(mlx5::SendOpcode::rdma_write, &from, 0, session.remote_key(0))));
        scatter(remote_model, remote_maps[0], 0, gather(local_model, plain(200000, 50), 0, 50));
    }
    SUBCASE("write: local interleaved key to a remote interleaved key, at an offset across pieces") {
        const mlx5::ScatterGatherElement from = session.local_key_element(1, 0, 49);
        require_success(session.run(request_of(mlx5::SendOpcode::rdma_write, &from, 5, session.remote_key(1))));
        scatter(remote_model, remote_maps[1], 5, gather(local_model, local_maps[1], 0, 49));
    }
    SUBCASE("write: local list key to a remote interleaved key") {
        const mlx5::ScatterGatherElement from = session.local_key_element(0, 0, 50);
        require_success(session.run(request_of(mlx5::SendOpcode::rdma_write, &from, 100, session.remote_key(1))));
        scatter(remote_model, remote_maps[1], 100, gather(local_model, local_maps[0], 0, 50));
    }
    SUBCASE("write: local list key to a plain remote region; read: a plain remote region into a local list key") {
        const mlx5::ScatterGatherElement from = session.local_key_element(0, 4, 40);
        require_success(session.run(request_of(mlx5::SendOpcode::rdma_write, &from, session.remote_addr(150000), session.remote_rkey())));
        scatter(remote_model, plain(150000, 40), 0, gather(local_model, local_maps[0], 4, 40));
        const mlx5::ScatterGatherElement into = session.local_key_element(0, 0, 50);
        require_success(session.run(request_of(mlx5::SendOpcode::rdma_read, &into, session.remote_addr(149990), session.remote_rkey())));
        scatter(local_model, local_maps[0], 0, gather(remote_model, plain(149990, 50), 0, 50));
    }
    SUBCASE("read: a remote list key into a local interleaved key") {
        const mlx5::ScatterGatherElement into = session.local_key_element(1, 2, 40);
        const mlx5::Completion read = session.run(request_of(mlx5::SendOpcode::rdma_read, &into, 3, session.remote_key(0)));
        require_success(read);
        CHECK(read.byte_len == 40);
        scatter(local_model, local_maps[1], 2, gather(remote_model, remote_maps[0], 3, 40));
    }
    SUBCASE("read: a whole remote interleaved key into a plain region") {
        const mlx5::ScatterGatherElement into = local.data->local(210000, 180);
        require_success(session.run(request_of(mlx5::SendOpcode::rdma_read, &into, 0, session.remote_key(1))));
        scatter(local_model, plain(210000, 180), 0, gather(remote_model, remote_maps[1], 0, 180));
    }
    SUBCASE("8 KiB in 512 and 256 pieces: write both sides keyed, then read back both ways") {
        const std::uint64_t moved_before = session.take_remote_receive(0).by_reference;
        // From a plain region into 512 pieces: by reference, through the child's bounce buffer.
        const mlx5::ScatterGatherElement from_plain = local.data->local(230000, 8192);
        require_success(session.run(request_of(mlx5::SendOpcode::rdma_write, &from_plain, 0, session.remote_key(2))));
        scatter(remote_model, remote_maps[2], 0, gather(local_model, plain(230000, 8192), 0, 8192));
        const mlx5::ScatterGatherElement from = session.local_key_element(2, 0, 8192);
        require_success(session.run(request_of(mlx5::SendOpcode::rdma_write, &from, 0, session.remote_key(2))));
        scatter(remote_model, remote_maps[2], 0, gather(local_model, local_maps[2], 0, 8192));
        const mlx5::ScatterGatherElement into_plain = local.data->local(220000, 8192);
        require_success(session.run(request_of(mlx5::SendOpcode::rdma_read, &into_plain, 0, session.remote_key(2))));
        scatter(local_model, plain(220000, 8192), 0, gather(remote_model, remote_maps[2], 0, 8192));
        const mlx5::ScatterGatherElement into_key = session.local_key_element(2, 100, 4000);
        require_success(session.run(request_of(mlx5::SendOpcode::rdma_read, &into_key, 1000, session.remote_key(2))));
        scatter(local_model, local_maps[2], 100, gather(remote_model, remote_maps[2], 1000, 4000));
        // The plain-sided write and read went by cross-memory attach (a side with more than 32
        // pieces of its own goes in the frames); with the same-host path off, nothing did.
        const std::uint64_t moved = session.take_remote_receive(0).by_reference - moved_before;
        if (same_host_path_off()) {
            CHECK(moved == 0);
        } else {
            CHECK(moved >= 2);
        }
    }
    session.check_both();
}

TEST_CASE("two processes: send gathers through list and interleaved keys, receive WQEs scatter through them") {
    Session session;
    Side& local = session.local();
    // The child receives into keys with local write only (a receive needs no remote right).
    const Layout receive_interleaved = interleaved(
        10, {{RegionName::main, 30000, 4, 12}, {RegionName::main, 31000, 0, 4}, {RegionName::main, 32000, 2, 2}},
        mlx5::kMemoryKeyLocalWrite);
    const Layout receive_list = list({{RegionName::main, 40000, 0}, {RegionName::main, 41000, 25}, {RegionName::main, 42000, 0},
                                      {RegionName::main, 43000, 15}},
                                     mlx5::kMemoryKeyLocalWrite);
    const Layout receive_large = interleaved(600, {{RegionName::main, 100000, 8, 8}}, mlx5::kMemoryKeyLocalWrite);
    const Layout send_list = list({{RegionName::main, 2000, 0}, {RegionName::main, 3000, 21}, {RegionName::main, 3500, 0},
                                   {RegionName::main, 6000, 29}, {RegionName::main, 8000, 10}},
                                  0);  // a send's gather needs only local read, which every key has
    const Layout send_interleaved = interleaved(11, {{RegionName::main, 10000, 3, 5}, {RegionName::main, 10500, 0, 1}}, 0);
    const Layout send_large = interleaved(300, {{RegionName::main, 140000, 16, 16}}, 0);
    const Layout receive_layouts[3] = {receive_interleaved, receive_list, receive_large};
    const Layout send_layouts[3] = {send_list, send_interleaved, send_large};
    std::vector<std::uint32_t> receive_maps[3];
    std::vector<std::uint32_t> send_maps[3];
    for (std::uint32_t k = 0; k < 3; ++k) {
        REQUIRE(session.configure_remote(k, receive_layouts[k]).status == mlx5::CompletionStatus::success);
        require_success(local.configure(k, send_layouts[k]));
        receive_maps[k] = byte_map(receive_layouts[k]);
        send_maps[k] = byte_map(send_layouts[k]);
    }
    REQUIRE(receive_maps[0].size() == 60);
    REQUIRE(receive_maps[1].size() == 40);
    REQUIRE(send_maps[0].size() == 60);
    REQUIRE(send_maps[1].size() == 33);
    REQUIRE(receive_maps[2].size() == 4800);
    REQUIRE(send_maps[2].size() == 4800);

    session.post_remote_receive(1, 0, 0, 60);   // all of the interleaved key
    session.post_remote_receive(2, 1, 0, 40);   // all of the list key; the message is shorter
    session.post_remote_receive(3, 0, 8, 52);   // the interleaved key from a piece's middle
    session.post_remote_receive(4, 2, 0, 4800);  // 600 pieces
    struct Send {
        mlx5::ScatterGatherElement from;
        std::vector<std::uint8_t> bytes;
        std::uint32_t receive_key;
        std::uint32_t receive_offset;
    };
    std::vector<Send> sends;
    sends.push_back({session.local_key_element(0, 0, 60), gather(session.local_model, send_maps[0], 0, 60), 0, 0});
    sends.push_back({session.local_key_element(1, 0, 33), gather(session.local_model, send_maps[1], 0, 33), 1, 0});
    sends.push_back({local.data->local(200000, 52), gather(session.local_model, plain(200000, 52), 0, 52), 0, 8});
    sends.push_back({session.local_key_element(2, 0, 4800), gather(session.local_model, send_maps[2], 0, 4800), 2, 0});
    for (std::size_t i = 0; i < sends.size(); ++i) {
        mlx5::SendWorkRequest request = request_of(i == 2 ? mlx5::SendOpcode::send_with_immediate : mlx5::SendOpcode::send,
                                                   &sends[i].from);
        request.immediate = 0x5e4d0000u + static_cast<std::uint32_t>(i);
        require_success(session.run(request));
        const Reply received = session.take_remote_receive(10000);
        REQUIRE(received.count == 1);
        CHECK(received.status == mlx5::CompletionStatus::success);
        CHECK(received.opcode == mlx5::CompletionOpcode::receive);
        CHECK(received.wr_id == i + 1);
        CHECK(received.byte_len == sends[i].bytes.size());
        scatter(session.remote_model, receive_maps[sends[i].receive_key], sends[i].receive_offset, sends[i].bytes);
    }
    session.check_both();
}

TEST_CASE("two processes: each refusal gives the NIC's completion on each side and leaves memory untouched") {
    Session session;
    Side& local = session.local();
    const Layout column = interleaved(16, {{RegionName::main, 64, 8, 120}});  // 128 bytes
    const std::vector<std::uint32_t> column_map = byte_map(column);
    const mlx5::ScatterGatherElement from = local.data->local(200000, 64);
    const mlx5::SendWorkRequest write = request_of(mlx5::SendOpcode::rdma_write, &from, 0, session.remote_key(0));
    // The requester's completion: the status and the CQE's syndrome (mlx5-facts.md section 5).
    auto check_completion = [](const mlx5::Completion& completion, mlx5::CompletionStatus status, std::uint8_t syndrome) {
        INFO("status " << std::string(mlx5::to_string(completion.status)) << ", syndrome " << int(completion.syndrome));
        CHECK(completion.status == status);
        CHECK(completion.syndrome == syndrome);
    };
    // An RDMA write or read refused at the responder leaves no CQE there (no receive WQE is
    // involved); the NAK is written after any CQE would have been, so none can still come.
    auto no_responder_completion = [&] { CHECK(session.take_remote_receive(0).count == 0); };
    // A refused configuration: the UMR's CQE is a local protection error and its queue pair goes
    // to ERR (the key stays free); the peer's write through the key is then a remote access error.
    auto refused_configuration = [&](const Layout& layout) {
        const Reply configured = session.configure_remote(0, layout);
        CHECK(configured.status == mlx5::CompletionStatus::local_protection_error);
        CHECK(configured.syndrome == 0x04);  // (an error completion's opcode is undefined, as in ibv_poll_cq(3))
        CHECK(configured.control_failed == 1);
        check_completion(session.run(write), mlx5::CompletionStatus::remote_access_error, 0x13);
        no_responder_completion();
    };

    SUBCASE("configuration: an entry's pattern runs past its region's end") {
        // 16 rows of 128 bytes from 1 KiB before the end of the child's buffer.
        refused_configuration(interleaved(16, {{RegionName::main, kBufferSize - 1024, 8, 120}}));
    }
    SUBCASE("configuration: a list entry past its region's end, after a zero-length one") {
        refused_configuration(list({{RegionName::main, 0, 0}, {RegionName::main, kBufferSize - 8, 16}}));
    }
    SUBCASE("configuration: an entry's key is a region of another protection domain") {
        refused_configuration(interleaved(4, {{RegionName::main, 64, 8, 8}, {RegionName::other_domain, 0, 8, 8}}));
    }
    SUBCASE("configuration: the key grants remote write, an entry's region has remote read only") {
        refused_configuration(list({{RegionName::main, 64, 8}, {RegionName::read_only, 0, 64}},
                                   mlx5::kMemoryKeyRemoteRead | mlx5::kMemoryKeyRemoteWrite));
    }
    SUBCASE("use: a write through a key without remote write (its regions have it)") {
        REQUIRE(session.configure_remote(0, interleaved(16, {{RegionName::main, 64, 8, 120}}, mlx5::kMemoryKeyRemoteRead)).status ==
                mlx5::CompletionStatus::success);
        // The key reads: the right it has works.
        const mlx5::ScatterGatherElement into = local.data->local(210000, 128);
        require_success(session.run(request_of(mlx5::SendOpcode::rdma_read, &into, 0, session.remote_key(0))));
        scatter(session.local_model, plain(210000, 128), 0, gather(session.remote_model, column_map, 0, 128));
        check_completion(session.run(write), mlx5::CompletionStatus::remote_access_error, 0x13);
        no_responder_completion();
    }
    SUBCASE("use: a read past the key's length") {
        REQUIRE(session.configure_remote(0, column).status == mlx5::CompletionStatus::success);
        const mlx5::ScatterGatherElement into = local.data->local(210000, 16);
        check_completion(session.run(request_of(mlx5::SendOpcode::rdma_read, &into, 120, session.remote_key(0))),
                         mlx5::CompletionStatus::remote_access_error, 0x13);
        no_responder_completion();
    }
    SUBCASE("use: a receive WQE through a key without local write") {
        REQUIRE(session.configure_remote(0, interleaved(16, {{RegionName::main, 64, 8, 120}}, mlx5::kMemoryKeyRemoteRead)).status ==
                mlx5::CompletionStatus::success);
        session.post_remote_receive(9, 0, 0, 128);
        mlx5::SendWorkRequest send = request_of(mlx5::SendOpcode::send, &from);
        check_completion(session.run(send), mlx5::CompletionStatus::remote_operation_error, 0x14);
        const Reply received = session.take_remote_receive(10000);
        REQUIRE(received.count == 1);
        CHECK(received.wr_id == 9);
        CHECK(received.status == mlx5::CompletionStatus::local_protection_error);
        CHECK(received.syndrome == 0x04);
    }
    SUBCASE("use after LOCAL_INV: a remote write") {
        REQUIRE(session.configure_remote(0, column).status == mlx5::CompletionStatus::success);
        require_success(session.run(write));  // the key works before
        scatter(session.remote_model, column_map, 0, gather(session.local_model, plain(200000, 64), 0, 64));
        const Reply invalidated = session.invalidate_remote(0);
        CHECK(invalidated.status == mlx5::CompletionStatus::success);
        CHECK(invalidated.opcode == mlx5::CompletionOpcode::local_invalidate);
        CHECK(invalidated.control_failed == 0);
        const mlx5::ScatterGatherElement other = local.data->local(200064, 64);
        check_completion(session.run(request_of(mlx5::SendOpcode::rdma_write, &other, 0, session.remote_key(0))),
                         mlx5::CompletionStatus::remote_access_error, 0x13);
        no_responder_completion();
    }
    SUBCASE("use after LOCAL_INV: a receive WQE through the key") {
        REQUIRE(session.configure_remote(0, column).status == mlx5::CompletionStatus::success);
        REQUIRE(session.invalidate_remote(0).status == mlx5::CompletionStatus::success);
        session.post_remote_receive(9, 0, 0, 128);
        check_completion(session.run(request_of(mlx5::SendOpcode::send, &from)), mlx5::CompletionStatus::remote_operation_error,
                         0x14);
        const Reply received = session.take_remote_receive(10000);
        REQUIRE(received.count == 1);
        CHECK(received.status == mlx5::CompletionStatus::local_protection_error);
        CHECK(received.syndrome == 0x04);
    }
    SUBCASE("use after LOCAL_INV: the local side of a write") {
        require_success(local.configure(0, kLocalList));
        require_success(local.invalidate(0));
        const mlx5::ScatterGatherElement through_key = session.local_key_element(0, 0, 50);
        check_completion(session.run(request_of(mlx5::SendOpcode::rdma_write, &through_key, session.remote_addr(0), session.remote_rkey())),
                         mlx5::CompletionStatus::local_protection_error, 0x04);
    }
    SUBCASE("configuration refused on the local side, then used as the local side of a send") {
        const mlx5::Completion configured = local.configure(0, list({{RegionName::other_domain, 0, 16}}));
        check_completion(configured, mlx5::CompletionStatus::local_protection_error, 0x04);
        const mlx5::ScatterGatherElement through_key = session.local_key_element(0, 0, 16);
        session.post_remote_receive(9, kPlainKey, 0, 64);
        check_completion(session.run(request_of(mlx5::SendOpcode::send, &through_key)), mlx5::CompletionStatus::local_protection_error,
                         0x04);
        // Nothing was sent: the receive is still posted, with no completion.
        CHECK(session.take_remote_receive(0).count == 0);
    }
    // Except where a step above succeeded first (and the models say so), no byte moved.
    session.check_both();
}
