// CPU entry points of the inference attention ops: prompt_flash_attention (prefill), fused_infer_attention_score
// (prefill here, paged decode forwarded to incre_flash_attention) and attention_update (merging partial results).
// Prefill reuses the FlashAttention forward kernel (cpu/attention/kernels.h) through the shared AttentionParams.
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>

#include "common/attention/tuning.h"
#include "common/inference/decode_params.h"
#include "common/inference/prefill_params.h"
#include "cpu/attention/kernels.h"
#include "cpu/inference/mla.h"
#include "generated/kernels.h"

namespace npu_fa {
namespace {

using namespace npu_fa::cpu;
using attention::AttentionInputs;
using attention::PromptParams;

struct Prefill {
  at::Tensor out, softmax_max, softmax_sum;
};

// Runs the FlashAttention forward for a prefill call. Query rows beyond a sequence's actual length (dense layouts)
// are zeros with max = -inf, sum = 0 (lse = -inf), like rows that see no key.
template <class Args>
Prefill run_prefill(const char* op, const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
                    const Args& a,
                    const std::function<void(attention::AttentionParams&, AttentionInputs&)>& patch = nullptr) {
  AttentionInputs in;
  PromptParams pp = attention::parse_prompt_params(op, query, key, value, a, in);
  if (patch) patch(pp.p, in);
  const auto& p = pp.p;
  ForwardOutputs o;
  const auto stats = attention::stats_shape(p, query);
  const auto f32 = query.options().dtype(at::kFloat);
  if (pp.padded) {
    o.out = at::zeros(pp.out_shape, query.options());
    o.softmax_max = at::full(stats, -std::numeric_limits<float>::infinity(), f32);
    o.softmax_sum = at::zeros(stats, f32);
  } else {
    o.out = at::empty(pp.out_shape, query.options());
    o.softmax_max = at::empty(stats, f32);
    o.softmax_sum = at::empty(stats, f32);
  }
  if (p.batch > 0 && p.q_heads > 0 && p.max_q_len > 0)
    attention::tuning::run_with_tiles(attention::tuning::Family::Prefill, p, in.query.scalar_type(),
                                      in.key.scalar_type(), [&] { attention_forward_stub(p, in, o); });
  return {o.out, o.softmax_max, o.softmax_sum};
}

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
// (the npu device runs its Ascend C kernel).
at::Tensor paged_decode(const char* op, const FusedInferAttentionScoreArgs& a) {
  auto handle = c10::Dispatcher::singleton().findOp(c10::OperatorName("npu_fa::incre_flash_attention", ""));
  TORCH_CHECK_VALUE(handle.has_value() && handle->hasSchema(), op, ": block_table (paged KV) needs the decode op "
                    "npu_fa::incre_flash_attention, which this build does not have");
  using Sig = at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&,
                         const std::optional<at::Tensor>&, const std::optional<at::Tensor>&,
                         const std::optional<at::Tensor>&, const std::optional<at::Tensor>&, int64_t, double,
                         c10::string_view, int64_t, int64_t, int64_t, const std::optional<at::Tensor>&,
                         const std::optional<at::Tensor>&, const std::optional<at::Tensor>&,
                         const std::optional<at::Tensor>&, const std::optional<at::Tensor>&,
                         const std::optional<at::Tensor>&, int64_t, int64_t, int64_t,
                         const std::optional<at::Tensor>&);
  // The decode op's inner_precise has the precision bit only (FIA's 2/3 add a fix for invalid rows, which it has).
  return handle->typed<Sig>().call(a.query, a.key, a.value, a.atten_mask, a.pse_shift, a.actual_seq_lengths_kv,
                                   a.block_table, std::nullopt, a.num_heads, a.scale, a.input_layout,
                                   a.num_key_value_heads, a.block_size, a.inner_precise % 2, a.antiquant_scale,
                                   a.antiquant_offset, a.key_antiquant_scale, a.key_antiquant_offset,
                                   a.value_antiquant_scale, a.value_antiquant_offset, a.antiquant_mode,
                                   a.key_antiquant_mode, a.value_antiquant_mode, std::nullopt);
}

bool is_int8_kv(const FusedInferAttentionScoreArgs& a) {
  return a.key.scalar_type() == at::kChar || a.value.scalar_type() == at::kChar;
}

// How a paged cache's rows lie: (num_blocks, block_size, N2*D), (num_blocks, block_size, N2, D) or head-major
// (num_blocks, N2, block_size, D) (a 4-D cache whose dim 2 is block_size).
struct CacheRows {
  at::Tensor cache;  // with a contiguous head dim
  int64_t heads, dim, block_stride, head_stride, seq_stride;
};

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

// Paged fused call through the prefill kernel, which reads the cache in place (its packing of each KV tile walks
// the block table), so every sparse mode, band, mask, pse_shift, query length and the lse mean what they mean
// without block_table. The parser sees a stand-in key/value of the contiguous shape the call describes (a
// zero-stride view: no copy); the rows are then addressed through the block table. Dense layouts: keys [0, kv_used)
// per sequence, kv_used = the longest actual_seq_lengths_kv entry; TND: each sequence's own keys (cumulative ends).
std::tuple<at::Tensor, at::Tensor> paged_prefill(const char* op, const FusedInferAttentionScoreArgs& a) {
  const c10::string_view layout = a.input_layout;
  const bool tnd = layout == "TND";
  TORCH_CHECK_VALUE(tnd || layout == "BSH" || layout == "BSND" || layout == "BNSD", op, ": with block_table, "
                    "input_layout must be BSH, BSND, BNSD or TND; got '", std::string(layout.data(), layout.size()), "'");
  TORCH_CHECK_VALUE(a.actual_seq_lengths_kv.has_value(), op, ": argument 'actual_seq_lengths_kv' is required with "
                    "block_table");
  const int64_t bs = a.block_size;
  TORCH_CHECK_VALUE(bs > 0, op, ": argument 'block_size' must be positive with block_table; got ", bs);
  const at::Tensor& block_table = *a.block_table;
  TORCH_CHECK_TYPE(block_table.scalar_type() == at::kInt || block_table.scalar_type() == at::kLong, op,
                   ": argument 'block_table' must be int32 or int64; got ", block_table.scalar_type());
  TORCH_CHECK_VALUE(block_table.dim() == 2, op, ": argument 'block_table' must be [B, max_blocks_per_seq]; got ",
                    block_table.sizes());
  const int64_t B = tnd ? block_table.size(0) : a.query.size(0);
  TORCH_CHECK_VALUE(block_table.size(0) == B, op, ": argument 'block_table' must be [B=", B,
                    ", max_blocks_per_seq]; got ", block_table.sizes());
  TORCH_CHECK_VALUE(a.key.dim() >= 3 && a.value.dim() >= 3, op, ": with block_table, 'key' and 'value' must be paged "
                    "caches; got shapes ", a.key.sizes(), " and ", a.value.sizes());
  const int64_t n2 = a.num_key_value_heads > 0 ? a.num_key_value_heads : a.num_heads;
  const CacheRows kr = cache_rows(op, "key", a.key, bs, n2), vr = cache_rows(op, "value", a.value, bs, n2);
  TORCH_CHECK_VALUE(kr.heads == n2 && vr.heads == n2 && a.key.size(0) == a.value.size(0), op, ": the paged key ",
                    a.key.sizes(), " and value ", a.value.sizes(), " caches must share num_blocks and hold N2=", n2,
                    " heads (num_key_value_heads)");
  std::vector<int64_t> lens;
  attention::read_per_batch_lengths(op, "actual_seq_lengths_kv", *a.actual_seq_lengths_kv, B,
                                    block_table.size(1) * bs, lens);
  const int64_t kv_used = lens.empty() ? 0 : *std::max_element(lens.begin(), lens.end());
  // The table with the blocks no key reads set to 0 (a padded table may hold anything there).
  const int64_t M = block_table.size(1), num_blocks = a.key.size(0);
  const at::Tensor bt = block_table.to(at::kCPU, at::kLong).contiguous();
  const int64_t* btp = bt.const_data_ptr<int64_t>();
  std::vector<int64_t> blocks(B * std::max<int64_t>(M, 1), 0);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i * bs < lens[b]; ++i) {
      const int64_t blk = btp[b * M + i];
      TORCH_CHECK_VALUE(blk >= 0 && blk < num_blocks, op, ": argument 'block_table'[", b, "][", i, "] = ", blk,
                        " is out of range [0, ", num_blocks, ")");
      blocks[b * M + i] = blk;
    }
  int64_t total = 0;
  for (int64_t b = 0; b < B; ++b) total += lens[b];
  auto stand_in = [&](const CacheRows& r) {
    std::vector<int64_t> shape;
    if (tnd) shape = {total, n2, r.dim};
    else if (layout == "BSH") shape = {B, kv_used, n2 * r.dim};
    else if (layout == "BSND") shape = {B, kv_used, n2, r.dim};
    else shape = {B, n2, kv_used, r.dim};
    std::vector<int64_t> strides(shape.size(), 0);
    strides.back() = 1;
    return r.cache.as_strided(shape, strides, r.cache.storage_offset());
  };
  const at::Tensor k = stand_in(kr), v = stand_in(vr);
  std::optional<at::Tensor> kv_lens = a.actual_seq_lengths_kv, mask = a.atten_mask, pse = a.pse_shift;
  if (tnd) {  // the parser takes cumulative KV ends for TND
    std::vector<int64_t> ends(B);
    int64_t e = 0;
    for (int64_t b = 0; b < B; ++b) ends[b] = e += lens[b];
    kv_lens = at::tensor(ends, at::kLong);
  } else {
    const bool one_token = paged_query_len(a.query, a.input_layout) == 1;
    if (mask.has_value() && a.sparse_mode <= 1) mask = fit_to_keys(op, "atten_mask", *mask, kv_used, one_token);
    if (pse.has_value()) pse = fit_to_keys(op, "pse_shift", *pse, kv_used, false);
  }
  const FusedInferAttentionScoreArgs g{a.query, k, v, pse, mask, a.actual_seq_lengths, kv_lens,
                                       a.block_table, a.num_heads, a.scale, a.pre_tokens, a.next_tokens,
                                       a.input_layout, a.num_key_value_heads, a.sparse_mode, a.inner_precise,
                                       a.block_size, a.softmax_lse_flag, a.antiquant_scale, a.antiquant_offset,
                                       a.key_antiquant_scale, a.key_antiquant_offset, a.value_antiquant_scale,
                                       a.value_antiquant_offset, a.antiquant_mode, a.key_antiquant_mode,
                                       a.value_antiquant_mode, a.query_rope, a.key_rope};
  auto page = [&](attention::RowMap& m, const CacheRows& r) {
    m.batch_offset.assign(B, 0);
    m.head_stride = r.head_stride;
    m.seq_stride = r.seq_stride;
    m.blocks = blocks;
    m.table_stride = std::max<int64_t>(M, 1);
    m.block_size = bs;
    m.block_stride = r.block_stride;
  };
  Prefill res = run_prefill(op, a.query, k, v, g, [&](attention::AttentionParams& p, AttentionInputs& in) {
    page(p.k, kr);
    page(p.v, vr);
    in.key = kr.cache;
    in.value = vr.cache;
  });
  if (!a.softmax_lse_flag) return {res.out, at::empty({0}, a.query.options().dtype(at::kFloat))};
  return {res.out, at::log(res.softmax_sum.narrow(-1, 0, 1)).add_(res.softmax_max.narrow(-1, 0, 1))};
}

}  // namespace

