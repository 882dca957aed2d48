// CPU kernels of the activation quantisation (dynamic_quant, dynamic_block_quant) and SwiGLU (swiglu, swiglu_grad) ops. The row math is
// vectorised in quant_kernels_isa.cpp; here rows are converted to fp32, scheduled with at::parallel_for and narrowed.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "cpu/quant/quant_kernels.h"
#include "generated/kernels.h"

namespace npu_fa {

namespace {

void check_activation(const char* op, const char* name, const at::Tensor& t, bool allow_double) {
  const auto s = t.scalar_type();
  TORCH_CHECK_TYPE(s == at::kFloat || s == at::kHalf || s == at::kBFloat16 || (allow_double && s == at::kDouble), op,
                   ": argument '", name, "' must be float16, bfloat16, float32", allow_double ? " or float64" : "",
                   "; got ", s);
}

// H values of any float dtype into an fp32 row.
template <typename scalar_t>
inline void load_row(const scalar_t* src, int64_t H, float* buf) {
  for (int64_t h = 0; h < H; ++h) buf[h] = static_cast<float>(src[h]);
}

}  // namespace

// ---------------------------------------------------------------------------------------------------------------
// dynamic_quant
// ---------------------------------------------------------------------------------------------------------------
std::tuple<at::Tensor, at::Tensor, at::Tensor> dynamic_quant_cpu(const DynamicQuantArgs& args) {
  const char* op = "dynamic_quant";
  const at::Tensor& x = args.x;
  check_activation(op, "x", x, false);
  TORCH_CHECK_VALUE(x.dim() >= 2, op, ": argument 'x' must have at least 2 dimensions (rows of the last one); got ",
                    "shape ", x.sizes());
  TORCH_CHECK_VALUE(args.bits == 8 || args.bits == 4, op, ": argument 'bits' must be 8 (int8) or 4 (int4 packed in ",
                    "int32); got ", args.bits);
  const int64_t H = x.size(-1);
  const int64_t S = H ? x.numel() / H : 0;
  if (args.bits == 4)
    TORCH_CHECK_VALUE(H % 8 == 0, op, ": int4 output packs 8 values per int32: x.size(-1) must be a multiple of 8; ",
                      "got ", H);
  // Per row: the smooth row to apply (-1: none).
  std::vector<int64_t> group_of_row;
  at::Tensor smooth;
  if (args.group_index.has_value()) {
    TORCH_CHECK_VALUE(args.smooth_scales.has_value(), op, ": argument 'group_index' needs 'smooth_scales' (one ",
                      "row of smooth scales per group)");
    const at::Tensor& gi = *args.group_index;
    TORCH_CHECK_TYPE(gi.scalar_type() == at::kInt || gi.scalar_type() == at::kLong, op,
                     ": argument 'group_index' must be int32 or int64; got ", gi.scalar_type());
    TORCH_CHECK_VALUE(gi.dim() == 1, op, ": argument 'group_index' must be 1-D [G]; got shape ", gi.sizes());
    TORCH_CHECK_VALUE(args.smooth_scales->dim() == 2 && args.smooth_scales->size(0) == gi.size(0) &&
                          args.smooth_scales->size(1) == H,
                      op, ": argument 'smooth_scales' of shape ", args.smooth_scales->sizes(), " must be [G, H] = [",
                      gi.size(0), ", ", H, "] with group_index");
    const at::Tensor g = gi.to(at::kLong).contiguous();
    const int64_t* gp = g.data_ptr<int64_t>();
    const int64_t G = g.numel();
    TORCH_CHECK_VALUE(G >= 1 && gp[G - 1] == S, op, ": argument 'group_index' must end at the row count of x (",
                      "numel / x.size(-1) = ", S, "); got ", G ? gp[G - 1] : int64_t{-1}, G ? "" : " (empty)");
    group_of_row.assign(S, -1);
    int64_t start = 0;
    for (int64_t grp = 0; grp < G; ++grp) {
      TORCH_CHECK_VALUE(gp[grp] >= start, op, ": argument 'group_index' must be nondecreasing and >= 0 (cumulative ",
                        "row ends); got ", gp[grp], " at position ", grp, " after ", start);
      for (int64_t r = start; r < gp[grp]; ++r) group_of_row[r] = grp;
      start = gp[grp];
    }
  } else if (args.smooth_scales.has_value()) {
    TORCH_CHECK_VALUE(args.smooth_scales->dim() == 1 && args.smooth_scales->size(0) == H, op,
                      ": argument 'smooth_scales' of shape ", args.smooth_scales->sizes(), " must be [H] = [", H,
                      "] without group_index");
    group_of_row.assign(S, 0);
  }
  if (args.smooth_scales.has_value()) {
    check_activation(op, "smooth_scales", *args.smooth_scales, false);
    smooth = args.smooth_scales->to(at::kFloat).contiguous();
  }
  const float qmax = args.bits == 8 ? 127.f : 7.f;
  std::vector<int64_t> out_shape(x.sizes().begin(), x.sizes().end());
  std::vector<int64_t> row_shape(x.sizes().begin(), x.sizes().end() - 1);
  if (args.bits == 4) out_shape.back() = H / 8;
  at::Tensor y = at::empty(out_shape, x.options().dtype(args.bits == 8 ? at::kChar : at::kInt));
  at::Tensor scale = at::empty(row_shape, x.options().dtype(at::kFloat));
  at::Tensor offset = args.asymmetric ? at::empty(row_shape, x.options().dtype(at::kFloat))
                                      : at::empty({0}, x.options().dtype(at::kFloat));
  if (S == 0 || H == 0) {
    if (scale.numel()) scale.zero_();
    if (offset.numel()) offset.zero_();
    return {y, scale, offset};
  }
  const at::Tensor xc = x.contiguous();
  const float* sp = smooth.defined() ? smooth.data_ptr<float>() : nullptr;
  float* scp = scale.data_ptr<float>();
  float* ofp = args.asymmetric ? offset.data_ptr<float>() : nullptr;
  int8_t* y8 = args.bits == 8 ? y.data_ptr<int8_t>() : nullptr;
  int32_t* y4 = args.bits == 4 ? y.data_ptr<int32_t>() : nullptr;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, xc.scalar_type(), "dynamic_quant", [&] {
    const scalar_t* xp = xc.data_ptr<scalar_t>();
    at::parallel_for(0, S, std::max<int64_t>(1, 8192 / H), [&](int64_t r0, int64_t r1) {
      std::vector<float> v(H), q(H);
      for (int64_t r = r0; r < r1; ++r) {
        load_row(xp + r * H, H, v.data());
        const int64_t grp = sp ? group_of_row[r] : -1;
        if (grp >= 0)
          for (int64_t h = 0; h < H; ++h) v[h] *= sp[grp * H + h];
        if (!args.asymmetric) {
          scp[r] = cpu::quantize_row_symmetric(v.data(), H, qmax, q.data());
        } else {
          float lo, hi;
          cpu::quant_minmax_stub(v.data(), H, &lo, &hi);
          const float s = (hi - lo) / (2.f * qmax + 1.f);
          const float o = s == 0.f ? 0.f : qmax - hi / s;
          scp[r] = s;
          ofp[r] = o;
          if (s == 0.f)
            std::fill(q.begin(), q.end(), 0.f);
          else
            cpu::quant_round_stub(v.data(), H, s, true, o, -qmax - 1.f, qmax, q.data());
        }
        if (y8) {
          int8_t* yp = y8 + r * H;
          for (int64_t h = 0; h < H; ++h) yp[h] = static_cast<int8_t>(q[h]);
        } else {
          int32_t* yp = y4 + r * (H / 8);
          for (int64_t w = 0; w < H / 8; ++w) {
            uint32_t packed = 0;
            for (int64_t j = 0; j < 8; ++j)
              packed |= (static_cast<uint32_t>(static_cast<int32_t>(q[w * 8 + j])) & 0xFu) << (4 * j);
            yp[w] = static_cast<int32_t>(packed);
          }
        }
      }
    });
  });
  return {y, scale, offset};
}

