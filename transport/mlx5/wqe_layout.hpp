// Byte layouts and constants of the mlx5 send/receive queues and completion queues.
// Sources: rdma-core 44 infiniband/mlx5dv.h, providers/mlx5 (qp.c, cq.c); see mlx5-facts.md.
// Written as plain constants so the software device and the data path share one vocabulary
// without sharing code that could hide a common misunderstanding.
#pragma once

#include <cstdint>

namespace rdmachan::mlx5 {

inline constexpr std::uint32_t kSendWqeBasicBlockSize = 64;  // one WQEBB
inline constexpr std::uint32_t kSegmentUnit = 16;            // ds counts 16-byte units
inline constexpr std::uint32_t kMaxDs = 0x3f;                // ds is 6 bits wide

// Send WQE opcodes (ctrl byte 3).
enum WqeOpcode : std::uint8_t {
    kOpcodeNop = 0x00,
    kOpcodeSendInvalidate = 0x01,
    kOpcodeRdmaWrite = 0x08,
    kOpcodeRdmaWriteImmediate = 0x09,
    kOpcodeSend = 0x0a,
    kOpcodeSendImmediate = 0x0b,
    kOpcodeRdmaRead = 0x10,
    kOpcodeAtomicCompareAndSwap = 0x11,
    kOpcodeAtomicFetchAndAdd = 0x12,
    kOpcodeUmr = 0x25,
};

// ctrl byte 11, fm_ce_se.
inline constexpr std::uint8_t kCtrlSolicited = 0x02;
inline constexpr std::uint8_t kCtrlCqUpdate = 0x08;  // generate a CQE
inline constexpr std::uint8_t kCtrlInitiatorSmallFence = 0x20;
inline constexpr std::uint8_t kCtrlFence = 0x80;

// Segment sizes.
inline constexpr std::uint32_t kControlSegmentSize = 16;
inline constexpr std::uint32_t kRemoteAddressSegmentSize = 16;
inline constexpr std::uint32_t kAtomicSegmentSize = 16;
inline constexpr std::uint32_t kDataSegmentSize = 16;
inline constexpr std::uint32_t kAddressVectorSize = 48;  // full (extended) DC/UD address vector
inline constexpr std::uint32_t kInlineHeaderSize = 4;
inline constexpr std::uint32_t kInlineFlag = 0x80000000u;

// UMR WQE (opcode 0x25): ctrl, the 48-byte UMR control segment, the 64-byte mkey context
// segment, then for a key configuration the translation entries, padded to 64 bytes. Layouts
// and the values libmlx5 writes: transport/mlx5/README.md "UMR WQEs".
inline constexpr std::uint32_t kUmrControlSegmentSize = 48;
inline constexpr std::uint32_t kMkeyContextSegmentSize = 64;
inline constexpr std::uint32_t kUmrEntrySize = 16;  // a KLM, data segment or repeat entry
inline constexpr std::uint32_t kUmrHeaderUnits =
    (kControlSegmentSize + kUmrControlSegmentSize + kMkeyContextSegmentSize) / kSegmentUnit;
// UMR control segment: flags (byte 0), klm_octowords (BE16 at 4), translation_offset (BE16
// at 6), mkey_mask (BE64 at 8), 32 reserved bytes.
inline constexpr std::uint32_t kUmrFlags = 0;
inline constexpr std::uint32_t kUmrKlmOctowords = 4;
inline constexpr std::uint32_t kUmrMkeyMask = 8;
inline constexpr std::uint8_t kUmrFlagInline = 0x80;
inline constexpr std::uint8_t kUmrFlagCheckFree = 0x20;
inline constexpr std::uint8_t kUmrFlagTranslationOffset = 0x10;
inline constexpr std::uint8_t kUmrFlagCheckQpn = 0x08;
inline constexpr std::uint64_t kUmrMaskLength = 1u << 0;
inline constexpr std::uint64_t kUmrMaskStartAddress = 1u << 6;
inline constexpr std::uint64_t kUmrMaskMkey = 1u << 13;
inline constexpr std::uint64_t kUmrMaskQpn = 1u << 14;
inline constexpr std::uint64_t kUmrMaskAccessLocalWrite = 1u << 18;
inline constexpr std::uint64_t kUmrMaskAccessRemoteRead = 1u << 19;
inline constexpr std::uint64_t kUmrMaskAccessRemoteWrite = 1u << 20;
inline constexpr std::uint64_t kUmrMaskAccessAtomic = 1u << 21;
inline constexpr std::uint64_t kUmrMaskFree = 1u << 29;
// mkey context segment: free (byte 0), access_flags (byte 2), qpn_mkey (BE32 at 4), start_addr
// (BE64 at 16), len (BE64 at 24).
inline constexpr std::uint32_t kMkeyFree = 0;
inline constexpr std::uint32_t kMkeyAccessFlags = 2;
inline constexpr std::uint32_t kMkeyQpnMkey = 4;
inline constexpr std::uint32_t kMkeyStartAddress = 16;
inline constexpr std::uint32_t kMkeyLength = 24;
inline constexpr std::uint8_t kMkeyFreeFlag = 0x40;
// Interleaved layout: a 16-byte repeat block header (byte_count BE32, op BE32, repeat_count
// BE32, reserved BE16, num_ent BE16), then one entry per pattern element (stride BE16,
// byte_count BE16, memkey BE32, va BE64).
inline constexpr std::uint32_t kRepeatBlockOp = 0x400;

// Control segment field offsets.
inline constexpr std::uint32_t kCtrlOpmodIndexOpcode = 0;
inline constexpr std::uint32_t kCtrlQpnDs = 4;
inline constexpr std::uint32_t kCtrlSignature = 8;
inline constexpr std::uint32_t kCtrlStreamChannel = 9;
inline constexpr std::uint32_t kCtrlFmCeSe = 11;
inline constexpr std::uint32_t kCtrlImmediate = 12;

// Address vector fields (struct mlx5_wqe_av).
inline constexpr std::uint32_t kAvDcKey = 0;
inline constexpr std::uint32_t kAvDqpDct = 8;
inline constexpr std::uint32_t kAvStatRateSl = 12;
inline constexpr std::uint32_t kAvFlMlid = 13;
inline constexpr std::uint32_t kAvRlid = 14;
inline constexpr std::uint32_t kAvRmac = 20;
inline constexpr std::uint32_t kAvTclass = 26;
inline constexpr std::uint32_t kAvHopLimit = 27;
inline constexpr std::uint32_t kAvGrhGidFl = 28;
inline constexpr std::uint32_t kAvRgid = 32;
inline constexpr std::uint32_t kExtendedAddressVector = 0x80000000u;  // MLX5_EXTENDED_UD_AV

// Receive side.
inline constexpr std::uint32_t kInvalidLkey = 0x100;  // MLX5_INVALID_LKEY terminates an SGE list
inline constexpr std::uint32_t kSrqNextSegmentSize = 16;
inline constexpr std::uint32_t kReceiveSignatureSegmentSize = 16;

// Doorbell record words (mlx5dv_qp.dbrec): [0] receive, [1] send. CQ: [0] set_ci, [1] arm.
inline constexpr std::uint32_t kReceiveDoorbell = 0;
inline constexpr std::uint32_t kSendDoorbell = 1;
inline constexpr std::uint32_t kCqSetConsumerIndex = 0;
inline constexpr std::uint32_t kCqArm = 1;

// Arming a CQ for one completion event (cq.c mlx5_arm_cq; mlx5dv.h MLX5_CQ_DOORBELL,
// MLX5_CQ_DB_REQ_NOT, MLX5_CQ_DB_REQ_NOT_SOL). The arm word is sequence number << 28 | command
// | consumer index; the CQ doorbell register at kCqDoorbellOffset in the UAR page
// (mlx5dv_cq.cq_uar) takes arm word << 32 | cqn as one big-endian 64-bit store.
inline constexpr std::uint32_t kCqDoorbellOffset = 0x20;
inline constexpr std::uint32_t kCqArmNext = 0u << 24;       // the next completion
inline constexpr std::uint32_t kCqArmSolicited = 1u << 24;  // the next solicited or error one
inline constexpr std::uint32_t kCqArmSequenceShift = 28;
inline constexpr std::uint32_t kCqArmSequenceMask = 3;  // 2 bits, one step per event taken
inline constexpr std::uint32_t kCqConsumerIndexMask = 0xffffff;

// CQE (struct mlx5_cqe64) field offsets within the 64-byte CQE. In a 128-byte entry the
// mlx5_cqe64 is the second half.
inline constexpr std::uint32_t kCqeSize64 = 64;
inline constexpr std::uint32_t kCqeSrqnUserIndex = 32;
inline constexpr std::uint32_t kCqeImmediateInvalidatePkey = 36;
inline constexpr std::uint32_t kCqeByteCount = 44;
inline constexpr std::uint32_t kCqeTimestamp = 48;
inline constexpr std::uint32_t kCqeVendorSyndrome = 54;  // error CQE
inline constexpr std::uint32_t kCqeSyndrome = 55;        // error CQE
inline constexpr std::uint32_t kCqeMlPath = 17;          // responder: path bits
inline constexpr std::uint32_t kCqeSlid = 22;            // responder: be16 source LID
inline constexpr std::uint32_t kCqeFlagsRemoteQpn = 24;  // responder: sl, grh, remote QPN
inline constexpr std::uint32_t kCqeSopDropQpn = 56;      // bits 31:24 WQE opcode, 23:0 QPN
inline constexpr std::uint32_t kCqeWqeCounter = 60;
inline constexpr std::uint32_t kCqeSignature = 62;
inline constexpr std::uint32_t kCqeOpOwn = 63;
// op_own: opcode << 4 | format << 2 | se << 1 | owner. SE: the request that completed this
// receive asked for a solicited event (the poller ignores it; the CQ's solicited arm uses it).
inline constexpr std::uint8_t kCqeSolicitedEvent = 0x02;

enum CqeOpcode : std::uint8_t {
    kCqeRequester = 0,
    kCqeResponderWriteImmediate = 1,
    kCqeResponderSend = 2,
    kCqeResponderSendImmediate = 3,
    kCqeResponderSendInvalidate = 4,
    kCqeResize = 5,
    kCqeNoPacket = 6,
    kCqeSignatureError = 12,
    kCqeRequesterError = 13,
    kCqeResponderError = 14,
    kCqeInvalid = 15,
};

// op_own bits 3:2.
inline constexpr std::uint8_t kCqeFormatInlineScatter32 = 1;
inline constexpr std::uint8_t kCqeFormatInlineScatter64 = 2;
inline constexpr std::uint8_t kCqeFormatCompressed = 3;
// Format 1 carries up to this many bytes, in the first bytes of the mlx5_cqe64; format 2 (a
// 128-byte CQE) twice as many, in the 64 bytes before it.
inline constexpr std::uint32_t kInlineScatterBytes = 32;

// Error CQE syndromes (cq.c mlx5_handle_error_cqe).
enum CqeSyndrome : std::uint8_t {
    kSyndromeLocalLength = 0x01,
    kSyndromeLocalQpOperation = 0x02,
    kSyndromeLocalProtection = 0x04,
    kSyndromeWorkRequestFlushed = 0x05,
    kSyndromeMemoryWindowBind = 0x06,
    kSyndromeBadResponse = 0x10,
    kSyndromeLocalAccess = 0x11,
    kSyndromeRemoteInvalidRequest = 0x12,
    kSyndromeRemoteAccess = 0x13,
    kSyndromeRemoteOperation = 0x14,
    kSyndromeTransportRetryExceeded = 0x15,
    kSyndromeRnrRetryExceeded = 0x16,
    kSyndromeRemoteAborted = 0x22,
};

}  // namespace rdmachan::mlx5
