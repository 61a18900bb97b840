// The verbs provider against a real kernel RDMA stack: soft-RoCE (rdma_rxe) devices rxe0 and
// rxe1 inside the VM that tests/vm/rxe-vm.sh boots. rxe0 <-> rxe1 crosses a veth pair;
// rxe0 <-> rxe0 uses rxe's loopback. Not runnable on a machine without these devices.
#include <doctest/doctest.h>

#include <cstring>
#include <fstream>
#include <string>

#include "rxe_fixture.hpp"
#include "transport/verbs/device_list.hpp"
#include "transport/verbs/device_selection.hpp"
#include "transport/verbs/verbs_error.hpp"

using namespace rxe_test;

namespace {

std::string read_sysfs_line(const std::string& path) {
    std::ifstream file(path);
    std::string line;
    std::getline(file, line);
    return line;
}

// Runs the body once per topology: across the veth pair, and rxe loopback on one device.
struct Topology {
    const char* name;
    bool cross;
};

}  // namespace

TEST_CASE("port query returns the kernel's GID table, GID types, active MTU and link layer") {
    const std::string device = first_device();
    const auto context = Context::open(device);
    CHECK(context->port_count() >= 1);
    const PortAttributes port = context->query_port(1);
    CHECK(port.active);
    CHECK(port.link_layer == LinkLayer::ethernet);
    CHECK(port.lid == 0);
    CHECK(port.active_mtu == 1024);
    REQUIRE(port.gid_table.size() >= 2);
    const std::string sysfs = "/sys/class/infiniband/" + device + "/ports/1/";
    for (const GidEntry& entry : port.gid_table) {
        const std::string index = std::to_string(entry.index);
        CHECK(to_string(entry.gid) == read_sysfs_line(sysfs + "gids/" + index));
        // The kernel writes "RoCE v2" / "IB/RoCE v1".
        const std::string type = read_sysfs_line(sysfs + "gid_attrs/types/" + index);
        CHECK(type == (entry.type == GidType::roce_v2 ? "RoCE v2" : "IB/RoCE v1"));
    }
    CHECK(is_ipv6_link_local(port.gid_table[0].gid));
    CHECK(port.gid_table[0].type == GidType::roce_v2);
    CHECK(is_ipv4_mapped(port.gid_table[1].gid));
    CHECK(port.gid_table[1].type == GidType::roce_v2);
    CHECK_THROWS_WITH_AS(context->query_port(2), doctest::Contains("ports are 1..1"), VerbsError);
}

TEST_CASE(
    "GID selection on a real RoCE port picks the IPv4-mapped RoCE v2 entry, or the override") {
    const auto context = Context::open(first_device());
    const PortAttributes port = context->query_port(1);
    const GidChoice automatic = select_gid(port.gid_table, port.link_layer);
    CHECK(automatic.entry.index == 1);
    CHECK(to_string(automatic.entry.gid) ==
          "0000:0000:0000:0000:0000:ffff:a9fe:4d01");  // 169.254.77.1
    const GidChoice overridden = select_gid(port.gid_table, port.link_layer, 0u);
    CHECK(overridden.entry.index == 0);
    CHECK(is_ipv6_link_local(overridden.entry.gid));
    CHECK_THROWS_AS(select_gid(port.gid_table, port.link_layer, 77u), VerbsError);
}

TEST_CASE("device list, open by name and device selection see the soft-RoCE devices") {
    const DeviceList list;
    REQUIRE_FALSE(list.empty());
    CHECK(list.find(first_device()) != nullptr);
    CHECK(list.find(second_device()) != nullptr);
    CHECK_THROWS_WITH_AS(Context::open("no_such_device"), doctest::Contains(first_device().c_str()),
                         VerbsError);
    const DeviceDecision automatic = select_device_on_this_machine("auto");
    // rxe has no mlx5dv: auto must take the generic verbs path on the first device.
    CHECK(automatic.kind == DeviceKind::verbs);
    CHECK(automatic.device_name == list.names().front());
    const DeviceDecision named = select_device_on_this_machine(second_device());
    CHECK(named.kind == DeviceKind::verbs);
    CHECK(named.device_name == second_device());
    CHECK(select_device_on_this_machine("soft").kind == DeviceKind::soft);
    CHECK_THROWS_WITH_AS(select_device_on_this_machine("mlx5_7"),
                         doctest::Contains("no such device"), VerbsError);
}