// ---------------------------------------------------------------------------------------------------------------
// dynamic_block_quant
// ---------------------------------------------------------------------------------------------------------------
namespace {

// The quantised target of dynamic_block_quant: its dtype and largest value.
struct BlockQuantTarget {
  at::ScalarType dtype;
  float max;
};

BlockQuantTarget block_quant_target(const char* op, int64_t dst_type, double dst_type_max) {
  BlockQuantTarget t{};
  switch (dst_type) {
    case static_cast<int64_t>(at::kChar): t = {at::kChar, 127.f}; break;
    case static_cast<int64_t>(at::kFloat8_e4m3fn): t = {at::kFloat8_e4m3fn, 448.f}; break;
    case static_cast<int64_t>(at::kFloat8_e5m2): t = {at::kFloat8_e5m2, 57344.f}; break;
    default:
      TORCH_CHECK_VALUE(false, op, ": argument 'dst_type' must be a torch dtype code of int8 (1), float8_e4m3fn (24) ",
                        "or float8_e5m2 (23); got ", dst_type);
  }
  TORCH_CHECK_VALUE(dst_type_max >= 0 && dst_type_max <= t.max, op, ": argument 'dst_type_max' must be 0 (the ",
                    "target's largest value, ", t.max, ") or in (0, ", t.max, "]; got ", dst_type_max);
  if (dst_type_max > 0) t.max = static_cast<float>(dst_type_max);
  return t;
}

// One block's rows [r0, r1) x columns [c0, c1) of an [M, N] matrix: its scale, and y = cast(x * factor).
template <typename scalar_t, typename out_t>
float quantize_block(const scalar_t* x, out_t* y, int64_t N, int64_t r0, int64_t r1, int64_t c0, int64_t c1,
                     float qmax, float min_scale, bool is_int8) {
  float amax = 0.f;  // NaN when the block holds one: it propagates to the scale, as dynamic_quant's does
  for (int64_t r = r0; r < r1; ++r)
    for (int64_t c = c0; c < c1; ++c) {
      const float a = std::abs(static_cast<float>(x[r * N + c]));
      amax = std::isnan(a) || std::isnan(amax) ? std::numeric_limits<float>::quiet_NaN() : std::max(amax, a);
    }
  // scale = max(amax / Q, min_scale); the values are multiplied by the factor that scale stands for (Q / amax, or
  // 1 / min_scale), as upstream computes them.
  const bool floor = min_scale > 0.f && amax / qmax < min_scale;
  const float scale = floor ? min_scale : amax / qmax;
  const float factor = scale == 0.f ? 0.f : floor ? 1.f / min_scale : qmax / amax;
  for (int64_t r = r0; r < r1; ++r)
    for (int64_t c = c0; c < c1; ++c) {
      float v = static_cast<float>(x[r * N + c]) * factor;
      if (is_int8) v = std::isnan(v) ? 0.f : std::min(127.f, std::max(-127.f, std::nearbyint(v)));  // int8 has no NaN
      y[r * N + c] = static_cast<out_t>(v);
    }
  return scale;
}

}  // namespace

