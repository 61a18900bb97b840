// A stand-in for the kernel's uverbs character device, inside this process, so that Debian's
// own libibverbs and libmlx5 (the binaries users run) open an mlx5 device and post and poll on
// this machine, which has no RDMA stack: the libc calls they make on /dev/infiniband/uverbs0
// (open, close, stat, fstat, ioctl, write, mmap, and socket for RDMA netlink) are defined here,
// in the executable, and so are found before libc's. Everything else goes to libc.
//
// The ioctl interface answers ENOTTY ("no ioctl framework"), but for one DEVX method (creating
// a memory key), so libibverbs uses the older write() commands, each of which is answered here
// the way the mlx5 kernel driver answers (drivers/infiniband/hw/mlx5 and include/uapi/rdma): a
// context with BlueFlame registers, a protection domain, memory keys, completion channels and
// queues, shared receive queues and queue pairs whose buffers libmlx5 allocated itself. Nothing
// is executed: the tests write the CQEs a NIC would write, and report the completion events a
// kernel would (report_completion_event). A command not answered here fails with EOPNOTSUPP
// and is named on stderr; an extended command other than MODIFY_QP fails with EOPNOTSUPP
// silently, as on a kernel without it.
#include "tests/libmlx5/fake_uverbs.hpp"

#include <arpa/inet.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <infiniband/verbs.h>
#include <rdma/ib_user_verbs.h>
#include <rdma/mlx5-abi.h>
#include <rdma/mlx5_user_ioctl_cmds.h>
#include <rdma/rdma_user_ioctl_cmds.h>
#include <linux/netlink.h>
#include <poll.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <vector>

