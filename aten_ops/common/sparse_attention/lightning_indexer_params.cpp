// Argument validation of the lightning-indexer ops, shared by every backend (see lightning_indexer_params.h).
#include "common/sparse_attention/lightning_indexer_params.h"

#include <c10/util/Exception.h>

#include <limits>

namespace npu_fa {
namespace sparse_attention {

namespace {

constexpr int64_t kI64Max = std::numeric_limits<int64_t>::max();

std::vector<int64_t> lengths(const char* op, const char* name, const at::Tensor& t) {
  TORCH_CHECK_TYPE(t.scalar_type() == at::kInt || t.scalar_type() == at::kLong, op, ": argument '", name,
                   "' must be an int32 or int64 tensor; got ", t.scalar_type());
  TORCH_CHECK_VALUE(t.dim() == 1, op, ": argument '", name, "' must be 1-D (one value per sequence); got shape ",
                    t.sizes());
  const at::Tensor c = t.to(at::kCPU, at::kLong).contiguous();
  return std::vector<int64_t>(c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel());
}

// cumulative ends -> (starts, lengths), each end non-decreasing, non-negative and <= total
void from_cumulative(const char* op, const char* name, const std::vector<int64_t>& ends, int64_t total,
                     const char* total_name, std::vector<int64_t>& start, std::vector<int64_t>& len) {
  int64_t prev = 0;
  for (size_t b = 0; b < ends.size(); ++b) {
    TORCH_CHECK_VALUE(ends[b] >= prev, op, ": argument '", name,
                      "' holds cumulative token counts (TND) and must be non-decreasing and non-negative; got ",
                      ends[b], " after ", prev, " at index ", b);
    TORCH_CHECK_VALUE(ends[b] <= total, op, ": argument '", name, "' ends at ", ends[b], " tokens but ", total_name,
                      " holds ", total);
    start.push_back(prev);
    len.push_back(ends[b] - prev);
    prev = ends[b];
  }
}

}  // namespace

void check_indexer_floating(const char* op, const char* name, const at::Tensor& t) {
  const at::ScalarType s = t.scalar_type();
  TORCH_CHECK_TYPE(s == at::kFloat || s == at::kHalf || s == at::kBFloat16 || s == at::kDouble, op, ": argument '",
                   name, "' must be float16, bfloat16, float32 or float64; got ", s);
}

void check_indexer_dtypes(const char* op, const at::Tensor& q, const char* qn, const at::Tensor& k, const char* kn,
                          const at::Tensor& w, const char* wn) {
  check_indexer_floating(op, qn, q);
  TORCH_CHECK_TYPE(k.scalar_type() == q.scalar_type(), op, ": argument '", kn, "' must have the dtype of '", qn,
                   "' (", q.scalar_type(), "); got ", k.scalar_type());
  const bool w_ok = w.scalar_type() == q.scalar_type() ||
                    (w.scalar_type() == at::kFloat && (q.scalar_type() == at::kHalf || q.scalar_type() == at::kBFloat16));
  TORCH_CHECK_TYPE(w_ok, op, ": argument '", wn, "' must have the dtype of '", qn, "' (", q.scalar_type(),
                   ") or be float32 next to a 16-bit query; got ", w.scalar_type());
}

IndexerGeometry parse_lightning_indexer(const char* op, const IndexerInputs& in, int64_t sparse_count,
                                        bool return_value) {
  check_indexer_dtypes(op, in.query, in.name_query, in.key, in.name_key, in.weights, in.name_weights);
  check_sparse_count(op, sparse_count);
  IndexerGeometry g = parse_indexer_geometry(op, in);
  TORCH_CHECK_VALUE(!(return_value && g.key_layout == KeyLayout::PA_BSND), op,
                    ": argument 'return_value' must be False with layout_key \"PA_BSND\" (the values serve training, ",
                    "which uses contiguous keys)");
  return g;
}

void check_sparse_count(const char* op, int64_t sparse_count) {
  const bool ok = (sparse_count >= 1 && sparse_count <= 2048) ||
                  (sparse_count >= 3072 && sparse_count <= 8192 && sparse_count % 1024 == 0);
  TORCH_CHECK_VALUE(ok, op, ": argument 'sparse_count' must lie in [1, 2048] or be one of 3072, 4096, 5120, 6144, ",
                    "7168, 8192; got ", sparse_count);
}

IndexerGeometry parse_indexer_geometry(const char* op, const IndexerInputs& in) {
  IndexerGeometry g;
  const at::Tensor& q = in.query;
  const at::Tensor& k = in.key;
  const at::Tensor& w = in.weights;
  TORCH_CHECK_VALUE(in.layout_query == "BSND" || in.layout_query == "TND", op, ": argument '", in.name_layout_query,
                    "' must be \"BSND\" or \"TND\"; got \"", in.layout_query, "\"");
  TORCH_CHECK_VALUE(in.layout_key == "BSND" || in.layout_key == "TND" || in.layout_key == "PA_BSND", op,
                    ": argument '", in.name_layout_key, "' must be \"BSND\", \"TND\" or \"PA_BSND\"; got \"",
                    in.layout_key, "\"");
  TORCH_CHECK_VALUE(in.layout_key == "PA_BSND" || in.layout_key == in.layout_query, op, ": argument '",
                    in.name_layout_key, "' must equal '", in.name_layout_query, "' (\"", in.layout_query,
                    "\") unless the key cache is paged (\"PA_BSND\"); got \"", in.layout_key, "\"");
  TORCH_CHECK_VALUE(in.sparse_mode == 0 || in.sparse_mode == 3, op,
                    ": argument 'sparse_mode' must be 0 (all keys) or 3 (right-down causal); got ", in.sparse_mode);
  TORCH_CHECK_VALUE(in.pre_tokens == kI64Max && in.next_tokens == kI64Max, op,
                    ": arguments 'pre_tokens' and 'next_tokens' must keep their default 2^63-1 (a band is not ",
                    "implemented upstream either); got pre_tokens=", in.pre_tokens, ", next_tokens=", in.next_tokens);
  g.sparse_mode = in.sparse_mode;
  g.query_tnd = in.layout_query == "TND";
  g.key_layout = in.layout_key == "BSND" ? KeyLayout::BSND : in.layout_key == "TND" ? KeyLayout::TND
                                                                                     : KeyLayout::PA_BSND;
  const int64_t qdim = g.query_tnd ? 3 : 4;
  TORCH_CHECK_VALUE(q.dim() == qdim, op, ": argument '", in.name_query, "' must be ",
                    g.query_tnd ? "3-D [T1, N1, D] (TND)" : "4-D [B, S1, N1, D] (BSND)", "; got shape ", q.sizes());
  const int64_t kdim = g.key_layout == KeyLayout::TND ? 3 : 4;
  TORCH_CHECK_VALUE(k.dim() == kdim, op, ": argument '", in.name_key, "' must be ",
                    g.key_layout == KeyLayout::TND   ? "3-D [T2, N2, D] (TND)"
                    : g.key_layout == KeyLayout::BSND ? "4-D [B, S2, N2, D] (BSND)"
                                                      : "4-D [blocks, block_size, N2, D] (PA_BSND)",
                    "; got shape ", k.sizes());
  g.N1 = q.size(-2);
  g.D = q.size(-1);
  g.N2 = k.size(-2);
  TORCH_CHECK_VALUE(k.size(-1) == g.D, op, ": argument '", in.name_key, "' must have the head dim of '",
                    in.name_query, "' (", g.D, "); got ", k.size(-1));
  TORCH_CHECK_VALUE(g.N2 >= 1 && g.N1 % g.N2 == 0, op, ": the query heads (", g.N1,
                    ") must be a multiple of the key heads (", g.N2, ") of argument '", in.name_key, "'");
  g.G = g.N1 / g.N2;
  // weights: the query's shape without D
  std::vector<int64_t> wshape(q.sizes().begin(), q.sizes().end() - 1);
  TORCH_CHECK_VALUE(w.sizes() == at::IntArrayRef(wshape), op, ": argument '", in.name_weights,
                    "' must have the shape of '", in.name_query, "' without its head dim ", at::IntArrayRef(wshape),
                    "; got ", w.sizes());

  const auto& asq = in.actual_seq_lengths_query;
  const auto& ask = in.actual_seq_lengths_key;
  if (in.cumulative_bsnd_lengths && !g.query_tnd) {
    TORCH_CHECK_VALUE(!asq.has_value() && !ask.has_value(), op, ": arguments '", in.name_seq_q, "' and '",
                      in.name_seq_k, "' are the TND layout's cumulative lengths and must be None with layout BSND");
  }
  // query sequences
  if (g.query_tnd) {
    TORCH_CHECK_VALUE(asq.has_value(), op, ": argument '", in.name_seq_q,
                      "' is required with layout TND (the cumulative query token counts, one per sequence)");
    const auto ends = lengths(op, in.name_seq_q, *asq);
    g.B = static_cast<int64_t>(ends.size());
    from_cumulative(op, in.name_seq_q, ends, q.size(0), "query's T1", g.q_start, g.q_len);
    g.q_rows = q.size(0);
  } else {
    g.B = q.size(0);
    const int64_t S1 = q.size(1);
    g.q_rows = g.B * S1;
    for (int64_t b = 0; b < g.B; ++b) g.q_start.push_back(b * S1);
    if (asq.has_value()) {
      const auto l = lengths(op, in.name_seq_q, *asq);
      TORCH_CHECK_VALUE(static_cast<int64_t>(l.size()) == g.B, op, ": argument '", in.name_seq_q,
                        "' must hold one length per sequence (", g.B, "); got ", l.size());
      for (int64_t b = 0; b < g.B; ++b) {
        TORCH_CHECK_VALUE(l[b] >= 0 && l[b] <= S1, op, ": argument '", in.name_seq_q, "' must lie in [0, S1=", S1,
                          "]; got ", l[b], " for sequence ", b);
        g.q_len.push_back(l[b]);
      }
    } else {
      g.q_len.assign(g.B, S1);
    }
  }
  // key sequences
  if (g.key_layout == KeyLayout::BSND) {
    TORCH_CHECK_VALUE(k.size(0) == g.B, op, ": argument '", in.name_key, "' must hold B=", g.B,
                      " sequences like the query; got ", k.size(0));
    const int64_t S2 = k.size(1);
    g.k_rows = g.B * S2;
    for (int64_t b = 0; b < g.B; ++b) g.k_start.push_back(b * S2);
    if (ask.has_value()) {
      const auto l = lengths(op, in.name_seq_k, *ask);
      TORCH_CHECK_VALUE(static_cast<int64_t>(l.size()) == g.B, op, ": argument '", in.name_seq_k,
                        "' must hold one length per sequence (", g.B, "); got ", l.size());
      for (int64_t b = 0; b < g.B; ++b) {
        TORCH_CHECK_VALUE(l[b] >= 0 && l[b] <= S2, op, ": argument '", in.name_seq_k, "' must lie in [0, S2=", S2,
                          "]; got ", l[b], " for sequence ", b);
        g.k_len.push_back(l[b]);
      }
    } else {
      g.k_len.assign(g.B, S2);
    }
  } else if (g.key_layout == KeyLayout::TND) {
    TORCH_CHECK_VALUE(ask.has_value(), op, ": argument '", in.name_seq_k,
                      "' is required with layout TND (the cumulative key token counts, one per sequence)");
    const auto ends = lengths(op, in.name_seq_k, *ask);
    TORCH_CHECK_VALUE(static_cast<int64_t>(ends.size()) == g.B, op, ": argument '", in.name_seq_k,
                      "' must hold one value per sequence like '", in.name_seq_q, "' (", g.B, "); got ", ends.size());
    from_cumulative(op, in.name_seq_k, ends, k.size(0), "key's T2", g.k_start, g.k_len);
    g.k_rows = k.size(0);
  } else {
    g.block_size = k.size(1);
    g.k_rows = k.size(0) * g.block_size;
    TORCH_CHECK_VALUE(ask.has_value(), op, ": argument '", in.name_seq_k,
                      "' is required with layout_key PA_BSND (the key tokens of each sequence)");
    TORCH_CHECK_VALUE(in.block_table.has_value(), op,
                      ": argument 'block_table' is required with layout_key PA_BSND (the cache blocks of each sequence)");
    const auto l = lengths(op, in.name_seq_k, *ask);
    TORCH_CHECK_VALUE(static_cast<int64_t>(l.size()) == g.B, op, ": argument '", in.name_seq_k,
                      "' must hold one length per sequence (", g.B, "); got ", l.size());
    const at::Tensor& bt = *in.block_table;
    TORCH_CHECK_TYPE(bt.scalar_type() == at::kInt || bt.scalar_type() == at::kLong, op,
                     ": argument 'block_table' must be int32 or int64; got ", bt.scalar_type());
    TORCH_CHECK_VALUE(bt.dim() == 2 && bt.size(0) == g.B, op, ": argument 'block_table' must be 2-D [B=", g.B,
                      ", max blocks per sequence]; got shape ", bt.sizes());
    TORCH_CHECK_VALUE(g.block_size > 0, op, ": argument '", in.name_key,
                      "' (PA_BSND) must have a block_size (dim 1) > 0; got shape ", k.sizes());
    g.block_table = bt.to(at::kCPU, at::kLong).contiguous();
    const int64_t* tab = g.block_table.data_ptr<int64_t>();
    const int64_t nblocks = k.size(0);
    for (int64_t b = 0; b < g.B; ++b) {
      TORCH_CHECK_VALUE(l[b] >= 0, op, ": argument '", in.name_seq_k, "' must be >= 0; got ", l[b],
                        " for sequence ", b);
      const int64_t need = (l[b] + g.block_size - 1) / g.block_size;
      TORCH_CHECK_VALUE(need <= bt.size(1), op, ": argument 'block_table' has ", bt.size(1),
                        " blocks per sequence, but sequence ", b, " needs ", need, " for its ", l[b],
                        " keys in blocks of ", g.block_size);
      for (int64_t j = 0; j < need; ++j) {
        const int64_t id = tab[b * bt.size(1) + j];
        TORCH_CHECK_VALUE(id >= 0 && id < nblocks, op, ": argument 'block_table' entry [", b, ", ", j, "] = ", id,
                          " is not a block of the cache (", nblocks, " blocks)");
      }
      g.k_len.push_back(l[b]);
      g.k_start.push_back(0);
    }
  }
  return g;
}

int64_t check_sparse_indices(const char* op, const char* name, const at::Tensor& idx, const at::Tensor& query,
                             const IndexerGeometry& g) {
  TORCH_CHECK_TYPE(idx.scalar_type() == at::kInt || idx.scalar_type() == at::kLong, op, ": argument '", name,
                   "' must be int32 or int64; got ", idx.scalar_type());
  std::vector<int64_t> lead(query.sizes().begin(), query.sizes().end() - 2);
  // [.., N2, K], or [.., K] with the N2 = 1 axis left out (as torch_npu's own test passes them)
  const bool no_n2 = g.N2 == 1 && idx.dim() == static_cast<int64_t>(lead.size()) + 1;
  TORCH_CHECK_VALUE(no_n2 || idx.dim() == static_cast<int64_t>(lead.size()) + 2, op, ": argument '", name,
                    "' must be ", lead.size() + 2, "-D [", g.query_tnd ? "T1" : "B, S1", ", N2, K]; got shape ",
                    idx.sizes());
  for (size_t i = 0; i < lead.size(); ++i)
    TORCH_CHECK_VALUE(idx.size(i) == lead[i], op, ": argument '", name, "' must have the query's leading sizes ",
                      at::IntArrayRef(lead), " and N2=", g.N2, "; got shape ", idx.sizes());
  TORCH_CHECK_VALUE(no_n2 || idx.size(-2) == g.N2, op, ": argument '", name, "' must have N2=", g.N2,
                    " key heads in dim -2; got shape ", idx.sizes());
  const int64_t K = idx.size(-1);
  // every entry -1 (padding) or a key position of its sequence
  const at::Tensor c = idx.to(at::kCPU, at::kLong).contiguous();
  const int64_t* p = c.data_ptr<int64_t>();
  const int64_t per_row = g.N2 * K;
  for (int64_t b = 0; b < g.B; ++b)
    for (int64_t i = 0; i < g.q_len[b]; ++i) {
      const int64_t* r = p + (g.q_start[b] + i) * per_row;
      for (int64_t j = 0; j < per_row; ++j)
        TORCH_CHECK_VALUE(r[j] >= -1 && r[j] < g.k_len[b], op, ": argument '", name, "' entry ", r[j],
                          " of query token ", i, " of sequence ", b, " is neither -1 nor a key position in [0, ",
                          g.k_len[b], ")");
    }
  return K;
}

}  // namespace sparse_attention
}  // namespace npu_fa
