// CPU kernel of dequant_swiglu_quant (torch_npu npu_dequant_swiglu_quant): the dequantisation and the gated
// activation are ATen element-wise passes over the computed rows in fp32 (swiglu_variants.h); the per-row int8
// quantisation runs on the intra-op threads through the quant family's vector stubs (quant_kernels.h: the
// dynamic_quant rounding, half to even and saturated).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <vector>

#include "common/quant/dequant_swiglu_quant.h"
#include "cpu/quant/quant_kernels.h"
#include "cpu/quant/swiglu_variants.h"
#include "generated/kernels.h"

namespace npu_fa {

namespace {

// Calls f(group, row0, row1) for the non-empty groups of the plan's computed rows.
template <typename F>
void for_groups(const quant::DequantSwigluQuantPlan& p, F&& f) {
  int64_t start = 0;
  for (int64_t g = 0; g < static_cast<int64_t>(p.group_end.size()); ++g) {
    if (p.group_end[g] > start) f(g, start, p.group_end[g]);
    start = p.group_end[g];
  }
}

// The dequantised rows [active_rows, cols] of x in fp32: float(x + int32 bias) * weight_scale[g] *
// activation_scale[r] + float bias for an int32 x; x itself otherwise.
at::Tensor dequantise(const DequantSwigluQuantArgs& args, const quant::DequantSwigluQuantPlan& p) {
  const at::Tensor rows = args.x.reshape({p.rows, p.cols}).narrow(0, 0, p.active_rows);
  if (args.x.scalar_type() != at::kInt) return rows.to(at::kFloat, /*non_blocking=*/false, /*copy=*/true);
  const bool int_bias = args.bias.has_value() && args.bias->scalar_type() == at::kInt;
  at::Tensor d = (int_bias ? rows + args.bias->reshape({1, p.cols}) : rows).to(at::kFloat);
  if (args.weight_scale.has_value()) {
    const at::Tensor ws = quant::per_group_table("dequant_swiglu_quant", "weight_scale", *args.weight_scale, p.groups,
                                                 p.cols);
    for_groups(p, [&](int64_t g, int64_t r0, int64_t r1) { d.narrow(0, r0, r1 - r0).mul_(ws[g]); });
  }
  if (args.activation_scale.has_value())
    d.mul_(args.activation_scale->reshape({p.rows, 1}).narrow(0, 0, p.active_rows));
  if (args.bias.has_value() && !int_bias) d.add_(args.bias->to(at::kFloat).reshape({1, p.cols}));
  return d;
}

// The gated activation of the dequantised rows, split along activate_dim: [computed rows of y, y_cols], contiguous.
at::Tensor activate(const DequantSwigluQuantArgs& args, const quant::DequantSwigluQuantPlan& p, const at::Tensor& d) {
  // The computed rows of x viewed as [pre, cut, post] around activate_dim (all rows when it is not the last one).
  const at::Tensor v = p.last_dim ? d.view({p.active_rows, p.cut, 1}) : d.view({p.pre, p.cut, p.post});
  at::Tensor a, b;
  if (args.swiglu_mode == 1) {
    a = v.slice(1, 0, p.cut, 2);
    b = v.slice(1, 1, p.cut, 2);
  } else {
    const at::Tensor first = v.narrow(1, 0, p.cut / 2), second = v.narrow(1, p.cut / 2, p.cut / 2);
    a = args.activate_left ? first : second;
    b = args.activate_left ? second : first;
  }
  const at::Tensor s = args.swiglu_mode == 0
                           ? cpu::swiglu_fp32(a, b)
                           : cpu::clamped_swiglu_fp32(a, b, args.glu_alpha, args.clamp_limit, args.glu_bias);
  return s.contiguous().view({-1, p.y_cols});
}

}  // namespace

std::tuple<at::Tensor, at::Tensor> dequant_swiglu_quant_cpu(const DequantSwigluQuantArgs& args) {
  const quant::DequantSwigluQuantPlan p = quant::parse_dequant_swiglu_quant(args);
  const at::TensorOptions opts = args.x.options();
  at::Tensor y = at::zeros(p.y_shape, opts.dtype(at::kChar));
  at::Tensor scale = at::zeros(p.scale_shape, opts.dtype(at::kFloat));
  if (p.active_rows == 0 || p.cols == 0) return {y, scale};

  const at::Tensor s = activate(args, p, dequantise(args, p));
  const int64_t n = p.y_cols, rows = s.size(0);
  // Group of each computed row of y (rows of y and x coincide when activate_dim is the last dimension; otherwise
  // there is one group).
  std::vector<int64_t> group_of_row(rows, 0);
  for_groups(p, [&](int64_t g, int64_t r0, int64_t r1) {
    if (p.last_dim) std::fill(group_of_row.begin() + r0, group_of_row.begin() + r1, g);
  });
  const bool dynamic = args.quant_mode == 1;
  at::Tensor qs, qo;
  if (args.quant_scale.has_value())
    qs = quant::per_group_table("dequant_swiglu_quant", "quant_scale", *args.quant_scale, p.groups, n);
  if (args.quant_offset.has_value())
    qo = quant::per_group_table("dequant_swiglu_quant", "quant_offset", *args.quant_offset, p.groups, n);
  const float* sp = s.data_ptr<float>();
  const float* qsp = qs.defined() ? qs.data_ptr<float>() : nullptr;
  const float* qop = qo.defined() ? qo.data_ptr<float>() : nullptr;
  int8_t* yp = y.data_ptr<int8_t>();
  float* scp = scale.data_ptr<float>();
  at::parallel_for(0, rows, std::max<int64_t>(1, 8192 / n), [&](int64_t r0, int64_t r1) {
    std::vector<float> v(n), q(n);
    for (int64_t r = r0; r < r1; ++r) {
      const float* src = sp + r * n;
      const int64_t g = group_of_row[r];
      const float* qsr = qsp ? qsp + g * n : nullptr;
      const float* qor = qop ? qop + g * n : nullptr;
      if (dynamic) {
        for (int64_t i = 0; i < n; ++i) v[i] = qsr ? src[i] * qsr[i] : src[i];
        scp[r] = cpu::quantize_row_symmetric(v.data(), n, 127.f, q.data());
      } else {
        for (int64_t i = 0; i < n; ++i) {
          float t = qsr ? src[i] / qsr[i] : src[i];
          v[i] = qor ? t + qor[i] : t;
        }
        // v * 1 + 0 is exact: the stub only rounds half to even and saturates.
        cpu::quant_round_stub(v.data(), n, 1.f, false, 0.f, -128.f, 127.f, q.data());
      }
      int8_t* dst = yp + r * n;
      for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<int8_t>(q[i]);
    }
  });
  return {y, scale};
}

}  // namespace npu_fa
