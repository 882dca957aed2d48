// Validated, backend-neutral description of one FlashAttentionScore call.
//
// Every backend (CPU now, the Ascend C kernels later) parses its arguments with parse_attention_params(), so
// all of them reject the same bad inputs with the same messages and agree on the meaning of layouts, masks,
// sparse modes and the dropout stream. Addresses are element offsets; the head dim is always contiguous.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/string_view.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <optional>
#include <vector>

namespace npu_fa {
struct FlashAttentionScoreGradArgs;  // generated/op_args.h
}  // namespace npu_fa

namespace npu_fa::attention {

enum class Layout { BSH, SBH, BSND, BNSD, TND };

// Where row (b, n, i) of a [.., seq, .., D] tensor starts: batch_offset[b] + n*head_stride + i*seq_stride.
// For TND the batch offset is the first token of sequence b, so the same formula serves packed batches.
// Paged (block_size > 0, keys of a paged KV cache read in place): position i of sequence b is row i % block_size
// of cache block blocks[b * table_stride + i / block_size], which starts at block * block_stride.
struct RowMap {
  std::vector<int64_t> batch_offset;
  int64_t head_stride = 0;
  int64_t seq_stride = 0;
  std::vector<int64_t> blocks;
  int64_t table_stride = 0, block_size = 0, block_stride = 0;
  // NZ paged caches (common/inference/nz_cache.h): a row's head dim lies in pieces of nz_c0 values, piece c at
  // at(b, n, i) + c * piece_stride; 0 = rows contiguous. Only the prefill packer reads such rows (rows_contiguous).
  int64_t nz_c0 = 0, piece_stride = 0;
  bool paged() const { return block_size > 0; }
  bool rows_contiguous() const { return nz_c0 == 0; }
  int64_t at(int64_t b, int64_t n, int64_t i) const {
    if (block_size > 0)
      return blocks[b * table_stride + i / block_size] * block_stride + n * head_stride + i % block_size * seq_stride;
    return batch_offset[b] + n * head_stride + i * seq_stride;
  }
};

// Visible keys of query row i (local to its sequence): i + lo <= j <= i + hi, intersected with [0, kv_len).
// kNone marks an unbounded side. Explicit atten_mask entries are applied on top (see MaskView).
struct Band {
  static constexpr int64_t kNone = std::numeric_limits<int64_t>::max() / 4;
  int64_t lo = -kNone;
  int64_t hi = kNone;
};

enum class TileKind { Empty, Full, Partial };

// A bool/uint8 mask (nonzero = masked out) addressed by element strides; a stride of 0 broadcasts.
struct MaskView {
  const uint8_t* data = nullptr;
  int64_t sb = 0, sn = 0, si = 0, sj = 0;
  bool masked(int64_t b, int64_t n, int64_t i, int64_t j) const { return data[b * sb + n * sn + i * si + j * sj] != 0; }
};

// An fp32 copy of pse addressed by strides (0 = broadcast): pse_type 1 adds it before scaling, 0 after.
struct PseView {
  const float* data = nullptr;
  int64_t sb = 0, sn = 0, si = 0, sj = 0;
  const float* row(int64_t b, int64_t n, int64_t i) const { return data + b * sb + n * sn + i * si; }
};

// Dequantisation of an int8 key or value (CANN's KV antiquant): x = (x_int8 + offset) * scale with scale/offset
// element (b, n2, pos, d) at b*s_b + n2*s_h + pos*s_pos + d*s_d (fp32). pos is the key's position in its sequence
// (the decode op's cache position). per_token: the factors vary with pos and not with d; otherwise they vary with
// neither b nor pos.
struct Antiquant {
  const float* scale = nullptr;               // nullptr: not int8
  const float* offset = nullptr;              // nullptr: symmetric (no offset)
  int64_t s_b = 0, s_h = 0, s_pos = 0, s_d = 0;
  bool per_token = false;
};

struct AttentionParams {
  const char* op = "";
  Layout layout = Layout::BSND;
  int64_t batch = 0;           // B (number of sequences for TND)
  int64_t q_heads = 0;         // N1
  int64_t kv_heads = 0;        // N2
  int64_t group = 1;           // N1 / N2
  int64_t head_dim = 0;        // D of q and k
  int64_t v_head_dim = 0;      // D of v and of the output
  int64_t max_q_len = 0;       // Sq (dense) or the longest sequence (TND)
  int64_t max_kv_len = 0;
  std::vector<int64_t> q_len, kv_len;   // per batch
  std::vector<int64_t> q_start, kv_start;  // first token of each sequence on the seq axis (0 unless TND)
  RowMap q, k, v;              // rows of the (contiguous-in-D) inputs
  RowMap out;                  // rows of attention_out / dy / attention_in (contiguous, q's layout, vD)
  RowMap stats;                // rows of softmax_max / softmax_sum (8 fp32 values per row; TND: NTD or TND order)
  RowMap row_id;               // dense ids of the query rows (b, n, i), 0 .. rows-1, for per-row scratch buffers
  // Dropout element (b, n, i, j) has index dropout_base[b] + (n * q_len[b] + i) * kv_len[b] + j in the flattened
  // mask: [B, N1, Sq, Skv] for the dense layouts, the [N1, Sq_b, Skv_b] blocks of the sequences one after the other
  // for TND (torch_npu's dropout mask order, numels = N1 * sum(Sq_b * Skv_b)).
  std::vector<int64_t> dropout_base;
  int64_t dropout_numel = 0;
  float scale = 1.f;
  float keep_prob = 1.f;
  int64_t pre_tokens = 0, next_tokens = 0;
  int64_t sparse_mode = 0;
  int64_t pse_type = 1;
  std::optional<MaskView> mask;        // only when the mask must be applied element-wise (modes 0 and 1)
  std::optional<PseView> pse;
  const float* sink = nullptr;         // fp32 [N1]: one extra logit per head in every softmax row (value 0)
  // softcap > 0: the scaled score x becomes softcap * tanh(x / softcap) before additive biases and the mask.
  float softcap = 0.f;
  // pse_type 2/3 (in-kernel ALiBi): slope of (b, n) at alibi_slopes[b * alibi_sb + n]; the bias of (i, j) in
  // sequence b is -slope * |j - i + alibi_shift[b]| (pse_type 2) or -slope * sqrt(|...|) (pse_type 3).
  const float* alibi_slopes = nullptr;
  int64_t alibi_sb = 0;
  std::vector<int64_t> alibi_shift;
  uint64_t seed = 0, offset = 0;       // dropout stream (used when keep_prob < 1 and no dropout_bits)
  const uint8_t* dropout_bits = nullptr;  // an explicit bit-packed keep mask (bit e of byte e/8, LSB first)
  // An int8 key and value (the inference ops' KV antiquant; fp16/bf16 query): dequantised as the kernels read them.
  Antiquant k_quant, v_quant;

