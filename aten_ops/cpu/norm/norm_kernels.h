// The row loops of the RMSNorm ops (cpu/norm/ops.cpp), compiled once per instruction set by
// cpu/norm/norm_kernels_isa.cpp so the row routines of cpu/norm/rms_norm_row.h run at the CPU's vector width. The
// entry points validate, lay the tensors out as contiguous [rows, n] and convert gamma / beta to the accumulation
// type A (float, double for double rows) before calling these.
#pragma once

#include <c10/core/ScalarType.h>

#include <cstdint>

#include "cpu/isa_dispatch.h"

namespace npu_fa::cpu {

// Forward: per row r, x = x1[r] (+ x2[r], rounded to dtype and written to x_out), rstd[r] = 1 / sqrt(mean(x^2) +
// eps), y = x * rstd * gamma (+ beta), written to y (dtype) and / or y_acc (A).
struct RmsNormParams {
  c10::ScalarType dtype;  // of x1, x2, x_out, y
  int64_t rows = 0, n = 0;
  double eps = 0;
  const void* x1 = nullptr;     // [rows, n]
  const void* x2 = nullptr;     // [rows, n]; nullptr: no residual add
  const void* gamma = nullptr;  // A [n] (1 + gamma for the gemma form)
  const void* beta = nullptr;   // A [n]; nullptr: none
  void* x_out = nullptr;        // [rows, n], required with x2
  void* y = nullptr;            // [rows, n] or nullptr
  void* y_acc = nullptr;        // A [rows, n] or nullptr
  void* rstd = nullptr;         // A [rows]
};

// Backward: dx = rstd * gamma * dy - x * rstd^3 * mean(gamma * dy * x) (+ dx_residual), dgamma = sum over rows of
// dy * x * rstd. The rows are summed into dgamma in a fixed order (chunks of rows that depend on the row count
// only), so the result does not depend on the thread count.
struct RmsNormGradParams {
  c10::ScalarType dtype;  // of dy, x, dx_residual, dx
  int64_t rows = 0, n = 0;
  const void* dy = nullptr;           // [rows, n]
  const void* x = nullptr;            // [rows, n]
  const void* gamma = nullptr;        // A [n]
  const void* rstd = nullptr;         // A [rows]
  const void* dx_residual = nullptr;  // [rows, n] or nullptr
  void* dx = nullptr;                 // [rows, n]
  void* dgamma = nullptr;             // A [n]
};

// Static quantisation of rows of fp32 values (the quantised RMSNorm ops): out[r, j] = clamp(rint(t), qmin, qmax)
// with t = y[r, j] / scale[j] + offset[j] (divide) or y[r, j] * scale[j] + offset[j]; rint rounds half to even and
// the quotient is a true fp32 division. scale / offset per column (stride 1) or one value (stride 0); offset nullptr:
// 0. out holds the integral values (int8 range, or [-8, 7] for int4, which the caller packs).
struct StaticQuantParams {
  int64_t rows = 0, n = 0;
  const float* y = nullptr;  // [rows, n]
  const float* scale = nullptr;
  int64_t scale_stride = 1;
  const float* offset = nullptr;
  int64_t offset_stride = 1;
  bool divide = true;
  float qmin = -128.f, qmax = 127.f;
  int8_t* out = nullptr;  // [rows, n]
};

NPU_FA_DECLARE_ISA_STUB(rms_norm_rows_stub, void (*)(const RmsNormParams&));
NPU_FA_DECLARE_ISA_STUB(rms_norm_grad_rows_stub, void (*)(const RmsNormGradParams&));
NPU_FA_DECLARE_ISA_STUB(static_quant_rows_stub, void (*)(const StaticQuantParams&));

}  // namespace npu_fa::cpu
