// fused_causal_conv1d and its in-place _v2 form on the npu device (PrivateUse1): the Ascend C kernel
// (ascendc/kernels/linear_attention/fused_causal_conv1d_kernel.cpp), validated exactly like the CPU op (shared
// common/linear_attention/causal_conv1d_params.h, which also resolves every sequence into its plan). The host turns
// the plans into one small int32 table — per computed sequence its rows of x, the line it reads (or none: zero
// state), the conv's first padded row, the line it writes and the pangu reset — and the kernel does the rest. What the
// kernel does not cover (float64, prefix caching with a 2-D cache_indices, a kernel width whose weights and window do
// not fit UB, 2^31 lines or tokens) goes to npu_host::fallback_to_cpu (the CPU kernel on the simulated device; an
// error on CANN builds and under TOT_NPU_SIM_NO_FALLBACK=1); see docs/ascendc_linear_attention.md.
#include <ATen/ATen.h>

#include <algorithm>
#include <optional>
#include <string>

#include "common/linear_attention/causal_conv1d_params.h"
#include "generated/kernels.h"
#include "linear_attention/fused_causal_conv1d_tiling.h"
#include "npu/ascendc_launch.h"
#include "npu/host_alias.h"

#ifndef TOT_WITH_CANN  // with CANN, ascendc_launch.h includes the generated aclrtlaunch_<kernel>.h launchers
#include "linear_attention/fused_causal_conv1d_kernel.h"
#endif

