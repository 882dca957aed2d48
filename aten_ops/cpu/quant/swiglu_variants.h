// The gated activations of the quant family's CPU kernels on fp32 tensors (ATen element-wise passes), one definition
// for every op that applies them: swiglu's silu(A) * B and the clamped form of gpt-oss (clipped_swiglu,
// dequant_swiglu_quant's swiglu_mode 1 and 2).
#pragma once

#include <ATen/ATen.h>

namespace npu_fa::cpu {

// silu(a) * b, a and b float32 of one shape.
inline at::Tensor swiglu_fp32(const at::Tensor& a, const at::Tensor& b) { return at::silu(a).mul_(b); }

// With A = min(a, limit) and B = clamp(b, -limit, limit): A * sigmoid(alpha * A) * (B + bias); a and b float32.
inline at::Tensor clamped_swiglu_fp32(const at::Tensor& a, const at::Tensor& b, double alpha, double limit,
                                      double bias) {
  const at::Tensor ac = a.clamp_max(limit);
  at::Tensor g = ac * at::sigmoid(ac * alpha);
  return g.mul_(b.clamp(-limit, limit).add_(bias));
}

}  // namespace npu_fa::cpu