namespace rdmachan::libmlx5_instructions {
namespace {

constexpr const char* kDevicePath = "/dev/infiniband/uverbs0";
const dev_t kDeviceNumber = makedev(231, 192);  // what the kernel gives uverbs0

// The descriptors open on the device: every context libibverbs opens has its own (a process
// of several MultiChannel ranks opens one per rank). close() forgets them, so a number the
// kernel hands out again for another file is that file's.
constexpr int kMaxDescriptors = 65536;
bool device_descriptors[kMaxDescriptors] = {};

bool is_device(int fd) { return fd >= 0 && fd < kMaxDescriptors && device_descriptors[fd]; }

}  // namespace

// The kernel's choice of a QP's BlueFlame register (drivers/infiniband/hw/mlx5/qp.c,
// alloc_bfreg): registers are numbered two per 4 KiB UAR; register 0 rings plain doorbells; the
// last num_low_latency of them are dedicated, one QP each (no lock in libmlx5); the rest are
// shared, the least used one taken. A dedicated one is taken first. The index answered counts
// four per UAR, as libmlx5's table of registers does.
BlueFlameRegisters::BlueFlameRegisters(std::uint32_t total, std::uint32_t low_latency)
    : total_(std::min(total, kMaxRegisters)), low_latency_(low_latency) {}

int BlueFlameRegisters::allocate() {
    const int total = static_cast<int>(total_);
    const int shared = std::max(0, total - static_cast<int>(low_latency_) - 1);
    int chosen = -1;
    for (int index = shared + 1; index < total && chosen < 0; ++index)
        if (users_[index] == 0) chosen = index;
    if (chosen < 0 && shared > 0) {
        chosen = 1;
        for (int index = 1; index <= shared; ++index)
            if (users_[index] < users_[chosen]) chosen = index;
    }
    if (chosen < 0) chosen = 0;
    ++users_[chosen];
    return chosen / 2 * 4 + chosen % 2;
}

namespace {
FakeKernelState state;

template <typename Function>
Function next(const char* name) {
    return reinterpret_cast<Function>(dlsym(RTLD_NEXT, name));
}

void fake_device_stat(struct stat* buffer) {
    std::memset(buffer, 0, sizeof *buffer);
    buffer->st_mode = S_IFCHR | 0666;
    buffer->st_rdev = kDeviceNumber;
}

// A command's core part (or the driver's request after it), as libibverbs laid it out.
template <typename T>
T read(const std::uint8_t* bytes) {
    T value;
    std::memcpy(&value, bytes, sizeof value);
    return value;
}

// Copies `value` to the user pointer the command carried.
template <typename T>
void respond(std::uint64_t response, const T& value) {
    std::memcpy(reinterpret_cast<void*>(response), &value, sizeof value);
}

// The core answer, and the driver's answer right after it.
template <typename Core, typename Driver>
void respond(std::uint64_t response, const Core& core, const Driver& driver) {
    respond(response, core);
    respond(response + sizeof core, driver);
}

int unsupported(std::uint32_t command, const char* why) {
    std::fprintf(stderr, "fake uverbs: command %u refused: %s\n", command, why);
    errno = EOPNOTSUPP;
    return -1;
}

// A QP's kind as the mlx5 driver tells it at creation: a DC QP is IBV_QPT_DRIVER with the DCI
// or DCT flag in the driver's request.
emulated::QueuePairKind kind_of(const ib_uverbs_create_qp& request, const mlx5_ib_create_qp& driver_request) {
    if (request.qp_type == IBV_QPT_DRIVER && (driver_request.flags & MLX5_QP_FLAG_TYPE_DCT) != 0)
        return emulated::QueuePairKind::dc_target;
    if (request.qp_type == IBV_QPT_DRIVER && (driver_request.flags & MLX5_QP_FLAG_TYPE_DCI) != 0)
        return emulated::QueuePairKind::dc_initiator;
    return emulated::QueuePairKind::reliable_connected;
}

// MODIFY_QP (both forms) judged by the kernel's rules; the QP's state moves only when accepted.
// Returns the errno the kernel answers, 0 when accepted.
int judge_modify(const ib_uverbs_modify_qp& request) {
    const auto record = state.queue_pair_records.find(request.qp_handle);
    if (record == state.queue_pair_records.end()) return EINVAL;
    const emulated::ModifyCheck modify =
        emulated::check_modify(record->second.kind, record->second.state, static_cast<int>(request.attr_mask),
                               static_cast<ibv_qp_state>(request.qp_state), static_cast<ibv_qp_state>(request.cur_qp_state));
    if (modify.check.error != 0) return modify.check.error;
    record->second.state = modify.next;
    return 0;
}

// The extended write() commands: header, an extended header (the response's address, the
// driver's words in and out), the core command, then the driver's request; the driver's answer
// follows the core response. Only MODIFY_QP is answered (a DCT's modify has no other form;
// libmlx5 learns the DCT's number from its move to RTR). The others fail with EOPNOTSUPP
// silently, as on a kernel without them: libibverbs then sends the legacy form (it asks for
// the extended device query first).
ssize_t execute_extended(const ib_uverbs_cmd_hdr& header, const std::uint8_t* body, size_t length) {
    ib_uverbs_ex_cmd_hdr extended;
    if (length < sizeof header + sizeof extended) return unsupported(header.command & 0xff, "shorter than an extended header");
    std::memcpy(&extended, body, sizeof extended);
    const std::uint8_t* core = body + sizeof extended;
    if ((header.command & IB_USER_VERBS_CMD_COMMAND_MASK) != IB_USER_VERBS_EX_CMD_MODIFY_QP) {
        errno = EOPNOTSUPP;
        return -1;
    }
    ib_uverbs_ex_modify_qp request{};
    std::memcpy(&request, core, std::min<std::size_t>(sizeof request, header.in_words * 8u));
    if (const int error = judge_modify(request.base); error != 0) {
        errno = error;
        return -1;
    }
    ib_uverbs_ex_modify_qp_resp answer{};
    answer.response_length = sizeof answer;
    respond(extended.response, answer);
    if (extended.provider_out_words * 8u >= sizeof(mlx5_ib_modify_qp_resp)) {
        mlx5_ib_modify_qp_resp driver{};
        driver.response_length = sizeof driver;
        // A DCT gets its number when it moves to RTR.
        if ((request.base.attr_mask & IBV_QP_STATE) != 0 && request.base.qp_state == IBV_QPS_RTR)
            driver.dctn = 0x2000 + state.dc_targets++;
        respond(extended.response + header.out_words * 8u, driver);
    }
    return static_cast<ssize_t>(length);
}

// A destroyed CQ's events still queued on its channel, unread: removed from the channel, as the
// kernel's ib_uverbs_release_ucq removes them, and not counted in DESTROY_CQ's answer (the kernel
// counts an event when ib_uverbs_event_read hands it out), so libibverbs waits only for the
// acknowledgement of events it read. Other CQs' events stay queued, in their order. Returns how
// many were dropped.
std::uint32_t drop_unread_events(const FakeKernelState::CompletionEvents& events) {
    const auto writer = state.channel_writers.find(events.channel);
    if (events.channel < 0 || writer == state.channel_writers.end()) return 0;
    std::vector<ib_uverbs_comp_event_desc> others;
    std::uint32_t dropped = 0;
    pollfd entry{events.channel, POLLIN, 0};
    ib_uverbs_comp_event_desc event{};
    while (::poll(&entry, 1, 0) == 1 && (entry.revents & POLLIN) != 0 &&
           ::read(events.channel, &event, sizeof event) == static_cast<ssize_t>(sizeof event)) {
        if (event.cq_handle == events.user_handle) {
            ++dropped;
        } else {
            others.push_back(event);
        }
    }
    for (const ib_uverbs_comp_event_desc& other : others)
        (void)!next<ssize_t (*)(int, const void*, size_t)>("write")(writer->second, &other, sizeof other);
    return dropped;
}

// The legacy write() commands on descriptor `fd`: header, the core command, then the driver's
// request; the core command's first field is the address of the response, which the driver's
// answer follows.
ssize_t execute(int fd, const void* buffer, size_t length) {
    ib_uverbs_cmd_hdr header;
    if (length < sizeof header) return unsupported(0, "shorter than a command header");
    std::memcpy(&header, buffer, sizeof header);
    const auto* body = static_cast<const std::uint8_t*>(buffer) + sizeof header;
    if ((header.command & IB_USER_VERBS_CMD_FLAG_EXTENDED) != 0) return execute_extended(header, body, length);
    const std::uint32_t command = header.command & IB_USER_VERBS_CMD_COMMAND_MASK;
    switch (command) {
    case IB_USER_VERBS_CMD_GET_CONTEXT: {
        const auto request = read<ib_uverbs_get_context>(body);
        mlx5_ib_alloc_ucontext_req_v2 driver_request{};
        std::memcpy(&driver_request, body + sizeof request,
                    std::min<std::size_t>(sizeof driver_request, length - sizeof header - sizeof request));
        state.registers[fd] = BlueFlameRegisters(driver_request.total_num_bfregs, driver_request.num_low_latency_bfregs);
        ib_uverbs_get_context_resp answer{};
        answer.async_fd = static_cast<std::uint32_t>(next<int (*)(const char*, int, ...)>("open")("/dev/null", O_RDONLY | O_CLOEXEC));
        answer.num_comp_vectors = 1;
        respond(request.response, answer);
        mlx5_ib_alloc_ucontext_resp driver{};
        driver.qp_tab_size = 1 << 18;
        driver.bf_reg_size = 512;
        // A kernel without the ioctl interface knows no dynamic UARs: it grants the registers asked for.
        driver.tot_bfregs = driver_request.total_num_bfregs;
        driver.cache_line_size = 64;
        driver.max_sq_desc_sz = 512;
        driver.max_rq_desc_sz = 512;
        driver.max_send_wqebb = 32768;
        driver.max_recv_wr = 32768;
        driver.max_srq_recv_wr = 32767;
        driver.num_ports = 1;
        driver.cqe_version = 1;
        driver.log_uar_size = 12;
        driver.num_uars_per_page = 1;
        // On a RoCE port libmlx5 asks the kernel to resolve an address handle's MAC.
        if (state.link_layer == IBV_LINK_LAYER_ETHERNET) driver.cmds_supp_uhw = MLX5_USER_CMDS_SUPP_UHW_CREATE_AH;
        driver.response_length = sizeof driver;
        const std::size_t room = header.out_words * 4u - sizeof answer;
        std::memcpy(reinterpret_cast<void*>(request.response + sizeof answer), &driver, std::min(room, sizeof driver));
        return static_cast<ssize_t>(length);
    }
    case IB_USER_VERBS_CMD_QUERY_DEVICE: {
        const auto request = read<ib_uverbs_query_device>(body);
        ib_uverbs_query_device_resp answer{};
        answer.fw_ver = 16ull << 32 | 35ull << 16 | 1012;
        answer.max_mr_size = ~0ull;
        answer.page_size_cap = ~0xfffull;
        answer.vendor_id = 0x02c9;
        answer.vendor_part_id = 0x1017;
        answer.max_qp = 1 << 18;
        answer.max_qp_wr = 32768;
        answer.max_sge = 30;
        answer.max_sge_rd = 30;
        answer.max_cq = 1 << 24;
        answer.max_cqe = (1 << 22) - 1;
        answer.max_mr = 1 << 24;
        answer.max_pd = 1 << 24;
        answer.max_qp_rd_atom = 16;
        answer.max_res_rd_atom = 1 << 22;
        answer.max_qp_init_rd_atom = 16;
        answer.atomic_cap = 1;  // IBV_ATOMIC_HCA
        answer.max_srq = 1 << 23;
        answer.max_srq_wr = 32767;
        answer.max_srq_sge = 31;
        answer.max_pkeys = 128;
        answer.local_ca_ack_delay = 16;
        answer.phys_port_cnt = 1;
        respond(request.response, answer);
        return static_cast<ssize_t>(length);
    }
    case IB_USER_VERBS_CMD_QUERY_PORT: {
        const auto request = read<ib_uverbs_query_port>(body);
        ib_uverbs_query_port_resp answer{};
        answer.max_msg_sz = 1u << 30;
        answer.gid_tbl_len = 1;
        answer.pkey_tbl_len = 128;
        answer.lid = 1;
        answer.sm_lid = 1;
        answer.state = 4;       // ACTIVE
        answer.max_mtu = 5;     // 4096
        answer.active_mtu = 5;
        answer.active_width = 2;
        answer.active_speed = 32;
        answer.phys_state = 5;  // LinkUp
        answer.link_layer = state.link_layer;
        respond(request.response, answer);
        return static_cast<ssize_t>(length);
    }
    case IB_USER_VERBS_CMD_ALLOC_PD: {
        const auto request = read<ib_uverbs_alloc_pd>(body);
        ib_uverbs_alloc_pd_resp answer{};
        answer.pd_handle = 1;
        mlx5_ib_alloc_pd_resp driver{};
        driver.pdn = 1;
        respond(request.response, answer, driver);
        return static_cast<ssize_t>(length);
    }
    case IB_USER_VERBS_CMD_REG_MR: {
        const auto request = read<ib_uverbs_reg_mr>(body);
        ib_uverbs_reg_mr_resp answer{};
        answer.mr_handle = ++state.memory_regions;
        answer.lkey = 0x1000 + answer.mr_handle;
        answer.rkey = answer.lkey;
        respond(request.response, answer);
        return static_cast<ssize_t>(length);
    }
    case IB_USER_VERBS_CMD_CREATE_COMP_CHANNEL: {
        // A pipe: libibverbs reads events from the descriptor answered, as from the kernel's
        // anonymous file, and the fake writes them into the other end.
        const auto request = read<ib_uverbs_create_comp_channel>(body);
        int ends[2];
        if (pipe2(ends, O_CLOEXEC) != 0) return -1;
        state.channel_writers[ends[0]] = ends[1];
        ib_uverbs_create_comp_channel_resp answer{};
        answer.fd = static_cast<std::uint32_t>(ends[0]);
        respond(request.response, answer);
        return static_cast<ssize_t>(length);
    }
    case IB_USER_VERBS_CMD_CREATE_CQ: {
        const auto request = read<ib_uverbs_create_cq>(body);
        const auto driver_request = read<mlx5_ib_create_cq>(body + sizeof request);
        // The kernel refuses a descriptor that is not a completion channel.
        if (request.comp_channel >= 0 && state.channel_writers.count(request.comp_channel) == 0) {
            errno = EINVAL;
            return -1;
        }
        const std::uint32_t handle = ++state.completion_queues;
        state.completion_events[handle] = {request.user_handle, request.comp_channel, 0};
        state.cq_buffer = driver_request.buf_addr;
        state.cq_doorbell_record = driver_request.db_addr;
        state.cqe_count = request.cqe + 1;
        state.cqe_size = driver_request.cqe_size;
        state.cqn = state.next_cqn++ & 0xffffff;
        ib_uverbs_create_cq_resp answer{};
        answer.cq_handle = handle;
        answer.cqe = request.cqe;
        mlx5_ib_create_cq_resp driver{};
        driver.cqn = state.cqn;
        respond(request.response, answer, driver);
        return static_cast<ssize_t>(length);
    }
    case IB_USER_VERBS_CMD_CREATE_QP: {
        const auto request = read<ib_uverbs_create_qp>(body);
        const auto driver_request = read<mlx5_ib_create_qp>(body + sizeof request);
        state.qpn = 0x1234 + state.queue_pairs++;
        const std::uint32_t handle = state.queue_pairs;
        state.queue_pair_records[handle] = {kind_of(request, driver_request), IBV_QPS_RESET};
        state.user_index = driver_request.uidx;
        state.send_wqe_count = driver_request.sq_wqe_count;
        state.qp_doorbell_record = driver_request.db_addr;
        ib_uverbs_create_qp_resp answer{};
        answer.qp_handle = handle;
        answer.qpn = state.qpn;
        answer.max_send_wr = request.max_send_wr;
        answer.max_recv_wr = request.max_recv_wr;
        answer.max_send_sge = request.max_send_sge;
        answer.max_recv_sge = request.max_recv_sge;
        answer.max_inline_data = request.max_inline_data;
        mlx5_ib_create_qp_resp driver{};
        driver.bfreg_index = static_cast<std::uint32_t>(state.registers[fd].allocate());
        respond(request.response, answer, driver);
        return static_cast<ssize_t>(length);
    }
    case IB_USER_VERBS_CMD_CREATE_SRQ: {
        const auto request = read<ib_uverbs_create_srq>(body);
        if (state.shared_receive_queues >= FakeKernelState::kMaxSharedReceiveQueues)
            return unsupported(command, "more SRQs than the fake kernel keeps");
        ib_uverbs_create_srq_resp answer{};
        answer.srq_handle = state.shared_receive_queues;
        answer.max_wr = request.max_wr;
        answer.max_sge = request.max_sge;
        answer.srqn = 0x50 + state.shared_receive_queues;
        state.shared_receive_limits[state.shared_receive_queues][0] = request.max_wr;
        state.shared_receive_limits[state.shared_receive_queues][1] = request.max_sge;
        ++state.shared_receive_queues;
        mlx5_ib_create_srq_resp driver{};
        driver.srqn = answer.srqn;
        respond(request.response, answer, driver);
        return static_cast<ssize_t>(length);
    }
    case IB_USER_VERBS_CMD_QUERY_SRQ: {
        const auto request = read<ib_uverbs_query_srq>(body);
        if (request.srq_handle >= state.shared_receive_queues) return unsupported(command, "no such SRQ handle");
        ib_uverbs_query_srq_resp answer{};
        answer.max_wr = state.shared_receive_limits[request.srq_handle][0];
        answer.max_sge = state.shared_receive_limits[request.srq_handle][1];
        respond(request.response, answer);
        return static_cast<ssize_t>(length);
    }
    // Destruction: libibverbs waits until the events reported were acknowledged; no
    // asynchronous events ever are.
    case IB_USER_VERBS_CMD_DESTROY_QP: {
        const auto request = read<ib_uverbs_destroy_qp>(body);
        state.queue_pair_records.erase(request.qp_handle);
        respond(request.response, ib_uverbs_destroy_qp_resp{});
        return static_cast<ssize_t>(length);
    }
    case IB_USER_VERBS_CMD_DESTROY_CQ: {
        const auto request = read<ib_uverbs_destroy_cq>(body);
        ib_uverbs_destroy_cq_resp answer{};
        const auto events = state.completion_events.find(request.cq_handle);
        if (events != state.completion_events.end()) {
            answer.comp_events_reported = events->second.reported - drop_unread_events(events->second);
            state.completion_events.erase(events);
        }
        respond(request.response, answer);
        return static_cast<ssize_t>(length);
    }
    case IB_USER_VERBS_CMD_DESTROY_SRQ: {
        const auto request = read<ib_uverbs_destroy_srq>(body);
        respond(request.response, ib_uverbs_destroy_srq_resp{});
        return static_cast<ssize_t>(length);
    }
    case IB_USER_VERBS_CMD_CREATE_AH: {
        // A RoCE address handle: the kernel resolves the next hop's MAC for the destination GID.
        const auto request = read<ib_uverbs_create_ah>(body);
        ib_uverbs_create_ah_resp answer{};
        answer.ah_handle = ++state.address_handles;
        mlx5_ib_create_ah_resp driver{};
        driver.response_length = sizeof driver;
        driver.dmac[0] = 0x02;
        std::memcpy(driver.dmac + 2, request.attr.grh.dgid + 12, 4);
        std::memcpy(state.address_handle_mac, driver.dmac, sizeof driver.dmac);
        respond(request.response, answer, driver);
        return static_cast<ssize_t>(length);
    }
    case IB_USER_VERBS_CMD_MODIFY_QP: {
        const int error = judge_modify(read<ib_uverbs_modify_qp>(body));
        if (error != 0) {
            errno = error;
            return -1;
        }
        return static_cast<ssize_t>(length);
    }
    case IB_USER_VERBS_CMD_DEALLOC_PD:
    case IB_USER_VERBS_CMD_DEREG_MR:
    case IB_USER_VERBS_CMD_DESTROY_AH:
        return static_cast<ssize_t>(length);
    default:
        return unsupported(command, "not answered by the fake kernel");
    }
}

// The one ioctl method answered: a DEVX CREATE_MKEY (mlx5dv_create_mkey), the indirect memory
// keys of memory layouts. Its output mailbox (create_mkey_out in the mlx5 PRM) gets status 0 and
// a new key index (bits 23:0 of bytes 8-11). Every other ioctl answers ENOTTY, so libibverbs
// keeps to the write() commands.
constexpr std::uint16_t kCreateMkeyOpcode = 0x200;  // MLX5_CMD_OP_CREATE_MKEY

int execute_ioctl(ib_uverbs_ioctl_hdr* header) {
    if (header->object_id != MLX5_IB_OBJECT_DEVX_OBJ || header->method_id != MLX5_IB_METHOD_DEVX_OBJ_CREATE) {
        errno = ENOTTY;
        return -1;
    }
    ib_uverbs_attr* handle = nullptr;
    const std::uint8_t* input = nullptr;
    std::uint8_t* output = nullptr;
    std::size_t output_length = 0;
    for (std::uint16_t i = 0; i < header->num_attrs; ++i) {
        ib_uverbs_attr& attribute = header->attrs[i];
        if (attribute.attr_id == MLX5_IB_ATTR_DEVX_OBJ_CREATE_HANDLE) handle = &attribute;
        if (attribute.attr_id == MLX5_IB_ATTR_DEVX_OBJ_CREATE_CMD_IN)
            input = attribute.len <= 8 ? reinterpret_cast<const std::uint8_t*>(&attribute.data)
                                       : reinterpret_cast<const std::uint8_t*>(attribute.data);
        if (attribute.attr_id == MLX5_IB_ATTR_DEVX_OBJ_CREATE_CMD_OUT) {
            output = reinterpret_cast<std::uint8_t*>(attribute.data);
            output_length = attribute.len;
            attribute.flags |= UVERBS_ATTR_F_VALID_OUTPUT;
        }
    }
    const std::uint16_t opcode = input == nullptr ? 0 : static_cast<std::uint16_t>(input[0] << 8 | input[1]);
    if (handle == nullptr || output == nullptr || output_length < 16 || opcode != kCreateMkeyOpcode) {
        std::fprintf(stderr, "fake uverbs: DEVX object create refused (opcode 0x%x): only CREATE_MKEY is answered\n", opcode);
        errno = EOPNOTSUPP;
        return -1;
    }
    std::memset(output, 0, output_length);
    const std::uint32_t index = htonl(0x100 + state.memory_keys++);
    std::memcpy(output + 8, &index, 4);
    handle->data = 0x1000 + state.memory_keys;
    return 0;
}

}  // namespace

FakeKernelState& fake_kernel() { return state; }

bool report_completion_event(std::uint32_t cq_handle) {
    const auto events = state.completion_events.find(cq_handle);
    if (events == state.completion_events.end() || events->second.channel < 0) return false;
    const auto writer = state.channel_writers.find(events->second.channel);
    if (writer == state.channel_writers.end()) return false;
    ib_uverbs_comp_event_desc event{};
    event.cq_handle = events->second.user_handle;
    if (next<ssize_t (*)(int, const void*, size_t)>("write")(writer->second, &event, sizeof event) != sizeof event)
        return false;
    ++events->second.reported;
    return true;
}

}  // namespace rdmachan::libmlx5_instructions

