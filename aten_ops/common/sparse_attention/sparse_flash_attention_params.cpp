// Argument validation of the sparse flash attention ops (see the header), shared by every backend.
#include "common/sparse_attention/sparse_flash_attention_params.h"

#include <cmath>
#include <limits>
#include <string>
#include <tuple>
#include <utility>

#include "common/checked_math.h"

namespace npu_fa::sparse_attention {

namespace {

constexpr int64_t kDefaultTokens = std::numeric_limits<int64_t>::max();

std::vector<int64_t> read_lengths(const char* op, const char* name, const at::Tensor& t) {
  TORCH_CHECK_TYPE(t.scalar_type() == at::kInt || t.scalar_type() == at::kLong, op, ": argument '", name,
                   "' must be int32 or int64; got ", t.scalar_type());
  TORCH_CHECK_VALUE(t.dim() == 1, op, ": argument '", name, "' must be 1-D (one entry per sequence); got shape ",
                    t.sizes());
  const at::Tensor c = t.to(at::kCPU, at::kLong).contiguous();
  return std::vector<int64_t>(c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel());
}

// Cumulative lengths (TND): non-decreasing, >= 0, the last at most `total`; returns the per-sequence lengths.
std::vector<int64_t> from_cumulative(const char* op, const char* name, const std::vector<int64_t>& ends,
                                     int64_t total, const char* total_name, std::vector<int64_t>* begins) {
  std::vector<int64_t> lens(ends.size());
  int64_t prev = 0;
  for (size_t b = 0; b < ends.size(); ++b) {
    TORCH_CHECK_VALUE(ends[b] >= prev, op, ": argument '", name,
                      "' must hold non-decreasing cumulative lengths (TND) starting at >= 0; got ", ends[b],
                      " at index ", b, " after ", prev);
    if (begins) begins->push_back(prev);
    lens[b] = ends[b] - prev;
    prev = ends[b];
  }
  TORCH_CHECK_VALUE(prev <= total, op, ": argument '", name, "' ends at ", prev, ", beyond the ", total, " rows of ",
                    total_name);
  return lens;
}

bool power_of_two(int64_t v) { return v > 0 && (v & (v - 1)) == 0; }

}  // namespace

void check_float(const char* op, const char* name, const at::Tensor& t) {
  const auto s = t.scalar_type();
  TORCH_CHECK_TYPE(s == at::kHalf || s == at::kBFloat16 || s == at::kFloat || s == at::kDouble, op, ": argument '",
                   name, "' must be float16, bfloat16, float32 or float64; got ", s);
}

SfaGeometry parse_sfa(const SfaCall& c) {
  const char* op = c.op;
  SfaGeometry g;
  const std::string lq(c.layout_query);
  const std::string lkv = c.layout_kv.empty() ? lq : std::string(c.layout_kv);
  TORCH_CHECK_VALUE(lq == "BSND" || lq == "TND", op, ": argument 'layout_query' must be BSND or TND; got '", lq,
                    "'");
  TORCH_CHECK_VALUE(lkv == "BSND" || lkv == "TND" || lkv == "PA_BSND", op,
                    ": argument 'layout_kv' must be BSND, TND or PA_BSND; got '", lkv, "'");
  TORCH_CHECK_VALUE(lkv == "PA_BSND" || lkv == lq, op, ": argument 'layout_kv' ('", lkv,
                    "') must equal 'layout_query' ('", lq, "') unless it is PA_BSND");
  g.q_tnd = lq == "TND";
  g.kv_layout = lkv == "BSND" ? KvLayout::BSND : lkv == "TND" ? KvLayout::TND : KvLayout::PA_BSND;
  TORCH_CHECK_VALUE(c.sparse_mode == 0 || c.sparse_mode == 3, op,
                    ": argument 'sparse_mode' must be 0 (no mask) or 3 (right-down causal); got ", c.sparse_mode,
                    " (other modes are not implemented)");
  TORCH_CHECK_VALUE(c.pre_tokens == kDefaultTokens && c.next_tokens == kDefaultTokens, op,
                    ": arguments 'pre_tokens' and 'next_tokens' support only their default 9223372036854775807; "
                    "got ", c.pre_tokens, " and ", c.next_tokens);
  TORCH_CHECK_VALUE(std::isfinite(c.scale_value), op, ": argument 'scale_value' must be finite; got ",
                    c.scale_value);
  TORCH_CHECK_VALUE(power_of_two(c.sparse_block_size) && c.sparse_block_size <= 128, op,
                    ": argument 'sparse_block_size' must be a power of two in [1, 128]; got ", c.sparse_block_size);
  g.sparse_block_size = c.sparse_block_size;
  g.sparse_mode = c.sparse_mode;
  g.scale = c.scale_value;

  const at::Tensor& q = c.query;
  TORCH_CHECK_VALUE(q.dim() == (g.q_tnd ? 3 : 4), op, ": argument 'query' must be ", g.q_tnd ? "3-D [T1, N1, D] (TND)"
                    : "4-D [B, S1, N1, D] (BSND)", "; got shape ", q.sizes());
  g.N1 = q.size(-2);
  const at::Tensor& k = c.key;
  const int64_t kdim = g.kv_layout == KvLayout::TND ? 3 : 4;
  TORCH_CHECK_VALUE(k.dim() == kdim, op, ": argument 'key' must be ",
                    g.kv_layout == KvLayout::TND ? "3-D [T2, N2, D] (TND)"
                    : g.kv_layout == KvLayout::BSND ? "4-D [B, S2, N2, D] (BSND)"
                    : "4-D [blocks, block_size, N2, D] (PA_BSND)", "; got shape ", k.sizes());
  g.N2 = k.size(-2);
  TORCH_CHECK_VALUE(g.N2 > 0 && g.N1 % g.N2 == 0, op, ": the query heads (", g.N1,
                    ") must be a multiple of the key heads (", g.N2, ")");
  g.G = g.N1 / g.N2;

  // query rows and their sequences
  std::optional<std::vector<int64_t>> qlens;
  if (c.actual_seq_lengths_query.has_value())
    qlens = read_lengths(op, c.q_len_name, *c.actual_seq_lengths_query);
  if (g.q_tnd) {
    TORCH_CHECK_VALUE(qlens.has_value(), op, ": argument '", c.q_len_name,
                      "' is required with layout_query TND (cumulative query lengths)");
    g.T1 = q.size(0);
    g.B = static_cast<int64_t>(qlens->size());
    std::vector<int64_t> begins;
    g.q_len = from_cumulative(op, c.q_len_name, *qlens, g.T1, "query", &begins);
    g.row_batch.assign(g.T1, -1);
    g.row_pos.assign(g.T1, 0);
    for (int64_t b = 0; b < g.B; ++b)
      for (int64_t i = 0; i < g.q_len[b]; ++i) {
        g.row_batch[begins[b] + i] = b;
        g.row_pos[begins[b] + i] = i;
      }
  } else {
    g.B = q.size(0);
    g.S1 = q.size(1);
    g.T1 = checked_mul(op, "B * S1", g.B, g.S1);
    if (qlens.has_value()) {
      TORCH_CHECK_VALUE(static_cast<int64_t>(qlens->size()) == g.B, op, ": argument '", c.q_len_name,
                        "' must have one entry per sequence (", g.B, "); got ", qlens->size());
      for (int64_t b = 0; b < g.B; ++b)
        TORCH_CHECK_VALUE((*qlens)[b] >= 0 && (*qlens)[b] <= g.S1, op, ": argument '", c.q_len_name,
                          "' must lie in [0, S1=", g.S1, "]; got ", (*qlens)[b], " for sequence ", b);
      g.q_len = *qlens;
    } else {
      g.q_len.assign(g.B, g.S1);
    }
    g.row_batch.assign(g.T1, -1);
    g.row_pos.assign(g.T1, 0);
    for (int64_t b = 0; b < g.B; ++b)
      for (int64_t i = 0; i < g.q_len[b]; ++i) {
        g.row_batch[b * g.S1 + i] = b;
        g.row_pos[b * g.S1 + i] = i;
      }
  }

  // KV sequences
  std::optional<std::vector<int64_t>> kvlens;
  if (c.actual_seq_lengths_kv.has_value())
    kvlens = read_lengths(op, c.kv_len_name, *c.actual_seq_lengths_kv);
  TORCH_CHECK_VALUE(g.kv_layout == KvLayout::PA_BSND || !c.block_table.has_value(), op,
                    ": argument 'block_table' is only for layout_kv PA_BSND (a paged cache); got layout_kv '", lkv,
                    "'");
  if (g.kv_layout != KvLayout::BSND) {
    TORCH_CHECK_VALUE(kvlens.has_value(), op, ": argument '", c.kv_len_name, "' is required with layout_kv ", lkv);
    TORCH_CHECK_VALUE(static_cast<int64_t>(kvlens->size()) == g.B, op, ": argument '", c.kv_len_name,
                      "' must have one entry per sequence (", g.B, "); got ", kvlens->size());
  }
  if (g.kv_layout == KvLayout::BSND) {
    TORCH_CHECK_VALUE(k.size(0) == g.B, op, ": argument 'key' must hold the ", g.B,
                      " sequences of query (BSND); got shape ", k.sizes());
    g.S2 = k.size(1);
    g.kv_rows = checked_mul(op, "B * S2", g.B, g.S2);
    if (kvlens.has_value()) {
      TORCH_CHECK_VALUE(static_cast<int64_t>(kvlens->size()) == g.B, op, ": argument '", c.kv_len_name,
                        "' must have one entry per sequence (", g.B, "); got ", kvlens->size());
      for (int64_t b = 0; b < g.B; ++b)
        TORCH_CHECK_VALUE((*kvlens)[b] >= 0 && (*kvlens)[b] <= g.S2, op, ": argument '", c.kv_len_name,
                          "' must lie in [0, S2=", g.S2, "]; got ", (*kvlens)[b], " for sequence ", b);
      g.kv_len = *kvlens;
    } else {
      g.kv_len.assign(g.B, g.S2);
    }
  } else if (g.kv_layout == KvLayout::TND) {
    g.kv_rows = k.size(0);
    g.kv_len = from_cumulative(op, c.kv_len_name, *kvlens, g.kv_rows, "key", &g.kv_begin);
  } else {
    TORCH_CHECK_VALUE(c.block_table.has_value(), op, ": argument 'block_table' is required with layout_kv PA_BSND");
    const at::Tensor& bt = *c.block_table;
    TORCH_CHECK_TYPE(bt.scalar_type() == at::kInt || bt.scalar_type() == at::kLong, op,
                     ": argument 'block_table' must be int32 or int64; got ", bt.scalar_type());
    TORCH_CHECK_VALUE(bt.dim() == 2 && bt.size(0) == g.B, op, ": argument 'block_table' must be 2-D [B=", g.B,
                      ", max_blocks]; got shape ", bt.sizes());
    const int64_t blocks = k.size(0);
    g.block_size = k.size(1);
    g.max_blocks = bt.size(1);
    g.kv_rows = checked_mul(op, "blocks * block_size", blocks, g.block_size);
    TORCH_CHECK_VALUE(g.block_size > 0 && g.block_size % g.sparse_block_size == 0, op,
                      ": argument 'sparse_block_size' (", g.sparse_block_size,
                      ") must divide the cache's block_size (key.size(1) = ", g.block_size, ")");
    const at::Tensor t = bt.to(at::kCPU, at::kLong).contiguous();
    g.table.assign(t.data_ptr<int64_t>(), t.data_ptr<int64_t>() + t.numel());
    g.kv_len = *kvlens;
    for (int64_t b = 0; b < g.B; ++b) {
      const int64_t len = g.kv_len[b];
      TORCH_CHECK_VALUE(len >= 0 && len <= checked_mul(op, "max_blocks * block_size", g.max_blocks, g.block_size),
                        op, ": argument '", c.kv_len_name, "' must lie in [0, max_blocks * block_size = ",
                        g.max_blocks * g.block_size, "] (block_table's capacity); got ", len, " for sequence ", b);
      for (int64_t j = 0; j * g.block_size < len; ++j) {
        const int64_t id = g.table[b * g.max_blocks + j];
        TORCH_CHECK_VALUE(id >= 0 && id < blocks, op, ": argument 'block_table' must hold block ids in [0, ", blocks,
                          ") for the blocks a sequence uses; got ", id, " at [", b, ", ", j, "]");
      }
    }
  }

  // sparse_indices
  const at::Tensor& idx = c.sparse_indices;
  TORCH_CHECK_TYPE(idx.scalar_type() == at::kInt, op, ": argument 'sparse_indices' must be int32; got ",
                   idx.scalar_type());
  const bool idx_ok = g.q_tnd ? (idx.dim() == 3 && idx.size(0) == g.T1 && idx.size(1) == g.N2)
                              : (idx.dim() == 4 && idx.size(0) == g.B && idx.size(1) == g.S1 && idx.size(2) == g.N2);
  TORCH_CHECK_VALUE(idx_ok, op, ": argument 'sparse_indices' must be ",
                    g.q_tnd ? "[T1, N2, K] = [" + std::to_string(g.T1) + ", " + std::to_string(g.N2) + ", K]"
                            : "[B, S1, N2, K] = [" + std::to_string(g.B) + ", " + std::to_string(g.S1) + ", " +
                                  std::to_string(g.N2) + ", K]",
                    "; got shape ", idx.sizes());
  g.K = idx.size(-1);
  g.indices = idx.to(at::kCPU).contiguous();
  const int32_t* p = g.indices.data_ptr<int32_t>();
  for (int64_t e = 0, n = g.indices.numel(); e < n; ++e)
    TORCH_CHECK_VALUE(p[e] >= -1, op, ": argument 'sparse_indices' must hold block indices >= 0 or -1 (unused "
                      "slot); got ", p[e]);
  return g;
}

void check_sinks(const char* op, const std::optional<at::Tensor>& sinks, const at::Tensor& query, int64_t N1) {
  if (!sinks.has_value()) return;
  // float64 sinks with a float64 query: what gradcheck of the sink gradient needs.
  const bool ok = sinks->scalar_type() == at::kFloat ||
                  (sinks->scalar_type() == at::kDouble && query.scalar_type() == at::kDouble);
  TORCH_CHECK_TYPE(ok, op, ": argument 'sinks' must be float32 (or float64 with a float64 query); got ",
                   sinks->scalar_type(), " with a ", query.scalar_type(), " query");
  TORCH_CHECK_VALUE(sinks->dim() == 1 && sinks->size(0) == N1, op, ": argument 'sinks' must be [N1] = [", N1,
                    "]; got shape ", sinks->sizes());
}

SfaTensors check_sfa_tensors(const char* op, const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
                             const std::optional<at::Tensor>& query_rope, const std::optional<at::Tensor>& key_rope,
                             int64_t attention_mode, const std::optional<at::Tensor>& sinks, const SfaGeometry& g) {
  check_float(op, "query", query);
  for (const auto& [name, t] : {std::pair<const char*, const at::Tensor*>{"key", &key}, {"value", &value}})
    TORCH_CHECK_TYPE(t->scalar_type() == query.scalar_type(), op, ": argument '", name, "' must have query's dtype (",
                     query.scalar_type(), "); got ", t->scalar_type());
  TORCH_CHECK_VALUE(attention_mode == 0 || attention_mode == 2, op,
                    ": argument 'attention_mode' must be 0 (plain) or 2 (MLA absorb: query_rope and key_rope "
                    "given); got ", attention_mode);
  const int64_t Dn = key.size(-1);
  TORCH_CHECK_VALUE(query.size(-1) == Dn, op, ": argument 'query' must have key's head dim (", Dn, "); got shape ",
                    query.sizes());
  int64_t Dr = 0;
  if (attention_mode == 2) {
    TORCH_CHECK_VALUE(query_rope.has_value() && key_rope.has_value(), op,
                      ": attention_mode 2 (MLA absorb) needs both 'query_rope' and 'key_rope'");
    TORCH_CHECK_VALUE(value.sizes() == key.sizes(), op,
                      ": attention_mode 2 (MLA absorb) needs value of key's shape ", key.sizes(), "; got ",
                      value.sizes());
    for (const auto& [name, t, like] : {std::tuple<const char*, const at::Tensor*, const at::Tensor*>{
                                            "query_rope", &*query_rope, &query},
                                        {"key_rope", &*key_rope, &key}}) {
      TORCH_CHECK_TYPE(t->scalar_type() == query.scalar_type(), op, ": argument '", name,
                       "' must have query's dtype (", query.scalar_type(), "); got ", t->scalar_type());
      const bool ok = t->dim() == like->dim() &&
                      t->sizes().slice(0, t->dim() - 1) == like->sizes().slice(0, like->dim() - 1);
      TORCH_CHECK_VALUE(ok, op, ": argument '", name, "' must have the shape of ", name == std::string("query_rope")
                        ? "query" : "key", " ", like->sizes(), " but for its last size; got ", t->sizes());
    }
    Dr = query_rope->size(-1);
    TORCH_CHECK_VALUE(key_rope->size(-1) == Dr, op, ": arguments 'query_rope' and 'key_rope' must have one rope dim; "
                      "got ", Dr, " and ", key_rope->size(-1));
  } else {
    TORCH_CHECK_VALUE(!query_rope.has_value() && !key_rope.has_value(), op,
                      ": 'query_rope' / 'key_rope' need attention_mode 2 (MLA absorb); got attention_mode ",
                      attention_mode);
    const bool ok = value.dim() == key.dim() &&
                    value.sizes().slice(0, key.dim() - 1) == key.sizes().slice(0, key.dim() - 1);
    TORCH_CHECK_VALUE(ok, op, ": argument 'value' must have key's shape ", key.sizes(),
                      " but for its last size; got ", value.sizes());
  }
  check_sinks(op, sinks, query, g.N1);
  return {Dn, Dr, value.size(-1)};
}

void SfaGeometry::select(int64_t t, int64_t n2, std::vector<int64_t>& rows) const {
  rows.clear();
  const int64_t b = row_batch[t];
  if (b < 0) return;
  const int64_t i = row_pos[t];
  int64_t limit = kv_len[b];
  if (sparse_mode == 3) limit = std::min(limit, kv_len[b] - q_len[b] + i + 1);
  const int32_t* slot = indices.data_ptr<int32_t>() + (t * N2 + n2) * K;
  for (int64_t s = 0; s < K; ++s) {
    if (slot[s] < 0) continue;
    const int64_t start = static_cast<int64_t>(slot[s]) * sparse_block_size;
    const int64_t end = std::min(start + sparse_block_size, limit);
    for (int64_t j = start; j < end; ++j) rows.push_back(kv_row(b, j));
  }
}

}  // namespace npu_fa::sparse_attention