std::tuple<at::Tensor, at::Tensor> dynamic_block_quant_cpu(const DynamicBlockQuantArgs& args) {
  const char* op = "dynamic_block_quant";
  const at::Tensor& x = args.x;
  check_activation(op, "x", x, false);
  TORCH_CHECK_VALUE(x.dim() == 2 || x.dim() == 3, op, ": argument 'x' must be 2-D [M, N] or 3-D [B, M, N]; got shape ",
                    x.sizes());
  TORCH_CHECK_VALUE(args.round_mode == "rint", op, ": argument 'round_mode' must be \"rint\" (\"round\" is ",
                    "hifloat8's, which is not implemented); got \"", args.round_mode, "\"");
  TORCH_CHECK_VALUE(args.row_block_size >= 1 && args.col_block_size >= 1, op, ": arguments 'row_block_size' and ",
                    "'col_block_size' must be >= 1; got ", args.row_block_size, " and ", args.col_block_size);
  TORCH_CHECK_VALUE(args.min_scale >= 0 && std::isfinite(args.min_scale), op,
                    ": argument 'min_scale' must be a finite value >= 0; got ", args.min_scale);
  const BlockQuantTarget target = block_quant_target(op, args.dst_type, args.dst_type_max);
  const int64_t B = x.dim() == 3 ? x.size(0) : 1, M = x.size(-2), N = x.size(-1);
  const int64_t rb = args.row_block_size, cb = args.col_block_size;
  const int64_t Mb = (M + rb - 1) / rb, Nb = (N + cb - 1) / cb;
  std::vector<int64_t> scale_shape{Mb, Nb};
  if (x.dim() == 3) scale_shape.insert(scale_shape.begin(), B);
  at::Tensor y = at::empty(x.sizes(), x.options().dtype(target.dtype));
  at::Tensor scale = at::empty(scale_shape, x.options().dtype(at::kFloat));
  if (x.numel() == 0) return {y, scale};
  const at::Tensor xc = x.contiguous();
  float* sp = scale.data_ptr<float>();
  const float min_scale = static_cast<float>(args.min_scale);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, xc.scalar_type(), "dynamic_block_quant", [&] {
    const scalar_t* xp = xc.data_ptr<scalar_t>();
    auto run = [&](auto* yp) {
      // One task per block row of one matrix: its blocks are disjoint from every other task's.
      at::parallel_for(0, B * Mb, std::max<int64_t>(1, 16384 / std::max<int64_t>(1, rb * N)), [&](int64_t t0,
                                                                                                  int64_t t1) {
        for (int64_t t = t0; t < t1; ++t) {
          const int64_t b = t / Mb, i = t % Mb, r0 = i * rb, r1 = std::min(M, r0 + rb);
          for (int64_t j = 0; j < Nb; ++j)
            sp[t * Nb + j] = quantize_block(xp + b * M * N, yp + b * M * N, N, r0, r1, j * cb,
                                            std::min(N, (j + 1) * cb), target.max, min_scale,
                                            target.dtype == at::kChar);
        }
      });
    };
    if (target.dtype == at::kChar)
      run(y.data_ptr<int8_t>());
    else if (target.dtype == at::kFloat8_e4m3fn)
      run(y.data_ptr<c10::Float8_e4m3fn>());
    else
      run(y.data_ptr<c10::Float8_e5m2>());
  });
  return {y, scale};
}

