// CPU entry points of the inference attention ops: prompt_flash_attention (prefill), fused_infer_attention_score
// (the routes of common/inference/fia_route.h: MLA, decode through incre_flash_attention, paged and dense prefill)
// and attention_update (merging partial results). Prefill reuses the FlashAttention forward kernel
// (cpu/attention/kernels.h) through the shared AttentionParams.
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>

#include "common/inference/decode_params.h"
#include "common/inference/fia_route.h"
#include "common/inference/paged_params.h"
#include "common/inference/prefill_params.h"
#include "cpu/attention/kernels.h"
#include "cpu/attention/tuning.h"
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

// Paged fused call through the prefill kernel, which reads the cache in place (its packing of each KV tile walks
// the block table), so every sparse mode, band, mask, pse_shift, query length and the lse mean what they mean
// without block_table. The parser sees a stand-in key/value of the contiguous shape the call describes (a
// zero-stride view: no copy); the rows are then addressed through the block table. Dense layouts: keys [0, kv_used)
// per sequence, kv_used = the longest actual_seq_lengths_kv entry; TND: each sequence's own keys (cumulative ends).
std::tuple<at::Tensor, at::Tensor> paged_prefill(const char* op, const FusedInferAttentionScoreArgs& a) {
  const attention::PagedPlan pl = attention::plan_paged(op, a);
  const c10::string_view layout = a.input_layout;
  const bool tnd = pl.tnd;
  const int64_t B = pl.batch, bs = pl.block_size, M = pl.max_blocks, n2 = pl.kv_heads, kv_used = pl.kv_used;
  const int64_t total = pl.total;
  const attention::CacheRows &kr = pl.k, &vr = pl.v;
  const std::vector<int64_t>& blocks = pl.blocks;
  auto stand_in = [&](const attention::CacheRows& r) {
    std::vector<int64_t> shape;
    if (tnd) shape = {total, n2, r.dim};
    else if (layout == "BSH") shape = {B, kv_used, n2 * r.dim};
    else if (layout == "BSND") shape = {B, kv_used, n2, r.dim};
    else shape = {B, n2, kv_used, r.dim};
    std::vector<int64_t> strides(shape.size(), 0);
    strides.back() = 1;
    return r.cache.as_strided(shape, strides, r.cache.storage_offset());
  };
  // The call as the parser sees it: the stand-ins, the plan's KV lengths (TND: cumulative ends), mask and pse.
  FusedInferAttentionScoreValues g(a);
  g.key = stand_in(kr);
  g.value = stand_in(vr);
  g.pse_shift = pl.pse;
  g.atten_mask = pl.mask;
  g.actual_seq_lengths_kv = pl.kv_lens;
  auto page = [&](attention::RowMap& m, const attention::CacheRows& r) {
    m.batch_offset.assign(B, 0);
    m.head_stride = r.head_stride;
    m.seq_stride = r.seq_stride;
    m.blocks = blocks;
    m.table_stride = std::max<int64_t>(M, 1);
    m.block_size = bs;
    m.block_stride = r.block_stride;
    m.nz_c0 = r.nz_c0;
    m.piece_stride = r.piece_stride;
  };
  Prefill res = run_prefill(op, a.query, g.key, g.value, g.args(), [&](attention::AttentionParams& p, AttentionInputs& in) {
    page(p.k, kr);
    page(p.v, vr);
    in.key = kr.cache;
    in.value = vr.cache;
  });
  if (!a.softmax_lse_flag) return {res.out, at::empty({0}, a.query.options().dtype(at::kFloat))};
  return {res.out, attention::lse_from_statistics(res.softmax_max, res.softmax_sum)};
}

}  // namespace

at::Tensor prompt_flash_attention_cpu(const PromptFlashAttentionArgs& args) {
  static constexpr const char* op = "prompt_flash_attention";
  attention::check_prompt_flags(op, args);
  return run_prefill(op, args.query, args.key, args.value, args).out;
}

namespace {

std::tuple<at::Tensor, at::Tensor> dense_prefill(const char* op, const FusedInferAttentionScoreArgs& a) {
  Prefill r = run_prefill(op, a.query, a.key, a.value, a);
  if (!a.softmax_lse_flag) return {r.out, at::empty({0}, a.query.options().dtype(at::kFloat))};
  // lse = max + log(sum); rows that saw no key: -inf + log(0) = -inf.
  return {r.out, attention::lse_from_statistics(r.softmax_max, r.softmax_sum)};
}

}  // namespace

std::tuple<at::Tensor, at::Tensor> fused_infer_attention_score_cpu(const FusedInferAttentionScoreArgs& args) {
  static constexpr const char* op = "fused_infer_attention_score";
  const attention::FiaPlan plan = attention::plan_fia(op, args);
  const FusedInferAttentionScoreArgs a = plan.call.args();
  switch (plan.route) {
    case attention::FiaRoute::Mla: return fused_infer_attention_score_mla(op, a);  // cpu/inference/mla.cpp
    case attention::FiaRoute::Decode: return attention::run_decode_route(plan);
    case attention::FiaRoute::PagedPrefill: return paged_prefill(op, a);
    case attention::FiaRoute::DensePrefill: return dense_prefill(op, a);
  }
  TORCH_CHECK(false, op, ": internal error: unknown route");
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
