// The route plan of fused_infer_attention_score (fia_route.h): the checks every route shares, the rules that choose
// the route, and the Decode route itself.
#include "common/inference/fia_route.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <limits>
#include <string>

#include "common/inference/decode_params.h"
#include "common/inference/paged_params.h"
#include "common/inference/prefill_params.h"
#include "generated/op_calls.h"

namespace npu_fa::attention {

namespace {

constexpr int64_t kMaxTokens = std::numeric_limits<int32_t>::max();

// learnable_sink as incre_flash_attention and flash_attention_score take it: float32, one logit per query head.
void check_learnable_sink(const char* op, const FusedInferAttentionScoreArgs& a) {
  if (!a.learnable_sink.has_value()) return;
  const at::Tensor& s = *a.learnable_sink;
  TORCH_CHECK_TYPE(s.scalar_type() == at::kFloat, op, ": argument 'learnable_sink' must be a float32 tensor (one "
                   "logit per query head); got ", s.scalar_type());
  TORCH_CHECK_VALUE(s.dim() == 1 && s.size(0) == a.num_heads, op, ": argument 'learnable_sink' must have shape "
                    "[num_heads=", a.num_heads, "] (one logit per query head); got ", s.sizes());
}

// What every route checks the same way, before the routes' own parsers.
void check_shared_arguments(const char* op, const FusedInferAttentionScoreArgs& a) {
  check_prompt_flags(op, a);
  check_scale(op, "scale", a.scale);  // here, so that the decode route (the decode op's parser) reports it as FIA's
  TORCH_CHECK_VALUE(a.block_table.has_value() || a.block_size == 0, op, ": argument 'block_size' is only used with "
                    "block_table (paged KV); got ", a.block_size);
  if (!is_int8_kv(a))  // antiquant arguments without an int8 cache are an error; modes are range-checked
    parse_kv_antiquant(op, AntiquantArgs::of(a), false, 0, 0, 0, 0);
  check_learnable_sink(op, a);
}

// The values of a 1-D integer lengths tensor, or nothing when it is absent or not one (the parsers of the routes
// then name what is wrong). The decision only reads them.
bool read_lengths(const std::optional<at::Tensor>& t, std::vector<int64_t>& out) {
  out.clear();
  if (!t.has_value() || t->dim() != 1 || (t->scalar_type() != at::kInt && t->scalar_type() != at::kLong)) return false;
  const at::Tensor c = t->to(at::kCPU, at::kLong).contiguous();
  out.assign(c.const_data_ptr<int64_t>(), c.const_data_ptr<int64_t>() + c.numel());
  return true;
}

// (num_blocks, N2, block_size, D), or the NZ (num_blocks, N2, D / c0, block_size, c0): the decode op reads both with
// input_layout BNSD.
bool head_major_cache(const FusedInferAttentionScoreArgs& a) {
  if (!a.block_table.has_value()) return false;
  return (a.key.dim() == 4 && a.key.size(2) == a.block_size) || (a.key.dim() == 5 && a.key.size(3) == a.block_size);
}

// Whether the band of a one-token row hides none of its keys [0, capacity): mode 0 with a mask keeps -pre <= j <=
// next (without one CANN ignores pre/next), mode 1 is the mask alone, mode 3 (bottom-right causal) keeps j <= len - 1;
// modes 2 and 4 hide keys. Mode 3 with a mask goes to the prefill path, which checks it is the optimised one.
bool band_hides_no_key(const FusedInferAttentionScoreArgs& a, int64_t capacity) {
  switch (a.sparse_mode) {
    case 0: return !a.atten_mask.has_value() || (a.pre_tokens >= 0 && a.next_tokens >= capacity - 1);
    case 1: return true;
    case 3: return !a.atten_mask.has_value();
    default: return false;
  }
}

// The decode op takes a mask of (B, S), (B, 1, S) or (B, 1, 1, S): one row per sequence, no head dim.
bool mask_is_per_batch(const FusedInferAttentionScoreArgs& a) {
  if (!a.atten_mask.has_value() || a.sparse_mode > 1) return true;
  const at::Tensor& m = *a.atten_mask;
  bool per_batch = m.dim() >= 2 && m.dim() <= 4;
  for (int64_t d = 1; per_batch && d + 1 < m.dim(); ++d) per_batch = m.size(d) == 1;
  return per_batch;
}

// Whether the decode op computes a dense one-token call exactly as the prefill path computes it on the same keys
// laid out contiguously: one query token, no lse (the decode op has none), equal K/V head dims, a band hiding none
// of the row's keys, a per-batch mask, every query length 1 (a length 0 makes a padded zero row; other values are
// the prefill parser's errors to report), and a cache form the decode op reads (head-major only with BNSD).
bool dense_decode_fits(const FusedInferAttentionScoreArgs& a, const FiaPlan& plan) {
  const c10::string_view lay = a.input_layout;
  if (a.softmax_lse_flag || !(lay == "BSH" || lay == "BSND" || lay == "BNSD")) return false;
  if (a.key.sizes() != a.value.sizes() || a.key.dim() < 3) return false;
  if (paged_query_len(a.query, lay) != 1) return false;
  if (head_major_cache(a) && lay != "BNSD") return false;
  int64_t capacity = a.key.size(lay == "BNSD" ? 2 : 1);
  if (a.block_table.has_value()) capacity = a.block_table->dim() == 2 ? a.block_table->size(1) * a.block_size : 0;
  if (!band_hides_no_key(a, capacity) || !mask_is_per_batch(a)) return false;
  if (a.actual_seq_lengths.has_value()) {
    const int64_t B = a.query.size(0), n = static_cast<int64_t>(plan.q_lens.size());
    if (n == 0 || (n != 1 && n != B)) return false;
    if (std::any_of(plan.q_lens.begin(), plan.q_lens.end(), [](int64_t l) { return l != 1; })) return false;
  }
  return true;
}

// A paged TND batch of one query token per sequence (cumulative ends 1, 2, ..., T: vLLM-Ascend's decode call) is
// the dense one-token call with B = T, so the decode op reads the cache in place. Same conditions as above; TND
// rows have no padding, no pse_shift is allowed (TND takes none), and the band is mode 0 or 3 without a mask.
bool tnd_decode_fits(const FusedInferAttentionScoreArgs& a, const FiaPlan& plan) {
  if (!plan.paged || !plan.tnd || a.softmax_lse_flag || a.pse_shift.has_value() || a.atten_mask.has_value())
    return false;
  if ((a.sparse_mode != 0 && a.sparse_mode != 3) || !a.actual_seq_lengths_kv.has_value()) return false;
  if (a.query.dim() != 3 || a.key.sizes() != a.value.sizes() || (a.key.dim() < 3 || a.key.dim() > 5)) return false;
  const int64_t T = a.query.size(0);
  if (T == 0 || static_cast<int64_t>(plan.q_lens.size()) != T) return false;
  for (int64_t i = 0; i < T; ++i)
    if (plan.q_lens[i] != i + 1) return false;
  return true;
}

// The route of a call, rule by rule.
FiaRoute choose_route(const FusedInferAttentionScoreArgs& a, FiaPlan& plan) {
  // Rope parts change the scores themselves: the MLA paths own every such call (they check the rope arguments, then
  // run the absorbed-MLA kernel or append the rope parts to the heads and plan that call again).
  if (a.query_rope.has_value() || a.key_rope.has_value()) return FiaRoute::Mla;
  if (plan.paged) {
    // A one-token call that hides no key: the decode op reads the cache in place and splits long sequences into
    // key chunks (flash-decoding), where the prefill kernel would run one query row per tile.
    if (dense_decode_fits(a, plan)) return FiaRoute::Decode;
    if (tnd_decode_fits(a, plan)) {
      plan.tnd_decode = true;
      return FiaRoute::Decode;
    }
    // Everything else on a paged cache (longer queries, the lse, bands, masks, pse_shift): the prefill kernel,
    // which reads the cache through the block table.
    return FiaRoute::PagedPrefill;
  }
  // A contiguous cache at one token, any cache dtype: the decode kernel splits each sequence into key chunks over
  // the threads and reads int8 with integer dot products, where the prefill kernel runs one query row per tile
  // (measured, B=4 N=32/8 S=8192 D=128 bf16 BNSD on two AVX2 threads: ~90 ms on the prefill kernel, ~12 ms here).
  if (dense_decode_fits(a, plan)) return FiaRoute::Decode;
  // Everything else: the prefill kernel on the contiguous cache (longer queries, the lse, bands, masks per row).
  return FiaRoute::DensePrefill;
}

bool per_token_antiquant(const FusedInferAttentionScoreArgs& a) {
  const auto per_token = [](int64_t mode) { return mode == 1 || mode == 3; };
  return a.antiquant_mode == 1 || per_token(a.key_antiquant_mode) || per_token(a.value_antiquant_mode);
}

// Query rows per sequence, for the window rule: TND from the cumulative ends, dense layouts the per-batch lengths (or
// the padded length). Empty when they cannot be read for `rows` sequences.
std::vector<int64_t> query_rows(const FusedInferAttentionScoreArgs& a, const FiaPlan& plan, int64_t rows) {
  std::vector<int64_t> q;
  if (plan.tnd) {
    if (static_cast<int64_t>(plan.q_lens.size()) != rows) return {};
    for (int64_t b = 0; b < rows; ++b) q.push_back(plan.q_lens[b] - (b ? plan.q_lens[b - 1] : 0));
    return q;
  }
  if (a.query.dim() < 3) return {};
  if (!a.actual_seq_lengths.has_value()) return std::vector<int64_t>(rows, paged_query_len(a.query, a.input_layout));
  const int64_t n = static_cast<int64_t>(plan.q_lens.size());
  if (n == 1) return std::vector<int64_t>(rows, plan.q_lens[0]);
  return n == rows ? plan.q_lens : std::vector<int64_t>{};
}

// A sliding window (sparse_mode 4, pre_tokens >= 0) over a paged cache: the blocks wholly before the first key the
// earliest query row of a sequence can see are dropped from its block_table row and its KV length. Mode 4's band is
// measured from the end of the keys, so the answer is unchanged; those blocks are then never read or range-checked
// (an engine may have freed them and left -1 there), and a route that gathers used blocks copies ~window keys per
// sequence instead of its history. Not with pse_shift or per-token antiquant factors: they are indexed by the key's
// position, which the drop would shift.
void skip_blocks_before_window(FiaPlan& plan) {
  FusedInferAttentionScoreValues& c = plan.call;
  if (!plan.paged || c.sparse_mode != 4 || c.pre_tokens < 0 || c.pre_tokens >= kMaxTokens || c.pse_shift.has_value())
    return;
  const FusedInferAttentionScoreArgs a = c.args();
  std::vector<int64_t> kv;
  if (per_token_antiquant(a) || c.block_size <= 0 || c.block_table->dim() != 2 ||
      !read_lengths(c.actual_seq_lengths_kv, kv))
    return;  // (what is wrong with them is the routes' to report)
  const int64_t rows = c.block_table->size(0), cols = c.block_table->size(1), bs = c.block_size;
  if (kv.size() == 1) kv.assign(rows, kv[0]);
  const std::vector<int64_t> q = query_rows(a, plan, rows);
  if (static_cast<int64_t>(kv.size()) != rows || static_cast<int64_t>(q.size()) != rows) return;
  std::vector<int64_t> skip(rows, 0);
  for (int64_t b = 0; b < rows; ++b) {
    const int64_t first = kv[b] - q[b] - c.pre_tokens;  // the first key the earliest query row sees
    if (first > 0 && q[b] >= 0 && kv[b] >= 0) skip[b] = first / bs;
  }
  if (std::all_of(skip.begin(), skip.end(), [](int64_t s) { return s == 0; })) return;
  const at::Tensor table = c.block_table->to(at::kCPU, at::kLong).contiguous();
  at::Tensor shifted = at::empty_like(table);
  const int64_t* src = table.const_data_ptr<int64_t>();
  int64_t* dst = shifted.data_ptr<int64_t>();
  for (int64_t b = 0; b < rows; ++b) {
    for (int64_t i = 0; i < cols; ++i) dst[b * cols + i] = src[b * cols + std::min(i + skip[b], cols - 1)];
    kv[b] -= skip[b] * bs;  // (the entries shifted in from the end are never read)
  }
  c.block_table = shifted.to(c.block_table->device(), c.block_table->scalar_type());
  c.actual_seq_lengths_kv = at::tensor(kv, at::kLong);
}

}  // namespace

FiaPlan plan_fia(const char* op, const FusedInferAttentionScoreArgs& a) {
  check_shared_arguments(op, a);
  FiaPlan plan;
  plan.call = FusedInferAttentionScoreValues(a);
  plan.paged = a.block_table.has_value();
  plan.tnd = a.input_layout == "TND";
  plan.int8_kv = is_int8_kv(a);
  read_lengths(a.actual_seq_lengths, plan.q_lens);
  skip_blocks_before_window(plan);
  plan.route = choose_route(plan.call.args(), plan);
  if (plan.route == FiaRoute::Decode && !plan.paged) {
    // A contiguous call is checked by the prefill parser first, which every other contiguous call goes through:
    // a bad argument is then reported under this op's name and argument names, not the decode op's.
    AttentionInputs unused;
    parse_prompt_params(op, a.query, a.key, a.value, a, unused);
  }
  return plan;
}

std::tuple<at::Tensor, at::Tensor> run_decode_route(const FiaPlan& plan) {
  const FusedInferAttentionScoreValues& c = plan.call;
  // The decode op takes the call's arguments under its own names.
  IncreFlashAttentionValues d;
  d.query = c.query;
  d.key = c.key;
  d.value = c.value;
  d.atten_mask = c.atten_mask;
  d.pse_shift = c.pse_shift;
  d.actual_seq_lengths = c.actual_seq_lengths_kv;  // the decode op's lengths are the KV lengths
  d.block_table = c.block_table;
  d.num_heads = c.num_heads;
  d.scale_value = c.scale;
  d.input_layout = c.input_layout;
  d.num_key_value_heads = c.num_key_value_heads;
  d.block_size = c.block_size;
  // The decode op's inner_precise has the precision bit only (FIA's 2/3 add a fix for invalid rows, which it has).
  d.inner_precise = c.inner_precise % 2;
  d.antiquant_scale = c.antiquant_scale;
  d.antiquant_offset = c.antiquant_offset;
  d.key_antiquant_scale = c.key_antiquant_scale;
  d.key_antiquant_offset = c.key_antiquant_offset;
  d.value_antiquant_scale = c.value_antiquant_scale;
  d.value_antiquant_offset = c.value_antiquant_offset;
  d.antiquant_mode = c.antiquant_mode;
  d.key_antiquant_mode = c.key_antiquant_mode;
  d.value_antiquant_mode = c.value_antiquant_mode;
  d.learnable_sink = c.learnable_sink;
  // PagedKVCache's (num_blocks, block_size, N2, D) is the decode op's (num_blocks, block_size, N2*D); a head-major
  // (num_blocks, N2, block_size, D) cache is read as it is (BNSD).
  const bool head_major = head_major_cache(c.args());
  if (plan.paged && c.key.dim() == 4 && !head_major) {
    d.key = c.key.flatten(2);
    d.value = c.value.is_same(c.key) ? d.key : c.value.flatten(2);
  }
  const int64_t seq_dim = head_major ? 2 : 1;
  if (plan.tnd_decode) {  // [T, N, D] as T sequences of one position
    d.query = c.query.unsqueeze(seq_dim);
    d.input_layout = head_major ? "BNSD" : "BSND";
  }
  at::Tensor out = call_incre_flash_attention(d.args());
  if (plan.tnd_decode) out = out.squeeze(seq_dim);
  return {out, at::empty({0}, c.query.options().dtype(at::kFloat))};
}

}  // namespace npu_fa::attention
