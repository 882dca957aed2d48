// Validated incre_flash_attention arguments (decode attention), shared by the CPU and npu backends.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/string_view.h>

#include <optional>

#include "cpu/incre_attention/kernels.h"

namespace npu_fa::attention {

using cpu::DecodeParams;

// DecodeParams plus the tensors its raw pointers and strides refer to (kept alive by the caller).
struct DecodeInputs {
  DecodeParams params;
  at::Tensor key, value;   // the caller's cache, or a copy when its last dim was not contiguous
  at::Tensor mask_u8;      // [B or 1, S] uint8, when atten_mask is given
  at::Tensor pse32;        // fp32 pse_shift, when given
};

// Every check of the op, in order; throws the op's error messages. params.scale = scale_value.
DecodeInputs validate_decode(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
                             const std::optional<at::Tensor>& atten_mask, const std::optional<at::Tensor>& pse_shift,
                             const std::optional<at::Tensor>& actual_seq_lengths,
                             const std::optional<at::Tensor>& block_table,
                             const std::optional<at::Tensor>& kv_padding_size, int64_t num_heads,
                             double scale_value, c10::string_view input_layout, int64_t num_key_value_heads,
                             int64_t block_size, int64_t inner_precise);

}  // namespace npu_fa::attention
