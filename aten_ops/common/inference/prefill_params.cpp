// Argument validation for the inference (prefill) attention ops, layered on parse_attention_params.
#include "common/inference/prefill_params.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <limits>
#include <sstream>
#include <type_traits>

#include "common/inference/decode_params.h"

namespace npu_fa::attention {

void read_per_batch_lengths(const char* op, const char* arg, const at::Tensor& t, int64_t batch, int64_t padded,
                            std::vector<int64_t>& len) {
  TORCH_CHECK_TYPE(t.scalar_type() == at::kLong || t.scalar_type() == at::kInt, op, ": argument '", arg,
                   "' must be an int64 or int32 tensor of per-batch lengths; got ", t.scalar_type());
  TORCH_CHECK_VALUE(t.dim() == 1 && (t.numel() == batch || t.numel() == 1), op, ": argument '", arg,
                    "' must be a 1-D tensor with one length per batch (B=", batch, ") or a single length; got shape ",
                    t.sizes());
  const at::Tensor c = t.to(at::kCPU, at::kLong).contiguous();
  const int64_t* e = c.data_ptr<int64_t>();
  len.assign(batch, 0);
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t v = e[c.numel() == 1 ? 0 : b];
    TORCH_CHECK_VALUE(v >= 0 && v <= padded, op, ": argument '", arg, "' entry ", b, " is ", v,
                      "; per-batch lengths must lie in [0, ", padded, "] (the padded sequence length of the tensor)",
                      v < 0 ? "" : ". For TND pass cumulative ends instead");
    len[b] = v;
  }
}

namespace {

// Whether the call has an int8 key/value (KV antiquant, fused_infer_attention_score only), checking what goes with
// one: both int8 and alike, an fp16/bf16 query (as torch_npu).
template <class Args>
bool int8_kv(const char* op, const at::Tensor& query, const at::Tensor& key, const at::Tensor& value, const Args&) {
  if constexpr (!std::is_same_v<Args, FusedInferAttentionScoreArgs>) {
    return false;
  } else {
    if (key.scalar_type() != at::kChar && value.scalar_type() != at::kChar) return false;
    TORCH_CHECK_TYPE(key.scalar_type() == at::kChar && value.scalar_type() == at::kChar, op, ": arguments 'key' and "
                     "'value' must both be int8 for an int8 cache; got ", key.scalar_type(), " and ",
                     value.scalar_type());
    const auto qt = query.scalar_type();
    TORCH_CHECK_TYPE(qt == at::kHalf || qt == at::kBFloat16, op, ": int8 key/value need a float16 or bfloat16 "
                     "'query' (as torch_npu); got ", qt);
    TORCH_CHECK_VALUE(key.sizes() == value.sizes(), op, ": int8 'key' and 'value' must have the same shape; got ",
                      key.sizes(), " and ", value.sizes());
    return true;
  }
}

// The dequantisation factors of an int8 key/value, validated for the keys the call reads (per-token factors are
// indexed by the key's position in its sequence, in every layout).
template <class Args>
void set_kv_antiquant(const char* op, const Args& a, AttentionParams& p, AttentionInputs& in) {
  if constexpr (std::is_same_v<Args, FusedInferAttentionScoreArgs>) {
    const int64_t need = p.kv_len.empty() ? 0 : *std::max_element(p.kv_len.begin(), p.kv_len.end());
    parse_kv_antiquant(op, AntiquantArgs::of(a), true, p.batch, p.kv_heads, p.head_dim, need).install(p, in);
  }
}

}  // namespace