at::Tensor prompt_flash_attention_cpu(const PromptFlashAttentionArgs& args) {
  static constexpr const char* op = "prompt_flash_attention";
  attention::check_prompt_flags(op, args);
  return run_prefill(op, args.query, args.key, args.value, args).out;
}

std::tuple<at::Tensor, at::Tensor> fused_infer_attention_score_cpu(const FusedInferAttentionScoreArgs& args) {
  static constexpr const char* op = "fused_infer_attention_score";
  attention::check_prompt_flags(op, args);
  // MLA: scores gain query_rope·key_ropeᵀ (cpu/inference/mla.cpp).
  if (args.query_rope.has_value() || args.key_rope.has_value()) return fused_infer_attention_score_mla(op, args);
  const bool int8 = is_int8_kv(args);
  if (!int8)  // antiquant arguments without an int8 cache are an error; modes are range-checked
    attention::parse_kv_antiquant(op, attention::AntiquantArgs::of(args), false, 0, 0, 0, 0);
  if (args.block_table.has_value()) {
    // Paged KV cache: the decode op where it computes the same thing, else the prefill path on gathered keys.
    if (decode_route_fits(op, args)) return {paged_decode(op, args), at::empty({0}, args.query.options().dtype(at::kFloat))};
    return paged_prefill(op, args);
  }
  TORCH_CHECK_VALUE(args.block_size == 0, op, ": argument 'block_size' is only used with block_table (paged KV); got ",
                    args.block_size);
  // An int8 cache: one-token calls take the decode op's int8 kernels; the prefill kernel dequantises tile by tile.
  if (int8 && decode_route_fits(op, args))
    return {paged_decode(op, args), at::empty({0}, args.query.options().dtype(at::kFloat))};
  Prefill r = run_prefill(op, args.query, args.key, args.value, args);
  if (!args.softmax_lse_flag) return {r.out, at::empty({0}, args.query.options().dtype(at::kFloat))};
  // lse = max + log(sum); rows that saw no key: -inf + log(0) = -inf.
  at::Tensor lse = at::log(r.softmax_sum.narrow(-1, 0, 1)).add_(r.softmax_max.narrow(-1, 0, 1));
  return {r.out, lse};
}