using namespace rdmachan::libmlx5_instructions;

extern "C" {

int open(const char* path, int flags, ...) {
    mode_t mode = 0;
    if ((flags & O_CREAT) != 0) {
        va_list arguments;
        va_start(arguments, flags);
        mode = va_arg(arguments, mode_t);
        va_end(arguments);
    }
    if (std::strcmp(path, kDevicePath) == 0) {
        const int fd = memfd_create("fake-uverbs0", MFD_CLOEXEC);
        if (fd >= kMaxDescriptors) {
            next<int (*)(int)>("close")(fd);
            errno = EMFILE;
            return -1;
        }
        if (fd >= 0) device_descriptors[fd] = true;
        return fd;
    }
    return next<int (*)(const char*, int, ...)>("open")(path, flags, mode);
}

// libibverbs lists devices through RDMA netlink first and reads sysfs only when that fails: on a
// host with RDMA devices it would find those and not the fake one.
int socket(int domain, int type, int protocol) {
    if (domain == AF_NETLINK && protocol == NETLINK_RDMA) {
        errno = EPROTONOSUPPORT;
        return -1;
    }
    return next<int (*)(int, int, int)>("socket")(domain, type, protocol);
}

int stat(const char* path, struct stat* buffer) {
    if (std::strcmp(path, kDevicePath) == 0) {
        fake_device_stat(buffer);
        return 0;
    }
    return next<int (*)(const char*, struct stat*)>("stat")(path, buffer);
}

int fstat(int fd, struct stat* buffer) {
    if (is_device(fd)) {
        fake_device_stat(buffer);
        return 0;
    }
    return next<int (*)(int, struct stat*)>("fstat")(fd, buffer);
}

int ioctl(int fd, unsigned long request, ...) {
    va_list arguments;
    va_start(arguments, request);
    void* argument = va_arg(arguments, void*);
    va_end(arguments);
    if (is_device(fd)) {
        if (request != RDMA_VERBS_IOCTL) {
            errno = ENOTTY;
            return -1;
        }
        return execute_ioctl(static_cast<ib_uverbs_ioctl_hdr*>(argument));
    }
    return next<int (*)(int, unsigned long, void*)>("ioctl")(fd, request, argument);
}

ssize_t write(int fd, const void* buffer, size_t length) {
    if (is_device(fd)) return execute(fd, buffer, length);
    return next<ssize_t (*)(int, const void*, size_t)>("write")(fd, buffer, length);
}

int close(int fd) {
    if (is_device(fd)) {
        device_descriptors[fd] = false;
        state.registers.erase(fd);
    }
    const auto channel = state.channel_writers.find(fd);
    if (channel != state.channel_writers.end()) {
        next<int (*)(int)>("close")(channel->second);
        state.channel_writers.erase(channel);
    }
    return next<int (*)(int)>("close")(fd);
}

void* mmap(void* address, size_t length, int protection, int flags, int fd, off_t offset) {
    if (is_device(fd)) {
        // UAR pages (doorbells, BlueFlame registers) and clock pages: plain memory here.
        void* page = next<void* (*)(void*, size_t, int, int, int, off_t)>("mmap")(nullptr, length, PROT_READ | PROT_WRITE,
                                                                                  MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (page != MAP_FAILED && state.page_count < FakeKernelState::kMaxPages) {
            state.pages[state.page_count] = page;
            state.page_lengths[state.page_count] = length;
            ++state.page_count;
        }
        return page;
    }
    return next<void* (*)(void*, size_t, int, int, int, off_t)>("mmap")(address, length, protection, flags, fd, offset);
}

}  // extern "C"
