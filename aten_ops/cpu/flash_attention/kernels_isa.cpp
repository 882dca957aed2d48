// Compiled three times by setup.py, once per instruction set, with -DCPU_CAPABILITY=<ISA> and that ISA's flags
// (the flags ATen uses for its own per-ISA kernels), so at::vec::Vectorized has the right width in each copy.
#include "cpu/flash_attention/kernels.h"

#ifndef CPU_CAPABILITY
#error "kernels_isa.cpp must be compiled with -DCPU_CAPABILITY=DEFAULT|AVX2|AVX512 (setup.py does this)"
#endif

#include "cpu/flash_attention/forward.h"
#include "cpu/flash_attention/backward.h"
