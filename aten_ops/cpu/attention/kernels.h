// The CPU FlashAttention kernels, compiled once per instruction set (see kernels_isa.cpp) and picked at run time
// by ops.cpp from at::get_cpu_capability(), like ATen's own DispatchStub kernels.
#pragma once

#include <ATen/core/Tensor.h>

#include "common/attention/params.h"

namespace npu_fa::cpu {

using attention::AttentionInputs;
using attention::AttentionParams;
using attention::RowMap;

// Outputs of the forward, allocated by ops.cpp: out in q's layout with vD (contiguous, rows at params.out),
// softmax_max/softmax_sum fp32 contiguous (rows at params.stats, 8 equal values per row).
struct ForwardOutputs {
  at::Tensor out, softmax_max, softmax_sum;
};

// Inputs and outputs of the backward. dy and attention_in are contiguous in q's layout (rows at params.out);
// softmax_max/sum contiguous fp32 (rows at params.stats). dq/dk/dv are contiguous tensors of query/key/value's
// shape and dtype with their rows given by dq_rows/dk_rows/dv_rows; dpse is defined (pse's shape and dtype,
// contiguous) only when params.pse is set.
struct BackwardTensors {
  at::Tensor dy, attention_in, softmax_max, softmax_sum;
  at::Tensor dq, dk, dv, dpse;
  RowMap dq_rows, dk_rows, dv_rows;
};

#define NPU_FA_DECLARE_ATTENTION_KERNELS(ISA)                                                                  \
  namespace ISA {                                                                                              \
  void attention_forward(const AttentionParams& p, const AttentionInputs& in, ForwardOutputs& o);              \
  void attention_backward(const AttentionParams& p, const AttentionInputs& in, BackwardTensors& t);            \
  }

NPU_FA_DECLARE_ATTENTION_KERNELS(DEFAULT)
NPU_FA_DECLARE_ATTENTION_KERNELS(AVX2)
NPU_FA_DECLARE_ATTENTION_KERNELS(AVX512)

}  // namespace npu_fa::cpu
