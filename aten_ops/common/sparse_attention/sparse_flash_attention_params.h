// Validated, backend-neutral description of one sparse flash attention call (sparse_flash_attention, its grad and
// kv_quant_sparse_flash_attention): the layouts, the per-sequence lengths, the block table and the selection rule,
// so every backend parses the arguments once and rejects bad input with the same messages.
#pragma once

#include <ATen/ATen.h>

#include <optional>
#include <string>
#include <vector>

namespace npu_fa::sparse_attention {

enum class KvLayout { BSND, TND, PA_BSND };

// The arguments every sparse flash attention op shares (the op-specific tensors are checked by the op).
struct SfaCall {
  const char* op;
  const at::Tensor& query;           // BSND [B, S1, N1, D] or TND [T1, N1, D]
  const at::Tensor& key;             // BSND [B, S2, N2, Dk], TND [T2, N2, Dk], PA_BSND [blocks, block_size, N2, Dk]
  const at::Tensor& sparse_indices;  // int32 BSND [B, S1, N2, K] or TND [T1, N2, K]
  const std::optional<at::Tensor>& block_table;
  const std::optional<at::Tensor>& actual_seq_lengths_query;
  const std::optional<at::Tensor>& actual_seq_lengths_kv;
  const char* q_len_name;  // how the op names the two length arguments
  const char* kv_len_name;
  double scale_value;
  int64_t sparse_block_size;
  c10::string_view layout_query;
  c10::string_view layout_kv;  // "" = layout_query
  int64_t sparse_mode;
  int64_t pre_tokens;
  int64_t next_tokens;
};

struct SfaGeometry {
  bool q_tnd = false;
  KvLayout kv_layout = KvLayout::BSND;
  int64_t B = 0, S1 = 0, T1 = 0;  // T1: query rows (B * S1 for BSND)
  int64_t N1 = 0, N2 = 0, G = 0;  // G = N1 / N2 query heads per KV head
  int64_t K = 0;                  // slots per row of sparse_indices
  int64_t kv_rows = 0;            // key viewed as [kv_rows, N2, Dk]
  int64_t S2 = 0, block_size = 0, max_blocks = 0;
  int64_t sparse_block_size = 1, sparse_mode = 3;
  double scale = 1.0;
  std::vector<int64_t> q_len, kv_begin, kv_len;  // per sequence
  std::vector<int64_t> row_batch, row_pos;       // per query row: its sequence (-1: padding) and position
  std::vector<int64_t> table;                    // PA_BSND: the block table, [B, max_blocks], int64
  at::Tensor indices;                            // sparse_indices, contiguous int32

  // Physical row (of key viewed as [kv_rows, N2, Dk]) of logical KV token j of sequence b.
  int64_t kv_row(int64_t b, int64_t j) const {
    switch (kv_layout) {
      case KvLayout::BSND: return b * S2 + j;
      case KvLayout::TND: return kv_begin[b] + j;
      default: return table[b * max_blocks + j / block_size] * block_size + j % block_size;
    }
  }

  // Offset of (query row t, KV head n2, group head 0) in softmax_max / softmax_sum (TND [N2, T1, G], BSND
  // [B, N2, S1, G]).
  int64_t stat_offset(int64_t t, int64_t n2) const {
    if (q_tnd) return (n2 * T1 + t) * G;
    return ((t / S1 * N2 + n2) * S1 + t % S1) * G;
  }

  // The physical rows query row t (batch b, position i) attends to through KV head n2, in slot order (a token
  // selected twice appears twice); empty for padding rows.
  void select(int64_t t, int64_t n2, std::vector<int64_t>& rows) const;
};

// Parses and validates the shared arguments; `key_dim` is the last size key must have (checked by the caller).
SfaGeometry parse_sfa(const SfaCall& call);

// float16, bfloat16, float32 or float64.
void check_float(const char* op, const char* name, const at::Tensor& t);

// Head dims of a checked sparse_flash_attention call: key's (= query's), the rope parts' (0 without) and value's.
struct SfaTensors {
  int64_t Dn, Dr, Dv;
};

// The rule of the optional attention sinks: float32 (float64 with a float64 query), [N1].
void check_sinks(const char* op, const std::optional<at::Tensor>& sinks, const at::Tensor& query, int64_t N1);

// The rules of sparse_flash_attention's own tensors (dtypes, attention_mode and its rope tensors, value's shape,
// sinks), shared by its grad and by every backend.
SfaTensors check_sfa_tensors(const char* op, const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
                             const std::optional<at::Tensor>& query_rope, const std::optional<at::Tensor>& key_rope,
                             int64_t attention_mode, const std::optional<at::Tensor>& sinks, const SfaGeometry& g);

}  // namespace npu_fa::sparse_attention
