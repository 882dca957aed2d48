// CPU entry points of recurrent_gated_delta_rule (torch_npu's npu_recurrent_gated_delta_rule and its _functional
// form) and rms_norm_gated (+ _grad, Qwen3-Next's gated RMSNorm): validate every argument (errors name the argument,
// the expectation and what was given), resolve the sequences and state slots on the host, lay the tensors out
// contiguously with the gates in the accumulation type, and run the loops of recurrent_gated_delta_rule_kernels.h.
#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "cpu/linear_attention/recurrent_gated_delta_rule_kernels.h"
#include "generated/kernels.h"

namespace npu_fa {

namespace {

bool is_float(at::ScalarType s) {
  return s == at::kFloat || s == at::kHalf || s == at::kBFloat16 || s == at::kDouble;
}

// The accumulation dtype of inputs of dtype s: float64 for float64, float32 otherwise.
at::ScalarType acc_dtype(at::ScalarType s) { return s == at::kDouble ? at::kDouble : at::kFloat; }

void check_float(const char* op, const char* name, const at::Tensor& t) {
  TORCH_CHECK_TYPE(is_float(t.scalar_type()), op, ": argument '", name,
                   "' must be float16, bfloat16, float32 or float64; got ", t.scalar_type());
}

// A tensor whose dtype must be ref's, or float32 (the state of a 16-bit call, the gate of the norm).
void check_dtype_or_float(const char* op, const char* name, const at::Tensor& t, const char* ref_name,
                          at::ScalarType ref) {
  const auto s = t.scalar_type();
  const bool ok = s == ref || (s == at::kFloat && ref != at::kDouble);
  TORCH_CHECK_TYPE(ok, op, ": argument '", name, "' must have ", ref_name, "'s dtype (", ref, ")",
                   ref == at::kDouble ? "" : " or float32", "; got ", s);
}

void check_shape(const char* op, const char* name, const at::Tensor& t, at::IntArrayRef want, const char* what) {
  TORCH_CHECK_VALUE(t.sizes() == want, op, ": argument '", name, "' must have shape ", want, " ", what, "; got ",
                    t.sizes());
}

// An index tensor read on the host: 1-D int32/int64, returned as int64 values.
std::vector<int64_t> host_ints(const char* op, const char* name, const at::Tensor& t, int64_t len,
                               const char* what) {
  TORCH_CHECK_TYPE(t.scalar_type() == at::kInt || t.scalar_type() == at::kLong, op, ": argument '", name,
                   "' must be int32 or int64; got ", t.scalar_type());
  TORCH_CHECK_VALUE(t.dim() == 1 && (len < 0 || t.size(0) == len), op, ": argument '", name, "' must be 1-D ",
                    what, "; got shape ", t.sizes());
  const at::Tensor c = t.to(at::kCPU, at::kLong).contiguous();
  return std::vector<int64_t>(c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel());
}

// The call's sequences and slots, resolved from the optional index arguments.
struct GdrPlan {
  std::vector<int64_t> seq_start;   // [B + 1]
  std::vector<int64_t> slot;        // [T]
  std::vector<int64_t> first_slot;  // [B]
};

template <typename Args>
GdrPlan plan_sequences(const char* op, const Args& a, int64_t T, int64_t slots) {
  GdrPlan p;
  std::vector<int64_t> lens;
  if (a.actual_seq_lengths.has_value()) {
    lens = host_ints(op, "actual_seq_lengths", *a.actual_seq_lengths, -1, "[B] (one length per sequence)");
  } else {
    lens.assign(static_cast<size_t>(T), 1);  // every token is a sequence of one (a decode step)
  }
  const int64_t B = static_cast<int64_t>(lens.size());
  p.seq_start.assign(static_cast<size_t>(B + 1), 0);
  for (int64_t i = 0; i < B; ++i) {
    TORCH_CHECK_VALUE(lens[i] >= 1, op, ": argument 'actual_seq_lengths' must hold lengths >= 1; got ", lens[i],
                      " for sequence ", i);
    TORCH_CHECK_VALUE(lens[i] <= T - p.seq_start[i], op,
                      ": argument 'actual_seq_lengths' must sum to the token count T = query.size(0) = ", T,
                      "; the lengths up to sequence ", i, " already exceed it");
    p.seq_start[i + 1] = p.seq_start[i] + lens[i];
  }
  TORCH_CHECK_VALUE(p.seq_start[B] == T, op, ": argument 'actual_seq_lengths' must sum to the token count T = ",
                    "query.size(0) = ", T, "; got a sum of ", p.seq_start[B]);
  if (a.ssm_state_indices.has_value()) {
    p.slot = host_ints(op, "ssm_state_indices", *a.ssm_state_indices, T, "[T] (one state slot per token)");
  } else {
    p.slot.resize(static_cast<size_t>(T));
    for (int64_t t = 0; t < T; ++t) p.slot[t] = t;
  }
  for (int64_t t = 0; t < T; ++t)
    TORCH_CHECK_VALUE(p.slot[t] >= 0 && p.slot[t] < slots, op, ": argument 'ssm_state_indices' must lie in [0, ",
                      "state.size(0) = ", slots, "); got ", p.slot[t], " for token ", t,
                      a.ssm_state_indices.has_value() ? "" : " (the default is the token's position)");
  // Distinct slots make the (sequence, head) work items independent: no item reads a slot another one writes.
  std::vector<int64_t> sorted(p.slot);
  std::sort(sorted.begin(), sorted.end());
  const auto dup = std::adjacent_find(sorted.begin(), sorted.end());
  TORCH_CHECK_VALUE(dup == sorted.end(), op, ": argument 'ssm_state_indices' must hold distinct slots (each token ",
                    "writes its own); slot ", dup == sorted.end() ? 0 : *dup, " appears more than once");
  std::vector<int64_t> accepted(static_cast<size_t>(B), 1);
  if (a.num_accepted_tokens.has_value())
    accepted = host_ints(op, "num_accepted_tokens", *a.num_accepted_tokens, B,
                         "[B] (one count per sequence of actual_seq_lengths)");
  p.first_slot.resize(static_cast<size_t>(B));
  for (int64_t i = 0; i < B; ++i) {
    TORCH_CHECK_VALUE(accepted[i] >= 1 && accepted[i] <= lens[i], op,
                      ": argument 'num_accepted_tokens' must lie in [1, actual_seq_lengths[i]]; got ", accepted[i],
                      " for sequence ", i, " of length ", lens[i]);
    p.first_slot[i] = p.slot[p.seq_start[i] + accepted[i] - 1];
  }
  return p;
}

// A per-token gate: shape checked, converted to the accumulation dtype, contiguous.
at::Tensor gate_tensor(const char* op, const char* name, const std::optional<at::Tensor>& t, at::IntArrayRef want,
                       const char* what, at::ScalarType acc) {
  if (!t.has_value()) return at::Tensor();
  check_float(op, name, *t);
  check_shape(op, name, *t, want, what);
  return t->to(acc).contiguous();
}

// Validates a call of either form and runs it on `state` (contiguous), which it updates in place.
template <typename Args>
at::Tensor run_recurrent(const char* op, const Args& a, const at::Tensor& state) {
  const at::Tensor& q = a.query;
  check_float(op, "query", q);
  TORCH_CHECK_VALUE(q.dim() == 3, op, ": argument 'query' must be 3-D [T, Nk, Dk]; got shape ", q.sizes());
  const int64_t T = q.size(0), Nk = q.size(1), Dk = q.size(2);
  TORCH_CHECK_VALUE(Nk >= 1, op, ": argument 'query' must have at least one head (Nk = query.size(1) >= 1); got ",
                    "shape ", q.sizes());
  check_shape(op, "key", a.key, q.sizes(), "(query's shape [T, Nk, Dk])");
  TORCH_CHECK_VALUE(a.value.dim() == 3 && a.value.size(0) == T, op,
                    ": argument 'value' must be 3-D [T, Nv, Dv] with T = query.size(0) = ", T, "; got shape ",
                    a.value.sizes());
  const int64_t Nv = a.value.size(1), Dv = a.value.size(2);
  TORCH_CHECK_VALUE(Nv % Nk == 0, op, ": argument 'value' must have a head count Nv that is a multiple of query's ",
                    "Nk = ", Nk, "; got Nv = ", Nv);
  for (const auto& [name, t] : {std::pair<const char*, const at::Tensor*>{"key", &a.key}, {"value", &a.value}})
    TORCH_CHECK_TYPE(t->scalar_type() == q.scalar_type(), op, ": argument '", name, "' must have query's dtype (",
                     q.scalar_type(), "); got ", t->scalar_type());
  check_dtype_or_float(op, "state", a.state, "query", q.scalar_type());
  TORCH_CHECK_VALUE(a.state.dim() == 4 && a.state.size(1) == Nv && a.state.size(2) == Dv && a.state.size(3) == Dk,
                    op, ": argument 'state' must be 4-D [slots, Nv, Dv, Dk] = [slots, ", Nv, ", ", Dv, ", ", Dk,
                    "]; got shape ", a.state.sizes());
  if (a.scale.has_value())
    TORCH_CHECK_VALUE(std::isfinite(*a.scale), op, ": argument 'scale' must be finite; got ", *a.scale);
  const at::ScalarType acc = acc_dtype(q.scalar_type());
  const at::Tensor beta = gate_tensor(op, "beta", a.beta, {T, Nv}, "[T, Nv]", acc);
  const at::Tensor g = gate_tensor(op, "g", a.g, {T, Nv}, "[T, Nv]", acc);
  const at::Tensor gk = gate_tensor(op, "gk", a.gk, {T, Nv, Dk}, "[T, Nv, Dk]", acc);
  const GdrPlan plan = plan_sequences(op, a, T, a.state.size(0));

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
  p.scale = a.scale.has_value() ? *a.scale : (Dk > 0 ? 1.0 / std::sqrt(static_cast<double>(Dk)) : 1.0);
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
  // The kernel addresses the cache as dense [slots, Nv, Dv, Dk] planes (upstream also takes a contiguous one).
  TORCH_CHECK_VALUE(args.state.is_contiguous(), op, ": argument 'state' must be contiguous (it is updated in ",
                    "place); got strides ", args.state.strides(), " for shape ", args.state.sizes());
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
