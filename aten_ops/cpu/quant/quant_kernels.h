// The vector parts of the activation-quantisation and SwiGLU kernels (cpu/quant/quant.cpp, cpu/moe/init_routing.cpp):
// compiled once per instruction set by cpu/quant/quant_kernels_isa.cpp and called through these stubs. All of them
// work on fp32 rows; the callers convert from and to the tensors' dtypes.
#pragma once

#include <algorithm>
#include <cstdint>

#include "cpu/isa_dispatch.h"

namespace npu_fa::cpu {

// max |v[i]| over n values (0 for n == 0).
NPU_FA_DECLARE_ISA_STUB(quant_absmax_stub, float (*)(const float* v, int64_t n));
// min and max of v over n >= 1 values.
NPU_FA_DECLARE_ISA_STUB(quant_minmax_stub, void (*)(const float* v, int64_t n, float* lo, float* hi));
// out[i] = clamp(rint(t), qmin, qmax) with t = v[i] / scale + offset (divide) or v[i] * scale + offset; rint rounds
// half to even. The quotient is a true fp32 division (not a multiplication by 1/scale) so the result matches the
// reference formula bit for bit.
NPU_FA_DECLARE_ISA_STUB(quant_round_stub, void (*)(const float* v, int64_t n, float scale, bool divide, float offset,
                                                   float qmin, float qmax, float* out));
// out[i] = a[i] * sigmoid(a[i]) * b[i].
NPU_FA_DECLARE_ISA_STUB(swiglu_row_stub, void (*)(const float* a, const float* b, float* out, int64_t n));
// With s = sigmoid(a): da = g * b * s * (1 + a * (1 - s)), db = g * a * s.
NPU_FA_DECLARE_ISA_STUB(swiglu_grad_row_stub, void (*)(const float* a, const float* b, const float* g, float* da,
                                                       float* db, int64_t n));

// Symmetric per-row quantisation of v (n fp32 values) to [-qmax-1, qmax]: returns scale = max|v| / qmax and writes
// rint(v / scale) to out (as integral fp32 values, the caller narrows them); a row with scale 0 (all zeros) is 0.
inline float quantize_row_symmetric(const float* v, int64_t n, float qmax, float* out) {
  const float scale = quant_absmax_stub(v, n) / qmax;
  if (scale == 0.f) {
    std::fill(out, out + n, 0.f);
    return scale;
  }
  quant_round_stub(v, n, scale, true, 0.f, -qmax - 1.f, qmax, out);
  return scale;
}

}  // namespace npu_fa::cpu
