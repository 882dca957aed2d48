// The vector parts of the quantisation and SwiGLU rows. Compiled three times by setup.py
// (-DCPU_CAPABILITY=DEFAULT|AVX2|AVX512), so at::vec::Vectorized has that ISA's width; registered in the stubs of
// cpu/quant/quant_kernels.h.
#include "cpu/quant/quant_kernels.h"

#ifndef CPU_CAPABILITY
#error "this *_isa.cpp must be compiled with -DCPU_CAPABILITY=DEFAULT|AVX2|AVX512 (setup.py does this)"
#endif

#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>

#include <algorithm>
#include <cmath>

namespace npu_fa::cpu::CPU_CAPABILITY {

using Vec = at::vec::Vectorized<float>;
constexpr int64_t W = Vec::size();

float lanes_max(Vec v) {
  float l[W];
  v.store(l);
  float m = l[0];
  for (int64_t i = 1; i < W; ++i)
    if (std::isnan(l[i]) || l[i] > m) m = l[i];  // once m is NaN no comparison replaces it
  return m;
}

// NaN propagates (at::vec::maximum does), so a row holding NaN gets a NaN scale rather than a silently finite one.
float quant_absmax(const float* v, int64_t n) {
  Vec acc(0.f);
  int64_t i = 0;
  for (; i + W <= n; i += W) acc = at::vec::maximum(acc, Vec::loadu(v + i).abs());
  float m = lanes_max(acc);
  for (; i < n; ++i) {
    const float a = std::fabs(v[i]);
    if (std::isnan(a) || a > m) m = a;
  }
  return m;
}

void quant_minmax(const float* v, int64_t n, float* lo, float* hi) {
  Vec mn(v[0]), mx(v[0]);
  int64_t i = 0;
  for (; i + W <= n; i += W) {
    const Vec x = Vec::loadu(v + i);
    mn = at::vec::minimum(mn, x);
    mx = at::vec::maximum(mx, x);
  }
  float fmn = -lanes_max(mn.neg()), fmx = lanes_max(mx);
  for (; i < n; ++i) {
    if (std::isnan(v[i]) || v[i] < fmn) fmn = v[i];
    if (std::isnan(v[i]) || v[i] > fmx) fmx = v[i];
  }
  *lo = fmn;
  *hi = fmx;
}

void quant_round(const float* v, int64_t n, float scale, bool divide, float offset, float qmin, float qmax,
                 float* out) {
  const Vec s(scale), o(offset), a(qmin), b(qmax);
  // round() of at::vec is round-half-to-even (the current rounding mode), like std::nearbyint below.
  if (divide)
    at::vec::map([&](Vec x) { return at::vec::clamp((x / s + o).round(), a, b); }, out, v, n);
  else
    at::vec::map([&](Vec x) { return at::vec::clamp((x * s + o).round(), a, b); }, out, v, n);
}

void swiglu_row(const float* a, const float* b, float* out, int64_t n) {
  const Vec one(1.f);
  at::vec::map2([&](Vec x, Vec y) { return x / (one + x.neg().exp()) * y; }, out, a, b, n);
}

void swiglu_grad_row(const float* a, const float* b, const float* g, float* da, float* db, int64_t n) {
  const Vec one(1.f);
  int64_t i = 0;
  auto step = [&](Vec x, Vec y, Vec gv, Vec& dx, Vec& dy) {
    const Vec s = one / (one + x.neg().exp());
    dx = gv * y * s * (one + x * (one - s));
    dy = gv * x * s;
  };
  for (; i + W <= n; i += W) {
    Vec dx, dy;
    step(Vec::loadu(a + i), Vec::loadu(b + i), Vec::loadu(g + i), dx, dy);
    dx.store(da + i);
    dy.store(db + i);
  }
  if (i < n) {
    const int64_t r = n - i;
    Vec dx, dy;
    step(Vec::loadu(a + i, r), Vec::loadu(b + i, r), Vec::loadu(g + i, r), dx, dy);
    dx.store(da + i, r);
    dy.store(db + i, r);
  }
}

NPU_FA_REGISTER_ISA_KERNEL(quant_absmax_stub, quant_absmax);
NPU_FA_REGISTER_ISA_KERNEL(quant_minmax_stub, quant_minmax);
NPU_FA_REGISTER_ISA_KERNEL(quant_round_stub, quant_round);
NPU_FA_REGISTER_ISA_KERNEL(swiglu_row_stub, swiglu_row);
NPU_FA_REGISTER_ISA_KERNEL(swiglu_grad_row_stub, swiglu_grad_row);

}  // namespace npu_fa::cpu::CPU_CAPABILITY
