// CPU entry points of the quantised matmul ops (native_functions.yaml, "Quantised matmul"):
//   trans_quant_param         float32 scale (+ offset) -> the int64 packing the matmuls read;
//   quantize                  per-channel / per-axis static quantisation to int8 / uint8 / int32 / packed int4;
//   quant_matmul              W8A8 (and W4A4 unpacked to int8): the exact int32 product of cpu/quant/int_mm.h
//                             (oneDNN's s8s8 -> s32 GEMM with VNNI / AMX-INT8 on AVX-512 CPUs, exact fp32 slices
//                             elsewhere), then ATen element-wise passes for the epilogue;
//                             the per-group A8W4 / A4W4 forms: one exact int32 product per group of K rows;
//   weight_quant_batchmatmul  W8A16 / W4A16: up to kGemvRows rows of x per product, the fused dequantise-and-multiply
//                             of cpu/quant/wq_gemv.h (weights read in place); more rows, (column tile) tasks on the
//                             intra-op threads, each dequantising its [K, tile] block of the weight (rounded to x's
//                             dtype) and calling ATen's GEMM on it, in x's dtype where the CPU multiplies it
//                             natively, else in fp32.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <optional>
#include <vector>

#include "cpu/brgemm.h"
#include "cpu/isa_dispatch.h"
#include "cpu/quant/int_mm.h"
#include "cpu/quant/swiglu_variants.h"
#include "cpu/quant/wq_gemv.h"
#include "generated/kernels.h"

