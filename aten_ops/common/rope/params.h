// Input validation of the rotary position embedding ops, shared by the CPU kernels (aten_ops/cpu/rope) and the
// PrivateUse1 kernels (aten_ops/npu/rope/rope.cpp) so both backends reject bad input with the same messages.
#pragma once

#include <ATen/ATen.h>

namespace npu_fa::rope {

// mode in [0, 3]; D even and positive (D % 4 == 0 for quarter mode).
void check_mode_and_dim(const char* op, int64_t mode, int64_t D);

// float32, float16, bfloat16 or float64.
void check_float(const char* op, const char* name, const at::Tensor& t);

// x, cos, sin floating; x at least 1-D; cos/sin end in D, have at most x's rank and broadcast to x.
void check_tables(const char* op, const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);

// The backward's extra rules on grad: x's shape, floating.
void check_grad(const char* op, const at::Tensor& grad, const at::Tensor& x);

}  // namespace npu_fa::rope
