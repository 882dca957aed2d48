// CPU entry point of incre_flash_attention (decode attention, CANN IncreFlashAttention): validate every argument,
// build DecodeParams, and run the kernel compiled for the best instruction set this CPU has (cpu/isa_dispatch.h).
#include <ATen/ATen.h>

#include "common/inference/decode_params.h"
#include "cpu/inference/decode_kernels.h"
#include "generated/kernels.h"

namespace npu_fa {

using cpu::DecodeParams;

at::Tensor incre_flash_attention_cpu(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
                                     const std::optional<at::Tensor>& atten_mask,
                                     const std::optional<at::Tensor>& pse_shift,
                                     const std::optional<at::Tensor>& actual_seq_lengths,
                                     const std::optional<at::Tensor>& block_table,
                                     const std::optional<at::Tensor>& kv_padding_size, int64_t num_heads,
                                     double scale_value, c10::string_view input_layout, int64_t num_key_value_heads,
                                     int64_t block_size, int64_t inner_precise) {
  attention::DecodeInputs in = attention::validate_decode(query, key, value, atten_mask, pse_shift, actual_seq_lengths,
                                                          block_table, kv_padding_size, num_heads, scale_value,
                                                          input_layout, num_key_value_heads, block_size, inner_precise);
  const DecodeParams& p = in.params;
  const int64_t B = p.batch, N1 = p.q_heads;
  const at::Tensor q32 = query.to(at::kFloat).contiguous();  // [B, N1, D] in every layout (Sq = 1), exact
  at::Tensor out = at::empty(query.sizes(), query.options().memory_format(at::MemoryFormat::Contiguous));
  if (B > 0 && N1 > 0) cpu::decode_attention_stub(p, q32, in.key, in.value, out);
  return out;
}

}  // namespace npu_fa
