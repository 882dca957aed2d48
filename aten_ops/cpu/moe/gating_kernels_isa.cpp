// The vector part of the MoE gating rows: a softmax over one row of expert scores. Compiled three times by setup.py
// (-DCPU_CAPABILITY=DEFAULT|AVX2|AVX512), so at::vec::Vectorized (and its Sleef exp, ~1 ulp) has that ISA's width;
// registered in moe_softmax_row_stub (cpu/moe/gating_kernels.h).
#include "cpu/moe/gating_kernels.h"

#ifndef CPU_CAPABILITY
#error "this *_isa.cpp must be compiled with -DCPU_CAPABILITY=DEFAULT|AVX2|AVX512 (setup.py does this)"
#endif

#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>

namespace npu_fa::cpu::CPU_CAPABILITY {

void moe_softmax_row(float* v, int64_t n) {
  using Vec = at::vec::Vectorized<float>;
  const float m = at::vec::reduce_all<float>([](Vec a, Vec b) { return at::vec::maximum(a, b); }, v, n);
  at::vec::map([m](Vec x) { return (x - Vec(m)).exp(); }, v, v, n);
  const float inv = 1.f / at::vec::reduce_all<float>([](Vec a, Vec b) { return a + b; }, v, n);
  at::vec::map([inv](Vec x) { return x * Vec(inv); }, v, v, n);
}

NPU_FA_REGISTER_ISA_KERNEL(moe_softmax_row_stub, moe_softmax_row);

}  // namespace npu_fa::cpu::CPU_CAPABILITY
