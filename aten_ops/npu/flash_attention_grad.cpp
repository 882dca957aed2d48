// flash_attention_score_grad on the npu (PrivateUse1) device: validates like the CPU op, brings q/k/v/dy/attention_in
// into BNSD-contiguous copies, fills the tiling and launches the Ascend C kernel
// ascendc/kernels/flash_attention/flash_attention_score_grad_kernel.cpp.
//
// Kernel path: dense layouts (BSH, SBH, BSND, BNSD), no pse, keep_prob = 1, any sparse_mode 0-4 (its band) with or
// without an element-wise bool/uint8 mask. Everything else (pse, dropout, TND, empty problems) runs the CPU kernel on
// CPU aliases of the npu tensors — on the simulated device only (docs/ascendc_flash_attention_grad.md).
#include <ATen/ATen.h>

#include "common/attention_params.h"
#include "flash_attention/flash_attention_score_grad_tiling.h"
#include "generated/kernels.h"
#include "npu/ascendc_launch.h"

extern "C" __global__ __aicore__ void flash_attention_score_grad(GM_ADDR query, GM_ADDR key, GM_ADDR value, GM_ADDR dy,
                                                                 GM_ADDR atten_mask, GM_ADDR softmax_max,
                                                                 GM_ADDR softmax_sum, GM_ADDR attention_in,
                                                                 GM_ADDR dq, GM_ADDR dk, GM_ADDR dv,
                                                                 GM_ADDR workspace, GM_ADDR tiling);

