// Validated incre_flash_attention arguments (decode attention), shared by the CPU and npu backends.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/string_view.h>

#include <cstdint>
#include <optional>
#include <vector>

#include "common/attention/params.h"
#include "generated/op_args.h"

namespace npu_fa::attention {

// Validated description of one decode call. Query rows are fp32 (the query converted exactly, not scaled),
// contiguous [B, N1, D] (row b*N1 + n); the output is contiguous [B, N1, D] in `out`'s dtype (the query's).
// Key/value row (b, n2, logical key j) lives at: cache + blk*s_blk + n2*s_head + (pos - blk_first)*s_seq where
//   contiguous cache: pos = kv_start[b] + j, blk = b, blk_first = 0 (one "block" per sequence);
//   paged cache:      pos = j, blk = block_table[b][j / block_size], blk_first = (j / block_size)*block_size.
// Mask / pse columns, and the position of per-token antiquant factors (Antiquant, common/attention/params.h), are
// cache positions pos (see docs/inference.md).
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
  // NZ caches (5-D paged (num_blocks, N2, D / c0, block_size, c0), docs/kv_cache.md "NZ layout"): a row's head dim
  // lies in D / c0 pieces of c0 elements (32 bytes), piece c at +c * nz_piece; 0 = rows contiguous.
  int64_t nz_c0 = 0, k_piece = 0, v_piece = 0;
  const uint8_t* mask = nullptr;              // mask[b*mask_sb + pos] != 0 -> masked
  int64_t mask_sb = 0;
  const float* pse = nullptr;                 // pse[b*pse_sb + n1*pse_sn + pos], added after scaling
  int64_t pse_sb = 0, pse_sn = 0;
  Antiquant k_quant, v_quant;                 // int8 key/value caches only
  const float* sink = nullptr;                // fp32 [N1]: one more logit per query head (zero value row)
};

// DecodeParams plus the tensors its raw pointers and strides refer to (kept alive by the caller).
struct DecodeInputs {
  DecodeParams params;
  at::Tensor key, value;   // the caller's cache, or a copy when its last dim was not contiguous
  at::Tensor mask_u8;      // [B or 1, S] uint8, when atten_mask is given
  at::Tensor pse32;        // fp32 pse_shift, when given
  at::Tensor sink32;       // fp32 learnable_sink, when given
  at::Tensor k_scale, k_offset, v_scale, v_offset;  // fp32 antiquant factors (int8 caches)
};

// The antiquant arguments, named as in incre_flash_attention and fused_infer_attention_score.
struct AntiquantArgs {
  const std::optional<at::Tensor>& antiquant_scale;
  const std::optional<at::Tensor>& antiquant_offset;
  const std::optional<at::Tensor>& key_antiquant_scale;
  const std::optional<at::Tensor>& key_antiquant_offset;
  const std::optional<at::Tensor>& value_antiquant_scale;
  const std::optional<at::Tensor>& value_antiquant_offset;
  int64_t antiquant_mode, key_antiquant_mode, value_antiquant_mode;
  template <class Args>
  static AntiquantArgs of(const Args& a) {
    return {a.antiquant_scale, a.antiquant_offset, a.key_antiquant_scale, a.key_antiquant_offset,
            a.value_antiquant_scale, a.value_antiquant_offset, a.antiquant_mode, a.key_antiquant_mode,
            a.value_antiquant_mode};
  }
};

// Validated antiquant factors of an int8 cache (fp32 tensors, referenced by k / v).
struct KvAntiquant {
  Antiquant k, v;
  at::Tensor k_scale, k_offset, v_scale, v_offset;
  // Sets the kernel parameters' k_quant / v_quant and keeps the factors alive in `in` (decode or prefill inputs).
  template <class Params, class Inputs>
  void install(Params& p, Inputs& in) const {
    p.k_quant = k;
    p.v_quant = v;
    in.k_scale = k_scale;
    in.k_offset = k_offset;
    in.v_scale = v_scale;
    in.v_offset = v_offset;
  }
};

// Checks the antiquant arguments of a call with B sequences, N2 KV heads of head dim D, reading cache positions
// < need; int8: key/value are int8 (else every antiquant tensor must be absent). Errors name `op`.
KvAntiquant parse_kv_antiquant(const char* op, const AntiquantArgs& a, bool int8, int64_t B, int64_t N2, int64_t D,
                               int64_t need);

// fp32 (x + offset) * scale of an int8 cache viewed as [B, N2, S, D] (any strides; S positions from 0).
at::Tensor dequantize_kv(const at::Tensor& x, const Antiquant& a, const at::Tensor& scale, const at::Tensor& offset);

// Every check of the op, in order; throws the op's error messages. params.scale = scale_value.
DecodeInputs validate_decode(const IncreFlashAttentionArgs& args);

}  // namespace npu_fa::attention
