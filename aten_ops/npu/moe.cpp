// PrivateUse1 (npu) kernels of moe_gating_top_k_softmax and _v2: validate like the CPU op (shared checks in
// common/moe/routing.h), tile on the host, launch the Ascend C kernel
// (ascendc/kernels/moe/moe_gating_top_k_softmax_kernel.cpp).
//
// What the kernel does not take (docs/ascendc_moe.md) runs the CPU kernel on CPU aliases of the npu
// tensors — on the simulated device only; a CANN build reports it as unsupported:
//   - float64 x (the kernel computes in fp32; fp64 is the gradcheck dtype);
//   - x containing NaN (the hardware ReduceMax gives NaN no defined rank; the CPU op ranks NaN first);
//   - rows whose E does not fit one UB pass, or N*k beyond int32 (the tiling's errors).
// Empty x launches nothing and returns empty outputs.
#include <ATen/ATen.h>

#include <optional>
#include <string>
#include <tuple>

#include "common/moe/routing.h"
#include "generated/kernels.h"
#include "moe/moe_gating_top_k_softmax_tiling.h"
#include "npu/ascendc_launch.h"
#include "npu/host_alias.h"

#ifndef TOT_WITH_CANN  // with CANN, ascendc_launch.h includes the generated aclrtlaunch_<kernel>.h launchers
#include "moe/moe_gating_top_k_softmax_kernel.h"
#endif

namespace npu_fa {

namespace {

using Outputs = std::tuple<at::Tensor, at::Tensor, at::Tensor>;

std::optional<tot_ascendc::GatingDtype> kernel_dtype(at::ScalarType s) {
  if (s == at::kFloat) return tot_ascendc::GatingDtype::kFloat32;
  if (s == at::kHalf) return tot_ascendc::GatingDtype::kFloat16;
  if (s == at::kBFloat16) return tot_ascendc::GatingDtype::kBFloat16;
  return std::nullopt;
}

// Why the Ascend C kernel cannot run this call ("" when it can); fills the tiling when it can.
std::string kernel_refusal(const at::Tensor& x, const moe::GatingShape& g, const std::optional<at::Tensor>& finished,
                           int64_t k, int64_t renorm, bool want_softmax, bool want_row_idx,
                           tot_ascendc::MoeGatingTopKSoftmaxTiling* tiling) {
  const auto dtype = kernel_dtype(x.scalar_type());
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

}  // namespace

std::tuple<at::Tensor, at::Tensor, at::Tensor> moe_gating_top_k_softmax_npu(const MoeGatingTopKSoftmaxArgs& args) {
  return gating_npu("moe_gating_top_k_softmax", args, /*renorm=*/0, false, true, moe_gating_top_k_softmax_cpu);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> moe_gating_top_k_softmax_v2_npu(const MoeGatingTopKSoftmaxV2Args& args) {
  return gating_npu("moe_gating_top_k_softmax_v2", args, args.renorm, args.output_softmax_result_flag, false,
                    moe_gating_top_k_softmax_v2_cpu);
}

}  // namespace npu_fa
