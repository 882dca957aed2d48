// CPU entry points of chunk_gated_delta_rule (CANN ChunkGatedDeltaRule, torch_npu npu_chunk_gated_delta_rule) and
// its backward: argument checks (each error names the argument, what is expected and what was given), conversion of
// the small per-token and per-sequence tensors to the accumulation type, then the per-ISA loops of
// chunk_gated_delta_rule_kernels_isa.cpp (the chunked WY / UT form; the formulas are written out there).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <cstring>
#include <vector>

#include "cpu/linear_attention/chunk_gated_delta_rule_kernels.h"
#include "generated/kernels.h"

namespace npu_fa {

namespace {

constexpr const char* kOp = "chunk_gated_delta_rule";

bool is_float(at::ScalarType s) {
  return s == at::kFloat || s == at::kHalf || s == at::kBFloat16 || s == at::kDouble;
}

void check_float(const char* op, const char* name, const at::Tensor& t) {
  TORCH_CHECK_TYPE(is_float(t.scalar_type()), op, ": argument '", name,
                   "' must be float32, float16, bfloat16 or float64; got ", t.scalar_type());
}

// The call's geometry, validated once for the forward and the backward.
struct Geometry {
  int64_t B = 1, T = 0, Nk = 1, Nv = 1, Dk = 0, Dv = 0;
  std::vector<int64_t> starts;  // B + 1 token offsets
  at::ScalarType acc = at::kFloat;
};

Geometry check_inputs(const char* op, const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
                      const std::optional<at::Tensor>& beta, const std::optional<at::Tensor>& initial_state,
                      const std::optional<at::Tensor>& lengths, const std::optional<double>& scale,
                      const std::optional<at::Tensor>& g) {
  check_float(op, "query", query);
  TORCH_CHECK_TYPE(key.scalar_type() == query.scalar_type() && value.scalar_type() == query.scalar_type(), op,
                   ": arguments 'query', 'key' and 'value' must have one dtype; got ", query.scalar_type(), ", ",
                   key.scalar_type(), " and ", value.scalar_type());
  TORCH_CHECK_VALUE(query.dim() == 3, op, ": argument 'query' must be 3-D [T, Nk, Dk] (TND); got shape ",
                    query.sizes());
  TORCH_CHECK_VALUE(key.sizes() == query.sizes(), op, ": argument 'key' must have query's shape ", query.sizes(),
                    "; got ", key.sizes());
  TORCH_CHECK_VALUE(value.dim() == 3 && value.size(0) == query.size(0), op,
                    ": argument 'value' must be 3-D [T, Nv, Dv] with query's T = ", query.size(0), "; got shape ",
                    value.sizes());
  Geometry geo;
  geo.T = query.size(0);
  geo.Nk = query.size(1);
  geo.Dk = query.size(2);
  geo.Nv = value.size(1);
  geo.Dv = value.size(2);
  geo.acc = query.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  TORCH_CHECK_VALUE(geo.Nk > 0 && geo.Nv > 0 && geo.Nv % geo.Nk == 0, op,
                    ": the value heads (value.size(1) = ", geo.Nv, ") must be a positive multiple of the key heads "
                    "(query.size(1) = ", geo.Nk, ")");
  for (const auto& [name, t] : {std::pair<const char*, const std::optional<at::Tensor>&>{"beta", beta}, {"g", g}}) {
    if (!t.has_value()) continue;
    check_float(op, name, *t);
    TORCH_CHECK_VALUE(t->dim() == 2 && t->size(0) == geo.T && t->size(1) == geo.Nv, op, ": argument '", name,
                      "' must be [T, Nv] = [", geo.T, ", ", geo.Nv, "]; got shape ", t->sizes());
  }
  if (lengths.has_value()) {
    const at::Tensor& l = *lengths;
    TORCH_CHECK_TYPE(l.scalar_type() == at::kInt || l.scalar_type() == at::kLong, op,
                     ": argument 'actual_seq_lengths' must be int32 or int64; got ", l.scalar_type());
    TORCH_CHECK_VALUE(l.dim() == 1, op, ": argument 'actual_seq_lengths' must be 1-D [B] (one length per sequence); "
                      "got shape ", l.sizes());
    const at::Tensor ll = l.to(at::kCPU, at::kLong).contiguous();
    geo.B = ll.numel();
    geo.starts.assign(1, 0);
    for (int64_t b = 0; b < geo.B; ++b) {
      const int64_t n = ll.data_ptr<int64_t>()[b];
      TORCH_CHECK_VALUE(n >= 0 && n <= geo.T - geo.starts.back(), op, ": argument 'actual_seq_lengths' must hold "
                        "lengths >= 0 summing to T = ", geo.T, " (query.size(0)); got ", n, " for sequence ", b,
                        " after ", geo.starts.back(), " tokens");
      geo.starts.push_back(geo.starts.back() + n);
    }
    TORCH_CHECK_VALUE(geo.starts.back() == geo.T, op, ": argument 'actual_seq_lengths' must sum to T = ", geo.T,
                      " (query.size(0)); got ", geo.starts.back());
  } else {
    geo.starts = {0, geo.T};
  }
  if (initial_state.has_value()) {
    const at::Tensor& s = *initial_state;
    check_float(op, "initial_state", s);
    TORCH_CHECK_VALUE(s.dim() == 4 && s.size(0) == geo.B && s.size(1) == geo.Nv && s.size(2) == geo.Dv &&
                          s.size(3) == geo.Dk,
                      op, ": argument 'initial_state' must be [B, Nv, Dv, Dk] = [", geo.B, ", ", geo.Nv, ", ", geo.Dv,
                      ", ", geo.Dk, "]; got shape ", s.sizes());
  }
  if (scale.has_value())
    TORCH_CHECK_VALUE(std::isfinite(*scale), op, ": argument 'scale' must be finite; got ", *scale);
  return geo;
}

// An optional tensor as a contiguous tensor of the accumulation type (undefined when absent).
at::Tensor acc_or_undefined(const std::optional<at::Tensor>& t, at::ScalarType acc) {
  return t.has_value() ? t->to(acc).contiguous() : at::Tensor();
}

const void* ptr(const at::Tensor& t) { return t.defined() ? t.const_data_ptr() : nullptr; }

cpu::GdnChunkParams make_params(const Geometry& geo, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                const at::Tensor& beta, const at::Tensor& g, const at::Tensor& s0,
                                const std::optional<double>& scale) {
  cpu::GdnChunkParams p;
  p.dtype = q.scalar_type();
  p.B = geo.B;
  p.T = geo.T;
  p.Nk = geo.Nk;
  p.Nv = geo.Nv;
  p.Dk = geo.Dk;
  p.Dv = geo.Dv;
  p.starts = geo.starts.data();
  p.scale = scale.value_or(1.0);
  p.q = q.const_data_ptr();
  p.k = k.const_data_ptr();
  p.v = v.const_data_ptr();
  p.beta = ptr(beta);
  p.g = ptr(g);
  p.state0 = ptr(s0);
  return p;
}

at::ScalarType state_dtype(const std::optional<at::Tensor>& initial_state, const Geometry& geo) {
  return initial_state.has_value() ? initial_state->scalar_type() : geo.acc;
}

}  // namespace

std::tuple<at::Tensor, at::Tensor> chunk_gated_delta_rule_cpu(const ChunkGatedDeltaRuleArgs& args) {
  const Geometry geo = check_inputs(kOp, args.query, args.key, args.value, args.beta, args.initial_state,
                                    args.actual_seq_lengths, args.scale, args.g);
  const at::Tensor q = args.query.contiguous(), k = args.key.contiguous(), v = args.value.contiguous();
  const at::Tensor beta = acc_or_undefined(args.beta, geo.acc), g = acc_or_undefined(args.g, geo.acc);
  const at::Tensor s0 = acc_or_undefined(args.initial_state, geo.acc);
  at::Tensor out = at::empty({geo.T, geo.Nv, geo.Dv}, v.options());
  at::Tensor state = at::empty({geo.B, geo.Nv, geo.Dv, geo.Dk}, v.options().dtype(geo.acc));
  cpu::GdnChunkParams p = make_params(geo, q, k, v, beta, g, s0, args.scale);
  p.out = out.data_ptr();
  p.state = state.data_ptr();
  cpu::chunk_gated_delta_rule_forward_stub(p);
  return {out, state.to(state_dtype(args.initial_state, geo))};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> chunk_gated_delta_rule_backward_cpu(
    const ChunkGatedDeltaRuleBackwardArgs& args) {
  const char* op = "chunk_gated_delta_rule_backward";
  const Geometry geo = check_inputs(op, args.query, args.key, args.value, args.beta, args.initial_state,
                                    args.actual_seq_lengths, args.scale, args.g);
  TORCH_CHECK_TYPE(args.d_out.scalar_type() == args.value.scalar_type(), op, ": argument 'd_out' must have value's "
                   "dtype ", args.value.scalar_type(), "; got ", args.d_out.scalar_type());
  TORCH_CHECK_VALUE(args.d_out.sizes() == args.value.sizes(), op, ": argument 'd_out' must have value's shape ",
                    args.value.sizes(), "; got ", args.d_out.sizes());
  if (args.d_final_state.has_value()) {
    check_float(op, "d_final_state", *args.d_final_state);
    const std::vector<int64_t> want{geo.B, geo.Nv, geo.Dv, geo.Dk};
    TORCH_CHECK_VALUE(args.d_final_state->sizes() == at::IntArrayRef(want), op,
                      ": argument 'd_final_state' must be [B, Nv, Dv, Dk] = ", at::IntArrayRef(want), "; got shape ",
                      args.d_final_state->sizes());
  }
  const at::Tensor q = args.query.contiguous(), k = args.key.contiguous(), v = args.value.contiguous();
  const at::Tensor d_out = args.d_out.contiguous();
  const at::Tensor beta = acc_or_undefined(args.beta, geo.acc), g = acc_or_undefined(args.g, geo.acc);
  const at::Tensor s0 = acc_or_undefined(args.initial_state, geo.acc);
  const at::Tensor d_state = acc_or_undefined(args.d_final_state, geo.acc);
  const auto acc = v.options().dtype(geo.acc);
  // dq / dk per value head; summed over each key head's group below, in head order.
  at::Tensor dq_h = at::empty({geo.T, geo.Nv, geo.Dk}, acc), dk_h = at::empty({geo.T, geo.Nv, geo.Dk}, acc);
  at::Tensor dv = at::empty({geo.T, geo.Nv, geo.Dv}, acc);
  at::Tensor dbeta = at::empty({geo.T, geo.Nv}, acc), dg = at::empty({geo.T, geo.Nv}, acc);
  at::Tensor ds0 = at::empty({geo.B, geo.Nv, geo.Dv, geo.Dk}, acc);
  cpu::GdnChunkParams p = make_params(geo, q, k, v, beta, g, s0, args.scale);
  p.d_out = d_out.const_data_ptr();
  p.d_state = ptr(d_state);
  p.dq = dq_h.data_ptr();
  p.dk = dk_h.data_ptr();
  p.dv = dv.data_ptr();
  p.dbeta = dbeta.data_ptr();
  p.dg = dg.data_ptr();
  p.d_state0 = ds0.data_ptr();
  cpu::chunk_gated_delta_rule_backward_stub(p);
  // The group sum: a sum over a dimension of size Nv / Nk in index order (no reduction kernel whose order could
  // depend on the thread count).
  const int64_t group = geo.Nv / geo.Nk;
  at::Tensor dq = dq_h.view({geo.T, geo.Nk, group, geo.Dk}).select(2, 0).clone();
  at::Tensor dk = dk_h.view({geo.T, geo.Nk, group, geo.Dk}).select(2, 0).clone();
  for (int64_t j = 1; j < group; ++j) {
    dq.add_(dq_h.view({geo.T, geo.Nk, group, geo.Dk}).select(2, j));
    dk.add_(dk_h.view({geo.T, geo.Nk, group, geo.Dk}).select(2, j));
  }
  const auto empty_or = [&](const std::optional<at::Tensor>& in, const at::Tensor& grad) {
    return in.has_value() ? grad.to(in->scalar_type()) : at::empty({0}, v.options());
  };
  return {dq.to(args.query.scalar_type()), dk.to(args.key.scalar_type()), dv.to(args.value.scalar_type()),
          empty_or(args.beta, dbeta), empty_or(args.initial_state, ds0), empty_or(args.g, dg)};
}

}  // namespace npu_fa
