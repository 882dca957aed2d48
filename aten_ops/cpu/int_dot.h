// Integer multiply-accumulate steps shared by the int8 kernels (decode's integer Q·Kᵀ / P·V, the exact int8 GEMM),
// compiled per instruction set with the kernel that includes them (namespace npu_fa::cpu::CPU_CAPABILITY, as
// cpu/vec_convert.h explains).
#pragma once

#if defined(CPU_CAPABILITY_AVX2)
#include <immintrin.h>

namespace npu_fa::cpu::CPU_CAPABILITY {

// acc + Σ pairs a·b in int32 lanes (vpmaddwd then vpaddd; exact), as inline asm: with the intrinsics GCC 12 copies
// the accumulators of a register block to fresh registers every step and spills one to the stack (seen in the
// 4-row blocks of both users: 7 moves and a store per 8 products).
inline __m256i madd_acc(__m256i acc, __m256i a, __m256i b) {
  __m256i t;
  asm("vpmaddwd %3, %2, %1\n\tvpaddd %1, %0, %0" : "+x"(acc), "=&x"(t) : "x"(a), "x"(b));
  return acc;
}

}  // namespace npu_fa::cpu::CPU_CAPABILITY
#endif
