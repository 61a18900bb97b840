// The project's mlx5 binding and DC control plane on the emulated ConnectX, where each call
// reaches the emulator's refusals: the project's error names the call, the object and the value,
// and carries the kernel's errno. Also the paths the suites do not take: a DC initiator moved to
// ERR by the engine and recovered, and a DC target asked for its number before RTR.
#include <doctest/doctest.h>

#include <cerrno>
#include <cstdlib>
#include <string>

#include "rdmachan/error.hpp"
#include "transport/device_interface.hpp"
#include "transport/verbs/completion_queue.hpp"
#include "transport/verbs/context.hpp"
#include "transport/verbs/dc_connection.hpp"
#include "transport/verbs/mlx5_binding.hpp"
#include "transport/verbs/mlx5_dc.hpp"
#include "transport/verbs/protection_domain.hpp"
#include "transport/verbs/shared_receive_queue.hpp"
#include "transport/verbs/verbs_error.hpp"

namespace verbs = rdmachan::verbs;
namespace transport = rdmachan::transport;

namespace {

struct Fixture {
    std::shared_ptr<verbs::Context> context = verbs::Context::open("mlx5_0");
    std::shared_ptr<verbs::ProtectionDomain> pd = verbs::ProtectionDomain::allocate(context);
    verbs::Mlx5CompletionQueue cq = verbs::create_mlx5_completion_queue(context, 64);

    verbs::QueuePairParents parents() const {
        verbs::QueuePairParents result;
        result.protection_domain = pd;
        result.send_completion_queue = cq.completion_queue;
        result.receive_completion_queue = cq.completion_queue;
        return result;
    }
};

// Runs `call`, expecting a VerbsError with `code` whose message contains every `part`.
template <typename Call>
void check_refused(Call&& call, int code, std::initializer_list<const char*> parts) {
    try {
        call();
        FAIL("no error");
    } catch (const verbs::VerbsError& error) {
        CHECK(error.code() == code);
        const std::string message = error.what();
        for (const char* part : parts) CHECK_MESSAGE(message.find(part) != std::string::npos, message, " lacks ", part);
    }
}

}  // namespace

TEST_CASE("a completion queue deeper than max_cqe: the error names mlx5dv_create_cq, the device and the depth") {
    Fixture fixture;
    check_refused([&] { verbs::create_mlx5_completion_queue(fixture.context, 5000000); }, EINVAL,
                  {"mlx5dv_create_cq", "mlx5_0", "depth 5000000", "EINVAL"});
}

TEST_CASE("an RC QP beyond max_qp_wr: the error names mlx5dv_create_qp and the value") {
    Fixture fixture;
    check_refused([&] { verbs::create_mlx5_queue_pair(fixture.parents(), {40000, 16, 1, 1, 0}, nullptr); }, EINVAL,
                  {"mlx5dv_create_qp", "RC QP on device 'mlx5_0'", "max_send_wr 40000", "EINVAL"});
    check_refused([&] { verbs::create_mlx5_queue_pair(verbs::QueuePairParents{}, {16, 16, 1, 1, 0}, nullptr); }, EINVAL,
                  {"protection domain and both completion queues are required"});
}

TEST_CASE("DC: creation refusals name the call and the value") {
    Fixture fixture;
    check_refused([&] { verbs::create_mlx5_dc_initiator(fixture.parents(), {16, 0, 31, 0, 0}, nullptr); }, EINVAL,
                  {"mlx5dv_create_qp", "DC initiator on device 'mlx5_0'", "max_send_sge 31", "EINVAL"});
    check_refused([&] { verbs::create_mlx5_dc_initiator(verbs::QueuePairParents{}, {16, 0, 1, 0, 0}, nullptr); }, EINVAL,
                  {"a protection domain and a send completion queue are required"});
    check_refused([&] { verbs::Mlx5DcTarget::create(fixture.parents(), 7); }, EINVAL,
                  {"a protection domain, a shared receive queue and a receive completion queue are required"});
}

TEST_CASE("DC: a target's number before RTR is refused; after RTR it is the DCT number") {
    Fixture fixture;
    verbs::QueuePairParents parents = fixture.parents();
    parents.shared_receive_queue = verbs::SharedReceiveQueue::create(fixture.pd, 16, 1);
    std::shared_ptr<verbs::Mlx5DcTarget> target = verbs::Mlx5DcTarget::create(parents, 0x5eed);
    check_refused([&] { (void)target->number(); }, EINVAL, {"DC target", "exists only after INIT->RTR"});
    verbs::ConnectionParameters parameters;
    parameters.port_num = 1;
    parameters.path_mtu = 1024;
    target->connect(parameters);
    CHECK(target->number() != 0);
    // The kernel allows a DCT nothing after RTR: the project's error names ibv_modify_qp and the mask.
    verbs::QueuePairTransition to_error;
    to_error.attributes.qp_state = IBV_QPS_ERR;
    to_error.mask = IBV_QP_STATE;
    check_refused([&] { target->queue_pair().modify(to_error, "DCT ->ERR"); }, EINVAL, {"ibv_modify_qp", "DCT ->ERR", "mask 0x1"});
}

