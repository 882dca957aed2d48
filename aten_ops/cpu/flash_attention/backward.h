// PLACEHOLDER: FlashAttention-2 backward (being written). Included once per ISA by kernels_isa.cpp.
#pragma once
#include "cpu/flash_attention/kernels.h"

namespace npu_fa::cpu::CPU_CAPABILITY {
void attention_backward(const AttentionParams& p, const AttentionInputs& in, BackwardTensors& t) {
  TORCH_CHECK(false, p.op, ": CPU backward kernel not implemented yet");
}
}  // namespace npu_fa::cpu::CPU_CAPABILITY
