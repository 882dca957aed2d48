// The loops of the causal conv1d ops (cpu/linear_attention/causal_conv1d.cpp), compiled once per instruction set by
// causal_conv1d_kernels_isa.cpp so the channel loops run at the CPU's vector width. The entry point validates the
// arguments and resolves every per-sequence decision (cache lines, offset, zero state, reset, block fills) into a
// SeqPlan; the kernels only move and multiply rows.
#pragma once

#include <c10/core/ScalarType.h>

#include <cstdint>
#include <vector>

#include "common/linear_attention/causal_conv1d_plan.h"
#include "cpu/isa_dispatch.h"

namespace npu_fa::cpu {

// One sequence of fused_causal_conv1d (common/linear_attention/causal_conv1d_plan.h).
using SeqPlan = linear_attention::SeqPlan;

struct FusedConvParams {
  c10::ScalarType dtype;  // x, weight, conv_states, bias, y
  int64_t dim = 0, K = 0, C = 0;  // channels, kernel width, cache rows per line
  const void* x = nullptr;        // [T, dim] contiguous
  const void* weight = nullptr;   // [K, dim] contiguous
  const void* bias = nullptr;     // [dim] or nullptr
  void* states = nullptr;         // [slots, C, dim] contiguous
  void* y = nullptr;              // [T, dim] contiguous; may be x itself (the v2 op)
  bool silu = false, residual = false;
  const std::vector<SeqPlan>* seqs = nullptr;  // the sequences to compute (skipped ones are not listed)
};

// input, out, grad: [S, B, H] contiguous; weight [W, H]; mask [B, S] bool or nullptr.
struct MaskedConvParams {
  c10::ScalarType dtype;
  int64_t S = 0, B = 0, H = 0, W = 0;
  const void* input = nullptr;
  const void* weight = nullptr;
  const bool* mask = nullptr;
  void* out = nullptr;                // forward: the output
  const void* grad_output = nullptr;  // backward
  void* grad_input = nullptr;
  void* grad_weight = nullptr;        // [W, H]
};

NPU_FA_DECLARE_ISA_STUB(fused_causal_conv1d_stub, void (*)(const FusedConvParams&));
NPU_FA_DECLARE_ISA_STUB(masked_causal_conv1d_stub, void (*)(const MaskedConvParams&));
NPU_FA_DECLARE_ISA_STUB(masked_causal_conv1d_backward_stub, void (*)(const MaskedConvParams&));

}  // namespace npu_fa::cpu
