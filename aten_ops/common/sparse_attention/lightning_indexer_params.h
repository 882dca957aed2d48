// Validated, backend-neutral description of one lightning-indexer call (lightning_indexer, quant_lightning_indexer,
// lightning_indexer_grad, sparse_lightning_indexer_grad_kl_loss): layouts, per-sequence token ranges, the causal
// visibility rule and where each key token lives (contiguous or paged).
#pragma once

#include <ATen/ATen.h>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace npu_fa {
namespace sparse_attention {

enum class KeyLayout { BSND, TND, PA_BSND };

// One call's geometry. Query tokens and key tokens are addressed as rows of [rows, heads, D] views:
//   query row of token i of batch b = q_start[b] + i (BSND: b * S1 + i; TND: the cumulative start),
//   key row of token s of batch b   = key_row(b, s) (BSND: b * S2 + s; TND: k_start[b] + s;
//                                     PA_BSND: block_table[b][s / block_size] * block_size + s % block_size).
struct IndexerGeometry {
  int64_t B = 0;           // sequences
  int64_t N1 = 0;          // query heads
  int64_t N2 = 0;          // key heads
  int64_t G = 0;           // N1 / N2, query heads per key head
  int64_t D = 0;           // head dim
  int64_t q_rows = 0;      // query.size(0) * (BSND: S1), the rows of the output
  int64_t k_rows = 0;      // key rows of the [rows, N2, D] view
  bool query_tnd = false;
  KeyLayout key_layout = KeyLayout::BSND;
  int64_t block_size = 0;  // PA_BSND
  int64_t sparse_mode = 3;
  std::vector<int64_t> q_start, q_len, k_start, k_len;
  at::Tensor block_table;  // int64 contiguous [B, max blocks] (PA_BSND only)

  // Keys query token i (0-based within batch b) sees: the first visible_keys(b, i) tokens of the sequence.
  int64_t visible_keys(int64_t b, int64_t i) const {
    if (sparse_mode == 0) return k_len[b];
    const int64_t v = k_len[b] - q_len[b] + i + 1;
    return v < 0 ? 0 : (v > k_len[b] ? k_len[b] : v);
  }
  // Row of key token s of batch b; *run receives how many of the following tokens (s, s+1, ...) lie in consecutive
  // rows (up to `limit`).
  int64_t key_row(int64_t b, int64_t s, int64_t limit, int64_t* run) const {
    if (key_layout == KeyLayout::PA_BSND) {
      const int64_t blk = s / block_size, off = s % block_size;
      const int64_t id = block_table.data_ptr<int64_t>()[b * block_table.size(1) + blk];
      if (run) *run = std::min(limit, block_size - off);
      return id * block_size + off;
    }
    if (run) *run = limit;
    return k_start[b] + s;
  }
};

struct IndexerInputs {
  const at::Tensor& query;
  const at::Tensor& key;
  const at::Tensor& weights;
  const std::optional<at::Tensor>& actual_seq_lengths_query;
  const std::optional<at::Tensor>& actual_seq_lengths_key;
  const std::optional<at::Tensor>& block_table;
  std::string layout_query;
  std::string layout_key;
  int64_t sparse_mode;
  int64_t pre_tokens;
  int64_t next_tokens;
  // argument names as the calling op spells them (the KL loss op says actual_seq_qlen / actual_seq_klen)
  const char* name_query = "query";
  const char* name_key = "key";
  const char* name_weights = "weights";
  const char* name_seq_q = "actual_seq_lengths_query";
  const char* name_seq_k = "actual_seq_lengths_key";
  const char* name_layout_query = "layout_query";
  const char* name_layout_key = "layout_key";
  bool cumulative_bsnd_lengths = false;  // KL loss: BSND takes no lengths
};

// Checks layouts, ranks, shapes, head counts, sequence lengths, the block table, sparse_mode and the reserved
// pre/next_tokens; errors name the argument, what is expected and what was given. Dtypes are the caller's.
IndexerGeometry parse_indexer_geometry(const char* op, const IndexerInputs& in);

// query / key (16-bit, fp32 or fp64, one dtype) and weights (their dtype, or float32 next to 16-bit ones); `qn`,
// `kn`, `wn` are the arguments' names in the calling op.
void check_indexer_dtypes(const char* op, const at::Tensor& q, const char* qn, const at::Tensor& k, const char* kn,
                          const at::Tensor& w, const char* wn);

// A float16 / bfloat16 / float32 / float64 tensor.
void check_indexer_floating(const char* op, const char* name, const at::Tensor& t);

// Every rule of lightning_indexer's forward (dtypes, sparse_count, the geometry, return_value only with contiguous
// keys), shared by the CPU and npu backends so both raise the same errors.
IndexerGeometry parse_lightning_indexer(const char* op, const IndexerInputs& in, int64_t sparse_count,
                                        bool return_value);

// sparse_count in [1, 2048] or one of 3072, 4096, 5120, 6144, 7168, 8192 (upstream's set).
void check_sparse_count(const char* op, int64_t sparse_count);

// sparse_indices [q_rows..., N2, K] of an indexer call: int32/int64, shape (BSND [B, S1, N2, K], TND [T1, N2, K]),
// every entry -1 or in [0, k_len) of its sequence. Returns K.
int64_t check_sparse_indices(const char* op, const char* name, const at::Tensor& idx, const at::Tensor& query,
                             const IndexerGeometry& g);

}  // namespace sparse_attention
}  // namespace npu_fa
