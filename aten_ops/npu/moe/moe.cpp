// PrivateUse1 (npu) kernels of moe_gating_top_k_softmax (_v2) and moe_finalize_routing: validate like the CPU op
// (shared checks in common/moe/routing.h and common/moe/finalize.h), tile on the host, launch the Ascend C kernel
// (ascendc/kernels/moe/moe_gating_top_k_softmax_kernel.cpp, moe_finalize_routing_kernel.cpp).
//
// What the kernel does not take (docs/ascendc_moe.md) runs the CPU kernel on CPU aliases of the npu
// tensors — on the simulated device only; a CANN build reports it as unsupported:
//   - float64 x (the kernel computes in fp32; fp64 is the gradcheck dtype);
//   - x containing NaN (the hardware ReduceMax gives NaN no defined rank; the CPU op ranks NaN first);
//   - rows whose E does not fit one UB pass, or N*k beyond int32 (the tiling's errors).
//   - float64 rows in moe_finalize_routing, or more rows than int32 indexes (the tiling's limits).
// Empty inputs launch nothing and return empty outputs.
#include <ATen/ATen.h>

#include <optional>
#include <string>
#include <tuple>

#include "common/moe/finalize.h"
#include "common/moe/routing.h"
#include "generated/kernels.h"
#include "moe/moe_finalize_routing_tiling.h"
#include "moe/moe_gating_top_k_softmax_tiling.h"
#include "npu/ascendc_launch.h"
#include "npu/host_alias.h"

#ifndef TOT_WITH_CANN  // with CANN, ascendc_launch.h includes the generated aclrtlaunch_<kernel>.h launchers
#include "moe/moe_finalize_routing_kernel.h"
#include "moe/moe_gating_top_k_softmax_kernel.h"
#endif