// ---------------------------------------------------------------------------------------------------------------
// swiglu / swiglu_grad
// ---------------------------------------------------------------------------------------------------------------
namespace {

// x viewed as [outer, 2, len]: A = x[o, 0], B = x[o, 1] (len = half * inner, contiguous).
struct Halves {
  int64_t dim, outer, len;
};

Halves split_halves(const char* op, const at::Tensor& x, int64_t dim) {
  check_activation(op, "x", x, true);
  TORCH_CHECK_VALUE(x.dim() >= 1, op, ": argument 'x' must have at least 1 dimension; got a 0-d tensor");
  TORCH_CHECK_VALUE(dim >= -x.dim() && dim < x.dim(), op, ": argument 'dim' must be in [", -x.dim(), ", ",
                    x.dim() - 1, "] for x of shape ", x.sizes(), "; got ", dim);
  const int64_t d = dim < 0 ? dim + x.dim() : dim;
  TORCH_CHECK_VALUE(x.size(d) % 2 == 0, op, ": argument 'x' must have an even size along dim ", dim,
                    " (it is split in halves); got shape ", x.sizes());
  Halves s{d, 1, x.size(d) / 2};
  for (int64_t i = 0; i < d; ++i) s.outer *= x.size(i);
  for (int64_t i = d + 1; i < x.dim(); ++i) s.len *= x.size(i);
  return s;
}

constexpr int64_t kChunk = 4096;  // values per task: a row of A, B and the output stay in L1

// Calls f(o, c0, n) for every chunk [c0, c0 + n) of every outer index o, in parallel.
template <typename F>
void for_chunks(const Halves& s, F&& f) {
  const int64_t per = (s.len + kChunk - 1) / kChunk;
  at::parallel_for(0, s.outer * per, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t o = t / per, c0 = (t % per) * kChunk;
      f(o, c0, std::min(kChunk, s.len - c0));
    }
  });
}

}  // namespace

