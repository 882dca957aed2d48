// Validation shared by the CPU kernel (aten_ops/cpu/linear_attention) and the npu glue (aten_ops/npu/linear_attention)
// of recurrent_gated_delta_rule and its _functional form: every argument checked with the same messages (naming the
// argument, the expectation and what was given), the sequences and slots resolved on the host, the gates converted to
// the accumulation dtype. The dtype / shape helpers also serve rms_norm_gated.
#pragma once

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

namespace npu_fa::linear_attention {

inline bool is_float(at::ScalarType s) {
  return s == at::kFloat || s == at::kHalf || s == at::kBFloat16 || s == at::kDouble;
}

// The accumulation dtype of inputs of dtype s: float64 for float64, float32 otherwise.
inline at::ScalarType acc_dtype(at::ScalarType s) { return s == at::kDouble ? at::kDouble : at::kFloat; }

inline void check_float(const char* op, const char* name, const at::Tensor& t) {
  TORCH_CHECK_TYPE(is_float(t.scalar_type()), op, ": argument '", name,
                   "' must be float16, bfloat16, float32 or float64; got ", t.scalar_type());
}

// A tensor whose dtype must be ref's, or float32 (the state of a 16-bit call, the gate of the norm).
inline void check_dtype_or_float(const char* op, const char* name, const at::Tensor& t, const char* ref_name,
                          at::ScalarType ref) {
  const auto s = t.scalar_type();
  const bool ok = s == ref || (s == at::kFloat && ref != at::kDouble);
  TORCH_CHECK_TYPE(ok, op, ": argument '", name, "' must have ", ref_name, "'s dtype (", ref, ")",
                   ref == at::kDouble ? "" : " or float32", "; got ", s);
}

inline void check_shape(const char* op, const char* name, const at::Tensor& t, at::IntArrayRef want,
                        const char* what) {
  TORCH_CHECK_VALUE(t.sizes() == want, op, ": argument '", name, "' must have shape ", want, " ", what, "; got ",
                    t.sizes());
}

// An index tensor read on the host: 1-D int32/int64, returned as int64 values.
inline std::vector<int64_t> host_ints(const char* op, const char* name, const at::Tensor& t, int64_t len,
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
inline at::Tensor gate_tensor(const char* op, const char* name, const std::optional<at::Tensor>& t,
                              at::IntArrayRef want, const char* what, at::ScalarType acc) {
  if (!t.has_value()) return at::Tensor();
  check_float(op, name, *t);
  check_shape(op, name, *t, want, what);
  return t->to(acc).contiguous();
}

// The in-place form's cache: the kernels address it as dense [slots, Nv, Dv, Dk] planes (upstream also takes a
// contiguous one).
inline void check_state_contiguous(const char* op, const at::Tensor& state) {
  TORCH_CHECK_VALUE(state.is_contiguous(), op, ": argument 'state' must be contiguous (it is updated in ",
                    "place); got strides ", state.strides(), " for shape ", state.sizes());
}

// One validated call: sizes, the scale, the gates in the accumulation dtype (undefined when absent, contiguous, on
// the inputs' device) and the resolved sequences and slots.
struct GdrCall {
  int64_t T = 0, Nk = 0, Nv = 0, Dk = 0, Dv = 0;
  double scale = 1.0;
  at::Tensor beta, g, gk;
  GdrPlan plan;
};

// Checks every argument of a call of either form (the state's contiguity is the in-place form's own rule).
template <typename Args>
GdrCall validate_recurrent(const char* op, const Args& a) {
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
  GdrCall call;
  call.T = T;
  call.Nk = Nk;
  call.Nv = Nv;
  call.Dk = Dk;
  call.Dv = Dv;
  call.scale = a.scale.has_value() ? *a.scale : (Dk > 0 ? 1.0 / std::sqrt(static_cast<double>(Dk)) : 1.0);
  call.beta = beta;
  call.g = g;
  call.gk = gk;
  call.plan = plan;
  return call;
}

}  // namespace npu_fa::linear_attention
