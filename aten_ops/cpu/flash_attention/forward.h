// PLACEHOLDER: FlashAttention-2 forward (being written). Included once per ISA by kernels_isa.cpp.
#pragma once
#include "cpu/flash_attention/kernels.h"

namespace npu_fa::cpu::CPU_CAPABILITY {
void attention_forward(const AttentionParams& p, const AttentionInputs& in, ForwardOutputs& o) {
  TORCH_CHECK(false, p.op, ": CPU forward kernel not implemented yet");
}
}  // namespace npu_fa::cpu::CPU_CAPABILITY