  bool has_dropout() const { return keep_prob < 1.f; }
  bool int8_kv() const { return k_quant.scale != nullptr; }
  // Whether the logits need more than scale (and an explicit pse): softcap or in-kernel ALiBi.
  bool has_logit_transform() const { return softcap > 0.f || alibi_slopes != nullptr; }
  // Keep-flags of keys [j0, j0 + n) of row i of sequence b, head n: from dropout_bits when given, else the stream.
  void dropout_keep(int64_t b, int64_t head, int64_t i, int64_t j0, int64_t n, uint8_t* keep) const;
  // The structural band of sequence b (sparse mode and pre/next tokens).
  Band band(int64_t b) const;
  // Classifies the tile rows [i0, i1) x keys [j0, j1) of sequence b by the band alone (the explicit mask,
  // if any, still has to be consulted for Full/Partial tiles).
  TileKind classify(int64_t b, int64_t i0, int64_t i1, int64_t j0, int64_t j1) const;
  // Keys [lo, hi) that any row of [i0, i1) may see; lo >= hi when none.
  std::pair<int64_t, int64_t> key_range(int64_t b, int64_t i0, int64_t i1) const;
  // True when key j is visible from row i of sequence b, head n (band and explicit mask).
  bool visible(int64_t b, int64_t n, int64_t i, int64_t j) const;
  // The row form of visible() for kernels: sets s[j - j0] = -inf for the keys j in [j0, j0 + nk) that row i of
  // sequence b, head n may not see. Inline: it runs on every Partial tile row.
  inline void mask_row(int64_t b, int64_t n, int64_t i, int64_t j0, int64_t nk, float* s) const;
};

void AttentionParams::mask_row(int64_t b, int64_t n, int64_t i, int64_t j0, int64_t nk, float* s) const {
  constexpr float kMasked = -std::numeric_limits<float>::infinity();
  const Band r = band(b);
  const int64_t lo = std::clamp<int64_t>(i + r.lo - j0, 0, nk);
  const int64_t hi = std::clamp<int64_t>(i + r.hi + 1 - j0, lo, nk);
  std::fill(s, s + lo, kMasked);
  std::fill(s + hi, s + nk, kMasked);
  if (!mask) return;
  const uint8_t* m = mask->data + (layout == Layout::TND ? 0 : b) * mask->sb + n * mask->sn + i * mask->si + j0 * mask->sj;
  const int64_t sj = mask->sj;
  for (int64_t j = lo; j < hi; ++j) s[j] = m[j * sj] ? kMasked : s[j];
}

// Tensors the kernels read; parse_attention_params() makes them contiguous in D (and converts pse to fp32),
// and keeps them alive for the views above.
struct AttentionInputs {
  at::Tensor query, key, value, pse_f32, mask_u8, sink_f32, dropout_mask, slopes_f32;
  at::Tensor k_scale, k_offset, v_scale, v_offset;  // fp32 antiquant factors of an int8 key/value
};

// The user-facing names of the arguments whose names differ between the ops sharing this parser (the inference
// ops call pse `pse_shift`, head_num `num_heads`, ...), so every message names the argument the caller passed; and
// what a calling op accepts beyond flash_attention_score.
struct ArgNames {
  const char* head_num = "head_num";
  const char* scale = "scale";
  const char* pse = "pse";
  const char* q_lens = "actual_seq_qlen";
  const char* kv_lens = "actual_seq_kvlen";
  // The calling op takes an int8 key/value with an fp16/bf16 query (KV antiquant) and sets the factors itself.
  bool int8_kv = false;
};

// Validates the arguments of flash_attention_score(_grad) and builds the parameters. `Args` is the generated argument
// struct of either op (FlashAttentionScoreArgs, FlashAttentionScoreGradArgs: the fields they share are read). Errors
// name the argument, the expectation and what was given. `inputs` receives the tensors the views point into.
template <class Args>
AttentionParams parse_attention_params(const char* op, const Args& args, AttentionInputs& inputs,
                                       const ArgNames& names = ArgNames{});

// Row addresses of a tensor laid out like the query (is_query) or like key/value, head dim `dim`, any strides
// with a contiguous head dim (e.g. the contiguous gradients dq/dk/dv of the backward).
RowMap row_map(const AttentionParams& p, const at::Tensor& t, bool is_query, int64_t dim);

// Shape of attention_out (q's layout with v's head dim) and of softmax_max/sum.
std::vector<int64_t> output_shape(const AttentionParams& p, const at::Tensor& query);
std::vector<int64_t> stats_shape(const AttentionParams& p, const at::Tensor& query);

// q/k/v must be float32, float16 or bfloat16, all alike (every attention op's first check).
void check_qkv_dtypes(const char* op, const at::Tensor& query, const at::Tensor& key, const at::Tensor& value);

// The softmax scale of every attention op (flash_attention_score, prompt/fused inference, decode): finite and
// representable in fp32, the kernels' compute type. `arg` is the name the op gives it (scale, scale_value).
void check_scale(const char* op, const char* arg, double scale);

// Checks a tensor that must have exactly the given shape (dy, attention_in, softmax_max/sum in the backward).
void check_shape(const char* op, const char* arg, const at::Tensor& t, at::IntArrayRef expected);

// Every check of flash_attention_score_grad, for every backend: a seed whenever keep_prob < 1, the forward's
// arguments (parse_attention_params), and the backward's tensors beyond q/k/v (dy, attention_in like query's output;
// softmax_max/sum float32 statistics).
AttentionParams parse_backward_params(const char* op, const FlashAttentionScoreGradArgs& args, AttentionInputs& inputs);

// ---- Dropout: a counter-based Philox4x32-10 stream, so masks do not depend on tiling or threads. ----
// Element e of a flattened mask draws word e % 4 of the block (counter = (e / 4, offset)) under key seed: the
// offset selects an independent subsequence, and the mask of a call depends only on (seed, offset, e).
struct Philox {
  static inline void round(uint32_t c[4], const uint32_t k[2]) {
    const uint64_t p0 = uint64_t(0xD2511F53u) * c[0];
    const uint64_t p1 = uint64_t(0xCD9E8D57u) * c[2];
    const uint32_t hi0 = uint32_t(p0 >> 32), lo0 = uint32_t(p0);
    const uint32_t hi1 = uint32_t(p1 >> 32), lo1 = uint32_t(p1);
    const uint32_t n0 = hi1 ^ c[1] ^ k[0], n2 = hi0 ^ c[3] ^ k[1];
    c[0] = n0; c[1] = lo1; c[2] = n2; c[3] = lo0;
  }
  // Four uint32 random words for the counter (block, offset) under key seed.
  static inline void generate(uint64_t seed, uint64_t offset, uint64_t block, uint32_t out[4]) {
    uint32_t c[4] = {uint32_t(block), uint32_t(block >> 32), uint32_t(offset), uint32_t(offset >> 32)};
    uint32_t k[2] = {uint32_t(seed), uint32_t(seed >> 32)};
    for (int r = 0; r < 10; ++r) {
      round(c, k);
      if (r < 9) { k[0] += 0x9E3779B9u; k[1] += 0xBB67AE85u; }
    }
    out[0] = c[0]; out[1] = c[1]; out[2] = c[2]; out[3] = c[3];
  }
};

// Keep-flags of the mask elements [e0, e0 + n) of the stream (seed, offset): keep[x] = 1 if element e0 + x is kept,
// i.e. its word is below keep_prob * 2^32.
void dropout_keep_run(uint64_t seed, uint64_t offset, float keep_prob, int64_t e0, int64_t n, uint8_t* keep);

}  // namespace npu_fa::attention
