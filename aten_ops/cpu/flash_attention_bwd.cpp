// PLACEHOLDER (being replaced by the real kernel): FlashAttention backward on CPU.
#include "common/attention_params.h"
#include "generated/kernels.h"

#include <ATen/ATen.h>

namespace npu_fa {

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> flash_attention_score_grad_cpu(
    const at::Tensor& query, const at::Tensor& key, const at::Tensor& value, const at::Tensor& dy, int64_t head_num,
    c10::string_view input_layout, const std::optional<at::Tensor>& pse, const std::optional<at::Tensor>& atten_mask,
    const at::Tensor& softmax_max, const at::Tensor& softmax_sum, const at::Tensor& attention_in,
    const std::optional<at::Tensor>& actual_seq_qlen, const std::optional<at::Tensor>& actual_seq_kvlen, double scale,
    double keep_prob, int64_t pre_tokens, int64_t next_tokens, int64_t inner_precise, int64_t sparse_mode,
    int64_t pse_type, const std::optional<at::Tensor>& seed, const std::optional<at::Tensor>& offset) {
  TORCH_CHECK(false, "flash_attention_score_grad: not implemented yet");
}

}  // namespace npu_fa