namespace npu_fa {
namespace {

using linear_attention::FusedPlan;
using linear_attention::SeqPlan;

tot_ascendc::ConvDtype kernel_dtype(at::ScalarType t) {
  if (t == at::kHalf) return tot_ascendc::ConvDtype::FP16;
  if (t == at::kBFloat16) return tot_ascendc::ConvDtype::BF16;
  return tot_ascendc::ConvDtype::FP32;
}

// Why the kernel cannot run this call ("" when it can), filling its tiling otherwise.
std::string plan_kernel(const at::Tensor& x, bool has_bias, const FusedPlan& p,
                        tot_ascendc::CausalConvTiling& tiling) {
  if (x.scalar_type() == at::kDouble) return "float64 inputs";
  if (p.prefix_caching) return "prefix caching (a 2-D cache_indices)";
  // Counts saturate at 2^32 - 1; the tiling (tokens, lines) and the check below (dim, width, state_len) reject what
  // the kernel's int32 tables cannot address.
  const auto u32 = [](int64_t v) { return uint32_t(std::min<int64_t>(v, int64_t(UINT32_MAX))); };
  tot_ascendc::ConvShape s;
  s.tokens = u32(x.numel() / p.dim);
  s.seqs = uint32_t(p.seqs.size());
  s.dim = u32(p.dim);
  s.width = u32(p.K);
  s.state_len = u32(p.C);
  int64_t longest = 0;
  for (const SeqPlan& q : p.seqs) longest = std::max(longest, q.len);
  s.longest = u32(longest);
  s.slots = uint64_t(p.slots);
  s.dtype = kernel_dtype(x.scalar_type());
  s.has_bias = has_bias;
  s.silu = p.silu;
  s.residual = p.residual;
  if (p.dim > INT32_MAX || p.K > INT32_MAX || p.C > INT32_MAX) return "a dim, kernel width or state_len of 2^31";
  return tot_ascendc::CausalConvTilingFn(s, tot_ascendc::Ascend910B(), tiling);
}

// int32 [seqs, kConvSeqFields]: the kernel's view of the plans (values below 2^31: the tiling checked the counts).
at::Tensor seq_table(const FusedPlan& p) {
  const int64_t n = int64_t(p.seqs.size());
  at::Tensor host = at::empty({n, int64_t(tot_ascendc::kConvSeqFields)}, at::TensorOptions().dtype(at::kInt));
  int32_t* r = host.data_ptr<int32_t>();
  for (const SeqPlan& s : p.seqs) {
    r[tot_ascendc::kConvStart] = int32_t(s.start);
    r[tot_ascendc::kConvLen] = int32_t(s.len);
    r[tot_ascendc::kConvReadLine] = int32_t(s.read_line);  // -1: zero state
    r[tot_ascendc::kConvOffset] = int32_t(s.offset);
    r[tot_ascendc::kConvWriteLine] = int32_t(s.write_line);
    r[tot_ascendc::kConvReset] = int32_t(s.reset);
    r += tot_ascendc::kConvSeqFields;
  }
  return host;
}

// A GM argument for a tensor that may be empty (no tokens, lines of no rows): the kernel never addresses it then,
// but every argument must be a GM buffer.
at::Tensor gm_buffer(const at::Tensor& t) {
  return t.numel() > 0 ? t : at::empty({32}, t.options().dtype(at::kByte));
}

// Runs the kernel: y = the conv of x (y may be x), `states` (contiguous) updated in place.
void run_kernel(const char* op, const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                at::Tensor& states, at::Tensor& y, const FusedPlan& plan,
                const tot_ascendc::CausalConvTiling& tiling) {
  const at::Tensor w = weight.contiguous();
  const std::optional<at::Tensor> b = bias.has_value() ? std::optional<at::Tensor>(bias->contiguous()) : std::nullopt;
  const at::Tensor table = seq_table(plan).to(x.device());
  const at::Tensor xg = gm_buffer(x), yg = y.is_same(x) ? xg : gm_buffer(y), sg = gm_buffer(states);
  npu_fa::ascendc::Launch launch(op);
  TOT_ASCENDC_RUN(launch, fused_causal_conv1d, tiling.block_dim, AscendC::KernelMode::AIV_MODE, launch.Gm(xg),
                  launch.Gm(w), launch.Gm(b), launch.Gm(table), launch.Gm(sg), launch.Gm(yg),
                  launch.Workspace(0, x.options()), launch.Tiling(tiling, x.options()));
}

}  // namespace

at::Tensor fused_causal_conv1d_npu(const FusedCausalConv1dArgs& args) {
  const char* op = "fused_causal_conv1d";
  const FusedPlan plan = linear_attention::plan_fused(op, args);
  if (plan.seqs.empty() || plan.dim == 0) return at::zeros(args.x.sizes(), args.x.options());
  tot_ascendc::CausalConvTiling tiling;
  const std::string unsupported = plan_kernel(args.x, args.bias.has_value(), plan, tiling);
  if (!unsupported.empty())
    return npu_host::fallback_to_cpu(op, unsupported, args, fused_causal_conv1d_cpu, args.x.device());
  const at::Tensor x = args.x.contiguous();
  at::Tensor y = at::zeros(x.sizes(), x.options());  // rows no sequence computes are 0
  at::Tensor states = args.conv_states.is_contiguous() ? args.conv_states : args.conv_states.contiguous();
  run_kernel(op, x, args.weight, args.bias, states, y, plan, tiling);
  if (!states.is_same(args.conv_states)) args.conv_states.copy_(states);
  return y;
}

void fused_causal_conv1d_v2_npu(const FusedCausalConv1dV2Args& args) {
  const char* op = "fused_causal_conv1d_v2";
  const FusedPlan plan = linear_attention::plan_fused(op, args);
  if (plan.seqs.empty() || plan.dim == 0) return;
  tot_ascendc::CausalConvTiling tiling;
  const std::string unsupported = plan_kernel(args.x, args.bias.has_value(), plan, tiling);
  if (!unsupported.empty())
    return npu_host::fallback_to_cpu(op, unsupported, args, fused_causal_conv1d_v2_cpu, args.x.device());
  // in place: the kernel writes each tile's rows of y over x after loading them; a strided x is computed in a copy
  at::Tensor x = args.x.is_contiguous() ? args.x : args.x.contiguous();
  at::Tensor states = args.conv_states.is_contiguous() ? args.conv_states : args.conv_states.contiguous();
  run_kernel(op, x, args.weight, args.bias, states, x, plan, tiling);
  if (!states.is_same(args.conv_states)) args.conv_states.copy_(states);
  if (!x.is_same(args.x)) args.x.copy_(x);
}

}  // namespace npu_fa
