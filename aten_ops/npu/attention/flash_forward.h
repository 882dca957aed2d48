// The FlashAttention forward Ascend C kernel as a host function, shared by the npu glue of flash_attention_score
// (attention.cpp) and of the inference prefill ops (inference.cpp), which reach the same kernel with their own
// validation: one tiling, one launch.
#pragma once

#include <ATen/ATen.h>

#include <optional>

#include "common/attention/params.h"

namespace npu_fa::npu_host {

// What the kernel has no path for among parsed parameters (an empty key sequence, head dim > 512), or nullptr.
const char* flash_forward_refusal(const attention::AttentionParams& p);

// Launches the kernel for parsed parameters of a dense layout whose sequences all have the full lengths (the
// caller checked it). Returns attention_out in BNSD [B, N1, S1, vD] and writes the [B, N1, S1, 8] fp32 softmax
// statistics into smax / ssum (allocated by the caller with that shape).
at::Tensor run_flash_forward(const char* op, const attention::AttentionParams& p, const at::Tensor& query,
                             const at::Tensor& key, const at::Tensor& value,
                             const std::optional<at::Tensor>& atten_mask, const at::Tensor& smax,
                             const at::Tensor& ssum);

}  // namespace npu_fa::npu_host
