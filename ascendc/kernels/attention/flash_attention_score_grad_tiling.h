// Tiling of the FlashAttention backward kernel (flash_attention_score_grad_kernel.cpp): a POD struct shared by the
// host and the kernel, and the pure host function that fills it. BNSD-contiguous q/dy/attention_in [B, N1, S1, D],
// k/v [B, N2, S2, D(v)], softmax_max/sum [B, N1, S1, 8] fp32.
//
// Work split (race-free): a task is (b, kv head n2, key block of bkv rows); AIV v of the launch takes tasks
// v, v + aiv_num, ... and owns dK/dV of its task's keys (fp32 accumulators in its private workspace, summed over the
// G query heads of the kv head and every query block). dQ contributions of different key blocks go to one fp32 dQ
// workspace by atomic add (SetAtomicAdd + DataCopy); after SyncAll a final pass casts it to the output dtype.
#pragma once

#include <cstdint>
#ifndef __CCE_AICORE__
#include <string>
#endif

#include "common/platform.h"

namespace tot_ascendc {

enum class FagDtype : uint32_t { FP32 = 0, FP16 = 1, BF16 = 2 };

struct FlashAttentionScoreGradTiling {
  uint32_t block_dim;      // AI Core groups of the MIX launch (<= 24)
  uint32_t aiv_num;        // 2 * block_dim vector cores
  uint32_t dtype;          // FagDtype of q/k/v/dy/attention_in and of dq/dk/dv
  uint32_t batch, q_heads, kv_heads, group;  // B, N1, N2, G = N1 / N2
  uint32_t s1, s2, d, dv;  // query / key lengths, head dims of q-k and of v
  float scale;
  // Visible keys of query row i: i + band_lo <= j <= i + band_hi (sparse mode / pre-next tokens), then the mask.
  int64_t band_lo, band_hi;
  uint32_t has_mask;       // bool mask, uint8 [Bm, Nm, S1, S2] contiguous (Bm in {1, B}, Nm in {1, N1})
  uint32_t pad0;
  uint64_t mask_batch_stride, mask_head_stride;  // elements; 0 when broadcast
  // Tiles: bq query rows x bkv key rows; pitches (elements) keep every UB row 32-byte aligned for fp32 and 16-bit.
  uint32_t bq, bkv, s1_blocks, s2_blocks, s1_tail, s2_tail;
  uint32_t bkv_pitch;      // AlignUp(bkv, 16): row pitch of S/dP/P/dS blocks
  uint32_t d_pitch, dv_pitch;  // AlignUp(d, 16), AlignUp(dv, 16): rows of the fp32 dQ/dK/dV accumulators
  uint32_t mask_pitch;     // bytes per mask row in UB: AlignUp(bkv, 32)
  uint32_t ub_chunk_elems; // elements of each of the 4 vector work buffers (2 fp32 + 2 in dtype)
  uint32_t vec_rows;       // S/dP rows per vector chunk (<= bq)
  uint32_t task_num;       // B * N2 * s2_blocks
  uint64_t rows;           // B * N1 * S1 (rows of dQ, Di and the statistics)
  // Workspace (bytes from its start): fp32 dQ accumulator [rows, d_pitch], Di [rows, 8], then per AIV a slice.
  uint64_t ws_dq_offset, ws_di_offset, ws_aiv_offset, ws_aiv_bytes;
  uint64_t ws_s_offset, ws_dp_offset, ws_p_offset, ws_ds_offset, ws_dqp_offset, ws_dk_offset, ws_dv_offset;  // in a slice
  uint64_t workspace_bytes;
  uint32_t ub_bytes;       // UB the kernel's buffers take (checked against the platform budget)
  uint32_t l1_bytes;       // L1 one matmul step needs (A + B operands, double-buffered)
};

#ifndef __CCE_AICORE__  // host side only: the device compiler sees just the POD struct
struct FlashAttentionScoreGradShape {
  int64_t batch = 0, q_heads = 0, kv_heads = 0, s1 = 0, s2 = 0, d = 0, dv = 0;
  FagDtype dtype = FagDtype::FP16;
  float scale = 1.f;
  int64_t band_lo = -(int64_t(1) << 40), band_hi = int64_t(1) << 40;
  bool has_mask = false;
  int64_t mask_batches = 1, mask_heads = 1;  // leading dims of the uint8 mask (1 = broadcast)
  int64_t max_block_dim = 0;                 // 0: all AI Core groups of the platform; tests use smaller values
  int64_t block_q = 0, block_kv = 0;         // 0: automatic tile sizes
};

// Fills `out`; returns "" on success or an error naming the impossible input.
std::string FlashAttentionScoreGradTilingFunc(const FlashAttentionScoreGradShape& shape, const PlatformInfo& platform,
                                              FlashAttentionScoreGradTiling& out);
#endif

// Elements a CompareScalar on one key row covers: the row rounded up to 128 (a whole number of 256-byte repeats
// for both fp32 key indices and the half mask row, as the Compare docs require).
inline uint32_t FaGradComparePitch(uint32_t kv_pitch) { return (kv_pitch + 127) / 128 * 128; }

}  // namespace tot_ascendc