namespace npu_fa {

namespace {

using Outputs = std::tuple<at::Tensor, at::Tensor, at::Tensor>;

// The kernels' dtype codes (fp32 0, fp16 1, bf16 2 in both tilings), or nothing for other dtypes.
template <class Code>
std::optional<Code> kernel_dtype(at::ScalarType s) {
  if (s == at::kFloat) return Code::kFloat32;
  if (s == at::kHalf) return Code::kFloat16;
  if (s == at::kBFloat16) return Code::kBFloat16;
  return std::nullopt;
}

// Why the Ascend C kernel cannot run this call ("" when it can); fills the tiling when it can.
std::string kernel_refusal(const at::Tensor& x, const moe::GatingShape& g, const std::optional<at::Tensor>& finished,
                           int64_t k, int64_t renorm, bool want_softmax, bool want_row_idx,
                           tot_ascendc::MoeGatingTopKSoftmaxTiling* tiling) {
  const auto dtype = kernel_dtype<tot_ascendc::GatingDtype>(x.scalar_type());
  if (!dtype) return std::string("x of dtype ") + c10::toString(x.scalar_type()) + " (the kernel takes fp32/fp16/bf16)";
#ifndef TOT_WITH_CANN
  if (x.isnan().any().item<bool>()) return "x contains NaN";
#endif
  tot_ascendc::MoeGatingTopKSoftmaxShape shape;
  shape.rows = g.rows;
  shape.experts = g.E;
  shape.k = k;
  shape.dtype = *dtype;
  shape.renorm = renorm;
  shape.has_finished = finished.has_value();
  shape.want_softmax = want_softmax;
  shape.want_row_idx = want_row_idx;
  return tot_ascendc::MoeGatingTopKSoftmaxTilingFor(shape, tot_ascendc::Ascend910B(), tiling);
}

struct GatingOutputs {
  at::Tensor y, expert, row_idx, softmax;
};

// Outputs on x's device, shaped as the CPU op's: row_idx (v1) or the fp32 softmax (v2, else empty) third.
GatingOutputs allocate_outputs(const at::Tensor& x, const moe::GatingShape& g, int64_t renorm, bool want_softmax,
                               bool want_row_idx) {
  GatingOutputs o;
  o.y = at::empty(g.out_sizes, x.options());
  o.expert = at::empty(g.out_sizes, x.options().dtype(at::kInt));
  o.row_idx = at::empty(want_row_idx ? at::IntArrayRef(g.out_sizes) : at::IntArrayRef({0}),
                        x.options().dtype(at::kInt));
  const bool sm_out = want_softmax && renorm == 0;
  o.softmax = at::empty(sm_out ? x.sizes() : at::IntArrayRef({0}), x.options().dtype(at::kFloat));
  return o;
}

void launch_gating(const at::Tensor& x, const std::optional<at::Tensor>& finished,
                   const tot_ascendc::MoeGatingTopKSoftmaxTiling& tiling, GatingOutputs& o) {
  const at::Tensor xc = x.contiguous();
  const std::optional<at::Tensor> fin =
      finished.has_value() ? std::optional<at::Tensor>(finished->contiguous()) : std::nullopt;
  ascendc::Launch launch("moe_gating_top_k_softmax");
  TOT_ASCENDC_RUN(launch, moe_gating_top_k_softmax_kernel, tiling.block_dim, AscendC::KernelMode::AIV_MODE,
                  launch.Gm(xc), launch.Gm(fin), launch.Gm(o.y), launch.Gm(o.expert),
                  tiling.want_row_idx ? launch.Gm(o.row_idx) : nullptr,
                  tiling.want_softmax ? launch.Gm(o.softmax) : nullptr, launch.Workspace(0, x.options()),
                  launch.Tiling(tiling, x.options()));
}

// Both versions: validation identical to the CPU op, then the kernel or (simulated device only) the CPU kernel.
template <class Args, class CpuKernel>
Outputs gating_npu(const char* op, const Args& args, int64_t renorm, bool want_softmax, bool want_row_idx,
                   CpuKernel&& cpu_kernel) {
  const at::Tensor& x = args.x;
  const std::optional<at::Tensor>& finished = args.finished;
  const int64_t k = args.k;
  moe::check_gating_renorm(op, renorm);
  const moe::GatingShape g = moe::check_gating(op, x, finished, k);
  tot_ascendc::MoeGatingTopKSoftmaxTiling tiling;
  const std::string refusal =
      x.numel() == 0 ? "" : kernel_refusal(x, g, finished, k, renorm, want_softmax, want_row_idx, &tiling);
  if (refusal.empty()) {
    GatingOutputs o = allocate_outputs(x, g, renorm, want_softmax, want_row_idx);
    if (x.numel() > 0) launch_gating(x, finished, tiling, o);
    return {o.y, o.expert, want_row_idx ? o.row_idx : o.softmax};
  }
  return npu_host::fallback_to_cpu(op, refusal, args, cpu_kernel, x.device());
}

// ---- moe_finalize_routing ----------------------------------------------------------------------------------------
// Why the Ascend C kernel cannot run this (validated) call ("" when it can); fills the tiling when it can.
std::string finalize_refusal(const MoeFinalizeRoutingArgs& a, const moe::FinalizePlan& fz,
                             tot_ascendc::MoeFinalizeRoutingTiling* tiling) {
  const at::ScalarType dt = a.expanded_permuted_rows.scalar_type();
  const auto dtype = kernel_dtype<tot_ascendc::FinalizeDtype>(dt);
  if (!dtype) return std::string("rows of dtype ") + c10::toString(dt) + " (the kernel takes fp32/fp16/bf16)";
  if (fz.R > INT32_MAX) return "more than 2^31 - 1 expanded rows (the kernel's row indices are int32)";
  tot_ascendc::MoeFinalizeRoutingShape s;
  s.tokens = fz.N;
  s.k = fz.k;
  s.hidden = fz.H;
  s.rows = fz.R;
  s.experts = a.bias.has_value() ? a.bias->size(0) : 0;
  s.dtype = *dtype;
  s.column_major = a.drop_pad_mode <= 1;
  s.has_skip1 = a.skip1.has_value();
  s.has_skip2 = a.skip2.has_value();
  s.has_bias = a.bias.has_value();
  s.has_scales = a.scales.has_value();
  return tot_ascendc::MoeFinalizeRoutingTilingFor(s, tot_ascendc::Ascend910B(), tiling);
}

std::optional<at::Tensor> contiguous_on(const std::optional<at::Tensor>& t, const c10::Device& device,
                                        at::ScalarType dtype) {
  if (!t.has_value()) return std::nullopt;
  return t->to(device, dtype).contiguous();
}

}  // namespace

at::Tensor moe_finalize_routing_npu(const MoeFinalizeRoutingArgs& args) {
  const char* op = "moe_finalize_routing";
  const at::Tensor& rows = args.expanded_permuted_rows;
  const moe::FinalizePlan fz =
      moe::plan_finalize(op, rows, args.skip1, args.skip2, args.bias, args.scales, args.expanded_src_to_dst_row,
                         args.export_for_source_row, args.drop_pad_mode);
  at::Tensor out = at::empty({fz.N, fz.H}, rows.options());
  if (out.numel() == 0) return out;
  tot_ascendc::MoeFinalizeRoutingTiling t;
  const std::string refusal = fz.k == 0 ? "no pairs per token" : finalize_refusal(args, fz, &t);
  if (!refusal.empty()) return npu_host::fallback_to_cpu(op, refusal, args, moe_finalize_routing_cpu, rows.device());
  // The kernel reads int32 indices and fp32 scales (the CPU op also sums in fp32); the indices were checked above.
  const c10::Device device = rows.device();
  const at::ScalarType dt = rows.scalar_type();
  const at::Tensor rc = rows.contiguous();
  // Positions past the rows (dropless modes) contribute nothing, as -1 does: the kernel reads them as -1.
  at::Tensor dst = args.expanded_src_to_dst_row.to(device, at::kInt);
  if (fz.past_rows) dst = dst.masked_fill(dst >= fz.R, -1);
  dst = dst.contiguous();
  const auto skip1 = contiguous_on(args.skip1, device, dt), skip2 = contiguous_on(args.skip2, device, dt);
  const auto bias = contiguous_on(args.bias, device, dt);
  const auto scales = contiguous_on(args.scales, device, at::kFloat);
  const auto experts = t.has_bias ? contiguous_on(args.export_for_source_row, device, at::kInt) : std::nullopt;
  ascendc::Launch launch(op);
  TOT_ASCENDC_RUN(launch, moe_finalize_routing_kernel, t.block_dim, AscendC::KernelMode::AIV_MODE, launch.Gm(rc),
                  launch.Gm(skip1), launch.Gm(skip2), launch.Gm(bias), launch.Gm(scales), launch.Gm(dst),
                  launch.Gm(experts), launch.Gm(out), launch.Workspace(0, rows.options()),
                  launch.Tiling(t, rows.options()));
  return out;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> moe_gating_top_k_softmax_npu(const MoeGatingTopKSoftmaxArgs& args) {
  return gating_npu("moe_gating_top_k_softmax", args, /*renorm=*/0, false, true, moe_gating_top_k_softmax_cpu);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> moe_gating_top_k_softmax_v2_npu(const MoeGatingTopKSoftmaxV2Args& args) {
  return gating_npu("moe_gating_top_k_softmax_v2", args, args.renorm, args.output_softmax_result_flag, false,
                    moe_gating_top_k_softmax_v2_cpu);
}

}  // namespace npu_fa