at::Tensor swiglu_cpu(const SwigluArgs& args) {
  const char* op = "swiglu";
  const Halves s = split_halves(op, args.x, args.dim);
  std::vector<int64_t> shape(args.x.sizes().begin(), args.x.sizes().end());
  shape[s.dim] /= 2;
  at::Tensor out = at::empty(shape, args.x.options());
  if (out.numel() == 0) return out;
  const at::Tensor xc = args.x.contiguous();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, xc.scalar_type(), "swiglu", [&] {
    const scalar_t* xp = xc.data_ptr<scalar_t>();
    scalar_t* yp = out.data_ptr<scalar_t>();
    for_chunks(s, [&](int64_t o, int64_t c0, int64_t n) {
      const scalar_t* a = xp + o * 2 * s.len + c0;
      const scalar_t* b = a + s.len;
      scalar_t* y = yp + o * s.len + c0;
      if constexpr (std::is_same_v<scalar_t, double>) {  // fp64 (gradcheck): plain loops in double
        for (int64_t i = 0; i < n; ++i) y[i] = a[i] / (1.0 + std::exp(-a[i])) * b[i];
      } else if constexpr (std::is_same_v<scalar_t, float>) {
        // The dispatch lambda is no template, so this branch is compiled for every dtype: hence the casts.
        cpu::swiglu_row_stub(reinterpret_cast<const float*>(a), reinterpret_cast<const float*>(b),
                             reinterpret_cast<float*>(y), n);
      } else {
        float fa[kChunk], fb[kChunk], fy[kChunk];
        load_row(a, n, fa);
        load_row(b, n, fb);
        cpu::swiglu_row_stub(fa, fb, fy, n);
        for (int64_t i = 0; i < n; ++i) y[i] = static_cast<scalar_t>(fy[i]);
      }
    });
  });
  return out;
}

at::Tensor swiglu_grad_cpu(const SwigluGradArgs& args) {
  const char* op = "swiglu_grad";
  const Halves s = split_halves(op, args.x, args.dim);
  std::vector<int64_t> gshape(args.x.sizes().begin(), args.x.sizes().end());
  gshape[s.dim] /= 2;
  TORCH_CHECK_VALUE(args.grad_output.sizes() == at::IntArrayRef(gshape), op, ": argument 'grad_output' of shape ",
                    args.grad_output.sizes(), " must be swiglu's output shape ", at::IntArrayRef(gshape));
  check_activation(op, "grad_output", args.grad_output, true);
  at::Tensor dx = at::empty(args.x.sizes(), args.x.options());
  if (dx.numel() == 0) return dx;
  const at::Tensor xc = args.x.contiguous();
  const at::Tensor gc = args.grad_output.to(args.x.scalar_type()).contiguous();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, xc.scalar_type(), "swiglu_grad", [&] {
    const scalar_t* xp = xc.data_ptr<scalar_t>();
    const scalar_t* gp = gc.data_ptr<scalar_t>();
    scalar_t* dp = dx.data_ptr<scalar_t>();
    for_chunks(s, [&](int64_t o, int64_t c0, int64_t n) {
      const scalar_t* a = xp + o * 2 * s.len + c0;
      const scalar_t* b = a + s.len;
      const scalar_t* g = gp + o * s.len + c0;
      scalar_t* da = dp + o * 2 * s.len + c0;
      scalar_t* db = da + s.len;
      if constexpr (std::is_same_v<scalar_t, double>) {  // fp64 (gradcheck): plain loops in double
        for (int64_t i = 0; i < n; ++i) {
          const double sg = 1.0 / (1.0 + std::exp(-a[i]));
          da[i] = g[i] * b[i] * sg * (1.0 + a[i] * (1.0 - sg));
          db[i] = g[i] * a[i] * sg;
        }
      } else if constexpr (std::is_same_v<scalar_t, float>) {
        cpu::swiglu_grad_row_stub(reinterpret_cast<const float*>(a), reinterpret_cast<const float*>(b),
                                  reinterpret_cast<const float*>(g), reinterpret_cast<float*>(da),
                                  reinterpret_cast<float*>(db), n);
      } else {
        float fa[kChunk], fb[kChunk], fg[kChunk], fda[kChunk], fdb[kChunk];
        load_row(a, n, fa);
        load_row(b, n, fb);
        load_row(g, n, fg);
        cpu::swiglu_grad_row_stub(fa, fb, fg, fda, fdb, n);
        for (int64_t i = 0; i < n; ++i) {
          da[i] = static_cast<scalar_t>(fda[i]);
          db[i] = static_cast<scalar_t>(fdb[i]);
        }
      }
    });
  });
  return dx;
}

}  // namespace npu_fa