namespace npu_fa {

namespace {

// The fp32 scale of an int64 packed by trans_quant_param: bits 0-31.
at::Tensor unpack_scale(const at::Tensor& packed) {
  return packed.bitwise_and(0xFFFFFFFFLL).to(at::kInt).view(at::kFloat);
}

// The offset of an int64 packed by trans_quant_param: bits 37-45, a 9-bit two's complement integer.
at::Tensor unpack_offset(const at::Tensor& packed) {
  const at::Tensor bits = packed.bitwise_right_shift(37).bitwise_and(0x1FF);
  return (bits.bitwise_xor(0x100) - 0x100).to(at::kFloat);
}

// int32 holding 8 int4 each along `dim` (element j in bits 4j..4j+3) -> int8 with that dimension 8 times longer.
at::Tensor unpack_int4(const at::Tensor& packed, int64_t dim) {
  const int64_t d = dim < 0 ? dim + packed.dim() : dim;
  const at::Tensor moved = packed.movedim(d, -1).contiguous();
  std::vector<int64_t> shape(moved.sizes().begin(), moved.sizes().end());
  shape.back() *= 8;
  at::Tensor q = at::empty(shape, packed.options().dtype(at::kChar));
  const int32_t* src = moved.data_ptr<int32_t>();
  int8_t* dst = q.data_ptr<int8_t>();
  // One pass over the words (a weight-only matmul unpacks its whole weight on every call): nibble j of a word is
  // element 8w + j, its two's complement value (nib ^ 8) - 8.
  at::parallel_for(0, moved.numel(), 4096, [&](int64_t w0, int64_t w1) {
    for (int64_t w = w0; w < w1; ++w) {
      const uint32_t word = static_cast<uint32_t>(src[w]);
      for (int64_t j = 0; j < 8; ++j)
        dst[w * 8 + j] = static_cast<int8_t>(static_cast<int32_t>(((word >> (4 * j)) & 15u) ^ 8u) - 8);
    }
  });
  return q.movedim(-1, d);
}

c10::ScalarType code_to_dtype(const char* op, const char* name, int64_t code, bool* int4) {
  *int4 = false;
  switch (code) {
    case 0: case 13: return at::kByte;                 // uint8 / quint8
    case 1: case 12: return at::kChar;                 // int8 / qint8
    case 3: case 14: return at::kInt;                  // int32 / qint32
    case 16: *int4 = true; return at::kInt;            // quint4x2: 8 int4 per int32
    default: break;
  }
  TORCH_CHECK_VALUE(false, op, ": argument '", name, "' must be a quantised dtype code: 12 (qint8) or 1 (int8), 13 ",
                    "(quint8) or 0 (uint8), 14 (qint32) or 3 (int32), 16 (quint4x2); got ", code);
}

// Packs int values in [-8, 7] (int32, last dimension a multiple of 8) eight to an int32, low nibble first.
at::Tensor pack_int4_last(const at::Tensor& q) {
  std::vector<int64_t> shape(q.sizes().begin(), q.sizes().end());
  const int64_t last = shape.back();
  shape.back() = last / 8;
  shape.push_back(8);
  const at::Tensor shifts = at::arange(0, 32, 4, q.options().dtype(at::kInt));
  at::Tensor nib = q.to(at::kInt).bitwise_and(15).reshape(shape).bitwise_left_shift(shifts);
  return nib.sum(-1, false, at::kLong).to(at::kInt);  // disjoint bits: the sum is the bitwise or (wraps to int32)
}

bool is_float(c10::ScalarType t) { return t == at::kFloat || t == at::kBFloat16 || t == at::kHalf; }

}  // namespace

// ---------------------------------------------------------------------------------------------------------------
// trans_quant_param
// ---------------------------------------------------------------------------------------------------------------
at::Tensor trans_quant_param_cpu(const TransQuantParamArgs& args) {
  const char* op = "trans_quant_param";
  const at::Tensor& scale = args.scale;
  TORCH_CHECK_TYPE(scale.scalar_type() == at::kFloat, op, ": argument 'scale' must be float32; got ",
                   scale.scalar_type());
  TORCH_CHECK_VALUE((scale.dim() == 1 || scale.dim() == 2) && scale.numel() > 0, op, ": argument 'scale' must be ",
                    "a non-empty 1-D or 2-D tensor; got shape ", scale.sizes());
  TORCH_CHECK_VALUE(args.round_mode == 0 || args.round_mode == 1, op, ": argument 'round_mode' must be 0 ",
                    "(truncate to FP19) or 1 (round to FP19); got ", args.round_mode);
  at::Tensor s = scale, o;
  std::vector<int64_t> out_shape(scale.sizes().begin(), scale.sizes().end());
  if (args.offset.has_value()) {
    o = *args.offset;
    TORCH_CHECK_TYPE(o.scalar_type() == at::kFloat, op, ": argument 'offset' must be float32; got ",
                     o.scalar_type());
    TORCH_CHECK_VALUE((o.dim() == 1 || o.dim() == 2) && o.numel() > 0, op, ": argument 'offset' must be a ",
                      "non-empty 1-D or 2-D tensor; got shape ", o.sizes());
    if (scale.dim() == 1) {
      const int64_t n = std::max(scale.numel(), o.numel());
      TORCH_CHECK_VALUE((scale.numel() == 1 || scale.numel() == n) && (o.numel() == 1 || o.numel() == n), op,
                        ": arguments 'scale' ", scale.sizes(), " and 'offset' ", o.sizes(), " must hold 1 or the ",
                        "same number (n) of values");
      out_shape = {n};
    } else {
      TORCH_CHECK_VALUE(o.numel() == 1 || o.numel() == scale.numel(), op, ": argument 'offset' of shape ", o.sizes(),
                        " must hold 1 value or one per scale (", scale.numel(), ") with a 2-D scale");
    }
    o = o.reshape({-1}).expand({c10::multiply_integers(out_shape)}).contiguous();
  }
  s = s.reshape({-1}).expand({c10::multiply_integers(out_shape)}).contiguous();
  at::Tensor out = at::empty(out_shape, scale.options().dtype(at::kLong));
  const float* sp = s.data_ptr<float>();
  const float* op_ = o.defined() ? o.data_ptr<float>() : nullptr;
  int64_t* yp = out.data_ptr<int64_t>();
  for (int64_t i = 0; i < out.numel(); ++i) {
    uint32_t bits;
    std::memcpy(&bits, sp + i, 4);
    if (args.round_mode == 1 && (bits & 0x7F800000u) != 0x7F800000u) bits += 0x1000u;  // nearest FP19, ties away
    uint64_t v = (uint64_t(bits) & 0xFFFFE000ull) | (uint64_t(1) << 46);
    if (op_) {
      const float r = std::nearbyint(op_[i]);
      const int64_t q = std::isnan(r) ? 0 : static_cast<int64_t>(std::min(255.f, std::max(-256.f, r)));
      v |= (uint64_t(q) & 0x1FFull) << 37;
    }
    yp[i] = static_cast<int64_t>(v);
  }
  return out;
}

// ---------------------------------------------------------------------------------------------------------------
// quantize
// ---------------------------------------------------------------------------------------------------------------
at::Tensor quantize_cpu(const QuantizeArgs& args) {
  const char* op = "quantize";
  const at::Tensor& x = args.input;
  TORCH_CHECK_TYPE(is_float(x.scalar_type()), op, ": argument 'input' must be float32, float16 or bfloat16; got ",
                   x.scalar_type());
  bool int4 = false;
  const c10::ScalarType out_dtype = code_to_dtype(op, "dtype", args.dtype, &int4);
  const at::Tensor& scales = args.scales;
  TORCH_CHECK_TYPE(is_float(scales.scalar_type()), op, ": argument 'scales' must be float32, float16 or bfloat16; ",
                   "got ", scales.scalar_type());
  at::Tensor s, z;  // broadcastable against x
  if (args.div_mode) {
    TORCH_CHECK_VALUE(!int4, op, ": dtype quint4x2 (16) needs div_mode=False");
    TORCH_CHECK_VALUE(x.dim() >= 1, op, ": argument 'input' must have at least 1 dimension with div_mode=True");
    TORCH_CHECK_VALUE(args.axis >= -x.dim() && args.axis < x.dim(), op, ": argument 'axis' must be in [", -x.dim(),
                      ", ", x.dim() - 1, "] for input of shape ", x.sizes(), "; got ", args.axis);
    const int64_t ax = args.axis < 0 ? args.axis + x.dim() : args.axis;
    const int64_t C = x.size(ax);
    TORCH_CHECK_VALUE(scales.dim() == 1 && (scales.size(0) == C || scales.size(0) == 1), op, ": argument 'scales' ",
                      "must be 1-D of input.size(axis) = ", C, " (or 1) values; got shape ", scales.sizes());
    std::vector<int64_t> view(x.dim(), 1);
    view[ax] = scales.size(0);
    s = scales.to(at::kFloat).reciprocal().reshape(view);
    if (args.zero_points.has_value()) {
      const at::Tensor& zp = *args.zero_points;
      const auto t = zp.scalar_type();
      TORCH_CHECK_TYPE(t == at::kChar || t == at::kByte || t == at::kInt || t == at::kBFloat16, op,
                       ": argument 'zero_points' must be int8, uint8, int32 or bfloat16 with div_mode=True; got ", t);
      TORCH_CHECK_VALUE(zp.dim() == 1 && zp.size(0) == scales.size(0), op, ": argument 'zero_points' of shape ",
                        zp.sizes(), " must have scales' shape ", scales.sizes());
      z = zp.to(at::kFloat).reshape(view);
    }
    at::Tensor y = (x.to(at::kFloat) * s).round_();
    if (z.defined()) y.add_(z);
    const double lo = out_dtype == at::kChar ? -128 : out_dtype == at::kByte ? 0 : -2147483648.0;
    const double hi = out_dtype == at::kChar ? 127 : out_dtype == at::kByte ? 255 : 2147483520.0;
    return y.clamp_(lo, hi).to(out_dtype);
  }
  TORCH_CHECK_VALUE(out_dtype == at::kChar || int4, op, ": argument 'dtype' must be 12 (qint8) or 16 (quint4x2) ",
                    "with div_mode=False; got ", args.dtype);
  TORCH_CHECK_VALUE(x.dim() >= 1, op, ": argument 'input' must have at least 1 dimension");
  TORCH_CHECK_VALUE(args.axis >= -2 && args.axis < x.dim(), op, ": argument 'axis' must be in [-2, ", x.dim() - 1,
                    "] with div_mode=False (-2: the second-last axis, otherwise the last); got ", args.axis);
  const int64_t ax = args.axis == -2 ? x.dim() - 2 : x.dim() - 1;
  TORCH_CHECK_VALUE(ax >= 0, op, ": axis -2 needs input of at least 2 dimensions; got shape ", x.sizes());
  TORCH_CHECK_TYPE(scales.scalar_type() == x.scalar_type(), op, ": argument 'scales' must have input's dtype (",
                   x.scalar_type(), ") with div_mode=False; got ", scales.scalar_type());
  auto shaped = [&](const at::Tensor& p, const char* name) {
    const int64_t C = x.size(ax);
    if (p.dim() == 1) {
      TORCH_CHECK_VALUE(p.size(0) == C || p.size(0) == 1, op, ": argument '", name, "' must be 1-D of ",
                        "input.size(", ax, ") = ", C, " (or 1) values, or of input's rank; got shape ", p.sizes());
      std::vector<int64_t> view(x.dim(), 1);
      view[ax] = p.size(0);
      return p.to(at::kFloat).reshape(view);
    }
    bool ok = p.dim() == x.dim();
    for (int64_t i = 0; ok && i < x.dim(); ++i) ok = p.size(i) == 1 || (i == ax && p.size(i) == C);
    TORCH_CHECK_VALUE(ok, op, ": argument '", name, "' of shape ", p.sizes(), " must be 1-D or of input's rank with ",
                      "size 1 everywhere but axis ", ax, " (size ", C, " or 1); input has shape ", x.sizes());
    return p.to(at::kFloat);
  };
  s = shaped(scales, "scales");
  if (args.zero_points.has_value()) {
    TORCH_CHECK_TYPE(args.zero_points->scalar_type() == x.scalar_type(), op, ": argument 'zero_points' must have ",
                     "input's dtype (", x.scalar_type(), ") with div_mode=False; got ", args.zero_points->scalar_type());
    TORCH_CHECK_VALUE(args.zero_points->sizes() == scales.sizes(), op, ": argument 'zero_points' of shape ",
                      args.zero_points->sizes(), " must have scales' shape ", scales.sizes());
    z = shaped(*args.zero_points, "zero_points");
  }
  if (int4) {
    TORCH_CHECK_VALUE(x.size(-1) % 8 == 0, op, ": dtype quint4x2 packs 8 values per int32 along the last axis, whose ",
                      "size must be a multiple of 8; got shape ", x.sizes());
  }
  at::Tensor y = x.to(at::kFloat) * s;
  if (z.defined()) y.add_(z);
  y.round_();
  if (!int4) return y.clamp_(-128, 127).to(at::kChar);
  return pack_int4_last(y.clamp_(-8, 7));
}

// ---------------------------------------------------------------------------------------------------------------
// quant_matmul
// ---------------------------------------------------------------------------------------------------------------
namespace {

// A [.., N]-broadcast fp32 vector of 1 or N values; `what` names the argument.
at::Tensor channel_vector(const char* op, const char* what, const at::Tensor& t, int64_t n) {
  const at::Tensor v = t.reshape({-1});
  TORCH_CHECK_VALUE((t.dim() == 1 || (t.dim() == 2 && t.size(0) == 1)) && (v.numel() == 1 || v.numel() == n), op,
                    ": argument '", what, "' must hold 1 (per tensor) or N=", n, " (per channel) values, shaped [1], ",
                    "[N] or [1, N]; got shape ", t.sizes());
  return v;
}

// ---- Per-group forms (group_sizes with group_k > 0) -------------------------------------------------------------
// Atlas A2/A3 run two: A8W4 (int8 activations, int4 weights, one scale per group of K rows and column, the result
// shaped the way the hardware computes it) and A4W4 per-token per-group asymmetric. Both are one exact int32 product
// per group whose fp32 results are combined in ascending group order, so the result does not depend on how the GEMM
// splits its work.

// group_k of group_sizes [group_m, group_n, group_k], or 0 when the ordinary (per tensor / channel / token) forms
// apply (None, or all zeros as torch_npu passes by default).
int64_t group_k_of(const char* op, const at::Tensor& x1, const at::Tensor& x2, at::OptionalIntArrayRef group_sizes) {
  if (!group_sizes.has_value()) return 0;
  const at::IntArrayRef g = *group_sizes;
  TORCH_CHECK_VALUE(g.size() == 3, op, ": argument 'group_sizes' must be [group_m, group_n, group_k] (3 values); ",
                    "got ", g);
  TORCH_CHECK_VALUE(g[0] >= 0 && g[1] >= 0 && g[2] >= 0, op, ": argument 'group_sizes' must hold values >= 0; got ",
                    g);
  if (g[0] == 0 && g[1] == 0 && g[2] == 0) return 0;
  TORCH_CHECK_NOT_IMPLEMENTED(!(x1.scalar_type() == at::kChar && x2.scalar_type() == at::kChar), op,
                              ": per-group / per-block quantisation of int8 x1 and int8 x2 (argument 'group_sizes' = ",
                              g, ": Ascend 950's G-B, B-B and mx forms) is not implemented; pass None");
  TORCH_CHECK_NOT_IMPLEMENTED(g[0] <= 1 && g[1] <= 1, op, ": argument 'group_sizes' = ", g, ": groups along m or n ",
                              "(group_m or group_n > 1, the per-block forms) are not implemented; they must be 0 or 1");
  TORCH_CHECK_VALUE(g[2] > 0, op, ": argument 'group_sizes' = ", g, " must have group_k > 0 (the group of K rows ",
                    "sharing a scale) for per-group quantisation, or be all zeros");
  return g[2];
}

// fp32 pertoken_scale as [M, 1]: float32 [M] or [M, 1], required by both per-group forms.
at::Tensor group_pertoken(const char* op, const std::optional<at::Tensor>& p, int64_t M) {
  TORCH_CHECK_VALUE(p.has_value(), op, ": argument 'pertoken_scale' (x1's scale, float32 [M] or [M, 1]) is required ",
                    "with per-group quantisation (group_sizes)");
  TORCH_CHECK_TYPE(p->scalar_type() == at::kFloat, op, ": argument 'pertoken_scale' must be float32; got ",
                   p->scalar_type());
  TORCH_CHECK_VALUE((p->dim() == 1 && p->size(0) == M) || (p->dim() == 2 && p->size(0) == M && p->size(1) == 1), op,
                    ": argument 'pertoken_scale' must be [M] or [M, 1] with M = ", M, "; got shape ", p->sizes());
  return p->reshape({M, 1});
}

// fp32 [K / G, N] scale: float32, or (A8W4) the int64 packing of npu_trans_quant_param without offset bits.
at::Tensor group_scale(const char* op, const at::Tensor& s, bool a8w4, int64_t groups, int64_t N) {
  const auto st = s.scalar_type();
  TORCH_CHECK_TYPE(st == at::kFloat || (a8w4 && st == at::kLong), op, ": argument 'scale' must be ",
                   a8w4 ? "int64 (npu_trans_quant_param's packing) or float32 for A8W4" : "float32 for A4W4",
                   " per-group quantisation; got ", st);
  TORCH_CHECK_VALUE(s.dim() == 2 && s.size(0) == groups && s.size(1) == N, op, ": argument 'scale' must be ",
                    "[K / group_k, N] = [", groups, ", ", N, "] (one scale per group of K rows and column); got shape ",
                    s.sizes());
  if (st != at::kLong) return s.contiguous();
  // The per-channel y_offset has its own argument here; offset bits in a per-group scale would be silently lost.
  TORCH_CHECK_VALUE(s.numel() == 0 || !unpack_offset(s).any().item<bool>(), op, ": argument 'scale' (int64) ",
                    "carries offset bits; A8W4's y_offset goes in argument 'offset'");
  return unpack_scale(s).contiguous();
}

at::Tensor quant_matmul_per_group(const QuantMatmulArgs& args, int64_t G) {
  const char* op = "quant_matmul";
  const at::Tensor &x1 = args.x1, &x2 = args.x2;
  const auto t1 = x1.scalar_type(), t2 = x2.scalar_type();
  TORCH_CHECK_TYPE((t1 == at::kChar || t1 == at::kInt) && t2 == at::kInt, op, ": per-group quantisation ",
                   "(group_sizes) needs an int32 x2 (8 int4 each) with an int8 x1 (A8W4) or an int32 x1 (A4W4); got ",
                   "x1 ", t1, " and x2 ", t2);
  const bool a8w4 = t1 == at::kChar;
  TORCH_CHECK_VALUE(x1.dim() == 2 && x2.dim() == 2, op, ": per-group quantisation (group_sizes) takes 2-D x1 and ",
                    "x2; got shapes ", x1.sizes(), " and ", x2.sizes());
  const int64_t M = x1.size(0), K = a8w4 ? x1.size(1) : x1.size(1) * 8;
  const at::Tensor q1 = a8w4 ? x1 : unpack_int4(x1, -1);
  at::Tensor q2;
  if (x2.size(0) == K) {
    q2 = unpack_int4(x2, -1);
  } else {
    TORCH_CHECK_VALUE(!a8w4 && x2.size(0) * 8 == K, op, ": argument 'x2' (int4 packed in int32) must be [K, N/8] ",
                      a8w4 ? "" : "or the transpose of [N, K/8] ", "with K = ", K, " (x1's K); got shape ",
                      x2.sizes());
    q2 = unpack_int4(x2, -2);
  }
  const int64_t N = q2.size(1);
  TORCH_CHECK_VALUE(K % G == 0, op, ": argument 'group_sizes': group_k = ", G, " must divide K = ", K);
  const int64_t groups = K / G;
  const int64_t code = args.output_dtype;
  TORCH_CHECK_VALUE(code == 5 || code == 15, op, ": per-group quantisation outputs float16 (5) or bfloat16 (15); ",
                    "argument 'output_dtype' got code ", code);
  const c10::ScalarType out_dtype = code == 5 ? at::kHalf : at::kBFloat16;
  TORCH_CHECK_VALUE(!args.bias.has_value(), op, ": argument 'bias' must be None with per-group quantisation ",
                    "(group_sizes)", a8w4 ? "; A8W4's per-column term goes in 'offset'" : "");
  const at::Tensor scale = group_scale(op, args.scale, a8w4, groups, N);
  TORCH_CHECK_VALUE(args.offset.has_value(), op, ": argument 'offset' is required with per-group quantisation: ",
                    a8w4 ? "A8W4's y_offset, float32 [N]" : "A4W4's zero points of x2, float16 [K / group_k, N]");
  const at::Tensor& off_in = *args.offset;
  if (a8w4) {
    TORCH_CHECK_TYPE(off_in.scalar_type() == at::kFloat, op, ": argument 'offset' (A8W4's y_offset) must be ",
                     "float32; got ", off_in.scalar_type());
    TORCH_CHECK_VALUE(off_in.dim() == 1 && off_in.size(0) == N, op, ": argument 'offset' (A8W4's y_offset) must be ",
                      "[N] = [", N, "]; got shape ", off_in.sizes());
  } else {
    TORCH_CHECK_TYPE(off_in.scalar_type() == at::kHalf, op, ": argument 'offset' (A4W4's zero points of x2) must ",
                     "be float16; got ", off_in.scalar_type());
    TORCH_CHECK_VALUE(off_in.sizes() == args.scale.sizes(), op, ": argument 'offset' (A4W4's zero points of x2) ",
                      "must have scale's shape [K / group_k, N] = [", groups, ", ", N, "]; got shape ",
                      off_in.sizes());
  }
  const at::Tensor offset = off_in.to(at::kFloat).contiguous();
  const at::Tensor pts = group_pertoken(op, args.pertoken_scale, M);

  at::Tensor f = at::zeros({M, N}, x1.options().dtype(at::kFloat));
  if (M > 0 && N > 0 && groups > 0) {
    // The exact int32 product of each group: at::_int_mm (oneDNN's s8s8s32 GEMM) where the CPU has AVX-512 (its
    // VNNI / AMX-INT8 kernels), else ATen's int32 GEMM, which on an AVX2-only CPU runs 10-25x faster than
    // at::_int_mm there (measured: M 1 and 64, K 8192 in groups of 256, N 1024). Both are exact.
    const bool int_mm = cpu::requested_isa() == cpu::Isa::AVX512;
    const auto product = int_mm ? at::kChar : at::kInt;
    // Group g's columns of x1 and rows of x2, each contiguous: a[g] [M, G], w[g] [G, N].
    const at::Tensor a = q1.reshape({M, groups, G}).transpose(0, 1).to(product).contiguous();
    const at::Tensor w = q2.to(product).contiguous().view({groups, G, N});
    // A8W4: the hardware multiplies x1 - 8 (it splits x1 into 16 * hi + lo with lo shifted by -8, which is
    // x1 - 8 in all), and (x1 - 8) @ w = x1 @ w - 8 * (column sums of w): exact in int32, no int8 overflow.
    // A4W4: x1 @ (w - zero point) = x1 @ w - (row sums of x1) * zero point, the second term in fp32 (the zero
    // points are float16).
    const at::Tensor col8 = a8w4 ? w.sum(1, false, at::kInt).mul_(8) : at::Tensor();         // [groups, N]
    const at::Tensor rows = a8w4 ? at::Tensor() : a.sum(2, false, at::kInt).to(at::kFloat);   // [groups, M]
    for (int64_t g = 0; g < groups; ++g) {
      at::Tensor acc = int_mm ? at::_int_mm(a[g], w[g]) : at::mm(a[g], w[g]);  // [M, N] int32
      at::Tensor t = a8w4 ? acc.sub_(col8[g]).to(at::kFloat)
                          : acc.to(at::kFloat).sub_(rows[g].unsqueeze(1) * offset[g]);
      f.addcmul_(t, scale[g]);  // f += t * scale[g, n]
    }
  }
  if (a8w4) f.add_(offset);
  f.mul_(pts);
  return f.to(out_dtype);
}

}  // namespace

at::Tensor quant_matmul_cpu(const QuantMatmulArgs& args) {
  const char* op = "quant_matmul";
  at::Tensor x1 = args.x1, x2 = args.x2;
  const int64_t group_k = group_k_of(op, x1, x2, args.group_sizes);
  if (group_k > 0) return quant_matmul_per_group(args, group_k);
  const auto t1 = x1.scalar_type(), t2 = x2.scalar_type();
  TORCH_CHECK_TYPE((t1 == at::kChar || t1 == at::kInt) && t2 == t1, op, ": arguments 'x1' and 'x2' must both be int8 ",
                   "(W8A8) or both int32 (8 int4 each, W4A4); got ", t1, " and ", t2,
                   t1 == at::kChar && t2 == at::kInt ? " (an int8 x1 with an int32 x2 is A8W4: it needs group_sizes)"
                                                     : "");
  TORCH_CHECK_VALUE(x1.dim() >= 2 && x1.dim() <= 6 && x2.dim() >= 2 && x2.dim() <= 6, op, ": arguments 'x1' and ",
                    "'x2' must have 2 to 6 dimensions; got shapes ", x1.sizes(), " and ", x2.sizes());
  if (t1 == at::kInt) {
    const int64_t K = x1.size(-1) * 8;
    x1 = unpack_int4(x1, -1);
    if (x2.size(-2) == K) {
      x2 = unpack_int4(x2, -1);
    } else {
      TORCH_CHECK_VALUE(x2.size(-2) * 8 == K, op, ": argument 'x2' (int4 packed in int32) must be [K, N/8] or the ",
                        "transpose of [N, K/8] with K = 8 * x1.size(-1) = ", K, "; got shape ", x2.sizes());
      x2 = unpack_int4(x2, -2);
    }
  }
  const int64_t M = x1.size(-2), K = x1.size(-1), N = x2.size(-1);
  TORCH_CHECK_VALUE(x2.size(-2) == K, op, ": x1 [.., M, K] and x2 [.., K, N] must agree on K: x1.size(-1) = ", K,
                    ", x2.size(-2) = ", x2.size(-2), " (shapes ", args.x1.sizes(), ", ", args.x2.sizes(), ")");
  const auto b1 = x1.sizes().slice(0, x1.dim() - 2), b2 = x2.sizes().slice(0, x2.dim() - 2);
  std::vector<int64_t> batch;
  try {
    batch = at::infer_size(b1, b2);
  } catch (const c10::Error&) {
    TORCH_CHECK_VALUE(false, op, ": the batch dimensions of x1 ", args.x1.sizes(), " and x2 ", args.x2.sizes(),
                      " do not broadcast");
  }
  const int64_t code = args.output_dtype;
  c10::ScalarType out_dtype;
  switch (code) {
    case 1: out_dtype = at::kChar; break;
    case 3: out_dtype = at::kInt; break;
    case 5: out_dtype = at::kHalf; break;
    case 6: out_dtype = at::kFloat; break;
    case 15: out_dtype = at::kBFloat16; break;
    default:
      TORCH_CHECK_VALUE(false, op, ": argument 'output_dtype' must be the code of int8 (1), float16 (5), bfloat16 ",
                        "(15), int32 (3) or float32 (6); got ", code);
  }
  // Scale and offset.
  const at::Tensor& scale_in = args.scale;
  const auto st = scale_in.scalar_type();
  TORCH_CHECK_TYPE(st == at::kFloat || st == at::kBFloat16 || st == at::kLong, op, ": argument 'scale' must be ",
                   "float32, bfloat16 or int64 (npu_trans_quant_param's packing); got ", st);
  at::Tensor scale = channel_vector(op, "scale", scale_in, N);
  at::Tensor offset;
  if (st == at::kLong) {
    offset = unpack_offset(scale);
    if (!offset.any().item<bool>()) offset = at::Tensor();
    scale = unpack_scale(scale);
  } else {
    scale = scale.to(at::kFloat);
  }
  if (args.offset.has_value()) {
    TORCH_CHECK_TYPE(args.offset->scalar_type() == at::kFloat, op, ": argument 'offset' must be float32; got ",
                     args.offset->scalar_type());
    TORCH_CHECK_VALUE(!offset.defined(), op, ": argument 'offset' was given next to an int64 scale that carries an ",
                      "offset already (npu_trans_quant_param's offset bits)");
    offset = channel_vector(op, "offset", *args.offset, N);
  }
  TORCH_CHECK_VALUE(!offset.defined() || out_dtype == at::kChar, op, ": argument 'offset' applies to int8 output ",
                    "only (output_dtype 1); got output_dtype ", code);
  at::Tensor pts;
  if (args.pertoken_scale.has_value()) {
    const at::Tensor& p = *args.pertoken_scale;
    TORCH_CHECK_TYPE(p.scalar_type() == at::kFloat, op, ": argument 'pertoken_scale' must be float32; got ",
                     p.scalar_type());
    TORCH_CHECK_VALUE(p.dim() == 1 && p.size(0) == M, op, ": argument 'pertoken_scale' must be [M] = [", M,
                      "] (one scale per row of x1); got shape ", p.sizes());
    TORCH_CHECK_VALUE(out_dtype != at::kInt, op, ": argument 'pertoken_scale' does not apply to int32 output");
    pts = p.reshape({M, 1});
  }
  // Bias.
  std::vector<int64_t> out_shape(batch);
  out_shape.push_back(M);
  out_shape.push_back(N);
  at::Tensor bias_i, bias_f;
  if (args.bias.has_value()) {
    const at::Tensor& b = *args.bias;
    const auto bt = b.scalar_type();
    TORCH_CHECK_TYPE(bt == at::kInt || is_float(bt), op, ": argument 'bias' must be int32, float32, bfloat16 or ",
                     "float16; got ", bt);
    const bool three = out_shape.size() == 3 && b.dim() == 3 && b.size(0) == out_shape[0] && b.size(1) == 1 &&
                       b.size(2) == N;
    TORCH_CHECK_VALUE((b.dim() == 1 && b.size(0) == N) || three, op, ": argument 'bias' must be [N] = [", N, "]",
                      out_shape.size() == 3 ? " or [B, 1, N] for a 3-D output" : "", "; got shape ", b.sizes());
    TORCH_CHECK_VALUE(bt == at::kInt || out_dtype != at::kInt, op, ": a float bias does not apply to int32 output");
    (bt == at::kInt ? bias_i : bias_f) = b;  // [N] or [B, 1, N]: broadcasts against [.., M, N]
  }
  // int32 accumulation, one _int_mm per batch entry (x2 without batch: x1's batch folded into its rows).
  at::Tensor acc;
  const int64_t B = c10::multiply_integers(batch);
  if (M == 0 || N == 0 || B == 0 || K == 0) {
    acc = at::zeros(out_shape, x1.options().dtype(at::kInt));
  } else if (x2.dim() == 2) {
    const at::Tensor a = x1.reshape({B * M, K}).contiguous();  // x2 has no batch: batch = x1's
    acc = cpu::exact_int_mm(a, x2.contiguous()).view(out_shape);
  } else {
    std::vector<int64_t> s1(batch), s2(batch);
    s1.push_back(M), s1.push_back(K), s2.push_back(K), s2.push_back(N);
    const at::Tensor a = x1.expand(s1).reshape({B, M, K});
    const at::Tensor w = x2.expand(s2).reshape({B, K, N});
    acc = at::empty({B, M, N}, x1.options().dtype(at::kInt));
    for (int64_t b = 0; b < B; ++b) {
      at::Tensor out_b = acc[b];
      out_b.copy_(cpu::exact_int_mm(a[b].contiguous(), w[b].contiguous()));
    }
    acc = acc.view(out_shape);
  }
  if (bias_i.defined()) acc.add_(bias_i);
  if (out_dtype == at::kInt) return acc;
  at::Tensor f = at::mul(acc, scale);  // int32 * fp32 -> fp32
  if (pts.defined()) f.mul_(pts);
  if (bias_f.defined()) f.add_(bias_f.to(at::kFloat));
  if (offset.defined()) f.add_(offset);
  if (out_dtype == at::kChar) f.round_().clamp_(-128, 127);  // round half to even, saturate
  return f.to(out_dtype);
}

// ---------------------------------------------------------------------------------------------------------------
// weight_quant_batchmatmul
// ---------------------------------------------------------------------------------------------------------------
namespace {

constexpr int64_t kTile = 128;  // columns per task: a [K, 128] block of x's dtype stays in L2 for serving K
// Rows of x per product up to which the fused dequantise-and-multiply (cpu/quant/wq_gemv.h) runs instead of the
// dequantised blocks and ATen's GEMM. Measured on AVX2 (4096 x 4096, one thread): the fused kernel costs about one
// dequantisation of the weight plus a GEMV per row, and is several times faster than the GEMM path at 16 and 32
// rows and still ahead at 64, where the margin is small; 32 leaves the larger products to the GEMM, which has
// native bf16 / fp16 products on AVX512-BF16 / AMX machines and the fused kernel does not.
constexpr int64_t kGemvRows = 32;

// The in-place layout of the [Bt, K, N] weight view (int4: still packed, int4_dim -1 along N, -2 along K) the fused
// kernel reads, or none (other strides go through the GEMM path).
std::optional<cpu::WqWeight> gemv_form(const at::Tensor& ws, int64_t int4_dim) {
  const bool n_unit = ws.stride(2) == 1 || ws.size(2) == 1, k_unit = ws.stride(1) == 1 || ws.size(1) == 1;
  if (int4_dim == -1) return n_unit ? std::optional(cpu::WqWeight::kInt4NMajor) : std::nullopt;
  if (int4_dim == -2) return k_unit ? std::optional(cpu::WqWeight::kInt4KMajor) : std::nullopt;
  if (n_unit) return cpu::WqWeight::kInt8NMajor;
  if (k_unit) return cpu::WqWeight::kInt8KMajor;
  return std::nullopt;
}

// xs [Bt, R, K] times the weight view ws [Bt, K, N] (stored as `form`) with the fp32 [G, N] parameters: fp32
// products per batch entry, rounded once to x's dtype, [Bt * R, N].
at::Tensor weight_quant_gemv(const at::Tensor& xs, const at::Tensor& ws, cpu::WqWeight form, const at::Tensor& scale,
                             const at::Tensor& offset, int64_t group, int64_t N) {
  const auto xt = xs.scalar_type();
  const int64_t Bt = xs.size(0), R = xs.size(1), K = xs.size(2);
  const at::Tensor xf = xs.to(at::kFloat).contiguous();  // also makes a strided x contiguous: R * K values
  at::Tensor yf = at::empty({Bt * R, N}, xs.options().dtype(at::kFloat));
  cpu::WqGemvParams p{};
  p.R = R, p.K = K, p.N = N, p.form = form, p.group = group;
  p.scale = scale.data_ptr<float>();
  p.offset = offset.defined() ? offset.data_ptr<float>() : nullptr;
  p.round = xt == at::kBFloat16 ? cpu::WqRound::kBFloat16 : xt == at::kHalf ? cpu::WqRound::kHalf
                                                                             : cpu::WqRound::kFloat;
  for (int64_t b = 0; b < Bt; ++b) {
    const at::Tensor wb = ws[b];
    p.x = xf.data_ptr<float>() + b * R * K;
    p.w = wb.data_ptr();
    p.w_sk = wb.stride(0), p.w_sn = wb.stride(1);
    p.y = yf.data_ptr<float>() + b * R * N;
    cpu::wq_gemv_stub(p);
  }
  return xt == at::kFloat ? yf : yf.to(xt);
}

// Columns [n0, n1) of the weight (int8 [K, N] view, any strides) dequantised into dst [K, n1 - n0]:
// (w + offset[g]) * scale[g] in fp32 (g = k / group), rounded once to x's dtype (scalar_t), stored as out_t (x's
// dtype, or fp32 for the fp32 product).
template <typename scalar_t, typename weight_t, typename out_t = scalar_t>
void dequant_block(const weight_t* w, int64_t sk, int64_t sn, int64_t K, int64_t n0, int64_t n1, const float* s,
                   const float* o, int64_t N, int64_t group, out_t* dst) {
  const int64_t T = n1 - n0;
  std::vector<float> row(T);
  for (int64_t k = 0; k < K; ++k) {
    const int64_t g = k / group;
    const float* sg = s + g * N + n0;
    const weight_t* wk = w + k * sk + n0 * sn;
    if (sn == 1)
      for (int64_t j = 0; j < T; ++j) row[j] = static_cast<float>(wk[j]);
    else
      for (int64_t j = 0; j < T; ++j) row[j] = static_cast<float>(wk[j * sn]);
    if (o) {
      const float* og = o + g * N + n0;
      for (int64_t j = 0; j < T; ++j) row[j] += og[j];
    }
    out_t* d = dst + k * T;
    for (int64_t j = 0; j < T; ++j) d[j] = static_cast<out_t>(static_cast<scalar_t>(row[j] * sg[j]));
  }
}

}  // namespace

at::Tensor weight_quant_batchmatmul_cpu(const WeightQuantBatchmatmulArgs& args) {
  const char* op = "weight_quant_batchmatmul";
  const at::Tensor& x = args.x;
  const auto xt = x.scalar_type();
  TORCH_CHECK_TYPE(xt == at::kHalf || xt == at::kBFloat16 || xt == at::kFloat, op,
                   ": argument 'x' must be float16 or bfloat16 (or float32); got ", xt);
  TORCH_CHECK_VALUE(x.dim() >= 2, op, ": argument 'x' must be [.., M, K]; got shape ", x.sizes());
  at::Tensor w = args.weight;
  const auto wt = w.scalar_type();
  TORCH_CHECK_TYPE(wt == at::kChar || wt == at::kInt, op, ": argument 'weight' must be int8 (W8A16) or int32 ",
                   "(8 int4 each, W4A16); got ", wt);
  TORCH_CHECK_VALUE(w.dim() >= 2 && w.dim() <= 6, op, ": argument 'weight' must be [.., K, N] (2 to 6 dimensions); ",
                    "got shape ", w.sizes());
  const int64_t K = x.size(-1);
  // int4: packed along N ([K, N/8]) or along K (the transpose of [N, K/8]); unpacked only for the GEMM path.
  int64_t int4_dim = 0;
  if (wt == at::kInt) {
    if (w.size(-2) == K) {
      int4_dim = -1;
    } else {
      TORCH_CHECK_VALUE(w.size(-2) * 8 == K, op, ": argument 'weight' (int4 packed in int32) must be [K, N/8] or ",
                        "the transpose of [N, K/8] with K = x.size(-1) = ", K, "; got shape ", w.sizes());
      int4_dim = -2;
    }
  } else {
    TORCH_CHECK_VALUE(w.size(-2) == K, op, ": x [.., M, K] and weight [.., K, N] must agree on K: x.size(-1) = ", K,
                      ", weight.size(-2) = ", w.size(-2));
  }
  const int64_t N = int4_dim == -1 ? w.size(-1) * 8 : w.size(-1);
  // Antiquant parameters as fp32 [G, N].
  const at::Tensor& as = args.antiquant_scale;
  const auto ast = as.scalar_type();
  const int64_t gs = args.antiquant_group_size;
  TORCH_CHECK_VALUE(gs >= 0, op, ": argument 'antiquant_group_size' must be >= 0; got ", gs);
  if (gs > 0) {
    TORCH_CHECK_VALUE(gs % 32 == 0 && gs < K, op, ": argument 'antiquant_group_size' must be a multiple of 32 in ",
                      "[32, K-1] = [32, ", K - 1, "]; got ", gs);
  }
  const int64_t G = gs > 0 ? (K + gs - 1) / gs : 1;
  const int64_t group = gs > 0 ? gs : std::max<int64_t>(K, 1);
  auto params = [&](const at::Tensor& p, const char* name) {
    const bool per_group = gs > 0;
    bool ok;
    if (per_group)
      ok = p.dim() == 2 && p.size(0) == G && p.size(1) == N;
    else
      ok = (p.dim() == 1 && (p.size(0) == N || p.size(0) == 1)) || (p.dim() == 2 && p.size(0) == 1 && p.size(1) == N);
    TORCH_CHECK_VALUE(ok, op, ": argument '", name, "' must be ",
                      per_group ? "[ceil(K / antiquant_group_size), N] = [" + std::to_string(G) + ", " +
                                      std::to_string(N) + "]"
                                : "[1], [N] or [1, N] with N = " + std::to_string(N),
                      " (antiquant_group_size ", gs, "); got shape ", p.sizes());
    return p.to(at::kFloat).reshape({-1, p.size(-1)}).expand({G, N}).contiguous();
  };
  TORCH_CHECK_TYPE(ast == xt || ast == at::kFloat || ast == at::kLong, op, ": argument 'antiquant_scale' must have ",
                   "x's dtype (", xt, "), float32 or int64 (packed fp32); got ", ast);
  const at::Tensor scale = params(ast == at::kLong ? unpack_scale(as) : as, "antiquant_scale");
  at::Tensor offset;
  if (args.antiquant_offset.has_value()) {
    const at::Tensor& ao = *args.antiquant_offset;
    const auto aot = ao.scalar_type();
    if (ast == at::kLong) {
      TORCH_CHECK_TYPE(aot == at::kInt, op, ": argument 'antiquant_offset' must be int32 next to an int64 ",
                       "antiquant_scale; got ", aot);
    } else {
      TORCH_CHECK_TYPE(aot == ast, op, ": argument 'antiquant_offset' must have antiquant_scale's dtype (", ast,
                       "); got ", aot);
    }
    TORCH_CHECK_VALUE(ao.sizes() == as.sizes(), op, ": argument 'antiquant_offset' of shape ", ao.sizes(),
                      " must have antiquant_scale's shape ", as.sizes());
    offset = params(ao, "antiquant_offset");
  }
  at::Tensor bias;
  if (args.bias.has_value()) {
    const at::Tensor& b = *args.bias;
    TORCH_CHECK_TYPE(b.scalar_type() == xt || b.scalar_type() == at::kFloat, op, ": argument 'bias' must have x's ",
                     "dtype (", xt, ") or float32; got ", b.scalar_type());
    TORCH_CHECK_VALUE((b.dim() == 1 && b.size(0) == N) || (b.dim() == 2 && b.size(0) == 1 && b.size(1) == N), op,
                      ": argument 'bias' must be [N] or [1, N] with N = ", N, "; got shape ", b.sizes());
    bias = b.reshape({N});
  }
  at::Tensor qscale, qoffset;
  if (args.quant_scale.has_value()) {
    const at::Tensor& q = *args.quant_scale;
    TORCH_CHECK_TYPE(q.scalar_type() == at::kFloat || q.scalar_type() == at::kLong, op, ": argument 'quant_scale' ",
                     "must be float32 or int64 (npu_trans_quant_param's packing); got ", q.scalar_type());
    TORCH_CHECK_VALUE(ast != at::kLong, op, ": argument 'quant_scale' must be None with an int64 antiquant_scale");
    qscale = channel_vector(op, "quant_scale", q, N);
    if (q.scalar_type() == at::kLong) {
      qoffset = unpack_offset(qscale);
      qscale = unpack_scale(qscale);
    }
    if (args.quant_offset.has_value()) {
      TORCH_CHECK_TYPE(args.quant_offset->scalar_type() == at::kFloat, op, ": argument 'quant_offset' must be ",
                       "float32; got ", args.quant_offset->scalar_type());
      TORCH_CHECK_VALUE(args.quant_offset->sizes() == q.sizes(), op, ": argument 'quant_offset' of shape ",
                        args.quant_offset->sizes(), " must have quant_scale's shape ", q.sizes());
      qoffset = channel_vector(op, "quant_offset", *args.quant_offset, N);
    }
  } else {
    TORCH_CHECK_VALUE(!args.quant_offset.has_value(), op, ": argument 'quant_offset' needs 'quant_scale'");
  }
  // A batched weight [.., K, N] broadcasts against x's batch: one 2-D product per batch entry.
  std::vector<int64_t> out_shape;
  at::Tensor xs, ws;  // [Bt, R, K], [Bt, K, N] (ws an int8 view, possibly transposed; int4 still packed)
  const int64_t Kw = w.size(-2), Nw = w.size(-1);  // the stored (packed) sizes
  if (w.dim() == 2) {
    out_shape.assign(x.sizes().begin(), x.sizes().end());
    out_shape.back() = N;
    xs = x.reshape({1, c10::multiply_integers(x.sizes().slice(0, x.dim() - 1)), K});
    ws = w.unsqueeze(0);
  } else {
    std::vector<int64_t> batch;
    try {
      batch = at::infer_size(x.sizes().slice(0, x.dim() - 2), w.sizes().slice(0, w.dim() - 2));
    } catch (const c10::Error&) {
      TORCH_CHECK_VALUE(false, op, ": the batch dimensions of x ", x.sizes(), " and weight ", w.sizes(),
                        " do not broadcast");
    }
    const int64_t M = x.size(-2), Bt = c10::multiply_integers(batch);
    std::vector<int64_t> sx(batch), sw(batch);
    sx.push_back(M), sx.push_back(K), sw.push_back(Kw), sw.push_back(Nw);
    xs = x.expand(sx).reshape({Bt, M, K});
    ws = w.expand(sw).reshape({Bt, Kw, Nw});
    out_shape = batch;
    out_shape.push_back(M);
    out_shape.push_back(N);
  }
  const int64_t Bt = xs.size(0), R = xs.size(1);
  at::Tensor y = at::empty({Bt * R, N}, x.options());
  const std::optional<cpu::WqWeight> form = gemv_form(ws, int4_dim);
  if (Bt * R > 0 && N > 0) {
    if (K == 0) {
      y.zero_();
    } else if (R <= kGemvRows && form.has_value()) {
      y = weight_quant_gemv(xs, ws, *form, scale, offset, group, N);
    } else {
      if (int4_dim != 0) ws = unpack_int4(ws, int4_dim);
      const float* sp = scale.data_ptr<float>();
      const float* opp = offset.defined() ? offset.data_ptr<float>() : nullptr;
      const int64_t tiles = (N + kTile - 1) / kTile;
      // The products run in x's dtype where the CPU multiplies it natively (fp32; bf16 / fp16 where oneDNN's
      // brgemm takes them: AVX512-BF16, AMX); elsewhere PyTorch's 16-bit GEMM is an emulation many times slower than
      // fp32, so the dequantised block (still rounded to x's dtype) and x are multiplied in fp32 instead.
      const bool native = xt == at::kFloat || cpu::brgemm_usable(xt);
      const auto mm_options = native ? x.options() : x.options().dtype(at::kFloat);
      AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, xt, "weight_quant_batchmatmul", [&] {
        for (int64_t b = 0; b < Bt; ++b) {
          const at::Tensor x2d = native ? xs[b].contiguous() : xs[b].to(at::kFloat).contiguous();
          const at::Tensor w8 = ws[b];
          at::Tensor yb = y.narrow(0, b * R, R);
          at::Tensor ymm = native ? yb : at::empty({R, N}, mm_options);
          const int8_t* wp = w8.data_ptr<int8_t>();
          const int64_t sk = w8.stride(0), sn = w8.stride(1);
          at::parallel_for(0, tiles, 1, [&](int64_t t0, int64_t t1) {
            at::Tensor block = at::empty({K, kTile}, mm_options);
            for (int64_t t = t0; t < t1; ++t) {
              const int64_t n0 = t * kTile, n1 = std::min(N, n0 + kTile), T = n1 - n0;
              at::Tensor dense = T == kTile ? block : at::empty({K, T}, mm_options);
              if (native)
                dequant_block<scalar_t, int8_t>(wp, sk, sn, K, n0, n1, sp, opp, N, group, dense.data_ptr<scalar_t>());
              else
                dequant_block<scalar_t, int8_t, float>(wp, sk, sn, K, n0, n1, sp, opp, N, group,
                                                       dense.data_ptr<float>());
              at::Tensor out = ymm.narrow(1, n0, T);
              at::mm_out(out, x2d, dense);
            }
          });
          if (!native) yb.copy_(ymm);
        }
      });
    }
  }
  if (bias.defined()) {
    if (bias.scalar_type() == xt)
      y.add_(bias);
    else
      y = (y.to(at::kFloat) + bias).to(xt);
  }
  if (qscale.defined()) {
    at::Tensor f = y.to(at::kFloat) * qscale;
    if (qoffset.defined()) f.add_(qoffset);
    y = f.round_().clamp_(-128, 127).to(at::kChar);
  }
  return y.view(out_shape);
}

}  // namespace npu_fa