TEST_CASE("every RC operation over the generic verbs data path") {
    const Topology topologies[] = {{"rxe0 <-> rxe1 across the veth pair", true},
                                   {"rxe0 loopback", false}};
    for (const Topology& topology : topologies) {
        CAPTURE(topology.name);
        Side a, b;
        make_pair(topology.cross, a, b);
        CHECK(a.queue_pair->state() == IBV_QPS_RTS);
        CHECK(b.queue_pair->state() == IBV_QPS_RTS);
        std::memcpy(a.data(), "hello from a", 13);
        const mlx5::ScatterGatherElement hello{a.address(), 13, a.memory_region->lkey()};

        // send: lands in b's posted receive.
        post_one_receive(b, 100, 64, 501);
        mlx5::SendWorkRequest send;
        send.wr_id = 1;
        send.opcode = mlx5::SendOpcode::send;
        send.flags = mlx5::kSendSignaled;
        send.sg_list = &hello;
        send.num_sge = 1;
        post_one_send(a, send);
        mlx5::Completion done = wait_for_completion(*a.completion_queue);
        CHECK(done.status == mlx5::CompletionStatus::success);
        CHECK(done.opcode == mlx5::CompletionOpcode::send);
        CHECK(done.wr_id == 1);
        mlx5::Completion received = wait_for_completion(*b.completion_queue);
        CHECK(received.status == mlx5::CompletionStatus::success);
        CHECK(received.opcode == mlx5::CompletionOpcode::receive);
        CHECK(received.is_receive);
        CHECK(received.wr_id == 501);
        CHECK(received.byte_len == 13);
        CHECK(received.qp_num == b.queue_pair->qpn());
        CHECK(std::memcmp(b.data() + 100, "hello from a", 13) == 0);

        // send with immediate: the immediate arrives in host order.
        post_one_receive(b, 200, 64, 502);
        mlx5::SendWorkRequest send_immediate = send;
        send_immediate.wr_id = 2;
        send_immediate.opcode = mlx5::SendOpcode::send_with_immediate;
        send_immediate.immediate = 0xc0ffee01;
        post_one_send(a, send_immediate);
        CHECK(wait_for_completion(*a.completion_queue).status == mlx5::CompletionStatus::success);
        received = wait_for_completion(*b.completion_queue);
        CHECK(received.opcode == mlx5::CompletionOpcode::receive);
        CHECK((received.flags & mlx5::kCompletionWithImmediate) != 0);
        CHECK(received.immediate == 0xc0ffee01);
        CHECK(std::memcmp(b.data() + 200, "hello from a", 13) == 0);

        // inline send: the payload is copied at post time, so the source may change at once.
        post_one_receive(b, 400, 64, 504);
        char inline_payload[] = "inline bytes";
        const mlx5::ScatterGatherElement inline_element{
            reinterpret_cast<std::uintptr_t>(inline_payload), sizeof(inline_payload), 0};
        mlx5::SendWorkRequest send_inline = send;
        send_inline.wr_id = 20;
        send_inline.flags = mlx5::kSendSignaled | mlx5::kSendInline;
        send_inline.sg_list = &inline_element;
        post_one_send(a, send_inline);
        std::memset(inline_payload, 'x', sizeof(inline_payload) - 1);
        CHECK(wait_for_completion(*a.completion_queue).status == mlx5::CompletionStatus::success);
        received = wait_for_completion(*b.completion_queue);
        CHECK(received.wr_id == 504);
        CHECK(received.byte_len == sizeof(inline_payload));
        CHECK(std::strcmp(reinterpret_cast<const char*>(b.data() + 400), "inline bytes") == 0);

        // write: b is not involved. Two SGEs are gathered into one contiguous remote range.
        std::memcpy(a.data() + 600, "-gathered", 10);
        const mlx5::ScatterGatherElement gather[2] = {
            {a.address(), 12, a.memory_region->lkey()},
            {a.address(600), 10, a.memory_region->lkey()}};
        mlx5::SendWorkRequest gathered_write = send;
        gathered_write.wr_id = 21;
        gathered_write.opcode = mlx5::SendOpcode::rdma_write;
        gathered_write.sg_list = gather;
        gathered_write.num_sge = 2;
        gathered_write.remote_addr = b.address(1500);
        gathered_write.rkey = b.memory_region->rkey();
        post_one_send(a, gathered_write);
        CHECK(wait_for_completion(*a.completion_queue).status == mlx5::CompletionStatus::success);
        CHECK(std::strcmp(reinterpret_cast<const char*>(b.data() + 1500),
                          "hello from a-gathered") == 0);

        mlx5::SendWorkRequest write = send;
        write.wr_id = 3;
        write.opcode = mlx5::SendOpcode::rdma_write;
        write.remote_addr = b.address(1000);
        write.rkey = b.memory_region->rkey();
        post_one_send(a, write);
        done = wait_for_completion(*a.completion_queue);
        CHECK(done.status == mlx5::CompletionStatus::success);
        CHECK(done.opcode == mlx5::CompletionOpcode::rdma_write);
        CHECK(std::memcmp(b.data() + 1000, "hello from a", 13) == 0);

        // write with immediate: consumes a receive, data lands at the remote address.
        post_one_receive(b, 300, 64, 503);
        mlx5::SendWorkRequest write_immediate = write;
        write_immediate.wr_id = 4;
        write_immediate.opcode = mlx5::SendOpcode::rdma_write_with_immediate;
        write_immediate.remote_addr = b.address(1100);
        write_immediate.immediate = 42;
        post_one_send(a, write_immediate);
        CHECK(wait_for_completion(*a.completion_queue).status == mlx5::CompletionStatus::success);
        received = wait_for_completion(*b.completion_queue);
        CHECK(received.status == mlx5::CompletionStatus::success);
        CHECK(received.opcode == mlx5::CompletionOpcode::receive_rdma_with_immediate);
        CHECK(received.wr_id == 503);
        CHECK(received.immediate == 42);
        CHECK(std::memcmp(b.data() + 1100, "hello from a", 13) == 0);

        // read: b's bytes come back into a's buffer.
        std::memcpy(b.data() + 2000, "bytes owned by b", 17);
        const mlx5::ScatterGatherElement read_target{a.address(500), 17, a.memory_region->lkey()};
        mlx5::SendWorkRequest read;
        read.wr_id = 5;
        read.opcode = mlx5::SendOpcode::rdma_read;
        read.flags = mlx5::kSendSignaled;
        read.sg_list = &read_target;
        read.num_sge = 1;
        read.remote_addr = b.address(2000);
        read.rkey = b.memory_region->rkey();
        post_one_send(a, read);
        done = wait_for_completion(*a.completion_queue);
        CHECK(done.status == mlx5::CompletionStatus::success);
        CHECK(done.opcode == mlx5::CompletionOpcode::rdma_read);
        CHECK(done.byte_len == 17);
        CHECK(std::memcmp(a.data() + 500, "bytes owned by b", 17) == 0);

        // compare and swap: the old value comes back, the new one is in b's memory.
        std::uint64_t remote_word = 7;
        std::memcpy(b.data() + 3000, &remote_word, 8);
        const mlx5::ScatterGatherElement old_value{a.address(3000), 8, a.memory_region->lkey()};
        mlx5::SendWorkRequest compare_and_swap;
        compare_and_swap.wr_id = 6;
        compare_and_swap.opcode = mlx5::SendOpcode::atomic_compare_and_swap;
        compare_and_swap.flags = mlx5::kSendSignaled;
        compare_and_swap.sg_list = &old_value;
        compare_and_swap.num_sge = 1;
        compare_and_swap.remote_addr = b.address(3000);
        compare_and_swap.rkey = b.memory_region->rkey();
        compare_and_swap.compare_add = 7;
        compare_and_swap.swap = 99;
        post_one_send(a, compare_and_swap);
        done = wait_for_completion(*a.completion_queue);
        CHECK(done.status == mlx5::CompletionStatus::success);
        CHECK(done.opcode == mlx5::CompletionOpcode::atomic_compare_and_swap);
        std::uint64_t value = 0;
        std::memcpy(&value, a.data() + 3000, 8);
        CHECK(value == 7);
        std::memcpy(&value, b.data() + 3000, 8);
        CHECK(value == 99);

        // fetch and add: old value back, sum in b's memory.
        mlx5::SendWorkRequest fetch_and_add = compare_and_swap;
        fetch_and_add.wr_id = 7;
        fetch_and_add.opcode = mlx5::SendOpcode::atomic_fetch_and_add;
        fetch_and_add.compare_add = 11;
        post_one_send(a, fetch_and_add);
        done = wait_for_completion(*a.completion_queue);
        CHECK(done.status == mlx5::CompletionStatus::success);
        CHECK(done.opcode == mlx5::CompletionOpcode::atomic_fetch_and_add);
        std::memcpy(&value, a.data() + 3000, 8);
        CHECK(value == 99);
        std::memcpy(&value, b.data() + 3000, 8);
        CHECK(value == 110);

        // A batch with unsignaled requests: one completion, for the signaled last one.
        mlx5::SendWorkRequest batch[3] = {write, write, write};
        batch[0].flags = 0;
        batch[0].remote_addr = b.address(3100);
        batch[1].flags = 0;
        batch[1].remote_addr = b.address(3200);
        batch[2].wr_id = 8;
        batch[2].remote_addr = b.address(3300);
        std::uint32_t posted = 0;
        REQUIRE(a.queue_pair->post_send(batch, &posted) == mlx5::PostResult::ok);
        CHECK(posted == 3);
        done = wait_for_completion(*a.completion_queue);
        CHECK(done.wr_id == 8);
        CHECK(done.status == mlx5::CompletionStatus::success);
        for (std::size_t offset : {3100, 3200, 3300})
            CHECK(std::memcmp(b.data() + offset, "hello from a", 13) == 0);
        mlx5::Completion none;
        CHECK(a.completion_queue->poll({&none, 1}) == 0);
    }
}

