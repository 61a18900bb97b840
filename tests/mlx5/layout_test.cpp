// The offsets in wqe_layout.hpp against the structures of rdma-core's own mlx5dv.h: if either
// side is wrong, this fails to compile.
#include <doctest/doctest.h>
#include <infiniband/mlx5dv.h>

#include <cstddef>

#include "transport/mlx5/completion.hpp"
#include "transport/mlx5/work_request.hpp"
#include "transport/mlx5/wqe_layout.hpp"

namespace mlx5 = rdmachan::mlx5;

static_assert(sizeof(mlx5_wqe_ctrl_seg) == mlx5::kControlSegmentSize);
static_assert(offsetof(mlx5_wqe_ctrl_seg, opmod_idx_opcode) == mlx5::kCtrlOpmodIndexOpcode);
static_assert(offsetof(mlx5_wqe_ctrl_seg, qpn_ds) == mlx5::kCtrlQpnDs);
static_assert(offsetof(mlx5_wqe_ctrl_seg, signature) == mlx5::kCtrlSignature);
static_assert(offsetof(mlx5_wqe_ctrl_seg, dci_stream_channel_id) == mlx5::kCtrlStreamChannel);
static_assert(offsetof(mlx5_wqe_ctrl_seg, fm_ce_se) == mlx5::kCtrlFmCeSe);
static_assert(offsetof(mlx5_wqe_ctrl_seg, imm) == mlx5::kCtrlImmediate);
static_assert(sizeof(mlx5_wqe_raddr_seg) == mlx5::kRemoteAddressSegmentSize);
static_assert(sizeof(mlx5_wqe_atomic_seg) == mlx5::kAtomicSegmentSize);
static_assert(sizeof(mlx5_wqe_data_seg) == mlx5::kDataSegmentSize);
static_assert(sizeof(mlx5_wqe_av) == mlx5::kAddressVectorSize);
static_assert(offsetof(mlx5_wqe_av, key) == mlx5::kAvDcKey);
static_assert(offsetof(mlx5_wqe_av, dqp_dct) == mlx5::kAvDqpDct);
static_assert(offsetof(mlx5_wqe_av, stat_rate_sl) == mlx5::kAvStatRateSl);
static_assert(offsetof(mlx5_wqe_av, fl_mlid) == mlx5::kAvFlMlid);
static_assert(offsetof(mlx5_wqe_av, rlid) == mlx5::kAvRlid);
static_assert(offsetof(mlx5_wqe_av, rmac) == mlx5::kAvRmac);
static_assert(offsetof(mlx5_wqe_av, tclass) == mlx5::kAvTclass);
static_assert(offsetof(mlx5_wqe_av, hop_limit) == mlx5::kAvHopLimit);
static_assert(offsetof(mlx5_wqe_av, grh_gid_fl) == mlx5::kAvGrhGidFl);
static_assert(offsetof(mlx5_wqe_av, rgid) == mlx5::kAvRgid);
// UMR WQE: segments, fields, flags and masks as the installed mlx5dv.h has them.
static_assert(sizeof(mlx5_wqe_umr_ctrl_seg) == mlx5::kUmrControlSegmentSize);
static_assert(offsetof(mlx5_wqe_umr_ctrl_seg, flags) == mlx5::kUmrFlags);
static_assert(offsetof(mlx5_wqe_umr_ctrl_seg, klm_octowords) == mlx5::kUmrKlmOctowords);
static_assert(offsetof(mlx5_wqe_umr_ctrl_seg, mkey_mask) == mlx5::kUmrMkeyMask);
static_assert(sizeof(mlx5_wqe_mkey_context_seg) == mlx5::kMkeyContextSegmentSize);
static_assert(offsetof(mlx5_wqe_mkey_context_seg, free) == mlx5::kMkeyFree);
static_assert(offsetof(mlx5_wqe_mkey_context_seg, access_flags) == mlx5::kMkeyAccessFlags);
static_assert(offsetof(mlx5_wqe_mkey_context_seg, qpn_mkey) == mlx5::kMkeyQpnMkey);
static_assert(offsetof(mlx5_wqe_mkey_context_seg, start_addr) == mlx5::kMkeyStartAddress);
static_assert(offsetof(mlx5_wqe_mkey_context_seg, len) == mlx5::kMkeyLength);
static_assert(sizeof(mlx5_wqe_umr_repeat_ent_seg) == mlx5::kUmrEntrySize);
static_assert(sizeof(mlx5_wqe_umr_repeat_block_seg) == mlx5::kUmrEntrySize);
static_assert(sizeof(mlx5_wqe_umr_klm_seg) == mlx5::kUmrEntrySize);
static_assert(static_cast<int>(MLX5_OPCODE_UMR) == mlx5::kOpcodeUmr);
static_assert(MLX5_WQE_CTRL_INITIATOR_SMALL_FENCE == mlx5::kCtrlInitiatorSmallFence);
static_assert(MLX5_WQE_UMR_CTRL_FLAG_INLINE == mlx5::kUmrFlagInline);
static_assert(MLX5_WQE_UMR_CTRL_FLAG_CHECK_FREE == mlx5::kUmrFlagCheckFree);
static_assert(MLX5_WQE_UMR_CTRL_FLAG_TRNSLATION_OFFSET == mlx5::kUmrFlagTranslationOffset);
static_assert(MLX5_WQE_UMR_CTRL_FLAG_CHECK_QPN == mlx5::kUmrFlagCheckQpn);
static_assert(MLX5_WQE_UMR_CTRL_MKEY_MASK_LEN == mlx5::kUmrMaskLength);
static_assert(MLX5_WQE_UMR_CTRL_MKEY_MASK_START_ADDR == mlx5::kUmrMaskStartAddress);
static_assert(MLX5_WQE_UMR_CTRL_MKEY_MASK_MKEY == mlx5::kUmrMaskMkey);
static_assert(MLX5_WQE_UMR_CTRL_MKEY_MASK_QPN == mlx5::kUmrMaskQpn);
static_assert(MLX5_WQE_UMR_CTRL_MKEY_MASK_ACCESS_LOCAL_WRITE == mlx5::kUmrMaskAccessLocalWrite);
static_assert(MLX5_WQE_UMR_CTRL_MKEY_MASK_ACCESS_REMOTE_READ == mlx5::kUmrMaskAccessRemoteRead);
static_assert(MLX5_WQE_UMR_CTRL_MKEY_MASK_ACCESS_REMOTE_WRITE == mlx5::kUmrMaskAccessRemoteWrite);
static_assert(MLX5_WQE_UMR_CTRL_MKEY_MASK_ACCESS_ATOMIC == mlx5::kUmrMaskAccessAtomic);
static_assert(MLX5_WQE_UMR_CTRL_MKEY_MASK_FREE == mlx5::kUmrMaskFree);
static_assert(MLX5_WQE_MKEY_CONTEXT_FREE == mlx5::kMkeyFreeFlag);
static_assert(sizeof(mlx5_wqe_inl_data_seg) == mlx5::kInlineHeaderSize);
static_assert(MLX5_WQE_MKEY_CONTEXT_ACCESS_FLAGS_LOCAL_WRITE == mlx5::kMemoryKeyLocalWrite);
static_assert(MLX5_WQE_MKEY_CONTEXT_ACCESS_FLAGS_REMOTE_READ == mlx5::kMemoryKeyRemoteRead);
static_assert(MLX5_WQE_MKEY_CONTEXT_ACCESS_FLAGS_REMOTE_WRITE == mlx5::kMemoryKeyRemoteWrite);
static_assert(MLX5_WQE_MKEY_CONTEXT_ACCESS_FLAGS_ATOMIC == mlx5::kMemoryKeyAtomic);
static_assert(static_cast<int>(MLX5DV_WC_UMR) == static_cast<int>(rdmachan::mlx5::CompletionOpcode::memory_key_configured));
static_assert(sizeof(mlx5_wqe_srq_next_seg) == mlx5::kSrqNextSegmentSize);
static_assert(sizeof(mlx5_cqe64) == mlx5::kCqeSize64);
static_assert(offsetof(mlx5_cqe64, ml_path) == mlx5::kCqeMlPath);
static_assert(offsetof(mlx5_cqe64, slid) == mlx5::kCqeSlid);
static_assert(offsetof(mlx5_cqe64, flags_rqpn) == mlx5::kCqeFlagsRemoteQpn);
static_assert(offsetof(mlx5_cqe64, srqn_uidx) == mlx5::kCqeSrqnUserIndex);
static_assert(offsetof(mlx5_cqe64, imm_inval_pkey) == mlx5::kCqeImmediateInvalidatePkey);
static_assert(offsetof(mlx5_cqe64, byte_cnt) == mlx5::kCqeByteCount);
static_assert(offsetof(mlx5_cqe64, timestamp) == mlx5::kCqeTimestamp);
static_assert(offsetof(mlx5_cqe64, sop_drop_qpn) == mlx5::kCqeSopDropQpn);
static_assert(offsetof(mlx5_cqe64, wqe_counter) == mlx5::kCqeWqeCounter);
static_assert(offsetof(mlx5_cqe64, signature) == mlx5::kCqeSignature);
static_assert(offsetof(mlx5_cqe64, op_own) == mlx5::kCqeOpOwn);
static_assert(offsetof(mlx5_err_cqe, vendor_err_synd) == mlx5::kCqeVendorSyndrome);
static_assert(offsetof(mlx5_err_cqe, syndrome) == mlx5::kCqeSyndrome);