// ---- attention_update: merging partial attention results over disjoint key ranges. ----
namespace {

void check_update_inputs(const char* op, const at::Tensor& lse, const at::Tensor& out) {
  TORCH_CHECK_TYPE(lse.scalar_type() == at::kFloat || lse.scalar_type() == at::kDouble, op,
                   ": argument 'lse' must be float32 (or float64); got ", lse.scalar_type());
  const auto dt = out.scalar_type();
  TORCH_CHECK_TYPE(dt == at::kFloat || dt == at::kHalf || dt == at::kBFloat16 || dt == at::kDouble, op,
                   ": argument 'out' must be float32, float16, bfloat16 or float64; got ", dt);
  TORCH_CHECK_VALUE(lse.dim() >= 1 && lse.size(0) >= 1, op, ": argument 'lse' must be [K, ...] with K >= 1 partial "
                    "results; got shape ", lse.sizes());
  // lse is [K, ...] or, as fused_infer_attention_score returns it, [K, ..., 1].
  const bool plain = out.dim() == lse.dim() + 1 && out.sizes().slice(0, lse.dim()) == lse.sizes();
  const bool keepdim = out.dim() == lse.dim() && lse.size(-1) == 1 &&
                       out.sizes().slice(0, lse.dim() - 1) == lse.sizes().slice(0, lse.dim() - 1);
  TORCH_CHECK_VALUE(plain || keepdim, op, ": argument 'out' must have shape [*lse.shape, D] (or lse may carry a "
                    "trailing 1: [K, ..., 1] with out [K, ..., D]); got lse ", lse.sizes(), " and out ", out.sizes());
  TORCH_CHECK_VALUE(lse.device() == out.device(), op, ": arguments 'lse' and 'out' must be on one device");
}

template <typename scalar_t, typename lse_t>
void update_kernel(const lse_t* lse, const scalar_t* out, int64_t K, int64_t R, int64_t D, scalar_t* res,
                   lse_t* res_lse) {
  using acc_t = std::conditional_t<std::is_same_v<lse_t, double> || std::is_same_v<scalar_t, double>, double, float>;
  const acc_t ninf = -std::numeric_limits<acc_t>::infinity();
  at::parallel_for(0, R, std::max<int64_t>(1, 4096 / std::max<int64_t>(D * K, 1)), [&](int64_t r0, int64_t r1) {
    std::vector<acc_t> acc(D);
    for (int64_t r = r0; r < r1; ++r) {
      acc_t m = ninf;
      for (int64_t k = 0; k < K; ++k) {  // a NaN part (a NaN attention row) makes the merged row NaN
        const acc_t li = lse[k * R + r];
        m = (m < li || li != li) ? li : m;
      }
      scalar_t* o = res + r * D;
      if (m == ninf) {  // every partial result is empty
        std::fill_n(o, D, scalar_t(0));
        res_lse[r] = ninf;
        continue;
      }
      acc_t s = 0;
      for (int64_t k = 0; k < K; ++k) s += std::exp(acc_t(lse[k * R + r]) - m);
      const acc_t L = m + std::log(s);
      std::fill(acc.begin(), acc.end(), acc_t(0));
      for (int64_t k = 0; k < K; ++k) {
        const acc_t li = lse[k * R + r];
        if (li == ninf) continue;  // exact zero weight
        const acc_t w = std::exp(li - L);
        const scalar_t* src = out + (k * R + r) * D;
        for (int64_t d = 0; d < D; ++d) acc[d] += w * acc_t(src[d]);
      }
      for (int64_t d = 0; d < D; ++d) o[d] = static_cast<scalar_t>(acc[d]);
      res_lse[r] = static_cast<lse_t>(L);
    }
  });
}

template <typename scalar_t, typename lse_t>
void update_grad_kernel(const lse_t* lse, const scalar_t* out, const lse_t* L, const scalar_t* merged,
                        const scalar_t* g, const lse_t* gl, int64_t K, int64_t R, int64_t D, lse_t* dlse,
                        scalar_t* dout) {
  using acc_t = std::conditional_t<std::is_same_v<lse_t, double> || std::is_same_v<scalar_t, double>, double, float>;
  const acc_t ninf = -std::numeric_limits<acc_t>::infinity();
  at::parallel_for(0, R, std::max<int64_t>(1, 4096 / std::max<int64_t>(D * K, 1)), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const scalar_t* gr = g + r * D;
      acc_t og = 0;  // merged·g
      for (int64_t d = 0; d < D; ++d) og += acc_t(merged[r * D + d]) * acc_t(gr[d]);
      const acc_t Lr = L[r];
      for (int64_t k = 0; k < K; ++k) {
        const acc_t li = lse[k * R + r];
        const acc_t w = (li == ninf || Lr == ninf) ? acc_t(0) : std::exp(li - Lr);
        const scalar_t* src = out + (k * R + r) * D;
        scalar_t* dst = dout + (k * R + r) * D;
        acc_t dot = 0;
        for (int64_t d = 0; d < D; ++d) {
          dot += acc_t(src[d]) * acc_t(gr[d]);
          dst[d] = static_cast<scalar_t>(w * acc_t(gr[d]));
        }
        dlse[k * R + r] = static_cast<lse_t>(w == 0 ? acc_t(0) : w * (acc_t(gl[r]) + dot - og));
      }
    }
  });
}

}  // namespace