TEST_CASE("RC connect with link-local GIDs (index 0) across the veth pair") {
    SideOptions link_local;
    link_local.gid_index = 0;
    Side a = make_side(first_device(), link_local);
    Side b = make_side(second_device(), link_local);
    CHECK(is_ipv6_link_local(a.gid.entry.gid));
    connect(a, b);
    std::memcpy(a.data(), "over fe80", 10);
    const mlx5::ScatterGatherElement element{a.address(), 10, a.memory_region->lkey()};
    mlx5::SendWorkRequest write;
    write.wr_id = 9;
    write.opcode = mlx5::SendOpcode::rdma_write;
    write.flags = mlx5::kSendSignaled;
    write.sg_list = &element;
    write.num_sge = 1;
    write.remote_addr = b.address(64);
    write.rkey = b.memory_region->rkey();
    post_one_send(a, write);
    CHECK(wait_for_completion(*a.completion_queue).status == mlx5::CompletionStatus::success);
    CHECK(std::memcmp(b.data() + 64, "over fe80", 10) == 0);
}

TEST_CASE("a shared receive queue feeds receives to an RC queue pair") {
    Side a, b;
    SideOptions with_srq;
    with_srq.with_shared_receive_queue = true;
    make_pair(true, a, b, with_srq);
    post_one_receive(b, 0, 64, 700);
    // Posting receives to the QP itself is refused: they belong to the SRQ.
    const mlx5::ScatterGatherElement element{b.address(), 8, b.memory_region->lkey()};
    const mlx5::ReceiveWorkRequest misplaced{1, &element, 1};
    std::uint32_t posted = 0;
    CHECK(b.queue_pair->post_receive({&misplaced, 1}, &posted) ==
          mlx5::PostResult::invalid_request);
    std::memcpy(a.data(), "via srq", 8);
    const mlx5::ScatterGatherElement source{a.address(), 8, a.memory_region->lkey()};
    mlx5::SendWorkRequest send;
    send.wr_id = 12;
    send.opcode = mlx5::SendOpcode::send;
    send.flags = mlx5::kSendSignaled;
    send.sg_list = &source;
    send.num_sge = 1;
    post_one_send(a, send);
    CHECK(wait_for_completion(*a.completion_queue).status == mlx5::CompletionStatus::success);
    const mlx5::Completion received = wait_for_completion(*b.completion_queue);
    CHECK(received.wr_id == 700);
    CHECK(received.byte_len == 8);
    CHECK(std::memcmp(b.data(), "via srq", 8) == 0);
}

TEST_CASE("an address handle to the peer's GID can be created") {
    Side a = make_side(first_device());
    const auto peer = Context::open(second_device());
    const PortAttributes peer_port = peer->query_port(1);
    const GidChoice peer_gid = select_gid(peer_port.gid_table, peer_port.link_layer);
    ibv_ah_attr attributes{};
    attributes.port_num = kPort;
    attributes.is_global = 1;
    std::memcpy(attributes.grh.dgid.raw, peer_gid.entry.gid.data(), 16);
    attributes.grh.sgid_index = static_cast<std::uint8_t>(a.gid.entry.index);
    attributes.grh.hop_limit = 64;
    const auto handle = AddressHandle::create(a.protection_domain, attributes);
    CHECK(handle->handle() != nullptr);
    attributes.grh.sgid_index = 200;  // no such source GID
    CHECK_THROWS_WITH_AS(AddressHandle::create(a.protection_domain, attributes),
                         doctest::Contains("ibv_create_ah"), VerbsError);
}
