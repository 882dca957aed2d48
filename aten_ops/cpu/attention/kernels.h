// The CPU FlashAttention kernels (forward.h, backward.h), compiled once per instruction set by
// cpu/attention/kernels_isa.cpp and called through the stubs below by cpu/attention/ops.cpp (training) and
// cpu/inference/prefill.cpp (prefill reuses the forward).
#pragma once

#include <ATen/core/Tensor.h>

#include "common/attention/params.h"
#include "cpu/isa_dispatch.h"

namespace npu_fa::cpu {

using attention::AttentionInputs;
using attention::AttentionParams;
using attention::RowMap;

// Outputs of the forward, allocated by the caller: out in q's layout with vD (contiguous, rows at params.out),
// softmax_max/softmax_sum fp32 contiguous (rows at params.stats, 8 equal values per row).
struct ForwardOutputs {
  at::Tensor out, softmax_max, softmax_sum;
};

// Inputs and outputs of the backward. dy and attention_in are contiguous in q's layout (rows at params.out);
// softmax_max/sum contiguous fp32 (rows at params.stats). dq/dk/dv are contiguous tensors of query/key/value's
// shape and dtype with their rows given by dq_rows/dk_rows/dv_rows; dpse is defined (pse's shape and dtype,
// contiguous) only when params.pse is set; dsink is float32 [N1] (zeros on entry), written only with params.sink.
struct BackwardTensors {
  at::Tensor dy, attention_in, softmax_max, softmax_sum;
  at::Tensor dq, dk, dv, dpse, dsink;
  RowMap dq_rows, dk_rows, dv_rows;
};

NPU_FA_DECLARE_ISA_STUB(attention_forward_stub, void (*)(const AttentionParams&, const AttentionInputs&,
                                                          ForwardOutputs&));
NPU_FA_DECLARE_ISA_STUB(attention_backward_stub, void (*)(const AttentionParams&, const AttentionInputs&,
                                                           BackwardTensors&));

}  // namespace npu_fa::cpu
