// The element-wise activations of grouped_matmul and moe_ffn in fp32 vectors (CANN's act_type numbering, GmmAct:
// gelu is the tanh form, fast_gelu is x·sigmoid(1.702x)), with their derivatives for grouped_matmul's backward.
// Included by the per-ISA kernel files, so at::vec::Vectorized<float> has the including file's ISA width.
#pragma once

#include <ATen/cpu/vec/vec.h>

#include <cstdint>

#include "cpu/moe/grouped_matmul_kernels.h"

namespace npu_fa::cpu::CPU_CAPABILITY::moe_act {

using Vec = at::vec::Vectorized<float>;

constexpr float kGeluC = 0.7978845608028654f;  // sqrt(2/pi)
constexpr float kGeluA = 0.044715f;
constexpr float kFastGeluB = 1.702f;

inline Vec sigmoid(const Vec& x) { return Vec(1.f) / (Vec(1.f) + x.neg().exp()); }

inline Vec activate(const Vec& x, int64_t act) {
  switch (act) {
    case kActRelu: return at::vec::clamp_min(x, Vec(0.f));
    case kActGeluTanh: {
      const Vec u = Vec(kGeluC) * (x + Vec(kGeluA) * x * x * x);
      return Vec(0.5f) * x * (Vec(1.f) + u.tanh());
    }
    case kActFastGelu: return x * sigmoid(Vec(kFastGeluB) * x);
    case kActSilu: return x * sigmoid(x);
    default: return x;
  }
}

inline Vec activate_derivative(const Vec& x, int64_t act) {
  switch (act) {
    case kActRelu: return Vec::blendv(Vec(0.f), Vec(1.f), x > Vec(0.f));
    case kActGeluTanh: {
      const Vec x2 = x * x;
      const Vec t = (Vec(kGeluC) * (x + Vec(kGeluA) * x2 * x)).tanh();
      const Vec du = Vec(kGeluC) * (Vec(1.f) + Vec(3.f * kGeluA) * x2);
      return Vec(0.5f) * (Vec(1.f) + t) + Vec(0.5f) * x * (Vec(1.f) - t * t) * du;
    }
    case kActFastGelu: {
      const Vec s = sigmoid(Vec(kFastGeluB) * x);
      return s + Vec(kFastGeluB) * x * s * (Vec(1.f) - s);
    }
    case kActSilu: {
      const Vec s = sigmoid(x);
      return s * (Vec(1.f) + x * (Vec(1.f) - s));
    }
    default: return Vec(1.f);
  }
}

}  // namespace npu_fa::cpu::CPU_CAPABILITY::moe_act
