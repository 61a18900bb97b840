// Error paths of the verbs provider against the soft-RoCE kernel stack (inside the VM):
// every failure must come back as a VerbsError naming the call and object, or as an error
// completion / PostResult value on the data path, within a deadline.
#include <doctest/doctest.h>
#include <sys/mman.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <string>
#include <vector>

#include "rxe_fixture.hpp"
#include "transport/verbs/mlx5_binding.hpp"
#include "transport/verbs/mlx5_dc.hpp"
#include "rdmachan/multi_channel.hpp"
#include "transport/verbs/verbs_error.hpp"

using namespace rxe_test;

TEST_CASE("memory registration errors come back as VerbsError with the errno") {
    const auto context = Context::open(first_device());
    const auto pd = ProtectionDomain::allocate(context);
    std::vector<std::uint8_t> memory(4096);
    SUBCASE("remote write without local write is refused (EINVAL)") {
        try {
            MemoryRegion::register_memory(pd, memory.data(), memory.size(),
                                          IBV_ACCESS_REMOTE_WRITE);
            FAIL("registration succeeded");
        } catch (const VerbsError& error) {
            CHECK(error.code() == EINVAL);
            CHECK(std::string(error.what()).find("ibv_reg_mr") != std::string::npos);
            CHECK(std::string(error.what()).find("access 0x2") != std::string::npos);
        }
    }
    SUBCASE("an unmapped address is refused (EFAULT)") {
        void* mapping =
            ::mmap(nullptr, 8192, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        REQUIRE(mapping != MAP_FAILED);
        REQUIRE(::munmap(mapping, 8192) == 0);
        try {
            MemoryRegion::register_memory(pd, mapping, 8192, IBV_ACCESS_LOCAL_WRITE);
            FAIL("registration of unmapped memory succeeded");
        } catch (const VerbsError& error) {
            CHECK(error.code() == EFAULT);
        }
    }
    SUBCASE("a valid registration yields keys and the exact range") {
        const auto region =
            MemoryRegion::register_memory(pd, memory.data(), memory.size(), IBV_ACCESS_LOCAL_WRITE);
        CHECK(region->address() == reinterpret_cast<std::uintptr_t>(memory.data()));
        CHECK(region->length() == memory.size());
        CHECK(region->lkey() != 0);
    }
}

TEST_CASE("RC connect errors name the transition, the QP and the return code") {
    Side side = make_side(first_device());
    RcEndpoint remote = side.endpoint();
    SUBCASE("INIT on a port the device does not have") {
        ConnectionParameters parameters = parameters_for(side, remote);
        parameters.port_num = 7;
        try {
            side.queue_pair->connect(parameters, remote);
            FAIL("connect succeeded");
        } catch (const VerbsError& error) {
            const std::string message = error.what();
            CHECK(message.find("RESET->INIT") != std::string::npos);
            CHECK(message.find(side.queue_pair->describe()) != std::string::npos);
            CHECK(message.find("EINVAL") != std::string::npos);
        }
        CHECK(side.queue_pair->state() == IBV_QPS_RESET);
    }
    SUBCASE("RTS straight from RESET is an illegal transition") {
        try {
            side.queue_pair->modify(make_ready_to_send_transition(parameters_for(side, remote)),
                                    "RTR->RTS");
            FAIL("modify succeeded");
        } catch (const VerbsError& error) {
            CHECK(std::string(error.what()).find("RTR->RTS") != std::string::npos);
            CHECK(error.code() == EINVAL);
        }
    }
}

TEST_CASE("a bad rkey gives a remote access error completion, not a hang") {
    Side a, b;
    make_pair(true, a, b);
    const mlx5::ScatterGatherElement element{a.address(), 8, a.memory_region->lkey()};
    mlx5::SendWorkRequest write;
    write.wr_id = 10;
    write.opcode = mlx5::SendOpcode::rdma_write;
    write.flags = mlx5::kSendSignaled;
    write.sg_list = &element;
    write.num_sge = 1;
    write.remote_addr = b.address();
    write.rkey = b.memory_region->rkey() ^ 0x5a5a00;
    post_one_send(a, write);
    const mlx5::Completion failed = wait_for_completion(*a.completion_queue);
    CHECK(failed.wr_id == 10);
    CHECK(failed.status == mlx5::CompletionStatus::remote_access_error);
    CHECK(std::string(mlx5::to_string(failed.status)) == "remote access error");
    // After an error the QP is in the error state and flushes what follows.
    CHECK(a.queue_pair->state() == IBV_QPS_ERR);
}

TEST_CASE("a read outside the remote region is refused by the responder") {
    Side a, b;
    make_pair(false, a, b);
    const mlx5::ScatterGatherElement element{a.address(), 64, a.memory_region->lkey()};
    mlx5::SendWorkRequest read;
    read.wr_id = 11;
    read.opcode = mlx5::SendOpcode::rdma_read;
    read.flags = mlx5::kSendSignaled;
    read.sg_list = &element;
    read.num_sge = 1;
    read.remote_addr = b.address(kBufferSize - 16);  // 64 bytes from here run past the region
    read.rkey = b.memory_region->rkey();
    post_one_send(a, read);
    CHECK(wait_for_completion(*a.completion_queue).status ==
          mlx5::CompletionStatus::remote_access_error);
}

TEST_CASE("post errors are values: too many SGEs, DC requests on RC, a full receive queue") {
    Side side = make_side(first_device());
    const std::uint32_t max_sge = side.queue_pair->capabilities().max_send_sge;
    std::vector<mlx5::ScatterGatherElement> elements(
        max_sge + 1, {side.address(), 8, side.memory_region->lkey()});
    mlx5::SendWorkRequest too_wide;
    too_wide.opcode = mlx5::SendOpcode::send;
    too_wide.sg_list = elements.data();
    too_wide.num_sge = max_sge + 1;
    std::uint32_t posted = 99;
    CHECK(side.queue_pair->post_send({&too_wide, 1}, &posted) == mlx5::PostResult::too_many_sge);
    CHECK(posted == 0);
    const std::uint8_t address_vector[48] = {};
    mlx5::SendWorkRequest dc;
    dc.dc_address_vector = address_vector;
    CHECK(side.queue_pair->post_send({&dc, 1}, &posted) == mlx5::PostResult::invalid_request);
    const std::uint32_t max_inline = side.queue_pair->capabilities().max_inline_data;
    std::vector<std::uint8_t> large(max_inline + 1);
    const mlx5::ScatterGatherElement large_element{reinterpret_cast<std::uintptr_t>(large.data()),
                                                   static_cast<std::uint32_t>(large.size()), 0};
    mlx5::SendWorkRequest too_large;
    too_large.opcode = mlx5::SendOpcode::send;
    too_large.flags = mlx5::kSendInline;
    too_large.sg_list = &large_element;
    too_large.num_sge = 1;
    CHECK(side.queue_pair->post_send({&too_large, 1}, &posted) ==
          mlx5::PostResult::inline_too_large);
    CHECK(posted == 0);

    // A QP in RESET refuses receives (the provider's EINVAL becomes invalid_request, nothing
    // posted); from INIT on they are accepted before the peer is known.
    const mlx5::ScatterGatherElement first_element{side.address(), 64, side.memory_region->lkey()};
    const mlx5::ReceiveWorkRequest early{1, &first_element, 1};
    CHECK(side.queue_pair->post_receive({&early, 1}, &posted) == mlx5::PostResult::invalid_request);
    CHECK(posted == 0);
    side.queue_pair->modify(make_init_transition(parameters_for(side, side.endpoint())),
                            "RESET->INIT");
    // The provider may round its ring up (rxe grants 16 but holds more), so fill until it
    // refuses: `posted` must be at least the granted depth, and the queue must stay full.
    const std::uint32_t depth = side.queue_pair->capabilities().max_recv_wr;
    std::vector<mlx5::ReceiveWorkRequest> receives(8 * depth);
    const mlx5::ScatterGatherElement receive_element{side.address(), 64,
                                                     side.memory_region->lkey()};
    for (std::uint32_t i = 0; i < receives.size(); ++i) receives[i] = {i, &receive_element, 1};
    CHECK(side.queue_pair->post_receive(receives, &posted) == mlx5::PostResult::queue_full);
    CHECK(posted >= depth);
    CHECK(posted < receives.size());
    MESSAGE("granted max_recv_wr " << depth << ", receive queue accepted " << posted);
    std::uint32_t posted_after_full = 99;
    CHECK(side.queue_pair->post_receive({&early, 1}, &posted_after_full) ==
          mlx5::PostResult::queue_full);
    CHECK(posted_after_full == 0);
}

TEST_CASE("the mlx5 binding refuses a non-mlx5 device cleanly") {
    // rxe has no mlx5dv: every mlx5-only entry point must fail with a named error (or, for
    // the optional thread domain, fall back), never crash or hand out half-built objects.
    Side side = make_side(first_device());
    CHECK(Mlx5ParentDomain::try_allocate(side.protection_domain) == nullptr);
    CHECK_THROWS_WITH_AS(create_mlx5_completion_queue(side.context, 16),
                         doctest::Contains("mlx5dv_create_cq"), VerbsError);
    try {
        create_mlx5_queue_pair({side.protection_domain, side.completion_queue,
                                side.completion_queue, nullptr, nullptr},
                               QueuePairCapabilities{}, nullptr);
        FAIL("mlx5dv_create_qp succeeded on a soft-RoCE device");
    } catch (const VerbsError& error) {
        CHECK(std::string(error.what()).find("mlx5dv_create_qp") != std::string::npos);
        CHECK(std::string(error.what()).find(first_device()) != std::string::npos);
    }
}

TEST_CASE("DC on a device that is not mlx5: a clear error, for initiators and targets alike") {
    SideOptions options;
    options.with_shared_receive_queue = true;
    Side side = make_side(first_device(), options);
    const std::string expected = "DC (dynamically connected) mode needs an mlx5 device (ConnectX); device '" +
                                 first_device() + "' is not driven by libmlx5";
    CHECK_THROWS_WITH_AS(require_dc_support(*side.context), doctest::Contains(expected.c_str()), VerbsError);
    CHECK_THROWS_WITH_AS(create_mlx5_dc_initiator({side.protection_domain, side.completion_queue, nullptr, nullptr, nullptr},
                                                  QueuePairCapabilities{}, nullptr),
                         doctest::Contains(expected.c_str()), VerbsError);
    CHECK_THROWS_WITH_AS(Mlx5DcTarget::create({side.protection_domain, side.completion_queue, side.completion_queue,
                                               side.shared_receive_queue, nullptr},
                                              0x1ee7a330),
                         doctest::Contains(expected.c_str()), VerbsError);
}

TEST_CASE("a DC MultiChannel on a generic verbs device is refused at build, naming the device") {
    try {
        (void)rdmachan::MultiChannelBuilder(rdmachan::ChannelBuilder().device(first_device()))
            .rank(0)
            .world_size(2)
            .mode(rdmachan::MultiChannelMode::dynamically_connected)
            .build();
        FAIL("a DC multi-channel was built on " << first_device());
    } catch (const rdmachan::Error& error) {
        const std::string text = error.what();
        CAPTURE(text);
        CHECK(text.find("needs an mlx5 device") != std::string::npos);
        CHECK(text.find(first_device()) != std::string::npos);
    }
}

TEST_CASE("RTR towards a GID nobody answers for fails at INIT->RTR, naming the QP") {
    Side side = make_side(first_device());
    RcEndpoint unreachable = side.endpoint();
    // ::ffff:169.254.77.99 is on the veth subnet but no interface owns it: address resolution
    // (ARP) for the RoCE v2 destination gets no answer.
    unreachable.gid[15] = 99;
    const auto started = std::chrono::steady_clock::now();
    try {
        side.queue_pair->connect(parameters_for(side, unreachable), unreachable);
        FAIL("connect to an unreachable GID succeeded");
    } catch (const VerbsError& error) {
        const std::string message = error.what();
        MESSAGE(message);
        CHECK(message.find("INIT->RTR") != std::string::npos);
        CHECK(message.find(side.queue_pair->describe()) != std::string::npos);
        // The kernel's address resolution gives up after about a second.
        CHECK(error.code() == ETIMEDOUT);
        CHECK(message.find("address resolution") != std::string::npos);
    }
    CHECK(side.queue_pair->state() == IBV_QPS_INIT);
    MESSAGE("failed after "
            << std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count()
            << " s");
}