template <class Args>
PromptParams parse_prompt_params(const char* op, const at::Tensor& query, const at::Tensor& key,
                                 const at::Tensor& value, const Args& a, AttentionInputs& in) {
  PromptParams r;
  const c10::string_view lay = a.input_layout;
  const bool known = lay == "BSH" || lay == "BSND" || lay == "BNSD" || lay == "BNSD_BSND" || lay == "TND";
  TORCH_CHECK_VALUE(known, op, ": argument 'input_layout' must be one of BSH, BSND, BNSD, BNSD_BSND, TND; got '",
                    std::string(lay.data(), lay.size()), "'");
  r.bsnd_out = lay == "BNSD_BSND";
  const bool tnd = lay == "TND";
  const c10::string_view base = r.bsnd_out ? c10::string_view("BNSD") : lay;
  TORCH_CHECK_VALUE(a.num_heads > 0, op, ": argument 'num_heads' must be positive; got ", a.num_heads);
  TORCH_CHECK_VALUE(a.num_key_value_heads >= 0, op, ": argument 'num_key_value_heads' must be >= 0 (0 = num_heads); got ",
                    a.num_key_value_heads);
  TORCH_CHECK_VALUE(a.num_key_value_heads == 0 || a.num_heads % a.num_key_value_heads == 0, op,
                    ": argument 'num_key_value_heads'=", a.num_key_value_heads, " must divide num_heads=", a.num_heads);

  std::optional<at::Tensor> mask = a.atten_mask;
  if (mask.has_value() && mask->dim() == 3) mask = mask->unsqueeze(1);  // [B, Sq, Skv] -> [B, 1, Sq, Skv]
  // CANN: in sparse_mode 0 without a mask, pre_tokens/next_tokens are ignored (full attention).
  int64_t pre = a.pre_tokens, next = a.next_tokens;
  if (a.sparse_mode == 0 && !mask.has_value()) pre = next = std::numeric_limits<int32_t>::max();
  ArgNames names;
  names.head_num = "num_heads";
  names.scale = prompt_scale_name(a);
  names.pse = "pse_shift";
  names.q_lens = "actual_seq_lengths";
  names.kv_lens = "actual_seq_lengths_kv";
  names.int8_kv = int8_kv(op, query, key, value, a);
  // The shared parser sees a flash_attention_score call: no dropout, pse added after scaling, lengths only for TND
  // (the dense layouts' per-batch lengths are read below), FIA's learnable_sink as its sink; the other arguments keep
  // that op's defaults.
  FlashAttentionScoreValues fa;
  fa.query = query;
  fa.key = key;
  fa.value = value;
  fa.head_num = a.num_heads;
  fa.input_layout = std::string(base);
  fa.pse = a.pse_shift;
  fa.pse_type = 0;
  fa.atten_mask = mask;
  if (tnd) {
    fa.actual_seq_qlen = a.actual_seq_lengths;
    fa.actual_seq_kvlen = a.actual_seq_lengths_kv;
    fa.softmax_layout = "TND";
  }
  fa.scale = prompt_scale(a);
  fa.pre_tokens = pre;
  fa.next_tokens = next;
  fa.inner_precise = a.inner_precise;
  fa.sparse_mode = a.sparse_mode;
  fa.sink = prompt_sink(a);  // checked by the caller (fia_route.cpp names it learnable_sink)
  r.p = parse_attention_params(op, fa.args(), in, names);
  AttentionParams& p = r.p;
  TORCH_CHECK_VALUE(a.num_key_value_heads == 0 || a.num_key_value_heads == p.kv_heads, op,
                    ": argument 'num_key_value_heads'=", a.num_key_value_heads, " does not match the ", p.kv_heads,
                    " heads of 'key' (shape ", key.sizes(), ")");
  if (!tnd) {
    if (a.actual_seq_lengths.has_value())
      read_per_batch_lengths(op, "actual_seq_lengths", *a.actual_seq_lengths, p.batch, p.max_q_len, p.q_len);
    if (a.actual_seq_lengths_kv.has_value())
      read_per_batch_lengths(op, "actual_seq_lengths_kv", *a.actual_seq_lengths_kv, p.batch, p.max_kv_len, p.kv_len);
    for (int64_t b = 0; b < p.batch; ++b) r.padded = r.padded || p.q_len[b] < p.max_q_len;
  }
  if (names.int8_kv) set_kv_antiquant(op, a, p, in);
  if (r.bsnd_out) {
    const int64_t B = p.batch, S = p.max_q_len, N = p.q_heads, vD = p.v_head_dim;
    r.out_shape = {B, S, N, vD};
    p.out.head_stride = vD;
    p.out.seq_stride = N * vD;
    for (int64_t b = 0; b < B; ++b) p.out.batch_offset[b] = b * S * N * vD;
  } else {
    r.out_shape = output_shape(p, query);
  }
  return r;
}

template PromptParams parse_prompt_params(const char*, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                          const PromptFlashAttentionArgs&, AttentionInputs&);
template PromptParams parse_prompt_params(const char*, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                          const FusedInferAttentionScoreArgs&, AttentionInputs&);

}  // namespace npu_fa::attention
