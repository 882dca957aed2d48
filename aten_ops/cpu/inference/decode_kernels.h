// The CPU decode-attention kernel (incre_flash_attention), compiled once per instruction set by decode_kernels_isa.cpp
// and picked at run time by decode.cpp.
#pragma once

#include <ATen/core/Tensor.h>

#include "common/inference/decode_params.h"

namespace npu_fa::cpu {

using attention::DecodeParams;

#define NPU_FA_DECLARE_DECODE_KERNELS(ISA)                                                                       \
  namespace ISA {                                                                                                \
  void decode_attention(const DecodeParams& p, const at::Tensor& q32, const at::Tensor& key,                     \
                        const at::Tensor& value, at::Tensor& out);                                               \
  }

NPU_FA_DECLARE_DECODE_KERNELS(DEFAULT)
NPU_FA_DECLARE_DECODE_KERNELS(AVX2)
NPU_FA_DECLARE_DECODE_KERNELS(AVX512)

}  // namespace npu_fa::cpu
