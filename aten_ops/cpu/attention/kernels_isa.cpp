// The FlashAttention forward and backward kernels, compiled three times by setup.py, once per instruction set, with
// -DCPU_CAPABILITY=<ISA> and that ISA's flags (the flags ATen uses for its own per-ISA kernels), so
// at::vec::Vectorized has the right width in each copy.
#include "cpu/attention/kernels.h"

#ifndef CPU_CAPABILITY
#error "this *_isa.cpp must be compiled with -DCPU_CAPABILITY=DEFAULT|AVX2|AVX512 (setup.py does this)"
#endif

#include "cpu/attention/forward.h"
#include "cpu/attention/backward.h"

namespace npu_fa::cpu::CPU_CAPABILITY {
NPU_FA_REGISTER_ISA_KERNEL(attention_forward_stub, attention_forward);
NPU_FA_REGISTER_ISA_KERNEL(attention_backward_stub, attention_backward);
}  // namespace npu_fa::cpu::CPU_CAPABILITY