TEST_CASE("an RC transition the kernel refuses: the project's error names the transition, the QP and the mask") {
    Fixture fixture;
    verbs::Mlx5QueuePair created = verbs::create_mlx5_queue_pair(fixture.parents(), {16, 16, 1, 1, 0}, nullptr);
    verbs::QueuePairTransition skipped;
    skipped.attributes.qp_state = IBV_QPS_RTS;
    skipped.mask = IBV_QP_STATE | IBV_QP_SQ_PSN;
    check_refused([&] { created.queue_pair->modify(skipped, "RESET->RTS"); }, EINVAL, {"ibv_modify_qp RESET->RTS", "mask 0x"});
}

TEST_CASE("the DC provider: an initiator the engine moves to ERR is recovered and connects again") {
    const std::shared_ptr<transport::Device> device = transport::open_device("mlx5_0");
    REQUIRE(device->kind() == transport::DeviceKind::mlx5);
    const std::shared_ptr<transport::ProtectionDomain> domain = device->allocate_protection_domain();
    const std::shared_ptr<transport::CompletionQueue> queue = domain->create_completion_queue(64);
    transport::QueuePairSettings settings;
    const std::shared_ptr<transport::QueuePair> initiator = domain->create_dc_initiator(settings, queue);
    transport::ConnectSettings connect;
    initiator->connect(connect);
    initiator->move_to_error();
    domain->recover_dc_initiator(*initiator);
    initiator->connect(connect);
    // From RTS, ERR is allowed again; a second recovery works the same.
    initiator->move_to_error();
    domain->recover_dc_initiator(*initiator);
    // RESET -> ERR is not a DCI transition (modify_dci_qp_is_ok): refused, named.
    CHECK_THROWS_WITH_AS(initiator->move_to_error(), doctest::Contains("ibv_modify_qp DCI ->ERR"), rdmachan::Error);
    // Connecting twice without a recovery is RTS -> INIT: refused, and the provider's error says so.
    initiator->connect(connect);
    CHECK_THROWS_WITH_AS(initiator->connect(connect), doctest::Contains("ibv_modify_qp DCI RESET->INIT"), rdmachan::Error);
}

TEST_CASE("the DC provider: a target's number before make_ready, and a second make_ready, are refused by name") {
    const std::shared_ptr<transport::Device> device = transport::open_device("mlx5_0");
    const std::shared_ptr<transport::ProtectionDomain> domain = device->allocate_protection_domain();
    const std::shared_ptr<transport::CompletionQueue> queue = domain->create_completion_queue(64);
    const std::shared_ptr<transport::DcTarget> target =
        domain->create_dc_target(domain->create_shared_receive_queue(16, queue), queue, 0x77, transport::kAccessRemoteWrite);
    CHECK_THROWS_WITH_AS((void)target->number(), doctest::Contains("exists only after INIT->RTR"), rdmachan::Error);
    target->make_ready(1, 1024, 12);
    CHECK(target->number() != 0);
    CHECK_THROWS_WITH_AS(target->make_ready(1, 1024, 12), doctest::Contains("ibv_modify_qp DCT RESET->INIT"), rdmachan::Error);
}

TEST_CASE("without thread or parent domains (an older provider) QPs are created in the plain PD") {
    Fixture fixture;
    for (const char* refused : {"alloc_td", "alloc_parent_domain"}) {
        CAPTURE(refused);
        REQUIRE(setenv("RDMACHAN_EMULATED_CONNECTX_REFUSE", refused, 1) == 0);
        const std::shared_ptr<verbs::Mlx5ParentDomain> parent = verbs::Mlx5ParentDomain::try_allocate(fixture.pd);
        unsetenv("RDMACHAN_EMULATED_CONNECTX_REFUSE");
        CHECK(parent == nullptr);
        verbs::Mlx5QueuePair created = verbs::create_mlx5_queue_pair(fixture.parents(), {16, 16, 1, 1, 0}, parent);
        CHECK(created.rings.send.blueflame_size > 0);
    }
    CHECK(verbs::Mlx5ParentDomain::try_allocate(fixture.pd) != nullptr);
}
