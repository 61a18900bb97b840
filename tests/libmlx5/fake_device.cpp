#include "tests/libmlx5/fake_device.hpp"

#include <infiniband/mlx5dv.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "tests/libmlx5/fake_uverbs.hpp"
#include "transport/mlx5/byte_order.hpp"
#include "transport/mlx5/wqe_layout.hpp"

namespace rdmachan::libmlx5_instructions {
namespace {

namespace fs = std::filesystem;

void write_file(const fs::path& path, const std::string& text) {
    fs::create_directories(path.parent_path());
    std::ofstream(path) << text << "\n";
}

// The sysfs entries libibverbs reads to find a device and match it to the mlx5 provider
// (SYSFS_PATH points it here): a ConnectX-5 (PCI 15b3:1017) named mlx5_0 behind uverbs0.
fs::path make_sysfs() {
    const fs::path root = fs::temp_directory_path() / ("libmlx5-sysfs-" + std::to_string(getpid()));
    write_file(root / "class/infiniband_verbs/abi_version", "6");
    write_file(root / "class/infiniband_verbs/uverbs0/ibdev", "mlx5_0");
    write_file(root / "class/infiniband_verbs/uverbs0/dev", "231:192");
    write_file(root / "class/infiniband_verbs/uverbs0/abi_version", "1");
    write_file(root / "class/infiniband/mlx5_0/node_type", "1: CA");
    write_file(root / "class/infiniband/mlx5_0/device/modalias", "pci:v000015B3d00001017sv000015B3sd00000008bc02sc00i00");
    // Port 1's GID table, read from sysfs when the GID query has no ioctl: one InfiniBand GID.
    write_file(root / "class/infiniband/mlx5_0/ports/1/gids/0", "fe80:0000:0000:0000:0002:c903:00a1:b2c3");
    write_file(root / "class/infiniband/mlx5_0/ports/1/gid_attrs/types/0", "IB/RoCE v1");
    for (int index = 1; index < 4; ++index) {
        write_file(root / ("class/infiniband/mlx5_0/ports/1/gids/" + std::to_string(index)), "0000:0000:0000:0000:0000:0000:0000:0000");
        write_file(root / ("class/infiniband/mlx5_0/ports/1/gid_attrs/types/" + std::to_string(index)), "IB/RoCE v1");
    }
    return root;
}

// RTR to RTS, the same for an RC queue pair and a DCI; nullptr and `error` set on failure.
ibv_qp* move_to_rts(ibv_qp* qp, std::string& error) {
    ibv_qp_attr attributes{};
    attributes.qp_state = IBV_QPS_RTS;
    attributes.timeout = 14;
    attributes.retry_cnt = 7;
    attributes.rnr_retry = 7;
    attributes.max_rd_atomic = 1;
    if (ibv_modify_qp(qp, &attributes,
                      IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
                          IBV_QP_MAX_QP_RD_ATOMIC) != 0) {
        error = "ibv_modify_qp to RTS failed";
        return nullptr;
    }
    return qp;
}

// INIT, RTR (connected to itself: nothing is sent), RTS.
ibv_qp* move_rc_to_rts(ibv_qp* qp, std::string& error) {
    ibv_qp_attr attributes{};
    attributes.qp_state = IBV_QPS_INIT;
    attributes.port_num = 1;
    attributes.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;
    if (ibv_modify_qp(qp, &attributes, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS) != 0) {
        error = "ibv_modify_qp to INIT failed";
        return nullptr;
    }
    attributes = {};
    attributes.qp_state = IBV_QPS_RTR;
    attributes.path_mtu = IBV_MTU_4096;
    attributes.dest_qp_num = qp->qp_num;
    attributes.ah_attr.dlid = 1;
    attributes.ah_attr.port_num = 1;
    attributes.max_dest_rd_atomic = 1;
    attributes.min_rnr_timer = 12;
    if (ibv_modify_qp(qp, &attributes,
                      IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                          IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER) != 0) {
        error = "ibv_modify_qp to RTR failed";
        return nullptr;
    }
    return move_to_rts(qp, error);
}

}  // namespace

std::string make_fake_sysfs() {
    const fs::path root = make_sysfs();
    setenv("SYSFS_PATH", root.c_str(), 1);
    return root.string();
}

FakeMlx5 open_fake_mlx5(std::uint32_t cq_entries, std::string& error) {
    FakeMlx5 mlx5;
    // libibverbs reads the tree while it lists the devices and opens one; it goes after that.
    const fs::path sysfs = make_fake_sysfs();
    int count = 0;
    ibv_device** devices = ibv_get_device_list(&count);
    if (devices == nullptr || count != 1) {
        error = "libibverbs did not list the one fake device";
        fs::remove_all(sysfs);
        return mlx5;
    }
    mlx5.context = ibv_open_device(devices[0]);
    ibv_free_device_list(devices);
    fs::remove_all(sysfs);
    if (mlx5.context == nullptr) {
        error = "libmlx5 did not open mlx5_0";
        return mlx5;
    }
    mlx5.pd = ibv_alloc_pd(mlx5.context);
    mlx5.cq = ibv_create_cq(mlx5.context, static_cast<int>(cq_entries), nullptr, nullptr, 0);
    if (mlx5.pd == nullptr || mlx5.cq == nullptr) {
        error = "ibv_alloc_pd or ibv_create_cq failed";
        return mlx5;
    }
    if (fake_kernel().cq_buffer == 0 || (fake_kernel().cqe_size != 64 && fake_kernel().cqe_size != 128))
        error = "the fake kernel did not see the CQ's ring of 64- or 128-byte CQEs";
    return mlx5;
}

ibv_qp* create_rts_queue_pair(const FakeMlx5& mlx5, ibv_qp_cap& caps, std::string& error, bool signal_all,
                              ibv_srq* shared_receive_queue) {
    ibv_qp_init_attr init{};
    init.send_cq = mlx5.cq;
    init.recv_cq = mlx5.cq;
    init.qp_type = IBV_QPT_RC;
    init.cap = caps;
    init.sq_sig_all = signal_all ? 1 : 0;
    init.srq = shared_receive_queue;
    ibv_qp* qp = ibv_create_qp(mlx5.pd, &init);
    if (qp == nullptr) {
        error = "ibv_create_qp failed";
        return nullptr;
    }
    caps = init.cap;
    return move_rc_to_rts(qp, error);
}

ibv_qp* create_rts_memory_key_queue_pair(const FakeMlx5& mlx5, ibv_qp_cap& caps, std::string& error) {
    ibv_qp_init_attr_ex attributes{};
    attributes.qp_type = IBV_QPT_RC;
    attributes.send_cq = mlx5.cq;
    attributes.recv_cq = mlx5.cq;
    attributes.pd = mlx5.pd;
    attributes.cap = caps;
    attributes.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
    attributes.send_ops_flags = IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_RDMA_READ |
                                IBV_QP_EX_WITH_LOCAL_INV;
    mlx5dv_qp_init_attr memory_keys{};
    memory_keys.comp_mask = MLX5DV_QP_INIT_ATTR_MASK_SEND_OPS_FLAGS;
    memory_keys.send_ops_flags = MLX5DV_QP_EX_WITH_MR_LIST | MLX5DV_QP_EX_WITH_MR_INTERLEAVED;
    ibv_qp* qp = mlx5dv_create_qp(mlx5.context, &attributes, &memory_keys);
    if (qp == nullptr) {
        error = "mlx5dv_create_qp with the memory-key operations failed";
        return nullptr;
    }
    caps = attributes.cap;
    return move_rc_to_rts(qp, error);
}


ibv_qp* create_rts_dc_initiator(const FakeMlx5& mlx5, ibv_qp_cap& caps, std::string& error) {
    ibv_qp_init_attr_ex attributes{};
    attributes.qp_type = IBV_QPT_DRIVER;
    attributes.send_cq = mlx5.cq;
    attributes.recv_cq = mlx5.cq;
    attributes.pd = mlx5.pd;
    attributes.cap = caps;
    attributes.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
    attributes.send_ops_flags = IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM | IBV_QP_EX_WITH_SEND |
                                IBV_QP_EX_WITH_SEND_WITH_IMM | IBV_QP_EX_WITH_RDMA_READ | IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP |
                                IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD;
    mlx5dv_qp_init_attr dc{};
    dc.comp_mask = MLX5DV_QP_INIT_ATTR_MASK_DC;
    dc.dc_init_attr.dc_type = MLX5DV_DCTYPE_DCI;
    ibv_qp* qp = mlx5dv_create_qp(mlx5.context, &attributes, &dc);
    if (qp == nullptr) {
        error = "mlx5dv_create_qp of a DCI failed";
        return nullptr;
    }
    caps = attributes.cap;
    ibv_qp_attr state{};
    state.qp_state = IBV_QPS_INIT;
    state.port_num = 1;
    if (ibv_modify_qp(qp, &state, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT) != 0) {
        error = "the DCI's move to INIT failed";
        return nullptr;
    }
    state = {};
    state.qp_state = IBV_QPS_RTR;
    state.path_mtu = IBV_MTU_4096;
    state.ah_attr.port_num = 1;
    if (ibv_modify_qp(qp, &state, IBV_QP_STATE | IBV_QP_PATH_MTU | IBV_QP_AV) != 0) {
        error = "the DCI's move to RTR failed";
        return nullptr;
    }
    return move_to_rts(qp, error);
}

void name_cqe(std::uint8_t* cqe, std::uint32_t user_index, std::uint32_t sop_drop_qpn, std::uint32_t wqe_counter) {
    mlx5::store_big32(cqe + mlx5::kCqeSrqnUserIndex, user_index & 0xffffff);
    mlx5::store_big32(cqe + mlx5::kCqeSopDropQpn, sop_drop_qpn);
    mlx5::store_big16(cqe + mlx5::kCqeWqeCounter, static_cast<std::uint16_t>(wqe_counter));
}

void write_requester_cqe(std::uint32_t index, std::uint32_t qpn, std::uint8_t wqe_opcode, std::uint32_t wqe_counter,
                         std::uint32_t byte_count) {
    const FakeKernelState& kernel = fake_kernel();
    // The mlx5_cqe64 is the last 64 bytes of an entry.
    auto* cqe = reinterpret_cast<std::uint8_t*>(kernel.cq_buffer) +
                static_cast<std::size_t>(index & (kernel.cqe_count - 1)) * kernel.cqe_size + (kernel.cqe_size - 64);
    std::memset(cqe, 0, 63);
    name_cqe(cqe, kernel.user_index, static_cast<std::uint32_t>(wqe_opcode) << 24 | qpn, wqe_counter);
    mlx5::store_big32(cqe + mlx5::kCqeByteCount, byte_count);
    const std::uint8_t owner = (index / kernel.cqe_count) & 1;
    std::atomic_ref<std::uint8_t>(cqe[mlx5::kCqeOpOwn])
        .store(static_cast<std::uint8_t>(mlx5::kCqeRequester << 4 | owner), std::memory_order_release);
}

}  // namespace rdmachan::libmlx5_instructions
