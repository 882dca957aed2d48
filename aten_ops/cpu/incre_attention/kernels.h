// The CPU decode-attention kernel (incre_flash_attention), compiled once per instruction set by kernels_isa.cpp and
// picked at run time by ops.cpp.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

namespace npu_fa::cpu {

// Validated description of one decode call. Query rows are fp32 (the query converted exactly, not scaled),
// contiguous [B, N1, D] (row b*N1 + n); the output is contiguous [B, N1, D] in `out`'s dtype (the query's).
// Key/value row (b, n2, logical key j) lives at: cache + blk*s_blk + n2*s_head + (pos - blk_first)*s_seq where
//   contiguous cache: pos = kv_start[b] + j, blk = b, blk_first = 0 (one "block" per sequence);
//   paged cache:      pos = j, blk = block_table[b][j / block_size], blk_first = (j / block_size)*block_size.
// Mask / pse columns are cache positions pos (see docs/inference.md).
struct DecodeParams {
  int64_t batch = 0, q_heads = 0, kv_heads = 0, group = 1, head_dim = 0;
  float scale = 1.f;                          // scale_value, multiplies q·k
  bool paged = false;
  int64_t block_size = 0;                     // paged only
  int64_t max_blocks = 0;                     // columns of block_table
  std::vector<int64_t> block_table;           // [B, max_blocks] (paged only)
  std::vector<int64_t> kv_start, kv_len;      // per batch
  int64_t k_blk = 0, k_head = 0, k_seq = 0;   // element strides of key
  int64_t v_blk = 0, v_head = 0, v_seq = 0;   // element strides of value
  const uint8_t* mask = nullptr;              // mask[b*mask_sb + pos] != 0 -> masked
  int64_t mask_sb = 0;
  const float* pse = nullptr;                 // pse[b*pse_sb + n1*pse_sn + pos], added after scaling
  int64_t pse_sb = 0, pse_sn = 0;
};

#define NPU_FA_DECLARE_DECODE_KERNELS(ISA)                                                                       \
  namespace ISA {                                                                                                \
  void decode_attention(const DecodeParams& p, const at::Tensor& q32, const at::Tensor& key,                     \
                        const at::Tensor& value, at::Tensor& out);                                               \
  }

NPU_FA_DECLARE_DECODE_KERNELS(DEFAULT)
NPU_FA_DECLARE_DECODE_KERNELS(AVX2)
NPU_FA_DECLARE_DECODE_KERNELS(AVX512)

}  // namespace npu_fa::cpu