namespace npu_fa {

// ---------------------------------------------------------------------------------------------------------------
// convert_weight_to_int4pack
// ---------------------------------------------------------------------------------------------------------------
at::Tensor convert_weight_to_int4pack_cpu(const ConvertWeightToInt4packArgs& args) {
  const char* op = "convert_weight_to_int4pack";
  const at::Tensor& w = args.weight;
  TORCH_CHECK_TYPE(w.scalar_type() == at::kInt, op, ": argument 'weight' must be int32; got ", w.scalar_type());
  TORCH_CHECK_VALUE(w.dim() == 2, op, ": argument 'weight' must be 2-D ([k, n] or [n, k]); got shape ", w.sizes());
  TORCH_CHECK_VALUE(w.size(1) % 8 == 0, op, ": argument 'weight' packs 8 values per int32 along its last axis, ",
                    "whose size must be a multiple of 8; got shape ", w.sizes());
  if (w.numel() > 0) {
    const int64_t lo = w.min().item<int64_t>(), hi = w.max().item<int64_t>();
    TORCH_CHECK_VALUE(lo >= -8 && hi <= 7, op, ": argument 'weight' must hold int4 values in [-8, 7]; got values ",
                      "in [", lo, ", ", hi, "]");
  }
  return pack_int4_last(w);
}

// ---------------------------------------------------------------------------------------------------------------
// clipped_swiglu
// ---------------------------------------------------------------------------------------------------------------
at::Tensor clipped_swiglu_cpu(const ClippedSwigluArgs& args) {
  const char* op = "clipped_swiglu";
  const at::Tensor& x = args.x;
  TORCH_CHECK_TYPE(is_float(x.scalar_type()), op, ": argument 'x' must be float16, bfloat16 or float32; got ",
                   x.scalar_type());
  TORCH_CHECK_VALUE(x.dim() >= 2, op, ": argument 'x' must have at least 2 dimensions; got shape ", x.sizes());
  TORCH_CHECK_VALUE(args.dim >= -x.dim() && args.dim < x.dim(), op, ": argument 'dim' must be in [", -x.dim(), ", ",
                    x.dim() - 1, "] for x of shape ", x.sizes(), "; got ", args.dim);
  const int64_t d = args.dim < 0 ? args.dim + x.dim() : args.dim;
  TORCH_CHECK_VALUE(x.size(d) % 2 == 0, op, ": argument 'x' must have an even size along dim ", args.dim,
                    "; got shape ", x.sizes());
  const int64_t pre = c10::multiply_integers(x.sizes().slice(0, d));
  const int64_t cols = pre ? x.numel() / pre : 0;
  int64_t rows = pre;
  if (args.group_index.has_value()) {
    const at::Tensor& gi = *args.group_index;
    TORCH_CHECK_TYPE(gi.scalar_type() == at::kLong || gi.scalar_type() == at::kInt, op,
                     ": argument 'group_index' must be int64 (or int32); got ", gi.scalar_type());
    TORCH_CHECK_VALUE(gi.dim() == 1, op, ": argument 'group_index' must be 1-D (token counts per group); got shape ",
                      gi.sizes());
    if (gi.numel() > 0)
      TORCH_CHECK_VALUE(gi.min().item<int64_t>() >= 0, op, ": argument 'group_index' must hold counts >= 0; got ",
                        "a minimum of ", gi.min().item<int64_t>());
    rows = std::min<int64_t>(pre, gi.sum().item<int64_t>());
  }
  std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
  shape[d] /= 2;
  at::Tensor y = at::zeros({pre, cols / 2}, x.options());
  if (rows > 0 && cols > 0) {
    const at::Tensor v = x.reshape({pre, cols}).narrow(0, 0, rows);
    at::Tensor a, b;
    if (args.interleaved) {
      a = v.slice(1, 0, cols, 2);
      b = v.slice(1, 1, cols, 2);
    } else {
      a = v.narrow(1, 0, cols / 2);
      b = v.narrow(1, cols / 2, cols / 2);
    }
    y.narrow(0, 0, rows).copy_(cpu::clamped_swiglu_fp32(a.to(at::kFloat), b.to(at::kFloat), args.alpha, args.limit,
                                                        args.bias));
  }
  return y.view(shape);
}

// ---------------------------------------------------------------------------------------------------------------
// transpose_batchmatmul
// ---------------------------------------------------------------------------------------------------------------
at::Tensor transpose_batchmatmul_cpu(const TransposeBatchmatmulArgs& args) {
  const char* op = "transpose_batchmatmul";
  const at::Tensor &in = args.input, &w = args.weight;
  TORCH_CHECK_TYPE(is_float(in.scalar_type()), op, ": argument 'input' must be float16, float32 or bfloat16; got ",
                   in.scalar_type());
  TORCH_CHECK_TYPE(w.scalar_type() == in.scalar_type(), op, ": argument 'weight' must have input's dtype (",
                   in.scalar_type(), "); got ", w.scalar_type());
  TORCH_CHECK_VALUE(in.dim() == 3 && w.dim() == 3, op, ": arguments 'input' and 'weight' must be 3-D; got shapes ",
                    in.sizes(), " and ", w.sizes());
  auto check_perm = [&](const char* name, at::IntArrayRef p) {
    bool ok = p.size() == 3;
    for (int64_t i = 0; ok && i < 3; ++i) ok = std::count(p.begin(), p.end(), i) == 1;
    TORCH_CHECK_VALUE(ok, op, ": argument '", name, "' should be a permutation of [0, 1, 2]; got ", p);
  };
  check_perm("perm_x1", args.perm_x1);
  check_perm("perm_x2", args.perm_x2);
  check_perm("perm_y", args.perm_y);
  const at::Tensor a = in.permute(args.perm_x1), b = w.permute(args.perm_x2);
  TORCH_CHECK_VALUE(a.size(0) == b.size(0) && a.size(2) == b.size(1), op, ": input.permute(perm_x1) ", a.sizes(),
                    " and weight.permute(perm_x2) ", b.sizes(), " must be [B, M, K] and [B, K, N]");
  const int64_t B = a.size(0), M = a.size(1), N = b.size(2);
  const bool y102 = args.perm_y.vec() == std::vector<int64_t>{1, 0, 2};
  const int64_t s = args.batch_split_factor;
  TORCH_CHECK_VALUE(s >= 1 && (B * N) % s == 0, op, ": argument 'batch_split_factor' must be >= 1 and ",
                    "divide B * N = ", B * N, "; got ", s);
  if (s > 1 || args.scale.has_value())
    TORCH_CHECK_VALUE(y102, op, ": argument 'perm_y' must be [1, 0, 2] with a scale or batch_split_factor > 1; got ",
                      args.perm_y);
  TORCH_CHECK_VALUE(!(s > 1 && args.scale.has_value()), op, ": argument 'batch_split_factor' must be 1 with a scale");
  if (args.scale.has_value()) {
    const at::Tensor& sc = *args.scale;
    TORCH_CHECK_TYPE(sc.scalar_type() == at::kLong || sc.scalar_type() == at::kFloat, op, ": argument 'scale' must ",
                     "be int64 (npu_trans_quant_param's packing) or float32; got ", sc.scalar_type());
    TORCH_CHECK_VALUE(sc.dim() == 1 && sc.size(0) == B * N, op, ": argument 'scale' must be [B * N] = [", B * N,
                      "]; got shape ", sc.sizes());
    const at::Tensor f = sc.scalar_type() == at::kLong ? unpack_scale(sc) : sc;
    at::Tensor r = at::bmm(a.to(at::kFloat), b.to(at::kFloat)).permute({1, 0, 2}).reshape({M, 1, B * N}) * f;
    return r.round_().clamp_(-128, 127).to(at::kChar);
  }
  at::Tensor out = at::bmm(a, b).permute(args.perm_y);  // [B, M, N] permuted; fp32 accumulation
  if (s > 1) return out.reshape({M, s, B * N / s}).transpose(0, 1).contiguous();
  return out.contiguous();
}

}  // namespace npu_fa
