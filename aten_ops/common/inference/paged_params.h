// The paged KV cache of fused_infer_attention_score, shared by the CPU kernels (cpu/inference/prefill.cpp) and the
// npu kernels (npu/inference/inference.cpp) so both validate it with the same messages: the cache's row forms, the
// blocks each sequence's keys use, and the arguments the prefill parser takes for them. Which calls take the paged
// prefill path is decided in fia_route.cpp.
#pragma once

#include <ATen/ATen.h>

#include <optional>
#include <vector>

#include "generated/op_args.h"

namespace npu_fa::attention {

// The query length of a paged fused call (BSH/BSND: dim 1, BNSD: dim 2), or -1 for shapes the parser rejects.
int64_t paged_query_len(const at::Tensor& q, c10::string_view layout);

bool is_int8_kv(const FusedInferAttentionScoreArgs& a);

// A mask or pse_shift of a paged call cut to the gathered keys (its last dim must cover the longest sequence).
at::Tensor fit_to_keys(const char* op, const char* arg, at::Tensor t, int64_t kv_used, bool one_token);

// How a paged cache's rows lie: (num_blocks, block_size, N2*D), (num_blocks, block_size, N2, D), head-major
// (num_blocks, N2, block_size, D) (a 4-D cache whose dim 2 is block_size) or NZ (5-D).
// An NZ cache (num_blocks, N2, D / c0, block_size, c0) has its head dim in pieces: nz_c0 > 0 (piece_stride apart).
struct CacheRows {
  at::Tensor cache;  // with a contiguous head dim (NZ: contiguous pieces)
  int64_t heads, dim, block_stride, head_stride, seq_stride;
  int64_t nz_c0 = 0, piece_stride = 0;
};
CacheRows cache_rows(const char* op, const char* name, const at::Tensor& cache, int64_t block_size, int64_t n2);

// A validated paged call: the layout, lengths and the blocks its keys use (blocks no key reads set to 0), the caches'
// row forms, and the arguments the prefill parser then takes (KV lengths as cumulative ends for TND; mask and
// pse_shift cut to kv_used keys for the dense layouts).
struct PagedPlan {
  bool tnd = false;
  int64_t batch = 0, block_size = 0, max_blocks = 0, kv_heads = 0, kv_used = 0, total = 0;
  std::vector<int64_t> lens;    // keys per sequence
  std::vector<int64_t> blocks;  // [batch, max(max_blocks, 1)]
  CacheRows k, v;
  std::optional<at::Tensor> kv_lens, mask, pse;
};
PagedPlan plan_paged(const char* op, const FusedInferAttentionScoreArgs& a);

}  // namespace npu_fa::attention
