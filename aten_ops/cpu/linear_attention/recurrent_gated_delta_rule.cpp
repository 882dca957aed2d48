// CPU entry points of recurrent_gated_delta_rule (torch_npu's npu_recurrent_gated_delta_rule and its _functional
// form) and rms_norm_gated (+ _grad, Qwen3-Next's gated RMSNorm): validate every argument (errors name the argument,
// the expectation and what was given), resolve the sequences and state slots on the host, lay the tensors out
// contiguously with the gates in the accumulation type, and run the loops of recurrent_gated_delta_rule_kernels.h.
#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "common/linear_attention/recurrent_gated_delta_rule_params.h"
#include "cpu/linear_attention/recurrent_gated_delta_rule_kernels.h"
#include "generated/kernels.h"

namespace npu_fa {

namespace {

using linear_attention::acc_dtype;
using linear_attention::check_dtype_or_float;
using linear_attention::check_float;
using linear_attention::check_shape;

// Validates a call of either form and runs it on `state` (contiguous), which it updates in place.
template <typename Args>
at::Tensor run_recurrent(const char* op, const Args& a, const at::Tensor& state) {
  const linear_attention::GdrCall call = linear_attention::validate_recurrent(op, a);
  const at::Tensor& q = a.query;
  const int64_t T = call.T, Nk = call.Nk, Nv = call.Nv, Dk = call.Dk, Dv = call.Dv;
  const at::Tensor &beta = call.beta, &g = call.g, &gk = call.gk;
  const linear_attention::GdrPlan& plan = call.plan;

  at::Tensor out = at::empty({T, Nv, Dv}, q.options());
  if (out.numel() == 0) return out;
  const at::Tensor qc = q.contiguous(), kc = a.key.contiguous(), vc = a.value.contiguous();
  cpu::RecurrentGdrParams p;
  p.dtype = q.scalar_type();
  p.state_dtype = state.scalar_type();
  p.T = T;
  p.B = static_cast<int64_t>(plan.first_slot.size());
  p.Nk = Nk;
  p.Nv = Nv;
  p.Dk = Dk;
  p.Dv = Dv;
  p.scale = call.scale;
  p.query = qc.data_ptr();
  p.key = kc.data_ptr();
  p.value = vc.data_ptr();
  p.beta = beta.defined() ? beta.data_ptr() : nullptr;
  p.g = g.defined() ? g.data_ptr() : nullptr;
  p.gk = gk.defined() ? gk.data_ptr() : nullptr;
  p.seq_start = plan.seq_start.data();
  p.first_slot = plan.first_slot.data();
  p.slot = plan.slot.data();
  p.state = state.data_ptr();
  p.out = out.data_ptr();
  cpu::recurrent_gdr_stub(p);
  return out;
}

void check_epsilon(const char* op, double eps) {
  TORCH_CHECK_VALUE(eps > 0 && std::isfinite(eps), op, ": argument 'epsilon' must be a finite number > 0; got ", eps);
}

// x [..., n] with weight [n] (x's dtype, or float32 for 16-bit x) and an optional gate of x's shape.
void check_norm_inputs(const char* op, const at::Tensor& x, const at::Tensor& weight,
                       const std::optional<at::Tensor>& gate) {
  check_float(op, "x", x);
  TORCH_CHECK_VALUE(x.dim() >= 1, op, ": argument 'x' must have at least one dimension; got a 0-d tensor");
  TORCH_CHECK_VALUE(weight.dim() == 1 && weight.size(0) == x.size(-1), op,
                    ": argument 'weight' must be 1-D [n] with n = x.size(-1) = ", x.size(-1), "; got shape ",
                    weight.sizes());
  check_dtype_or_float(op, "weight", weight, "x", x.scalar_type());
  if (gate.has_value()) {
    check_shape(op, "gate", *gate, x.sizes(), "(x's shape)");
    check_dtype_or_float(op, "gate", *gate, "x", x.scalar_type());
  }
}

std::vector<int64_t> rstd_shape(const at::Tensor& x) {
  std::vector<int64_t> s(x.sizes().begin(), x.sizes().end());
  s.back() = 1;
  return s;
}

}  // namespace

at::Tensor recurrent_gated_delta_rule_cpu(const RecurrentGatedDeltaRuleArgs& args) {
  const char* op = "recurrent_gated_delta_rule";
  linear_attention::check_state_contiguous(op, args.state);
  return run_recurrent(op, args, args.state);
}

std::tuple<at::Tensor, at::Tensor> recurrent_gated_delta_rule_functional_cpu(
    const RecurrentGatedDeltaRuleFunctionalArgs& args) {
  const char* op = "recurrent_gated_delta_rule_functional";
  at::Tensor new_state = args.state.clone(at::MemoryFormat::Contiguous);
  at::Tensor out = run_recurrent(op, args, new_state);
  return {out, new_state};
}

std::tuple<at::Tensor, at::Tensor> rms_norm_gated_cpu(const RmsNormGatedArgs& args) {
  const char* op = "rms_norm_gated";
  const at::Tensor& x = args.x;
  check_norm_inputs(op, x, args.weight, args.gate);
  check_epsilon(op, args.epsilon);
  const at::ScalarType acc = acc_dtype(x.scalar_type());
  at::Tensor y = at::empty(x.sizes(), x.options());
  at::Tensor rstd = at::empty(rstd_shape(x), x.options().dtype(acc));
  if (x.numel() == 0) return {y, rstd};
  const at::Tensor xc = x.contiguous();
  const at::Tensor w = args.weight.to(acc).contiguous();
  const at::Tensor gate = args.gate.has_value() ? args.gate->contiguous() : at::Tensor();
  cpu::RmsNormGatedParams p;
  p.dtype = x.scalar_type();
  p.gate_dtype = gate.defined() ? gate.scalar_type() : x.scalar_type();
  p.n = x.size(-1);
  p.rows = x.numel() / p.n;
  p.eps = args.epsilon;
  p.round_product = args.weight.scalar_type() == x.scalar_type();
  p.x = xc.data_ptr();
  p.weight = w.data_ptr();
  p.gate = gate.defined() ? gate.data_ptr() : nullptr;
  p.y = y.data_ptr();
  p.rstd = rstd.data_ptr();
  cpu::rms_norm_gated_rows_stub(p);
  return {y, rstd};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> rms_norm_gated_grad_cpu(const RmsNormGatedGradArgs& args) {
  const char* op = "rms_norm_gated_grad";
  const at::Tensor& x = args.x;
  check_norm_inputs(op, x, args.weight, args.gate);
  check_shape(op, "dy", args.dy, x.sizes(), "(x's shape)");
  TORCH_CHECK_TYPE(args.dy.scalar_type() == x.scalar_type(), op, ": argument 'dy' must have x's dtype (",
                   x.scalar_type(), "); got ", args.dy.scalar_type());
  const at::ScalarType acc = acc_dtype(x.scalar_type());
  check_shape(op, "rstd", args.rstd, rstd_shape(x), "(x.shape[:-1] + [1], the forward's rstd)");
  TORCH_CHECK_TYPE(args.rstd.scalar_type() == acc, op, ": argument 'rstd' must be ", acc, " (the forward's); got ",
                   args.rstd.scalar_type());
  const int64_t n = x.size(-1);
  at::Tensor dx = at::empty(x.sizes(), x.options());
  at::Tensor dgate = args.gate.has_value() ? at::empty(x.sizes(), args.gate->options()) : at::empty({0}, x.options());
  at::Tensor dweight_acc = at::zeros({n}, x.options().dtype(acc));
  if (x.numel() > 0) {
    const at::Tensor xc = x.contiguous(), dyc = args.dy.contiguous(), rc = args.rstd.contiguous();
    const at::Tensor w = args.weight.to(acc).contiguous();
    const at::Tensor gate = args.gate.has_value() ? args.gate->contiguous() : at::Tensor();
    cpu::RmsNormGatedGradParams p;
    p.dtype = x.scalar_type();
    p.gate_dtype = gate.defined() ? gate.scalar_type() : x.scalar_type();
    p.n = n;
    p.rows = x.numel() / n;
    p.dy = dyc.data_ptr();
    p.x = xc.data_ptr();
    p.weight = w.data_ptr();
    p.rstd = rc.data_ptr();
    p.gate = gate.defined() ? gate.data_ptr() : nullptr;
    p.dx = dx.data_ptr();
    p.dweight = dweight_acc.data_ptr();
    p.dgate = gate.defined() ? dgate.data_ptr() : nullptr;
    cpu::rms_norm_gated_grad_rows_stub(p);
  }
  return {dx, dweight_acc.to(args.weight.scalar_type()), dgate};
}

}  // namespace npu_fa