static_assert(static_cast<long long>(MLX5_OPCODE_RDMA_WRITE) == static_cast<long long>(mlx5::kOpcodeRdmaWrite));
static_assert(static_cast<long long>(MLX5_OPCODE_RDMA_WRITE_IMM) == static_cast<long long>(mlx5::kOpcodeRdmaWriteImmediate));
static_assert(static_cast<long long>(MLX5_OPCODE_SEND) == static_cast<long long>(mlx5::kOpcodeSend));
static_assert(static_cast<long long>(MLX5_OPCODE_SEND_IMM) == static_cast<long long>(mlx5::kOpcodeSendImmediate));
static_assert(static_cast<long long>(MLX5_OPCODE_SEND_INVAL) == static_cast<long long>(mlx5::kOpcodeSendInvalidate));
static_assert(static_cast<long long>(MLX5_OPCODE_RDMA_READ) == static_cast<long long>(mlx5::kOpcodeRdmaRead));
static_assert(static_cast<long long>(MLX5_OPCODE_ATOMIC_CS) == static_cast<long long>(mlx5::kOpcodeAtomicCompareAndSwap));
static_assert(static_cast<long long>(MLX5_OPCODE_ATOMIC_FA) == static_cast<long long>(mlx5::kOpcodeAtomicFetchAndAdd));
static_assert(static_cast<long long>(MLX5_WQE_CTRL_CQ_UPDATE) == static_cast<long long>(mlx5::kCtrlCqUpdate));
static_assert(static_cast<long long>(MLX5_WQE_CTRL_SOLICITED) == static_cast<long long>(mlx5::kCtrlSolicited));
static_assert(static_cast<long long>(MLX5_WQE_CTRL_FENCE) == static_cast<long long>(mlx5::kCtrlFence));
static_assert(static_cast<long long>(MLX5_INLINE_SEG) == static_cast<long long>(mlx5::kInlineFlag));
static_assert(static_cast<long long>(MLX5_INVALID_LKEY) == static_cast<long long>(mlx5::kInvalidLkey));
static_assert(static_cast<long long>(MLX5_EXTENDED_UD_AV) == static_cast<long long>(mlx5::kExtendedAddressVector));
static_assert(static_cast<long long>(MLX5_SND_DBR) == static_cast<long long>(mlx5::kSendDoorbell));
static_assert(static_cast<long long>(MLX5_RCV_DBR) == static_cast<long long>(mlx5::kReceiveDoorbell));
static_assert(static_cast<long long>(MLX5_CQE_REQ) == static_cast<long long>(mlx5::kCqeRequester));
static_assert(static_cast<long long>(MLX5_CQE_RESP_WR_IMM) == static_cast<long long>(mlx5::kCqeResponderWriteImmediate));
static_assert(static_cast<long long>(MLX5_CQE_RESP_SEND) == static_cast<long long>(mlx5::kCqeResponderSend));
static_assert(static_cast<long long>(MLX5_CQE_RESP_SEND_IMM) == static_cast<long long>(mlx5::kCqeResponderSendImmediate));
static_assert(static_cast<long long>(MLX5_CQE_RESP_SEND_INV) == static_cast<long long>(mlx5::kCqeResponderSendInvalidate));
static_assert(static_cast<long long>(MLX5_CQE_REQ_ERR) == static_cast<long long>(mlx5::kCqeRequesterError));
static_assert(static_cast<long long>(MLX5_CQE_RESP_ERR) == static_cast<long long>(mlx5::kCqeResponderError));
static_assert(static_cast<long long>(MLX5_CQE_INVALID) == static_cast<long long>(mlx5::kCqeInvalid));
static_assert(static_cast<long long>(MLX5_CQE_SYNDROME_REMOTE_ACCESS_ERR) == static_cast<long long>(mlx5::kSyndromeRemoteAccess));
static_assert(static_cast<long long>(MLX5_CQE_SYNDROME_WR_FLUSH_ERR) == static_cast<long long>(mlx5::kSyndromeWorkRequestFlushed));
static_assert(static_cast<long long>(MLX5_CQE_SYNDROME_RNR_RETRY_EXC_ERR) == static_cast<long long>(mlx5::kSyndromeRnrRetryExceeded));
static_assert(static_cast<long long>(MLX5_CQE_SYNDROME_TRANSPORT_RETRY_EXC_ERR) == static_cast<long long>(mlx5::kSyndromeTransportRetryExceeded));
static_assert(static_cast<long long>(MLX5_CQE_SYNDROME_LOCAL_PROT_ERR) == static_cast<long long>(mlx5::kSyndromeLocalProtection));

TEST_CASE("mlx5 layout constants agree with rdma-core's mlx5dv.h") {
    // The static_asserts above are the test; this case makes the suite report it.
    CHECK(sizeof(mlx5_cqe64) == 64);
}