namespace npu_fa {
namespace {

using attention::AttentionInputs;
using attention::AttentionParams;
using attention::Layout;

constexpr const char* kOp = "flash_attention_score_grad";

// The CPU op's checks beyond parse_attention_params (same messages as aten_ops/cpu/flash_attention/ops.cpp).
void check_grad_tensors(const AttentionParams& p, const at::Tensor& query, const at::Tensor& dy,
                        const at::Tensor& softmax_max, const at::Tensor& softmax_sum, const at::Tensor& attention_in) {
  const auto out_shape = attention::output_shape(p, query);
  const auto stats_shape = attention::stats_shape(p, query);
  attention::check_shape(kOp, "dy", dy, out_shape);
  attention::check_shape(kOp, "attention_in", attention_in, out_shape);
  attention::check_shape(kOp, "softmax_max", softmax_max, stats_shape);
  attention::check_shape(kOp, "softmax_sum", softmax_sum, stats_shape);
  TORCH_CHECK_TYPE(dy.scalar_type() == query.scalar_type() && attention_in.scalar_type() == query.scalar_type(), kOp,
                   ": arguments 'dy' and 'attention_in' must have query's dtype ", query.scalar_type(), "; got ",
                   dy.scalar_type(), " and ", attention_in.scalar_type());
  TORCH_CHECK_TYPE(softmax_max.scalar_type() == at::kFloat && softmax_sum.scalar_type() == at::kFloat, kOp,
                   ": arguments 'softmax_max' and 'softmax_sum' must be float32; got ", softmax_max.scalar_type(),
                   " and ", softmax_sum.scalar_type());
}

// [B, N, S, D] contiguous copy of a q- or kv-like tensor of a dense layout.
at::Tensor to_bnsd(const at::Tensor& t, Layout layout, int64_t b, int64_t n, int64_t s, int64_t d) {
  switch (layout) {
    case Layout::BNSD: return t.contiguous();
    case Layout::BSND: return t.permute({0, 2, 1, 3}).contiguous();
    case Layout::BSH: return t.reshape({b, s, n, d}).permute({0, 2, 1, 3}).contiguous();
    default: return t.reshape({s, b, n, d}).permute({1, 2, 0, 3}).contiguous();  // SBH
  }
}

// Inverse of to_bnsd: a [B, N, S, D] result in the caller's layout (contiguous, like the CPU op's outputs).
at::Tensor from_bnsd(const at::Tensor& t, Layout layout) {
  const int64_t b = t.size(0), n = t.size(1), s = t.size(2), d = t.size(3);
  switch (layout) {
    case Layout::BNSD: return t;
    case Layout::BSND: return t.permute({0, 2, 1, 3}).contiguous();
    case Layout::BSH: return t.permute({0, 2, 1, 3}).reshape({b, s, n * d});
    default: return t.permute({2, 0, 1, 3}).reshape({s, b, n * d});  // SBH
  }
}

tot_ascendc::FagDtype kernel_dtype(at::ScalarType t) {
  if (t == at::kFloat) return tot_ascendc::FagDtype::FP32;
  return t == at::kHalf ? tot_ascendc::FagDtype::FP16 : tot_ascendc::FagDtype::BF16;
}

bool kernel_supports(const AttentionParams& p, const at::Tensor& query, const at::Tensor& key) {
  return !p.pse.has_value() && !p.has_dropout() && p.layout != Layout::TND && query.numel() > 0 && key.numel() > 0;
}

}  // namespace

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> flash_attention_score_grad_npu(
    const at::Tensor& query, const at::Tensor& key, const at::Tensor& value, const at::Tensor& dy, int64_t head_num,
    c10::string_view input_layout, const std::optional<at::Tensor>& pse, const std::optional<at::Tensor>& atten_mask,
    const at::Tensor& softmax_max, const at::Tensor& softmax_sum, const at::Tensor& attention_in,
    const std::optional<at::Tensor>& actual_seq_qlen, const std::optional<at::Tensor>& actual_seq_kvlen, double scale,
    double keep_prob, int64_t pre_tokens, int64_t next_tokens, int64_t inner_precise, int64_t sparse_mode,
    int64_t pse_type, const std::optional<at::Tensor>& seed, const std::optional<at::Tensor>& offset) {
  TORCH_CHECK_VALUE(keep_prob >= 1.0 || seed.has_value(), kOp, ": argument 'seed' is required when keep_prob < 1 (pass "
                    "the seed_out/offset_out of the forward so the same dropout mask is regenerated)");
  AttentionInputs in;
  const AttentionParams p = attention::parse_attention_params(
      kOp, query, key, value, head_num, input_layout, pse, atten_mask, actual_seq_qlen, actual_seq_kvlen, scale,
      keep_prob, pre_tokens, next_tokens, inner_precise, sparse_mode, pse_type, seed, offset, in);
  check_grad_tensors(p, query, dy, softmax_max, softmax_sum, attention_in);

  if (!kernel_supports(p, query, key)) {
#ifndef TOT_WITH_CANN
    // Simulated device: the CPU kernel on CPU copies, results moved back to the npu.
    auto cpu = [](const at::Tensor& t) { return t.cpu(); };
    auto cpu_opt = [](const std::optional<at::Tensor>& t) -> std::optional<at::Tensor> {
      return t.has_value() ? std::optional<at::Tensor>(t->cpu()) : std::nullopt;
    };
    auto [dq, dk, dv, dpse] = flash_attention_score_grad_cpu(
        cpu(query), cpu(key), cpu(value), cpu(dy), head_num, input_layout, cpu_opt(pse), cpu_opt(atten_mask),
        cpu(softmax_max), cpu(softmax_sum), cpu(attention_in), cpu_opt(actual_seq_qlen), cpu_opt(actual_seq_kvlen),
        scale, keep_prob, pre_tokens, next_tokens, inner_precise, sparse_mode, pse_type, cpu_opt(seed),
        cpu_opt(offset));
    const c10::Device dev = query.device();
    return {dq.to(dev), dk.to(dev), dv.to(dev), dpse.to(dev)};
#else
    TORCH_CHECK(false, kOp, ": the Ascend C kernel supports dense layouts without pse and dropout; got layout ",
                input_layout, p.pse.has_value() ? " with pse" : "", p.has_dropout() ? " with dropout" : "");
#endif
  }

  const int64_t B = p.batch, N1 = p.q_heads, N2 = p.kv_heads, S1 = p.max_q_len, S2 = p.max_kv_len;
  const int64_t D = p.head_dim, Dv = p.v_head_dim;
  const at::Tensor q = to_bnsd(query, p.layout, B, N1, S1, D), k = to_bnsd(key, p.layout, B, N2, S2, D),
                   v = to_bnsd(value, p.layout, B, N2, S2, Dv), g = to_bnsd(dy, p.layout, B, N1, S1, Dv),
                   o = to_bnsd(attention_in, p.layout, B, N1, S1, Dv);
  const at::Tensor smax = softmax_max.contiguous(), ssum = softmax_sum.contiguous();

  tot_ascendc::FlashAttentionScoreGradShape shape;
  shape.batch = B;
  shape.q_heads = N1;
  shape.kv_heads = N2;
  shape.s1 = S1;
  shape.s2 = S2;
  shape.d = D;
  shape.dv = Dv;
  shape.dtype = kernel_dtype(query.scalar_type());
  shape.scale = p.scale;
  const attention::Band band = p.band(0);  // dense layouts: one band for every batch
  shape.band_lo = band.lo;
  shape.band_hi = band.hi;
  std::optional<at::Tensor> mask;
  if (p.mask.has_value()) {  // element-wise mask (modes 0 and 1): uint8 [Bm, Nm, S1, S2] contiguous
    at::Tensor m = in.mask_u8;
    if (m.dim() == 2) m = m.view({1, 1, S1, S2});
    mask = m.contiguous();
    shape.has_mask = true;
    shape.mask_batches = m.size(0);
    shape.mask_heads = m.size(1);
  }
  tot_ascendc::FlashAttentionScoreGradTiling tiling;
  const std::string err = tot_ascendc::FlashAttentionScoreGradTilingFunc(shape, tot_ascendc::Ascend910B(), tiling);
  TORCH_CHECK_VALUE(err.empty(), err);  // names the op and the impossible input

  at::Tensor dq = at::empty({B, N1, S1, D}, q.options()), dk = at::empty({B, N2, S2, D}, k.options()),
             dv = at::empty({B, N2, S2, Dv}, v.options());
  npu_fa::ascendc::Launch launch(kOp);
  TOT_ASCENDC_RUN(launch, ::flash_attention_score_grad, tiling.block_dim, AscendC::KernelMode::MIX_MODE,
                  launch.Gm(q), launch.Gm(k), launch.Gm(v), launch.Gm(g), launch.Gm(mask), launch.Gm(smax),
                  launch.Gm(ssum), launch.Gm(o), launch.Gm(dq), launch.Gm(dk), launch.Gm(dv),
                  launch.Workspace(int64_t(tiling.workspace_bytes), q.options()), launch.Tiling(tiling, q.options()));
  return {from_bnsd(dq, p.layout), from_bnsd(dk, p.layout), from_bnsd(dv, p.layout), at::empty({0}, query.options())};
}

}  // namespace npu_fa
