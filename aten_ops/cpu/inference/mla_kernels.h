// The CPU kernel of absorbed Multi-head Latent Attention (fused_infer_attention_score with query_rope/key_rope and
// one KV head), compiled once per instruction set by cpu/inference/mla_kernels_isa.cpp and called through
// mla_attention_stub by cpu/inference/mla.cpp.
#pragma once

#include <ATen/core/Tensor.h>

#include <vector>

#include "cpu/isa_dispatch.h"

namespace npu_fa::cpu {

// Element strides of an operand's rows: row (b, i, h) of sequence b lies at
// base + b * sb + (off[b] + i) * ss + h * sh, with off the sequence's first row in a packed (TND) layout.
struct MlaRows {
  int64_t sb = 0, ss = 0, sh = 0;
};

struct MlaParams {
  int64_t batch = 0, heads = 0, dim = 0, rope_dim = 0, v_dim = 0;
  double scale = 1.0;
  // Band as AttentionParams::band: mode 2 (top-left causal), 3 (bottom-right causal), 4 (pre/next around the
  // bottom-right diagonal); anything else sees every key in [0, kv_len).
  int64_t sparse_mode = 0, pre_tokens = 0, next_tokens = 0;
  std::vector<int64_t> q_len, kv_len, q_off, kv_off;
  MlaRows q, qr, out;  // query rows indexed by (b, query position, head)
  MlaRows k, kr, v;    // key rows (b, key position, -): sb/ss for a contiguous cache, ss within a block when paged
  // Paged cache (block_size > 0): key j of sequence b is row j % block_size of block blocks[b * table_stride +
  // j / block_size]; *_block are the block strides of key, key_rope and value.
  int64_t block_size = 0, table_stride = 0, k_block = 0, kr_block = 0, v_block = 0;
  std::vector<int64_t> blocks;
  // NZ paged caches (common/inference/nz_cache.h): rows in pieces of nz_c0 values; piece c of a row at
  // row + c * *_piece (the rows' ss is then c0). 0: rows contiguous.
  int64_t nz_c0 = 0, k_piece = 0, kr_piece = 0, v_piece = 0;
  bool v_is_k = false;  // value is key (the same rows): the tile is read once for both products
  // learnable_sink (fp32 [heads]): one more logit per head in every row, with a zero value row, added to each row's
  // statistics as the prefill kernels add it (online_softmax::add_sink); nullptr without one.
  const float* sink = nullptr;
  // softmax_lse (fp32) of row (b, i, h) at lse + b * lse_sb + (q_off[b] + i) * lse_si + h * lse_sh.
  int64_t lse_sb = 0, lse_si = 0, lse_sh = 0;
};

// Writes the rows of out (and lse when non-null) for every query row within its sequence; rows beyond are left
// as the caller initialised them. All tensors share one floating dtype (fp32, bf16 or fp16).
NPU_FA_DECLARE_ISA_STUB(mla_attention_stub,
                        void (*)(const MlaParams& p, const at::Tensor& q, const at::Tensor& q_rope,
                                 const at::Tensor& key, const at::Tensor& key_rope, const at::Tensor& value,
                                 at::Tensor& out, float* lse));

}  // namespace npu_fa::cpu
