// Shared paged-cache handling of fused_infer_attention_score (paged_params.h).
#include "common/inference/paged_params.h"

#include <algorithm>
#include <string>

#include "common/inference/prefill_params.h"
#include "generated/op_calls.h"

namespace npu_fa::attention {

// The query length of a paged fused call (BSH/BSND: dim 1, BNSD: dim 2), or -1 for shapes the parser rejects.
int64_t paged_query_len(const at::Tensor& q, c10::string_view layout) {
  if (layout == "BNSD") return q.dim() == 4 ? q.size(2) : -1;
  return q.dim() >= 3 ? q.size(1) : -1;
}

// Whether the decode op (which reads the paged cache in place) computes exactly what the prefill path computes on
// the same keys made contiguous: one query token per sequence, no lse, a band hiding none of its keys, a mask in the
// per-batch forms the decode op takes, and no query row beyond its sequence (actual_seq_lengths 0).
bool decode_route_fits(const char* op, const FusedInferAttentionScoreArgs& a) {
  const c10::string_view lay = a.input_layout;
  if (a.softmax_lse_flag || !(lay == "BSH" || lay == "BSND" || lay == "BNSD")) return false;
  if (a.key.sizes() != a.value.sizes()) return false;  // the decode op reads K and V of one head dim
  if (paged_query_len(a.query, lay) != 1) return false;
  const std::optional<at::Tensor>& m = a.atten_mask;
  // The band of query row 0 against keys [0, len): mode 0 with a mask keeps -pre <= j <= next (without one CANN
  // ignores pre/next), 1 is the mask alone, 3 (bottom-right causal) keeps j <= len - 1; 2 and 4 hide keys.
  // (Contiguous caches take this route only when int8: the decode kernels read int8 with integer dot products.)
  int64_t capacity = 0;
  if (a.block_table.has_value())
    capacity = a.block_table->dim() == 2 ? a.block_table->size(1) * a.block_size : 0;
  else if (a.key.dim() >= 3)
    capacity = a.key.size(lay == "BNSD" ? 2 : 1);
  switch (a.sparse_mode) {
    case 0: if (m.has_value() && (a.pre_tokens < 0 || a.next_tokens < capacity - 1)) return false; break;
    case 1: break;
    case 3: if (m.has_value()) return false; break;  // the compressed mask is checked on the prefill route
    default: return false;
  }
  if (a.sparse_mode <= 1 && m.has_value()) {  // the decode op takes (B, S), (B, 1, S), (B, 1, 1, S): no head dim
    bool per_batch = m->dim() >= 2 && m->dim() <= 4;
    for (int64_t d = 1; per_batch && d + 1 < m->dim(); ++d) per_batch = m->size(d) == 1;
    if (!per_batch) return false;
  }
  if (a.actual_seq_lengths.has_value()) {  // a query length of 0 makes a padded (zero) row
    std::vector<int64_t> q_lens;
    attention::read_per_batch_lengths(op, "actual_seq_lengths", *a.actual_seq_lengths, a.query.size(0), 1, q_lens);
    if (std::find(q_lens.begin(), q_lens.end(), 0) != q_lens.end()) return false;
  }
  return true;
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

// A one-token fused call through the decode op (a paged cache, or an int8 contiguous one), through the dispatcher
// (the npu device runs its Ascend C kernel). The decode op takes the call's arguments under its own names.
at::Tensor paged_decode(const char* op, const FusedInferAttentionScoreArgs& a) {
  IncreFlashAttentionValues d;
  d.query = a.query;
  d.key = a.key;
  d.value = a.value;
  d.atten_mask = a.atten_mask;
  d.pse_shift = a.pse_shift;
  d.actual_seq_lengths = a.actual_seq_lengths_kv;  // the decode op's lengths are the KV lengths
  d.block_table = a.block_table;
  d.num_heads = a.num_heads;
  d.scale_value = a.scale;
  d.input_layout = std::string(a.input_layout);
  d.num_key_value_heads = a.num_key_value_heads;
  d.block_size = a.block_size;
  // The decode op's inner_precise has the precision bit only (FIA's 2/3 add a fix for invalid rows, which it has).
  d.inner_precise = a.inner_precise % 2;
  d.antiquant_scale = a.antiquant_scale;
  d.antiquant_offset = a.antiquant_offset;
  d.key_antiquant_scale = a.key_antiquant_scale;
  d.key_antiquant_offset = a.key_antiquant_offset;
  d.value_antiquant_scale = a.value_antiquant_scale;
  d.value_antiquant_offset = a.value_antiquant_offset;
  d.antiquant_mode = a.antiquant_mode;
  d.key_antiquant_mode = a.key_antiquant_mode;
  d.value_antiquant_mode = a.value_antiquant_mode;
  return call_incre_flash_attention(d.args());
}

bool is_int8_kv(const FusedInferAttentionScoreArgs& a) {
  return a.key.scalar_type() == at::kChar || a.value.scalar_type() == at::kChar;
}

CacheRows cache_rows(const char* op, const char* name, const at::Tensor& cache, int64_t block_size, int64_t n2) {
  const at::Tensor c = cache.stride(-1) == 1 ? cache : cache.contiguous();
  if (c.dim() == 3) {
    TORCH_CHECK_VALUE(c.size(1) == block_size && n2 > 0 && c.size(2) % n2 == 0, op, ": a paged '", name, "' cache "
                      "(num_blocks, block_size, N2*D) must have block_size=", block_size, " rows of N2=", n2,
                      " heads; got shape ", c.sizes());
    return {c, n2, c.size(2) / n2, c.stride(0), c.size(2) / n2, c.stride(1)};
  }
  TORCH_CHECK_VALUE(c.dim() == 4 && (c.size(2) == block_size || c.size(1) == block_size), op, ": a paged '", name,
                    "' cache must be (num_blocks, block_size, N2*D), (num_blocks, block_size, N2, D) or (num_blocks, "
                    "N2, block_size, D) with block_size=", block_size, "; got shape ", c.sizes());
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