std::tuple<at::Tensor, at::Tensor> attention_update_cpu(const AttentionUpdateArgs& args) {
  static constexpr const char* op = "attention_update";
  check_update_inputs(op, args.lse, args.out);
  const int64_t K = args.lse.size(0), R = args.lse[0].numel(), D = args.out.size(-1);
  const at::Tensor l = args.lse.contiguous(), o = args.out.contiguous();
  at::Tensor res = at::empty(args.out.sizes().slice(1), args.out.options());
  at::Tensor res_lse = at::empty(args.lse.sizes().slice(1), args.lse.options());
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, args.out.scalar_type(), op, [&] {
    using out_t = scalar_t;
    AT_DISPATCH_FLOATING_TYPES(args.lse.scalar_type(), op, [&] {
      update_kernel<out_t, scalar_t>(l.const_data_ptr<scalar_t>(), o.const_data_ptr<out_t>(), K, R, D,
                                     res.data_ptr<out_t>(), res_lse.data_ptr<scalar_t>());
    });
  });
  return {res, res_lse};
}

std::tuple<at::Tensor, at::Tensor> attention_update_grad_cpu(const AttentionUpdateGradArgs& args) {
  static constexpr const char* op = "attention_update_grad";
  check_update_inputs(op, args.lse, args.out);
  const auto rows = args.lse.sizes().slice(1);
  const auto outs = args.out.sizes().slice(1);
  TORCH_CHECK_VALUE(args.softmax_lse.sizes() == rows && args.grad_softmax_lse.sizes() == rows, op,
                    ": arguments 'softmax_lse' and 'grad_softmax_lse' must have shape ", rows, "; got ",
                    args.softmax_lse.sizes(), " and ", args.grad_softmax_lse.sizes());
  TORCH_CHECK_VALUE(args.attention_out.sizes() == outs && args.grad_attention_out.sizes() == outs, op,
                    ": arguments 'attention_out' and 'grad_attention_out' must have shape ", outs, "; got ",
                    args.attention_out.sizes(), " and ", args.grad_attention_out.sizes());
  TORCH_CHECK_TYPE(args.softmax_lse.scalar_type() == args.lse.scalar_type() && args.grad_softmax_lse.scalar_type() == args.lse.scalar_type() &&
                       args.attention_out.scalar_type() == args.out.scalar_type() &&
                       args.grad_attention_out.scalar_type() == args.out.scalar_type(),
                   op, ": the lse arguments must share lse's dtype and the output arguments out's dtype");
  const int64_t K = args.lse.size(0), R = args.lse[0].numel(), D = args.out.size(-1);
  const at::Tensor l = args.lse.contiguous(), o = args.out.contiguous(), L = args.softmax_lse.contiguous(),
                   m = args.attention_out.contiguous(), g = args.grad_attention_out.contiguous(), gl = args.grad_softmax_lse.contiguous();
  at::Tensor dlse = at::empty(args.lse.sizes(), args.lse.options());
  at::Tensor dout = at::empty(args.out.sizes(), args.out.options());
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, args.out.scalar_type(), op, [&] {
    using out_t = scalar_t;
    AT_DISPATCH_FLOATING_TYPES(args.lse.scalar_type(), op, [&] {
      update_grad_kernel<out_t, scalar_t>(l.const_data_ptr<scalar_t>(), o.const_data_ptr<out_t>(),
                                          L.const_data_ptr<scalar_t>(), m.const_data_ptr<out_t>(),
                                          g.const_data_ptr<out_t>(), gl.const_data_ptr<scalar_t>(), K, R, D,
                                          dlse.data_ptr<scalar_t>(), dout.data_ptr<out_t>());
    });
  });
  return {dlse, dout};
}

}  // namespace npu_fa
