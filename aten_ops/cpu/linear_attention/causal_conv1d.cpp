// CPU entry points of the causal conv1d ops (torch_npu npu_fused_causal_conv1d, _v2, npu_masked_causal_conv1d and its
// backward): validate every argument and resolve each sequence of a fused call into a SeqPlan (shared with the npu
// glue: common/linear_attention/causal_conv1d_params.h), then run the loops of causal_conv1d_kernels_isa.cpp.
#include <ATen/ATen.h>

#include <algorithm>
#include <string>
#include <vector>

#include "common/linear_attention/causal_conv1d_params.h"
#include "cpu/linear_attention/causal_conv1d_kernels.h"
#include "generated/kernels.h"

namespace npu_fa {

namespace {

using linear_attention::check_same_dtype;
using linear_attention::FusedPlan;
using linear_attention::plan_fused;

// Runs the plan with y written to `y` (x itself for the v2 op).
void run_fused(const FusedPlan& plan, const at::Tensor& x, const std::optional<at::Tensor>& bias,
               const at::Tensor& weight, at::Tensor& states, at::Tensor& y) {
  if (plan.seqs.empty() || plan.dim == 0) return;
  at::Tensor st = states.is_contiguous() ? states : states.contiguous();
  const at::Tensor w = weight.contiguous();
  const at::Tensor bc = bias.has_value() ? bias->contiguous() : at::Tensor();
  cpu::FusedConvParams p;
  p.dtype = x.scalar_type();
  p.dim = plan.dim;
  p.K = plan.K;
  p.C = plan.C;
  p.x = x.data_ptr();
  p.weight = w.data_ptr();
  p.bias = bc.defined() ? bc.data_ptr() : nullptr;
  p.states = st.data_ptr();
  p.y = y.data_ptr();
  p.silu = plan.silu;
  p.residual = plan.residual;
  p.seqs = &plan.seqs;
  cpu::fused_causal_conv1d_stub(p);
  if (!st.is_same(states)) states.copy_(st);
}

}  // namespace

at::Tensor fused_causal_conv1d_cpu(const FusedCausalConv1dArgs& args) {
  const FusedPlan plan = plan_fused("fused_causal_conv1d", args);
  const at::Tensor x = args.x.contiguous();
  at::Tensor y = at::zeros(x.sizes(), x.options());
  at::Tensor states = args.conv_states;
  run_fused(plan, x, args.bias, args.weight, states, y);
  return y;
}

void fused_causal_conv1d_v2_cpu(const FusedCausalConv1dV2Args& args) {
  const FusedPlan plan = plan_fused("fused_causal_conv1d_v2", args);
  // in place: the kernel writes y over x row by row (see fused_sequence); a strided x is computed in a copy
  at::Tensor x = args.x.is_contiguous() ? args.x : args.x.contiguous();
  at::Tensor states = args.conv_states;
  run_fused(plan, x, args.bias, args.weight, states, x);
  if (!x.is_same(args.x)) args.x.copy_(x);
}

namespace {

// input [S, B, H], weight [W, H] of input's dtype, mask [B, S] bool.
void check_masked(const char* op, const at::Tensor& input, const at::Tensor& weight,
                  const std::optional<at::Tensor>& mask) {
  linear_attention::check_conv_float(op, "input", input);
  check_same_dtype(op, "weight", weight, "input", input);
  TORCH_CHECK_VALUE(input.dim() == 3, op, ": argument 'input' must be 3-D [S, B, H]; got shape ", input.sizes());
  TORCH_CHECK_VALUE(weight.dim() == 2 && weight.size(0) >= 1 && weight.size(1) == input.size(2), op,
                    ": argument 'weight' must be 2-D [W, H] with W >= 1 and H = ", input.size(2),
                    " (input's last dimension); got shape ", weight.sizes());
  if (mask.has_value()) {
    TORCH_CHECK_TYPE(mask->scalar_type() == at::kBool, op, ": argument 'mask' must be bool; got ",
                     mask->scalar_type());
    TORCH_CHECK_VALUE(mask->dim() == 2 && mask->size(0) == input.size(1) && mask->size(1) == input.size(0), op,
                      ": argument 'mask' must be 2-D [B, S] = [", input.size(1), ", ", input.size(0), "]; got shape ",
                      mask->sizes());
  }
}

cpu::MaskedConvParams masked_params(const at::Tensor& input, const at::Tensor& weight, const at::Tensor& mask) {
  cpu::MaskedConvParams p;
  p.dtype = input.scalar_type();
  p.S = input.size(0);
  p.B = input.size(1);
  p.H = input.size(2);
  p.W = weight.size(0);
  p.input = input.data_ptr();
  p.weight = weight.data_ptr();
  p.mask = mask.defined() ? mask.data_ptr<bool>() : nullptr;
  return p;
}

}  // namespace

at::Tensor masked_causal_conv1d_cpu(const MaskedCausalConv1dArgs& args) {
  const char* op = "masked_causal_conv1d";
  check_masked(op, args.input, args.weight, args.mask);
  const at::Tensor input = args.input.contiguous();
  at::Tensor out = at::empty(input.sizes(), input.options());
  if (out.numel() == 0) return out;
  const at::Tensor weight = args.weight.contiguous();
  const at::Tensor mask = args.mask.has_value() ? args.mask->contiguous() : at::Tensor();
  cpu::MaskedConvParams p = masked_params(input, weight, mask);
  p.out = out.data_ptr();
  cpu::masked_causal_conv1d_stub(p);
  return out;
}

std::tuple<at::Tensor, at::Tensor> masked_causal_conv1d_backward_cpu(const MaskedCausalConv1dBackwardArgs& args) {
  const char* op = "masked_causal_conv1d_backward";
  check_masked(op, args.input, args.weight, args.mask);
  check_same_dtype(op, "grad_output", args.grad_output, "input", args.input);
  TORCH_CHECK_VALUE(args.grad_output.sizes() == args.input.sizes(), op,
                    ": argument 'grad_output' must have input's shape ", args.input.sizes(), "; got ",
                    args.grad_output.sizes());
  const at::Tensor input = args.input.contiguous();
  const at::Tensor grad = args.grad_output.contiguous();
  const at::Tensor weight = args.weight.contiguous();
  at::Tensor grad_input = at::empty(input.sizes(), input.options());
  at::Tensor grad_weight = at::zeros(weight.sizes(), weight.options());
  if (input.numel() == 0) return {grad_input, grad_weight};
  const at::Tensor mask = args.mask.has_value() ? args.mask->contiguous() : at::Tensor();
  cpu::MaskedConvParams p = masked_params(input, weight, mask);
  p.grad_output = grad.data_ptr();
  p.grad_input = grad_input.data_ptr();
  p.grad_weight = grad_weight.data_ptr();
  cpu::masked_causal_conv1d_backward_stub(p);
  return {grad_input, grad_weight};
}

}  // namespace npu_fa
