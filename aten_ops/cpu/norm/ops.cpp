// CPU entry points of the RMSNorm ops declared in native_functions.yaml (torch_npu's npu_rms_norm,
// npu_gemma_rms_norm, npu_rms_norm_backward, npu_add_rms_norm and its cast / quantised forms): validate, lay the
// tensors out as contiguous [rows, n] (n = gamma.numel(), the normalised trailing dimensions of x), convert gamma to
// the accumulation type once, and run the row loops of norm_kernels.h.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "cpu/norm/norm_kernels.h"
#include "cpu/quant/quant_kernels.h"
#include "generated/kernels.h"

namespace npu_fa {

namespace {

bool is_float(at::ScalarType s) {
  return s == at::kFloat || s == at::kHalf || s == at::kBFloat16 || s == at::kDouble;
}

// The accumulation (and rstd) dtype of rows of s: float64 for float64, float32 otherwise.
at::ScalarType acc_dtype(at::ScalarType s) { return s == at::kDouble ? at::kDouble : at::kFloat; }

void check_x(const char* op, const char* name, const at::Tensor& x) {
  TORCH_CHECK_TYPE(is_float(x.scalar_type()), op, ": argument '", name,
                   "' must be float16, bfloat16, float32 or float64; got ", x.scalar_type());
}

// gamma (and beta): the trailing dimensions of x, x's dtype or float32 for float16 / bfloat16 x.
void check_weight(const char* op, const char* name, const at::Tensor& w, const at::Tensor& x, const char* xname) {
  TORCH_CHECK_VALUE(w.dim() >= 1 && w.dim() <= x.dim() &&
                        w.sizes() == x.sizes().slice(static_cast<size_t>(x.dim() - w.dim())),
                    op, ": argument '", name, "' must have the shape of the trailing dimensions of ", xname, " (",
                    xname, ".shape[-", name, ".dim():], at least one dimension); got ", name, " shape ", w.sizes(),
                    " for ", xname, " shape ", x.sizes());
  const auto xs = x.scalar_type(), ws = w.scalar_type();
  const bool ok = ws == xs || (ws == at::kFloat && (xs == at::kHalf || xs == at::kBFloat16));
  TORCH_CHECK_TYPE(ok, op, ": argument '", name, "' must have ", xname, "'s dtype (", xs, ")",
                   xs == at::kHalf || xs == at::kBFloat16 ? " or float32" : "", "; got ", ws);
}

void check_epsilon(const char* op, double eps) {
  TORCH_CHECK_VALUE(eps > 0 && std::isfinite(eps), op, ": argument 'epsilon' must be a finite number > 0; got ", eps);
}

void check_same(const char* op, const char* name, const at::Tensor& t, const char* xname, const at::Tensor& x) {
  TORCH_CHECK_VALUE(t.sizes() == x.sizes(), op, ": argument '", name, "' must have ", xname, "'s shape ", x.sizes(),
                    "; got ", t.sizes());
  TORCH_CHECK_TYPE(t.scalar_type() == x.scalar_type(), op, ": argument '", name, "' must have ", xname, "'s dtype ",
                   x.scalar_type(), "; got ", t.scalar_type());
}

// x.shape[:-k] + [1] * k, k = gamma.dim(): the shape of rstd.
std::vector<int64_t> rstd_shape(const at::Tensor& x, int64_t k) {
  std::vector<int64_t> s(x.sizes().begin(), x.sizes().end());
  for (int64_t i = x.dim() - k; i < x.dim(); ++i) s[i] = 1;
  return s;
}

// gamma (+ 1 for the gemma form) as a contiguous tensor of the accumulation type.
at::Tensor weight_acc(const at::Tensor& w, at::ScalarType acc, bool plus_one = false) {
  at::Tensor g = w.to(acc).contiguous().view(-1);
  return plus_one ? (g + 1) : g;
}

struct Forward {
  at::Tensor y, rstd, x_out, y_acc;
};

// The shared forward of every RMSNorm op: x1 (+ x2) normalised over gamma's dimensions. want_y / want_y_acc: the
// outputs in x's dtype / in the accumulation type.
Forward run_forward(const at::Tensor& x1, const std::optional<at::Tensor>& x2, const at::Tensor& gamma,
                    const std::optional<at::Tensor>& beta, double eps, bool gemma, bool want_y, bool want_y_acc) {
  const at::ScalarType acc = acc_dtype(x1.scalar_type());
  const int64_t n = gamma.numel();
  const int64_t rows = n ? x1.numel() / n : 0;
  Forward f;
  f.rstd = at::empty(rstd_shape(x1, gamma.dim()), x1.options().dtype(acc));
  if (want_y) f.y = at::empty(x1.sizes(), x1.options());
  if (want_y_acc) f.y_acc = at::empty(x1.sizes(), x1.options().dtype(acc));
  if (x2.has_value()) f.x_out = at::empty(x1.sizes(), x1.options());
  if (x1.numel() == 0) {  // no rows, or rows of no values (rstd = 1 / sqrt(eps): the mean of no squares is 0)
    f.rstd.fill_(1.0 / std::sqrt(eps));
    return f;
  }
  const at::Tensor xc = x1.contiguous();
  const at::Tensor x2c = x2.has_value() ? x2->contiguous() : at::Tensor();
  const at::Tensor g = weight_acc(gamma, acc, gemma);
  const at::Tensor b = beta.has_value() ? weight_acc(*beta, acc) : at::Tensor();
  cpu::RmsNormParams p;
  p.dtype = x1.scalar_type();
  p.rows = rows;
  p.n = n;
  p.eps = eps;
  p.x1 = xc.const_data_ptr();
  p.x2 = x2c.defined() ? x2c.const_data_ptr() : nullptr;
  p.gamma = g.const_data_ptr();
  p.beta = b.defined() ? b.const_data_ptr() : nullptr;
  p.x_out = f.x_out.defined() ? f.x_out.mutable_data_ptr() : nullptr;
  p.y = f.y.defined() ? f.y.mutable_data_ptr() : nullptr;
  p.y_acc = f.y_acc.defined() ? f.y_acc.mutable_data_ptr() : nullptr;
  p.rstd = f.rstd.mutable_data_ptr();
  cpu::rms_norm_rows_stub(p);
  return f;
}

void check_add_inputs(const char* op, const at::Tensor& x1, const at::Tensor& x2, const at::Tensor& gamma,
                      double eps) {
  check_x(op, "x1", x1);
  check_same(op, "x2", x2, "x1", x1);
  check_weight(op, "gamma", gamma, x1, "x1");
  check_epsilon(op, eps);
}

}  // namespace

// ---------------------------------------------------------------------------------------------------------------
// rms_norm, rms_norm_grad
// ---------------------------------------------------------------------------------------------------------------
std::tuple<at::Tensor, at::Tensor> rms_norm_cpu(const RmsNormArgs& a) {
  const char* op = a.gemma ? "gemma_rms_norm" : "rms_norm";
  check_x(op, "x", a.x);
  check_weight(op, "gamma", a.gamma, a.x, "x");
  check_epsilon(op, a.epsilon);
  Forward f = run_forward(a.x, std::nullopt, a.gamma, std::nullopt, a.epsilon, a.gemma, true, false);
  return {f.y, f.rstd};
}

std::tuple<at::Tensor, at::Tensor> rms_norm_grad_cpu(const RmsNormGradArgs& a) {
  const char* op = "rms_norm_grad";
  check_x(op, "x", a.x);
  check_same(op, "dy", a.dy, "x", a.x);
  check_weight(op, "gamma", a.gamma, a.x, "x");
  const at::ScalarType acc = acc_dtype(a.x.scalar_type());
  const int64_t n = a.gamma.numel();
  const int64_t rows = n ? a.x.numel() / n : 0;
  TORCH_CHECK_TYPE(a.rstd.scalar_type() == acc, op, ": argument 'rstd' must be ", acc, " (the forward's rstd for x of ",
                   a.x.scalar_type(), "); got ", a.rstd.scalar_type());
  TORCH_CHECK_VALUE(a.rstd.numel() == rows, op, ": argument 'rstd' must hold one value per row of x (",
                    "x.shape[:-gamma.dim()], ", rows, " rows); got shape ", a.rstd.sizes());
  if (a.dx_residual.has_value()) check_same(op, "dx_residual", *a.dx_residual, "x", a.x);
  at::Tensor dx = at::empty(a.x.sizes(), a.x.options());
  at::Tensor dgamma = at::zeros(a.gamma.sizes(), a.x.options().dtype(acc));
  if (a.x.numel() == 0) {
    if (a.dx_residual.has_value()) dx.copy_(*a.dx_residual);
    return {dx, dgamma};
  }
  const at::Tensor xc = a.x.contiguous(), dyc = a.dy.contiguous(), rc = a.rstd.contiguous();
  const at::Tensor res = a.dx_residual.has_value() ? a.dx_residual->contiguous() : at::Tensor();
  const at::Tensor g = weight_acc(a.gamma, acc, a.gemma);
  cpu::RmsNormGradParams p;
  p.dtype = a.x.scalar_type();
  p.rows = rows;
  p.n = n;
  p.dy = dyc.const_data_ptr();
  p.x = xc.const_data_ptr();
  p.gamma = g.const_data_ptr();
  p.rstd = rc.const_data_ptr();
  p.dx_residual = res.defined() ? res.const_data_ptr() : nullptr;
  p.dx = dx.mutable_data_ptr();
  p.dgamma = dgamma.mutable_data_ptr();
  cpu::rms_norm_grad_rows_stub(p);
  return {dx, dgamma};
}

}  // namespace npu_fa

