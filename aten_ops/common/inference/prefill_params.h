// Parameters of the inference attention ops (PromptFlashAttention, FusedInferAttentionScore), built on the shared
// FlashAttentionScore parser: the same layouts, masks, sparse modes and messages, plus what inference adds
// (per-batch sequence lengths for the dense layouts, the BNSD_BSND layout, pse_shift, num_key_value_heads).
#pragma once

#include <ATen/ATen.h>

#include "common/attention/params.h"
#include "generated/op_args.h"

namespace npu_fa::attention {

// The two ops sharing this parser name their scale differently.
inline double prompt_scale(const PromptFlashAttentionArgs& a) { return a.scale_value; }
inline double prompt_scale(const FusedInferAttentionScoreArgs& a) { return a.scale; }
inline const char* prompt_scale_name(const PromptFlashAttentionArgs&) { return "scale_value"; }
inline const char* prompt_scale_name(const FusedInferAttentionScoreArgs&) { return "scale"; }
// fused_infer_attention_score's learnable_sink is the shared parser's sink (prompt_flash_attention has none).
inline std::optional<at::Tensor> prompt_sink(const PromptFlashAttentionArgs&) { return std::nullopt; }
inline std::optional<at::Tensor> prompt_sink(const FusedInferAttentionScoreArgs& a) { return a.learnable_sink; }

// The checks each prefill op makes before parsing (shared by the CPU and npu kernels).
inline void check_prompt_flags(const char* op, const PromptFlashAttentionArgs& a) {
  TORCH_CHECK_VALUE(!a.padding_mask.has_value(), op,
                    ": argument 'padding_mask' is reserved upstream and not supported; "
                    "pass atten_mask (True = masked out) or actual_seq_lengths");
  TORCH_CHECK_VALUE(a.inner_precise >= 0 && a.inner_precise <= 3, op, ": argument 'inner_precise' must be in [0, 3]; got ",
                    a.inner_precise);
}
inline void check_prompt_flags(const char* op, const FusedInferAttentionScoreArgs& a) {
  TORCH_CHECK_VALUE(a.inner_precise >= 0 && a.inner_precise <= 3, op, ": argument 'inner_precise' must be in [0, 3]; got ",
                    a.inner_precise);
}

// The softmax lse of the inference ops ([..., 1]) from the kernels' [..., 8] max / sum statistics:
// max + log(sum); rows that saw no key give -inf.
inline at::Tensor lse_from_statistics(const at::Tensor& softmax_max, const at::Tensor& softmax_sum) {
  return at::log(softmax_sum.narrow(-1, 0, 1)).add_(softmax_max.narrow(-1, 0, 1));
}

struct PromptParams {
  AttentionParams p;
  bool bsnd_out = false;       // BNSD_BSND: BNSD inputs, BSND output
  bool padded = false;         // some query row of a dense layout lies beyond its sequence's actual length
  std::vector<int64_t> out_shape;
};

// Per-batch (non-cumulative) lengths of a dense layout: a 1-D int32/int64 tensor with B entries (or 1, broadcast),
// each in [0, padded]. Overwrites `len`.
void read_per_batch_lengths(const char* op, const char* arg, const at::Tensor& t, int64_t batch, int64_t padded,
                            std::vector<int64_t>& len);

// Validates and builds the parameters of a prefill call; the output tensor must be allocated with
// `out_shape` (contiguous) — its rows are already in p.out. `Args` is the generated argument struct of
// prompt_flash_attention or fused_infer_attention_score; query/key/value are passed apart (the paged path of the
// fused op hands in gathered caches).
template <class Args>
PromptParams parse_prompt_params(const char* op, const at::Tensor& query, const at::Tensor& key,
                                 const at::Tensor& value, const Args& a, AttentionInputs& in);

}  // namespace npu_fa::attention
