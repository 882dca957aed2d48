// grouped_matmul's element-wise kernels, compiled three times by setup.py (-DCPU_CAPABILITY=DEFAULT|AVX2|AVX512) so
// at::vec::Vectorized<float> has that ISA's width. Everything is computed in fp32; fp16/bf16 rows are converted
// through a small stack buffer (kChunk values at a time) so the same vector code serves every dtype.
#include "cpu/moe/grouped_matmul_kernels.h"
#include "cpu/moe/activations.h"

#ifndef CPU_CAPABILITY
#error "this *_isa.cpp must be compiled with -DCPU_CAPABILITY=DEFAULT|AVX2|AVX512 (setup.py does this)"
#endif

#include <ATen/Parallel.h>
#include <ATen/cpu/vec/vec.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cmath>

namespace npu_fa::cpu::CPU_CAPABILITY {
namespace {

using Vec = at::vec::Vectorized<float>;
constexpr int64_t kChunk = 256;  // values converted to fp32 at a time (a multiple of every Vec width)

using moe_act::activate;
using moe_act::activate_derivative;
using moe_act::kFastGeluB;
using moe_act::kGeluA;
using moe_act::kGeluC;

template <typename T>
inline void to_float(const T* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<float>(src[i]);
}

template <typename T>
inline void from_float(const float* src, T* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<T>(src[i]);
}

template <typename T>
void epilogue(Block pre, Block out, const void* bias_, int64_t rows, int64_t cols, int64_t act) {
  const float* bias = static_cast<const float*>(bias_);
  alignas(64) float buf[kChunk];
  alignas(64) float res[kChunk];
  for (int64_t r = 0; r < rows; ++r) {
    T* p = static_cast<T*>(pre.data) + r * pre.ld;
    T* o = static_cast<T*>(out.data) + r * out.ld;
    for (int64_t c0 = 0; c0 < cols; c0 += kChunk) {
      const int64_t n = std::min(kChunk, cols - c0);
      to_float(p + c0, buf, n);
      for (int64_t i = 0; i < n; i += Vec::size()) {
        const int64_t w = std::min<int64_t>(Vec::size(), n - i);
        Vec v = Vec::loadu(buf + i, w);
        if (bias) v = v + Vec::loadu(bias + c0 + i, w);
        v.store(buf + i, w);
        if (act != kActNone) activate(v, act).store(res + i, w);
      }
      if (bias) from_float(buf, p + c0, n);
      if (act != kActNone) from_float(res, o + c0, n);
    }
  }
}

template <typename T>
void act_backward(const T* grad, const T* pre, T* dst, int64_t n, int64_t act) {
  at::parallel_for(0, (n + kChunk - 1) / kChunk, 64, [&](int64_t b, int64_t e) {
    alignas(64) float g[kChunk];
    alignas(64) float x[kChunk];
    for (int64_t blk = b; blk < e; ++blk) {
      const int64_t c0 = blk * kChunk, m = std::min(kChunk, n - c0);
      to_float(grad + c0, g, m);
      to_float(pre + c0, x, m);
      for (int64_t i = 0; i < m; i += Vec::size()) {
        const int64_t w = std::min<int64_t>(Vec::size(), m - i);
        (Vec::loadu(g + i, w) * activate_derivative(Vec::loadu(x + i, w), act)).store(g + i, w);
      }
      from_float(g, dst + c0, m);
    }
  });
}

// float64 (used by gradcheck): scalar loops in double, the same formulas.
double activate(double x, int64_t act) {
  const auto sig = [](double v) { return 1.0 / (1.0 + std::exp(-v)); };
  switch (act) {
    case kActRelu: return x > 0 ? x : 0.0;
    case kActGeluTanh: return 0.5 * x * (1.0 + std::tanh(double(kGeluC) * (x + double(kGeluA) * x * x * x)));
    case kActFastGelu: return x * sig(double(kFastGeluB) * x);
    case kActSilu: return x * sig(x);
    default: return x;
  }
}

double activate_derivative(double x, int64_t act) {
  const auto sig = [](double v) { return 1.0 / (1.0 + std::exp(-v)); };
  const double c = kGeluC, a = kGeluA, b = kFastGeluB;
  switch (act) {
    case kActRelu: return x > 0 ? 1.0 : 0.0;
    case kActGeluTanh: {
      const double t = std::tanh(c * (x + a * x * x * x));
      return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * c * (1.0 + 3.0 * a * x * x);
    }
    case kActFastGelu: { const double s = sig(b * x); return s + b * x * s * (1.0 - s); }
    case kActSilu: { const double s = sig(x); return s * (1.0 + x * (1.0 - s)); }
    default: return 1.0;
  }
}

template <>
void epilogue<double>(Block pre, Block out, const void* bias_, int64_t rows, int64_t cols, int64_t act) {
  const double* bias = static_cast<const double*>(bias_);
  for (int64_t r = 0; r < rows; ++r) {
    double* p = static_cast<double*>(pre.data) + r * pre.ld;
    double* o = static_cast<double*>(out.data) + r * out.ld;
    for (int64_t c = 0; c < cols; ++c) {
      if (bias) p[c] += bias[c];
      if (act != kActNone) o[c] = activate(p[c], act);
    }
  }
}

template <>
void act_backward<double>(const double* grad, const double* pre, double* dst, int64_t n, int64_t act) {
  for (int64_t i = 0; i < n; ++i) dst[i] = grad[i] * activate_derivative(pre[i], act);
}

}  // namespace

void gmm_epilogue(c10::ScalarType dtype, Block pre, Block out, const void* bias, int64_t rows, int64_t cols,
                  int64_t act) {
  if (!bias && act == kActNone) return;
  switch (dtype) {
    case c10::ScalarType::Float: return epilogue<float>(pre, out, bias, rows, cols, act);
    case c10::ScalarType::Double: return epilogue<double>(pre, out, bias, rows, cols, act);
    case c10::ScalarType::BFloat16: return epilogue<c10::BFloat16>(pre, out, bias, rows, cols, act);
    case c10::ScalarType::Half: return epilogue<c10::Half>(pre, out, bias, rows, cols, act);
    default: TORCH_CHECK(false, "grouped_matmul: unsupported dtype ", dtype);
  }
}

void gmm_act_backward(c10::ScalarType dtype, const void* grad, const void* pre, void* dst, int64_t n, int64_t act) {
  switch (dtype) {
    case c10::ScalarType::Float:
      return act_backward(static_cast<const float*>(grad), static_cast<const float*>(pre), static_cast<float*>(dst),
                          n, act);
    case c10::ScalarType::Double:
      return act_backward(static_cast<const double*>(grad), static_cast<const double*>(pre),
                          static_cast<double*>(dst), n, act);
    case c10::ScalarType::BFloat16:
      return act_backward(static_cast<const c10::BFloat16*>(grad), static_cast<const c10::BFloat16*>(pre),
                          static_cast<c10::BFloat16*>(dst), n, act);
    case c10::ScalarType::Half:
      return act_backward(static_cast<const c10::Half*>(grad), static_cast<const c10::Half*>(pre),
                          static_cast<c10::Half*>(dst), n, act);
    default: TORCH_CHECK(false, "grouped_matmul_grad: unsupported dtype ", dtype);
  }
}

NPU_FA_REGISTER_ISA_KERNEL(gmm_epilogue_stub, gmm_epilogue);
NPU_FA_REGISTER_ISA_KERNEL(gmm_act_backward_stub, gmm_act_backward);

}  // namespace npu_fa::cpu::CPU_CAPABILITY
