// Tiling of the FlashAttention forward Ascend C kernel (flash_attention_score_kernel.cpp): the POD struct the
// kernel reads from GM, the UB plan shared by host and kernel, and the pure host tiling function.
//
// Work split: a task is one (batch b, query head n, block of s1_block query rows). Tasks are numbered
// ((b * N + n) * s1_blocks + s1 block), so neighbouring tasks share K/V (same KV head under GQA), and each AIV gets
// a contiguous range balanced by cost (the number of key blocks the band leaves visible). Per task the AIV loops
// over key blocks of s2_block keys: cube S = Q·Kᵀ -> GM workspace, vector softmax in chunks of vec_rows rows,
// cube O_partial = P·V -> GM workspace, vector rescale-accumulate into the fp32 accumulator kept in UB.
#pragma once

#include <cstdint>
#ifndef __CCE_AICORE__  // host only: the device compiler sees the POD struct and the UB plan
#include <string>
#endif

#include "common/platform.h"

namespace tot_ascendc {

constexpr uint32_t kFaMaxAiv = 48;  // 2 AIVs x 24 AI Core groups on 910B

enum FaDtype : uint32_t { FA_FLOAT32 = 0, FA_FLOAT16 = 1, FA_BFLOAT16 = 2 };
enum FaMaskKind : uint32_t { FA_MASK_NONE = 0, FA_MASK_EXPLICIT = 1 };

// What the kernel reads (copied to GM by the glue). Lengths in elements unless named _bytes.
struct FlashAttentionScoreTilingData {
  uint32_t batch, q_heads, kv_heads, group;  // group = q_heads / kv_heads (GQA)
  uint32_t s1, s2, head_dim, v_head_dim;
  uint32_t v_dim_pad;                        // v_head_dim rounded up to 16: the row pitch of O tiles in UB/GM
  uint32_t dtype, elem_bytes;                // FaDtype of q/k/v/out
  float scale;
  uint32_t mask_kind;                        // FaMaskKind: an explicit uint8 mask [mb, mn, S1, S2] (1 = masked)
  uint32_t pad0;
  uint64_t mask_batch_stride, mask_head_stride;  // 0 = the mask broadcasts over that axis
  int32_t band_lo, band_hi;                  // key j is visible from row i iff i + band_lo <= j <= i + band_hi
  uint32_t s1_block, s2_block, vec_rows;     // cube tile rows/keys; rows the vector stage handles at a time
  uint32_t s1_blocks, s2_blocks, s1_tail, s2_tail;  // tails = size of the last block (== block when it divides)
  uint32_t block_dim, aiv_num, total_tasks;  // block_dim AI Core groups (MIX 1:2) -> aiv_num = 2 * block_dim
  uint32_t task_begin[kFaMaxAiv + 1];        // AIV a owns tasks [task_begin[a], task_begin[a + 1])
  uint64_t ws_s_offset, ws_p_offset, ws_o_offset;  // byte offsets inside one AIV's workspace slice (two S slices)
  uint64_t ws_per_aiv, workspace_bytes;
  uint32_t ub_bytes, l1_bytes;               // planned use (checked against the platform)
};

// Inputs of the tiling function (shapes after the glue made q/k/v BNSD-contiguous).
struct FlashAttentionTilingInput {
  uint32_t batch = 0, q_heads = 0, group = 1, s1 = 0, s2 = 0, head_dim = 0, v_head_dim = 0;  // v 0 = head_dim
  FaDtype dtype = FA_FLOAT16;
  float scale = 1.f;
  FaMaskKind mask_kind = FA_MASK_NONE;
  bool mask_per_batch = false, mask_per_head = false;  // explicit mask shape [B or 1, N or 1, S1, S2]
  int64_t band_lo = -(int64_t(1) << 40), band_hi = int64_t(1) << 40;  // unbounded by default
};

// 0 = automatic; otherwise forced (s1 a multiple of 8, s2 a multiple of 32).
struct FlashAttentionTilingOptions {
  uint32_t s1_block = 0, s2_block = 0;
};

inline uint32_t FaElemBytes(uint32_t dtype) { return dtype == FA_FLOAT32 ? 4u : 2u; }

// UB buffers of one AIV, in the order the kernel calls InitBuffer (bytes; each rounded to 32 by TPipe).
struct FaUbPlan {
  uint32_t s_in;      // x2 (double-buffered queue): [vec_rows, s2_block] fp32 scores
  uint32_t p_out;     // [vec_rows, s2_block] probabilities in the input dtype (0 for fp32: the scores buffer is P)
  uint32_t mask_u8;   // [vec_rows, s2_block] uint8 mask tile (0 without a mask)
  uint32_t mask_f16;  // the same as half, for CompareScalar (0 without a mask)
  uint32_t sel_bits;  // Select bit mask for a chunk
  uint32_t col_idx;   // [s2_block] fp32 column indices (band masking)
  uint32_t fold;      // [vec_rows, 64] fp32 partial row reductions
  uint32_t row_vec;   // [vec_rows] fp32 compact row max / sum
  uint32_t tmp8;      // x2: [vec_rows, 8] fp32 broadcast row values
  uint32_t stats8;    // x3 (max, sum, rescale factor): [s1_block, 8] fp32, live for a whole task
  uint32_t acc;       // [s1_block, v_dim_pad] fp32 output accumulator, live for a whole task
  uint32_t o_in;      // x2 (double-buffered queue): [vec_rows, v_dim_pad] fp32 P·V partial
  uint32_t o_out;     // [vec_rows, v_dim_pad] output in the input dtype (0 for fp32)
  uint32_t Total() const {
    auto r = [](uint32_t b) { return (b + 31u) / 32u * 32u; };
    return 2 * r(s_in) + r(p_out) + r(mask_u8) + r(mask_f16) + r(sel_bits) + r(col_idx) + r(fold) + r(row_vec) +
           2 * r(tmp8) + 3 * r(stats8) + r(acc) + 2 * r(o_in) + r(o_out);
  }
};

inline FaUbPlan FaPlanUb(uint32_t s1_block, uint32_t s2_block, uint32_t vec_rows, uint32_t v_dim_pad,
                         uint32_t elem_bytes, bool has_mask) {
  FaUbPlan p;
  p.s_in = vec_rows * s2_block * 4;
  p.p_out = elem_bytes == 4 ? 0 : vec_rows * s2_block * elem_bytes;
  p.mask_u8 = has_mask ? vec_rows * s2_block : 0;
  p.mask_f16 = has_mask ? vec_rows * s2_block * 2 : 0;
  p.sel_bits = (vec_rows * s2_block / 8 + 31) / 32 * 32;
  p.col_idx = s2_block * 4;
  p.fold = vec_rows * 64 * 4;
  p.row_vec = (vec_rows * 4 + 31) / 32 * 32;
  p.tmp8 = vec_rows * 32;
  p.stats8 = s1_block * 32;
  p.acc = s1_block * v_dim_pad * 4;
  p.o_in = vec_rows * v_dim_pad * 4;
  p.o_out = elem_bytes == 4 ? 0 : vec_rows * v_dim_pad * elem_bytes;
  return p;
}

// L1 the cube needs for one product (A and B tiles resident, single-buffered): max of Q·Kᵀ and P·V.
inline uint32_t FaL1Bytes(uint32_t s1_block, uint32_t s2_block, uint32_t head_dim, uint32_t v_head_dim,
                          uint32_t elem_bytes) {
  const uint64_t bmm1 = (uint64_t(s1_block) + s2_block) * head_dim * elem_bytes;
  const uint64_t bmm2 = (uint64_t(s1_block) * s2_block + uint64_t(s2_block) * v_head_dim) * elem_bytes;
  const uint64_t m = bmm1 > bmm2 ? bmm1 : bmm2;
  return m > 0xffffffffu ? 0xffffffffu : uint32_t(m);
}

#ifndef __CCE_AICORE__
// Fills `out`; returns "" on success, else what makes the input impossible.
std::string FlashAttentionScoreTiling(const FlashAttentionTilingInput& in, const FlashAttentionTilingOptions& opt,
                                      const PlatformInfo& platform, FlashAttentionScoreTilingData* out);
#endif

}  // namespace tot_ascendc
