// The exact int32 product of two int8 matrices, shared by the W8A8 ops (quant_matmul, grouped_matmul_quant).
#pragma once

#include <ATen/ATen.h>

#include <algorithm>
#include <cstdint>

#include "cpu/isa_dispatch.h"

namespace npu_fa::cpu {

// K rows per fp32 slice: a product of two int8 values is an integer of magnitude <= 2^14, so every partial sum of
// 1024 of them is an integer of magnitude <= 2^24, which fp32 holds exactly whatever the summation order.
constexpr int64_t kExactK = 1024;

// a [M, K] int8 @ b [K, N] int8 -> int32 [M, N], exact. oneDNN's s8s8s32 GEMM (at::_int_mm) where the CPU has
// AVX-512 (its VNNI / AMX-INT8 kernels). Elsewhere at::_int_mm runs a reference loop (measured on an AVX2-only CPU:
// 0.2-0.3 GOP/s, 100x below fp32 GEMM), so there the product is fp32 GEMMs over slices of kExactK rows of K, each
// exact (above), summed in int32.
inline at::Tensor exact_int_mm(const at::Tensor& a, const at::Tensor& b) {
  if (requested_isa() == Isa::AVX512) return at::_int_mm(a, b);
  const int64_t K = a.size(1);
  at::Tensor acc = at::zeros({a.size(0), b.size(1)}, a.options().dtype(at::kInt));
  for (int64_t k0 = 0; k0 < K; k0 += kExactK) {
    const int64_t k = std::min(kExactK, K - k0);
    acc.add_(at::mm(a.narrow(1, k0, k).to(at::kFloat), b.narrow(0, k0, k).to(at::kFloat)).to(at::kInt));
  }
  return acc;
}

}  // namespace npu_fa::cpu
