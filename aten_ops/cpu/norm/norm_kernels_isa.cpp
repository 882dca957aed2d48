// The row loops of the RMSNorm ops for one instruction set (see norm_kernels.h): rows in parallel, each converted to
// the accumulation type once, normalised by the shared row routines (cpu/norm/rms_norm_row.h) and written.
#include "cpu/norm/norm_kernels.h"

#ifndef CPU_CAPABILITY
#error "this *_isa.cpp must be compiled with -DCPU_CAPABILITY=DEFAULT|AVX2|AVX512 (setup.py does this)"
#endif

#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>

#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "cpu/norm/rms_norm_row.h"

namespace npu_fa::cpu::CPU_CAPABILITY {

namespace {

// Rows per task of at::parallel_for: about 16K values.
int64_t grain(int64_t n) { return std::max<int64_t>(1, (int64_t{1} << 14) / std::max<int64_t>(n, 1)); }

template <typename T>
void forward(const RmsNormParams& p) {
  using A = norm::acc_of<T>;
  const int64_t n = p.n;
  const T* x1 = static_cast<const T*>(p.x1);
  const T* x2 = static_cast<const T*>(p.x2);
  const A* gamma = static_cast<const A*>(p.gamma);
  const A* beta = static_cast<const A*>(p.beta);
  T* x_out = static_cast<T*>(p.x_out);
  T* y = static_cast<T*>(p.y);
  A* y_acc = static_cast<A*>(p.y_acc);
  A* rstd = static_cast<A*>(p.rstd);
  at::parallel_for(0, p.rows, grain(n), [&](int64_t r0, int64_t r1) {
    std::vector<A> buf(y_acc ? 0 : n), tmp(x2 ? n : 0);
    for (int64_t r = r0; r < r1; ++r) {
      const T* x = x1 + r * n;
      if (x2 != nullptr) {  // x = x1 + x2 rounded to T: the normalised row is the x written out
        A* sum = tmp.data();
        norm::add_row(x, x2 + r * n, n, y_acc ? y_acc + r * n : buf.data(), sum);
        norm::load_row(sum, n, x_out + r * n);
        x = x_out + r * n;
      }
      A* out = y_acc ? y_acc + r * n : buf.data();
      rstd[r] = norm::rms_norm_row(x, n, gamma, p.eps, out, beta);
      if (y != nullptr) norm::load_row(out, n, y + r * n);
    }
  });
}

template <typename T>
void backward(const RmsNormGradParams& p) {
  using A = norm::acc_of<T>;
  const int64_t n = p.n, rows = p.rows;
  const T* dy = static_cast<const T*>(p.dy);
  const T* x = static_cast<const T*>(p.x);
  const T* res = static_cast<const T*>(p.dx_residual);
  const A* gamma = static_cast<const A*>(p.gamma);
  const A* rstd = static_cast<const A*>(p.rstd);
  T* dx = static_cast<T*>(p.dx);
  A* dgamma = static_cast<A*>(p.dgamma);
  // dgamma: one partial sum per chunk of rows (the chunks depend on the row count only), summed in chunk order.
  const int64_t chunks = std::min<int64_t>(rows, 64);
  const int64_t per_chunk = chunks ? (rows + chunks - 1) / chunks : 0;
  std::vector<A> partial(static_cast<size_t>(chunks * n), A(0));
  at::parallel_for(0, chunks, 1, [&](int64_t c0, int64_t c1) {
    std::vector<A> xa(n), da(n), gdy(n), ra(res ? n : 0);
    for (int64_t c = c0; c < c1; ++c) {
      A* dg = partial.data() + c * n;
      for (int64_t r = c * per_chunk; r < std::min(rows, (c + 1) * per_chunk); ++r) {
        norm::load_row(x + r * n, n, xa.data());
        norm::load_row(dy + r * n, n, da.data());
        norm::rms_norm_grad_row(xa.data(), da.data(), n, gamma, rstd[r], gdy.data(), da.data(), dg);
        if (res != nullptr) {
          norm::load_row(res + r * n, n, ra.data());
          for (int64_t j = 0; j < n; ++j) da[j] += ra[j];
        }
        norm::load_row(da.data(), n, dx + r * n);
      }
    }
  });
  std::fill(dgamma, dgamma + n, A(0));
  for (int64_t c = 0; c < chunks; ++c)
    for (int64_t j = 0; j < n; ++j) dgamma[j] += partial[c * n + j];
}

void static_quant_rows(const StaticQuantParams& p) {
  using Vec = at::vec::Vectorized<float>;
  constexpr int64_t W = Vec::size();
  const int64_t n = p.n;
  const Vec lo(p.qmin), hi(p.qmax), zero(0.f);
  at::parallel_for(0, p.rows, grain(n), [&](int64_t r0, int64_t r1) {
    alignas(64) float buf[W];
    for (int64_t r = r0; r < r1; ++r) {
      const float* y = p.y + r * n;
      int8_t* out = p.out + r * n;
      int64_t j = 0;
      for (; j + W <= n; j += W) {
        const Vec s = p.scale_stride ? Vec::loadu(p.scale + j) : Vec(p.scale[0]);
        const Vec o = p.offset == nullptr ? zero : (p.offset_stride ? Vec::loadu(p.offset + j) : Vec(p.offset[0]));
        const Vec v = Vec::loadu(y + j);
        // round() of at::vec is round-half-to-even (the current rounding mode), like std::nearbyint below.
        at::vec::clamp(((p.divide ? v / s : v * s) + o).round(), lo, hi).store(buf);
        for (int64_t k = 0; k < W; ++k) out[j + k] = static_cast<int8_t>(buf[k]);
      }
      for (; j < n; ++j) {
        const float s = p.scale[j * p.scale_stride];
        const float o = p.offset == nullptr ? 0.f : p.offset[j * p.offset_stride];
        const float t = std::nearbyint((p.divide ? y[j] / s : y[j] * s) + o);
        out[j] = static_cast<int8_t>(std::min(std::max(t, p.qmin), p.qmax));
      }
    }
  });
}

void rms_norm_rows(const RmsNormParams& p) {
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, p.dtype, "rms_norm", [&] { forward<scalar_t>(p); });
}

void rms_norm_grad_rows(const RmsNormGradParams& p) {
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, p.dtype, "rms_norm_grad", [&] { backward<scalar_t>(p); });
}

}  // namespace

NPU_FA_REGISTER_ISA_KERNEL(rms_norm_rows_stub, rms_norm_rows);
NPU_FA_REGISTER_ISA_KERNEL(rms_norm_grad_rows_stub, rms_norm_grad_rows);
NPU_FA_REGISTER_ISA_KERNEL(static_quant_rows_stub, static_quant_rows);

}  // namespace npu_fa::cpu::CPU_CAPABILITY
