// Shared paged-cache handling of fused_infer_attention_score (paged_params.h).
#include "common/inference/paged_params.h"

#include <algorithm>
#include <string>

#include "common/inference/nz_cache.h"
#include "common/inference/prefill_params.h"

namespace npu_fa::attention {

// The query length of a paged fused call (BSH/BSND: dim 1, BNSD: dim 2), or -1 for shapes the parser rejects.
int64_t paged_query_len(const at::Tensor& q, c10::string_view layout) {
  if (layout == "BNSD") return q.dim() == 4 ? q.size(2) : -1;
  return q.dim() >= 3 ? q.size(1) : -1;
}

// A mask or pse_shift of a paged call, indexed by key position: a paged cache has no padded length, so (as in the
// decode op) the last dim must cover the longest sequence, and it is cut to the gathered keys. A 2-D mask of a
// one-token query is the decode op's per-batch (B, S) form.
at::Tensor fit_to_keys(const char* op, const char* arg, at::Tensor t, int64_t kv_used, bool one_token) {
  if (one_token && t.dim() == 2) t = t.reshape({t.size(0), 1, 1, t.size(1)});
  TORCH_CHECK_VALUE(t.dim() >= 2 && t.size(-1) >= kv_used, op, ": argument '", arg, "' with block_table must cover "
                    "the longest sequence in its last dim (>= max(actual_seq_lengths_kv) = ", kv_used, "); got shape ",
                    t.sizes());
  return t.narrow(-1, 0, kv_used);
}

bool is_int8_kv(const FusedInferAttentionScoreArgs& a) {
  return a.key.scalar_type() == at::kChar || a.value.scalar_type() == at::kChar;
}

CacheRows cache_rows(const char* op, const char* name, const at::Tensor& cache, int64_t block_size, int64_t n2) {
  const at::Tensor c = cache.stride(-1) == 1 ? cache : cache.contiguous();
  if (is_nz_cache(c)) {
    const NzStrides s = nz_strides(op, name, c, n2, c.size(2) * c.size(4), block_size);
    return {c, n2, c.size(2) * c.size(4), s.blk, s.head, s.seq, s.c0, s.piece};
  }
  if (c.dim() == 3) {
    TORCH_CHECK_VALUE(c.size(1) == block_size && n2 > 0 && c.size(2) % n2 == 0, op, ": a paged '", name, "' cache "
                      "(num_blocks, block_size, N2*D) must have block_size=", block_size, " rows of N2=", n2,
                      " heads; got shape ", c.sizes());
    return {c, n2, c.size(2) / n2, c.stride(0), c.size(2) / n2, c.stride(1)};
  }
  TORCH_CHECK_VALUE(c.dim() == 4 && (c.size(2) == block_size || c.size(1) == block_size), op, ": a paged '", name,
                    "' cache must be (num_blocks, block_size, N2*D), (num_blocks, block_size, N2, D), (num_blocks, "
                    "N2, block_size, D) or NZ (num_blocks, N2, D/c0, block_size, c0) with block_size=", block_size, "; got shape ", c.sizes());
  if (c.size(2) == block_size) return {c, c.size(1), c.size(3), c.stride(0), c.stride(1), c.stride(2)};
  return {c, c.size(2), c.size(3), c.stride(0), c.stride(2), c.stride(1)};
}

PagedPlan plan_paged(const char* op, const FusedInferAttentionScoreArgs& a) {
  const c10::string_view layout = a.input_layout;
  PagedPlan pl;
  const bool tnd = pl.tnd = layout == "TND";
  TORCH_CHECK_VALUE(tnd || layout == "BSH" || layout == "BSND" || layout == "BNSD", op, ": with block_table, "
                    "input_layout must be BSH, BSND, BNSD or TND; got '", std::string(layout.data(), layout.size()), "'");
  TORCH_CHECK_VALUE(a.actual_seq_lengths_kv.has_value(), op, ": argument 'actual_seq_lengths_kv' is required with "
                    "block_table");
  const int64_t bs = pl.block_size = a.block_size;
  TORCH_CHECK_VALUE(bs > 0, op, ": argument 'block_size' must be positive with block_table; got ", bs);
  const at::Tensor& block_table = *a.block_table;
  TORCH_CHECK_TYPE(block_table.scalar_type() == at::kInt || block_table.scalar_type() == at::kLong, op,
                   ": argument 'block_table' must be int32 or int64; got ", block_table.scalar_type());
  TORCH_CHECK_VALUE(block_table.dim() == 2, op, ": argument 'block_table' must be [B, max_blocks_per_seq]; got ",
                    block_table.sizes());
  const int64_t B = pl.batch = tnd ? block_table.size(0) : a.query.size(0);
  TORCH_CHECK_VALUE(block_table.size(0) == B, op, ": argument 'block_table' must be [B=", B,
                    ", max_blocks_per_seq]; got ", block_table.sizes());
  TORCH_CHECK_VALUE(a.key.dim() >= 3 && a.value.dim() >= 3, op, ": with block_table, 'key' and 'value' must be paged "
                    "caches; got shapes ", a.key.sizes(), " and ", a.value.sizes());
  const int64_t n2 = pl.kv_heads = a.num_key_value_heads > 0 ? a.num_key_value_heads : a.num_heads;
  const CacheRows kr = pl.k = cache_rows(op, "key", a.key, bs, n2);
  const CacheRows vr = pl.v = cache_rows(op, "value", a.value, bs, n2);
  TORCH_CHECK_VALUE(kr.heads == n2 && vr.heads == n2 && a.key.size(0) == a.value.size(0), op, ": the paged key ",
                    a.key.sizes(), " and value ", a.value.sizes(), " caches must share num_blocks and hold N2=", n2,
                    " heads (num_key_value_heads)");
  std::vector<int64_t>& lens = pl.lens;
  attention::read_per_batch_lengths(op, "actual_seq_lengths_kv", *a.actual_seq_lengths_kv, B,
                                    block_table.size(1) * bs, lens);
  const int64_t kv_used = pl.kv_used = lens.empty() ? 0 : *std::max_element(lens.begin(), lens.end());
  // The table with the blocks no key reads set to 0 (a padded table may hold anything there).
  const int64_t M = pl.max_blocks = block_table.size(1), num_blocks = a.key.size(0);
  const at::Tensor bt = block_table.to(at::kCPU, at::kLong).contiguous();
  const int64_t* btp = bt.const_data_ptr<int64_t>();
  std::vector<int64_t>& blocks = pl.blocks;
  blocks.assign(B * std::max<int64_t>(M, 1), 0);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i * bs < lens[b]; ++i) {
      const int64_t blk = btp[b * M + i];
      TORCH_CHECK_VALUE(blk >= 0 && blk < num_blocks, op, ": argument 'block_table'[", b, "][", i, "] = ", blk,
                        " is out of range [0, ", num_blocks, ")");
      blocks[b * M + i] = blk;
    }
  for (int64_t b = 0; b < B; ++b) pl.total += lens[b];
  pl.kv_lens = a.actual_seq_lengths_kv;
  pl.mask = a.atten_mask;
  pl.pse = a.pse_shift;
  if (tnd) {  // the parser takes cumulative KV ends for TND
    std::vector<int64_t> ends(B);
    int64_t e = 0;
    for (int64_t b = 0; b < B; ++b) ends[b] = e += lens[b];
    pl.kv_lens = at::tensor(ends, at::kLong);
  } else {
    const bool one_token = paged_query_len(a.query, a.input_layout) == 1;
    if (pl.mask.has_value() && a.sparse_mode <= 1) pl.mask = fit_to_keys(op, "atten_mask", *pl.mask, kv_used, one_token);
    if (pl.pse.has_value()) pl.pse = fit_to_keys(op, "pse_shift", *pl.pse, kv_used, false);
  }
  return pl;
}

}  // namespace npu_fa::attention
