// Argument checks of dequant_swiglu_quant (see the header).
#include "common/quant/dequant_swiglu_quant.h"

#include <c10/util/accumulate.h>

#include <cmath>

#include "generated/op_args.h"

namespace npu_fa::quant {

namespace {

constexpr const char* kOp = "dequant_swiglu_quant";

bool is_half_float(at::ScalarType s) { return s == at::kFloat || s == at::kHalf || s == at::kBFloat16; }

// [n] or [1, n] (shared), or [G, n] when per-group rows are allowed.
void check_row_table(const char* name, const at::Tensor& t, int64_t groups, int64_t n, bool per_group) {
  const bool shared = (t.dim() == 1 && t.size(0) == n) || (t.dim() == 2 && t.size(0) == 1 && t.size(1) == n);
  const bool grouped = per_group && t.dim() == 2 && t.size(0) == groups && t.size(1) == n;
  TORCH_CHECK_VALUE(shared || grouped, kOp, ": argument '", name, "' must have shape [", n, "] or [1, ", n, "]",
                    per_group ? " or [G, " : "", per_group ? std::to_string(n) + "] (G = " + std::to_string(groups) +
                    " groups)" : std::string(), "; got ", t.sizes());
}

}  // namespace

at::Tensor per_group_table(const char* op, const char* name, const at::Tensor& t, int64_t groups, int64_t n) {
  const at::Tensor f = t.to(at::kFloat);
  if (t.dim() == 2 && (t.size(0) == groups || t.size(0) == 1) && (t.size(1) == n || t.size(1) == 1))
    return f.expand({groups, n}).contiguous();
  if (t.dim() == 1 && t.size(0) == n) return f.view({1, n}).expand({groups, n}).contiguous();
  if (t.dim() == 1 && (t.size(0) == groups || t.size(0) == 1))
    return f.view({-1, 1}).expand({groups, n}).contiguous();
  TORCH_CHECK_VALUE(false, op, ": argument '", name, "' must have shape [G, ", n, "], [1, ", n, "], [", n,
                    "] (per channel), [G, 1] or [G] (per group) or [1], with G = ", groups, " groups; got ",
                    t.sizes());
  return f;
}

DequantSwigluQuantPlan parse_dequant_swiglu_quant(const DequantSwigluQuantArgs& args) {
  const at::Tensor& x = args.x;
  const auto xt = x.scalar_type();
  TORCH_CHECK_TYPE(xt == at::kInt || xt == at::kHalf || xt == at::kBFloat16, kOp,
                   ": argument 'x' must be int32 (a matmul accumulation), float16 or bfloat16; got ", xt);
  TORCH_CHECK_VALUE(x.dim() >= 2, kOp, ": argument 'x' must have at least 2 dimensions; got shape ", x.sizes());
  TORCH_CHECK_VALUE(args.quant_mode == 0 || args.quant_mode == 1, kOp,
                    ": argument 'quant_mode' must be 0 (static) or 1 (dynamic); got ", args.quant_mode);
  TORCH_CHECK_VALUE(args.swiglu_mode >= 0 && args.swiglu_mode <= 2, kOp,
                    ": argument 'swiglu_mode' must be 0 (SwiGLU), 1 (clamped, even/odd positions) or 2 (clamped, ",
                    "halves); got ", args.swiglu_mode);
  TORCH_CHECK_VALUE(std::isfinite(args.clamp_limit) && args.clamp_limit > 0, kOp,
                    ": argument 'clamp_limit' must be positive and finite; got ", args.clamp_limit);
  TORCH_CHECK_VALUE(std::isfinite(args.glu_alpha), kOp, ": argument 'glu_alpha' must be finite; got ",
                    args.glu_alpha);
  TORCH_CHECK_VALUE(std::isfinite(args.glu_bias), kOp, ": argument 'glu_bias' must be finite; got ", args.glu_bias);
  TORCH_CHECK_VALUE(args.activate_dim >= -x.dim() && args.activate_dim < x.dim(), kOp,
                    ": argument 'activate_dim' must be in [", -x.dim(), ", ", x.dim() - 1, "] for x of shape ",
                    x.sizes(), "; got ", args.activate_dim);

  DequantSwigluQuantPlan p;
  p.dim = args.activate_dim < 0 ? args.activate_dim + x.dim() : args.activate_dim;
  p.last_dim = p.dim == x.dim() - 1;
  TORCH_CHECK_VALUE(x.size(p.dim) % 2 == 0, kOp, ": argument 'x' must have an even size along activate_dim ",
                    args.activate_dim, " (it is split in two); got shape ", x.sizes());
  p.cols = x.size(-1);
  p.rows = c10::multiply_integers(x.sizes().slice(0, x.dim() - 1));
  p.pre = c10::multiply_integers(x.sizes().slice(0, p.dim));
  p.cut = x.size(p.dim);
  p.post = c10::multiply_integers(x.sizes().slice(p.dim + 1));
  p.y_shape.assign(x.sizes().begin(), x.sizes().end());
  p.y_shape[p.dim] /= 2;
  p.scale_shape.assign(p.y_shape.begin(), p.y_shape.end() - 1);
  p.y_cols = p.y_shape.back();
  p.y_rows = c10::multiply_integers(p.scale_shape);
  if (!p.last_dim) {
    TORCH_CHECK_VALUE(!args.group_index.has_value(), kOp, ": argument 'group_index' must be None when activate_dim (",
                      args.activate_dim, ") is not x's last dimension");
    TORCH_CHECK_VALUE(args.quant_mode == 0, kOp, ": quant_mode 1 (dynamic) needs activate_dim to be x's last ",
                      "dimension; got activate_dim ", args.activate_dim, " for x of shape ", x.sizes());
  }

  // Row groups.
  p.active_rows = p.rows;
  p.group_end = {p.rows};
  if (args.group_index.has_value()) {
    const at::Tensor& gi = *args.group_index;
    TORCH_CHECK_TYPE(gi.scalar_type() == at::kLong || gi.scalar_type() == at::kInt, kOp,
                     ": argument 'group_index' must be int64 (or int32) token counts; got ", gi.scalar_type());
    TORCH_CHECK_VALUE(gi.dim() == 1 && gi.numel() >= 1, kOp, ": argument 'group_index' must be 1-D with at least ",
                      "one group (token counts per group); got shape ", gi.sizes());
    const at::Tensor g = gi.to(at::kCPU, at::kLong).contiguous();
    const int64_t* gp = g.data_ptr<int64_t>();
    p.groups = g.numel();
    p.group_end.assign(p.groups, 0);
    int64_t end = 0;
    for (int64_t i = 0; i < p.groups; ++i) {
      TORCH_CHECK_VALUE(gp[i] >= 0, kOp, ": argument 'group_index' must hold token counts >= 0; got ", gp[i],
                        " at position ", i);
      end += gp[i];
      TORCH_CHECK_VALUE(end <= p.rows, kOp, ": argument 'group_index' must sum to at most the row count of x (",
                        p.rows, " = numel / x.size(-1)); its first ", i + 1, " counts sum to ", end);
      p.group_end[i] = end;
    }
    p.active_rows = end;
  }

  const bool int_x = xt == at::kInt;
  if (args.weight_scale.has_value()) {
    const at::Tensor& w = *args.weight_scale;
    TORCH_CHECK_TYPE(w.scalar_type() == at::kFloat, kOp, ": argument 'weight_scale' must be float32; got ",
                     w.scalar_type());
    check_row_table("weight_scale", w, p.groups, p.cols, true);
  }
  if (args.activation_scale.has_value()) {
    const at::Tensor& a = *args.activation_scale;
    TORCH_CHECK_VALUE(int_x, kOp, ": argument 'activation_scale' must be None for ", xt, " x (it dequantises an ",
                      "int32 x)");
    TORCH_CHECK_TYPE(a.scalar_type() == at::kFloat, kOp, ": argument 'activation_scale' must be float32; got ",
                     a.scalar_type());
    const auto lead = x.sizes().slice(0, x.dim() - 1);
    const bool ok = a.sizes() == lead || (a.dim() == x.dim() && a.sizes().slice(0, x.dim() - 1) == lead &&
                                          a.size(-1) == 1);
    TORCH_CHECK_VALUE(ok, kOp, ": argument 'activation_scale' must have shape ", lead, " (one value per row of x, ",
                      "optionally with a trailing 1); got ", a.sizes());
  }
  if (args.bias.has_value()) {
    const at::Tensor& b = *args.bias;
    TORCH_CHECK_VALUE(int_x, kOp, ": argument 'bias' must be None for ", xt, " x (it is added to an int32 x)");
    TORCH_CHECK_VALUE(!args.group_index.has_value(), kOp, ": argument 'bias' must be None with group_index");
    TORCH_CHECK_TYPE(b.scalar_type() == at::kInt || is_half_float(b.scalar_type()), kOp,
                     ": argument 'bias' must be int32, float32, float16 or bfloat16; got ", b.scalar_type());
    check_row_table("bias", b, 1, p.cols, false);
  }
  if (args.quant_scale.has_value()) {
    const at::Tensor& q = *args.quant_scale;
    if (args.quant_mode == 0) {
      TORCH_CHECK_TYPE(q.scalar_type() == at::kFloat, kOp, ": argument 'quant_scale' must be float32 in static ",
                       "quantisation (quant_mode 0); got ", q.scalar_type());
    } else {
      TORCH_CHECK_TYPE(is_half_float(q.scalar_type()), kOp, ": argument 'quant_scale' must be float32, float16 or ",
                       "bfloat16; got ", q.scalar_type());
    }
    per_group_table(kOp, "quant_scale", q, p.groups, p.y_cols);
  }
  if (args.quant_offset.has_value()) {
    const at::Tensor& o = *args.quant_offset;
    TORCH_CHECK_VALUE(args.quant_mode == 0, kOp, ": argument 'quant_offset' applies to static quantisation only; ",
                      "it must be None with quant_mode 1 (dynamic)");
    TORCH_CHECK_TYPE(is_half_float(o.scalar_type()), kOp, ": argument 'quant_offset' must be float32, float16 or ",
                     "bfloat16; got ", o.scalar_type());
    per_group_table(kOp, "quant_offset", o, p.groups, p.y_cols);
  }
  return p;
}

}  // namespace npu_fa::quant
