// The CPU decode-attention kernel (incre_flash_attention), compiled once per instruction set by
// cpu/inference/decode_kernels_isa.cpp and called through decode_attention_stub by cpu/inference/decode.cpp.
#pragma once

#include <ATen/core/Tensor.h>

#include "common/inference/decode_params.h"
#include "cpu/isa_dispatch.h"

namespace npu_fa::cpu {

using attention::DecodeParams;

// out <- attention of q32 ([B, N1, D] fp32) over key/value (contiguous or paged, as p describes).
NPU_FA_DECLARE_ISA_STUB(decode_attention_stub, void (*)(const DecodeParams& p, const at::Tensor& q32,
                                                         const at::Tensor& key, const at::Tensor& value,
                                                         at::Tensor& out));

}  // namespace npu_fa::cpu
