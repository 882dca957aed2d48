// Parameters of the inference attention ops (PromptFlashAttention, FusedInferAttentionScore), built on the shared
// FlashAttentionScore parser: the same layouts, masks, sparse modes and messages, plus what inference adds
// (per-batch sequence lengths for the dense layouts, the BNSD_BSND layout, pse_shift, num_key_value_heads).
#pragma once

#include "common/attention/params.h"

namespace npu_fa::attention {

struct PromptArgs {
  const std::optional<at::Tensor>* pse_shift = nullptr;
  const std::optional<at::Tensor>* atten_mask = nullptr;
  const std::optional<at::Tensor>* actual_seq_lengths = nullptr;
  const std::optional<at::Tensor>* actual_seq_lengths_kv = nullptr;
  int64_t num_heads = 1;
  double scale = 1.0;
  const char* scale_name = "scale";  // prompt_flash_attention calls it scale_value
  int64_t pre_tokens = 0, next_tokens = 0;
  c10::string_view input_layout;
  int64_t num_key_value_heads = 0;
  int64_t sparse_mode = 0;
  int64_t inner_precise = 0;
};

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
// `out_shape` (contiguous) — its rows are already in p.out.
PromptParams parse_prompt_params(const char* op, const at::Tensor& query, const at::Tensor& key,
                                 const at::Tensor& value, const PromptArgs& a, AttentionInputs& in);

}  // namespace npu_fa::attention
