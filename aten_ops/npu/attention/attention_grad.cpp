// flash_attention_score_grad on the npu (PrivateUse1) device: validates like the CPU op, brings q/k/v/dy/attention_in
// into BNSD-contiguous copies, fills the tiling and launches the Ascend C kernel
// ascendc/kernels/attention/flash_attention_score_grad_kernel.cpp.
//
// Kernel path: dense layouts (BSH, SBH, BSND, BNSD), no pse, softcap or sink, keep_prob = 1, any sparse_mode 0-4 (its band)
// with or without an element-wise bool/uint8 mask. Everything else (pse, softcap, sink, dropout, TND, empty problems) runs the
// CPU kernel on CPU aliases of the npu tensors — on the simulated device only (docs/ascendc_attention_grad.md).
#include <ATen/ATen.h>

#include "common/attention/params.h"
#include "attention/flash_attention_score_grad_tiling.h"
#include "generated/kernels.h"
#include "npu/ascendc_launch.h"
#include "npu/attention/bnsd_layout.h"
#include "npu/host_alias.h"
#include "npu/injected_fault.h"

#ifndef TOT_WITH_CANN  // with CANN, ascendc_launch.h includes the generated aclrtlaunch_<kernel>.h launchers
#include "attention/flash_attention_score_grad_kernel.h"
#endif

namespace npu_fa {
namespace {

using attention::AttentionInputs;
using attention::AttentionParams;
using attention::Layout;

constexpr const char* kOp = "flash_attention_score_grad";

tot_ascendc::FagDtype kernel_dtype(at::ScalarType t) {
  if (t == at::kFloat) return tot_ascendc::FagDtype::FP32;
  return t == at::kHalf ? tot_ascendc::FagDtype::FP16 : tot_ascendc::FagDtype::BF16;
}

bool kernel_supports(const AttentionParams& p, const at::Tensor& query, const at::Tensor& key) {
  return !p.pse.has_value() && !p.has_logit_transform() && !p.has_dropout() && p.sink == nullptr && p.layout != Layout::TND &&
         query.numel() > 0 && key.numel() > 0;
}

// TOT_NPU_SIM_FAULT (npu/injected_fault.h, simulated device only, for testing the differential oracle): the
// backward kernel's faults — "bwd_scale" (5% too large) or "bwd_window" (one more key visible above the band).
void inject_fault(tot_ascendc::FlashAttentionScoreGradShape& shape) {
  const std::string fault = npu_host::injected_fault();
  if (fault == "bwd_scale") shape.scale *= 1.05f;
  if (fault == "bwd_window") shape.band_hi = npu_host::widened_band_hi(shape.band_hi);
}

}  // namespace

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> flash_attention_score_grad_npu(
    const FlashAttentionScoreGradArgs& args) {
  AttentionInputs in;
  const AttentionParams p = attention::parse_backward_params(kOp, args, in);

  if (!kernel_supports(p, args.query, args.key)) {
    const std::string why = std::string("layout ") + std::string(args.input_layout) +
                            (args.pse.has_value() ? " with pse" : "") + (p.softcap > 0.f ? " with softcap" : "") +
                            (p.has_dropout() ? " with dropout" : "") + (p.sink ? " with sink" : "") +
                            " (it runs dense layouts without pse, softcap, dropout and sink)";
    return npu_host::fallback_to_cpu(kOp, why, args, flash_attention_score_grad_cpu, args.query.device());
  }

  const int64_t B = p.batch, N1 = p.q_heads, N2 = p.kv_heads, S1 = p.max_q_len, S2 = p.max_kv_len;
  const int64_t D = p.head_dim, Dv = p.v_head_dim;
  using npu_host::from_bnsd;
  using npu_host::to_bnsd;
  const at::Tensor q = to_bnsd(args.query, p.layout, N1), k = to_bnsd(args.key, p.layout, N2), v = to_bnsd(args.value, p.layout, N2),
                   g = to_bnsd(args.dy, p.layout, N1), o = to_bnsd(args.attention_in, p.layout, N1);
  const at::Tensor smax = args.softmax_max.contiguous(), ssum = args.softmax_sum.contiguous();

  tot_ascendc::FlashAttentionScoreGradShape shape;
  shape.batch = B;
  shape.q_heads = N1;
  shape.kv_heads = N2;
  shape.s1 = S1;
  shape.s2 = S2;
  shape.d = D;
  shape.dv = Dv;
  shape.dtype = kernel_dtype(args.query.scalar_type());
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
  inject_fault(shape);
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
  return {from_bnsd(dq, p.layout), from_bnsd(dk, p.layout), from_bnsd(dv, p.layout), at::empty({0}, args.query.options()),
          at::empty({0}, args.key.options().dtype(at::kFloat))};
}

}  // namespace npu_fa
