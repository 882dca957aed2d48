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

// c [M, N] = a [M, K] · b [K, N] in int32 with vpmaddwd on int16-extended operands (cpu/quant/int_mm_isa.cpp); rows
// at strides lda, ldb, ldc, unit column stride. Registered by the AVX2 build only.
NPU_FA_DECLARE_ISA_STUB(int8_mm_exact_stub, void (*)(const int8_t* a, int64_t lda, const int8_t* b, int64_t ldb,
                                                     int32_t* c, int64_t ldc, int64_t M, int64_t K, int64_t N));

// a [M, K] int8 @ b [K, N] int8 -> int32 [M, N], exact. oneDNN's s8s8s32 GEMM (at::_int_mm) where the CPU has
// AVX-512 (its VNNI / AMX-INT8 kernels). Elsewhere at::_int_mm runs a reference loop (measured on an AVX2-only CPU:
// 0.2-0.3 GOP/s, 100x below fp32 GEMM), so AVX2 CPUs take the integer kernel above and the others fp32 GEMMs over
// slices of kExactK rows of K, each exact (above), summed in int32.
inline at::Tensor exact_int_mm(const at::Tensor& a, const at::Tensor& b) {
  if (requested_isa() == Isa::AVX512) return at::_int_mm(a, b);
  if (requested_isa() == Isa::AVX2) {
    const at::Tensor ac = a.stride(1) == 1 ? a : a.contiguous();
    const at::Tensor bc = b.stride(1) == 1 ? b : b.contiguous();
    at::Tensor out = at::empty({a.size(0), b.size(1)}, a.options().dtype(at::kInt));
    int8_mm_exact_stub(ac.data_ptr<int8_t>(), ac.stride(0), bc.data_ptr<int8_t>(), bc.stride(0),
                       out.data_ptr<int32_t>(), out.stride(0), a.size(0), a.size(1), b.size(1));
    return out;
  }
  const int64_t K = a.size(1);
  at::Tensor acc = at::zeros({a.size(0), b.size(1)}, a.options().dtype(at::kInt));
  for (int64_t k0 = 0; k0 < K; k0 += kExactK) {
    const int64_t k = std::min(kExactK, K - k0);
    acc.add_(at::mm(a.narrow(1, k0, k).to(at::kFloat), b.narrow(0, k0, k).to(at::kFloat)).to(at::kInt));
  }
  return acc;
}

}  // namespace npu_fa::cpu