namespace npu_fa {

// ---------------------------------------------------------------------------------------------------------------
// add_rms_norm, add_rms_norm_cast
// ---------------------------------------------------------------------------------------------------------------
std::tuple<at::Tensor, at::Tensor, at::Tensor> add_rms_norm_cpu(const AddRmsNormArgs& a) {
  check_add_inputs("add_rms_norm", a.x1, a.x2, a.gamma, a.epsilon);
  Forward f = run_forward(a.x1, a.x2, a.gamma, std::nullopt, a.epsilon, false, true, false);
  return {f.y, f.rstd, f.x_out};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> add_rms_norm_cast_cpu(const AddRmsNormCastArgs& a) {
  const char* op = "add_rms_norm_cast";
  check_add_inputs(op, a.x1, a.x2, a.gamma, a.epsilon);
  TORCH_CHECK_TYPE(a.x1.scalar_type() != at::kDouble, op, ": argument 'x1' must be float16, bfloat16 or float32 (",
                   "y1 is its float32 copy); got ", a.x1.scalar_type());
  Forward f = run_forward(a.x1, a.x2, a.gamma, std::nullopt, a.epsilon, false, true, true);
  return {f.y_acc, f.y, f.rstd, f.x_out};
}

}  // namespace npu_fa

// ---------------------------------------------------------------------------------------------------------------
// The quantised forms: add_rms_norm_quant, add_rms_norm_dynamic_quant, rms_norm_quant
// ---------------------------------------------------------------------------------------------------------------
namespace npu_fa {

namespace {

void check_not_double(const char* op, const char* name, const at::Tensor& x) {
  TORCH_CHECK_TYPE(x.scalar_type() != at::kDouble, op, ": argument '", name,
                   "' must be float16, bfloat16 or float32; got ", x.scalar_type());
}

// A per-column quantisation parameter of gamma's shape (or, with one_value, a single value), floating (or int32 /
// int8 where int_ok), as fp32.
at::Tensor quant_param(const char* op, const char* name, const at::Tensor& t, const at::Tensor& gamma, bool int_ok,
                       bool one_value = false) {
  const auto s = t.scalar_type();
  const bool ok = s == at::kFloat || s == at::kHalf || s == at::kBFloat16 ||
                  (int_ok && (s == at::kInt || s == at::kChar));
  TORCH_CHECK_TYPE(ok, op, ": argument '", name, "' must be float32, bfloat16 or float16",
                   int_ok ? (one_value ? " (or int8)" : " (or int32)") : "", "; got ", s);
  if (one_value) {
    TORCH_CHECK_VALUE(t.numel() == 1, op, ": argument '", name, "' must hold one value (shape [1]); got shape ",
                      t.sizes());
  } else {
    TORCH_CHECK_VALUE(t.sizes() == gamma.sizes(), op, ": argument '", name, "' must have gamma's shape ",
                      gamma.sizes(), "; got ", t.sizes());
  }
  return t.to(at::kFloat).contiguous().view(-1);
}

// int8 [rows, n] of fp32 y [rows, n] (contiguous): clamp(round(y / scale + offset)) or with y * scale.
at::Tensor static_quant(const at::Tensor& y, const at::Tensor& scale, const at::Tensor& offset, bool divide) {
  at::Tensor out = at::empty(y.sizes(), y.options().dtype(at::kChar));
  if (y.numel() == 0) return out;
  cpu::StaticQuantParams p;
  p.n = scale.numel() == 1 && y.dim() > 0 ? y.size(-1) : scale.numel();
  p.rows = p.n ? y.numel() / p.n : 0;
  p.y = y.const_data_ptr<float>();
  p.scale = scale.const_data_ptr<float>();
  p.scale_stride = scale.numel() == 1 ? 0 : 1;
  p.offset = offset.defined() ? offset.const_data_ptr<float>() : nullptr;
  p.offset_stride = offset.defined() && offset.numel() == 1 ? 0 : 1;
  p.divide = divide;
  p.out = out.mutable_data_ptr<int8_t>();
  cpu::static_quant_rows_stub(p);
  return out;
}

}  // namespace

std::tuple<at::Tensor, at::Tensor, at::Tensor> add_rms_norm_quant_cpu(const AddRmsNormQuantArgs& a) {
  const char* op = "add_rms_norm_quant";
  check_add_inputs(op, a.x1, a.x2, a.gamma, a.epsilon);
  check_not_double(op, "x1", a.x1);
  TORCH_CHECK_VALUE(a.axis == -1, op, ": argument 'axis' must be -1 (quantisation along the normalised dimensions, ",
                    "the only axis implemented upstream); got ", a.axis);
  if (a.beta.has_value()) {
    check_weight(op, "beta", *a.beta, a.x1, "x1");
    TORCH_CHECK_VALUE(a.beta->sizes() == a.gamma.sizes(), op, ": argument 'beta' must have gamma's shape ",
                      a.gamma.sizes(), "; got ", a.beta->sizes());
  }
  TORCH_CHECK_VALUE(a.scales2.has_value() || !a.zero_points2.has_value(), op,
                    ": argument 'zero_points2' needs 'scales2' (the second output's scales); got scales2=None");
  const at::Tensor s1 = quant_param(op, "scales1", a.scales1, a.gamma, false);
  const at::Tensor z1 = a.zero_points1.has_value() ? quant_param(op, "zero_points1", *a.zero_points1, a.gamma, true)
                                                   : at::Tensor();
  const at::Tensor s2 = a.scales2.has_value() ? quant_param(op, "scales2", *a.scales2, a.gamma, false) : at::Tensor();
  const at::Tensor z2 = a.zero_points2.has_value() ? quant_param(op, "zero_points2", *a.zero_points2, a.gamma, true)
                                                   : at::Tensor();
  Forward f = run_forward(a.x1, a.x2, a.gamma, a.beta, a.epsilon, false, false, true);
  at::Tensor y1 = static_quant(f.y_acc, s1, z1, a.div_mode);
  at::Tensor y2 = s2.defined() ? static_quant(f.y_acc, s2, z2, a.div_mode) : at::zeros_like(y1);
  return {y1, y2, f.x_out};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> add_rms_norm_dynamic_quant_cpu(
    const AddRmsNormDynamicQuantArgs& a) {
  const char* op = "add_rms_norm_dynamic_quant";
  check_add_inputs(op, a.x1, a.x2, a.gamma, a.epsilon);
  check_not_double(op, "x1", a.x1);
  TORCH_CHECK_VALUE(a.gamma.dim() == 1, op, ": argument 'gamma' must be 1-D [H] (H = x1.size(-1), the rows that are ",
                    "quantised); got shape ", a.gamma.sizes());
  TORCH_CHECK_VALUE(a.output_y1 || a.output_y2, op, ": at least one of the outputs y1, y2 must be asked for ",
                    "(output_mask [False, False])");
  TORCH_CHECK_VALUE(a.output_y1 || !a.smooth_scale1.has_value(), op,
                    ": argument 'smooth_scale1' is given but output y1 is not asked for (output_mask[0] False)");
  TORCH_CHECK_VALUE(a.output_y2 || !a.smooth_scale2.has_value(), op,
                    ": argument 'smooth_scale2' is given but output y2 is not asked for (output_mask[1] False)");
  for (auto [name, t] : {std::pair<const char*, const std::optional<at::Tensor>*>{"smooth_scale1", &a.smooth_scale1},
                         {"smooth_scale2", &a.smooth_scale2}, {"beta", &a.beta}})
    if (t->has_value()) {
      check_weight(op, name, **t, a.x1, "x1");
      TORCH_CHECK_VALUE((*t)->sizes() == a.gamma.sizes(), op, ": argument '", name, "' must have gamma's shape ",
                        a.gamma.sizes(), "; got ", (*t)->sizes());
    }
  Forward f = run_forward(a.x1, a.x2, a.gamma, a.beta, a.epsilon, false, false, true);
  const int64_t H = a.gamma.numel();
  const int64_t rows = H ? a.x1.numel() / H : 0;
  std::vector<int64_t> row_shape(a.x1.sizes().begin(), a.x1.sizes().end() - 1);
  const auto i8 = a.x1.options().dtype(at::kChar);
  const auto f32 = a.x1.options().dtype(at::kFloat);
  at::Tensor y[2], scale[2], smooth[2];
  const bool want[2] = {a.output_y1, a.output_y2};
  const std::optional<at::Tensor>* smooth_arg[2] = {&a.smooth_scale1, &a.smooth_scale2};
  for (int k = 0; k < 2; ++k) {
    // An output not asked for is a zero-dimensional 0, as upstream's kernel returns it.
    y[k] = want[k] ? at::empty(a.x1.sizes(), i8) : at::zeros({}, i8);
    scale[k] = want[k] ? at::empty(row_shape, f32) : at::zeros({}, f32);
    if (smooth_arg[k]->has_value()) smooth[k] = (*smooth_arg[k])->to(at::kFloat).contiguous();
  }
  if (rows > 0 && H > 0) {
    const float* yp = f.y_acc.const_data_ptr<float>();
    at::parallel_for(0, rows, std::max<int64_t>(1, 8192 / H), [&](int64_t r0, int64_t r1) {
      std::vector<float> v(H), q(H);
      for (int64_t r = r0; r < r1; ++r) {
        for (int k = 0; k < 2; ++k) {
          if (!want[k]) continue;
          const float* row = yp + r * H;
          if (smooth[k].defined()) {
            const float* sp = smooth[k].const_data_ptr<float>();
            for (int64_t h = 0; h < H; ++h) v[h] = row[h] * sp[h];
          } else {
            std::copy(row, row + H, v.begin());
          }
          scale[k].mutable_data_ptr<float>()[r] = cpu::quantize_row_symmetric(v.data(), H, 127.f, q.data());
          int8_t* out = y[k].mutable_data_ptr<int8_t>() + r * H;
          for (int64_t h = 0; h < H; ++h) out[h] = static_cast<int8_t>(q[h]);
        }
      }
    });
  } else {
    for (int k = 0; k < 2; ++k)
      if (want[k]) scale[k].zero_();
  }
  return {y[0], y[1], f.x_out, scale[0], scale[1]};
}

at::Tensor rms_norm_quant_cpu(const RmsNormQuantArgs& a) {
  const char* op = "rms_norm_quant";
  check_x(op, "x", a.x);
  check_not_double(op, "x", a.x);
  check_epsilon(op, a.epsilon);
  TORCH_CHECK_VALUE(a.x.dim() >= 1, op, ": argument 'x' must have at least 1 dimension; got a scalar");
  const int64_t H = a.x.size(-1);
  // gamma, beta: [H] or [1, H]; the normalised row is the last dimension of x.
  for (auto [name, t] : {std::pair<const char*, const at::Tensor*>{"gamma", &a.gamma}, {"beta", &a.beta}}) {
    TORCH_CHECK_VALUE((t->dim() == 1 && t->size(0) == H) || (t->dim() == 2 && t->size(0) == 1 && t->size(1) == H),
                      op, ": argument '", name, "' must have shape [H] or [1, H] with H = x.size(-1) = ", H,
                      "; got ", t->sizes());
    const auto xs = a.x.scalar_type(), ws = t->scalar_type();
    TORCH_CHECK_TYPE(ws == xs || ws == at::kFloat, op, ": argument '", name, "' must have x's dtype (", xs,
                     ") or float32; got ", ws);
  }
  const at::Tensor gamma = a.gamma.reshape({H}), beta = a.beta.reshape({H});
  const at::Tensor s = quant_param(op, "scale", a.scale, gamma, false, true);
  const at::Tensor o = quant_param(op, "offset", a.offset, gamma, true, true);
  Forward f = run_forward(a.x, std::nullopt, gamma, beta, a.epsilon, false, false, true);
  return static_quant(f.y_acc, s, o, false);
}

}  // namespace npu_fa
