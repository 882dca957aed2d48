// CPU kernels of the MoE routing ops: init_routing (v1, v2), compute_expert_tokens, finalize_routing, and the
// Megatron-style token permute / unpermute, each with its backward where the op is differentiable.
//
// Every op routes N*k (token, slot) pairs. The sort by expert is a stable counting sort (linear in N*k, see
// common/moe/routing.h); the row work (copy, weighted sum) is parallel over rows of H values, each row written by
// exactly one thread, so results are deterministic. Weighted sums accumulate in fp32 (fp64 for fp64).
#include <limits>

#include "common/moe/routing.h"
#include "generated/kernels.h"

namespace npu_fa {
namespace {

using moe::acc_t;

int64_t row_grain(int64_t H) { return std::max<int64_t>(1, 16384 / std::max<int64_t>(H, 1)); }

// Expert keys checked to be >= 0; returns the bucket count for the counting sort (max + 1).
int64_t expert_buckets(const char* op, const char* name, const std::vector<int64_t>& keys) {
  int64_t mx = -1;
  for (size_t f = 0; f < keys.size(); ++f) {
    TORCH_CHECK_VALUE(keys[f] >= 0, op, ": argument '", name, "'[", f, "] = ", keys[f],
                      " is out of range; expert indices must be >= 0");
    mx = std::max(mx, keys[f]);
  }
  TORCH_CHECK_VALUE(mx < (int64_t{1} << 24), op, ": argument '", name, "' holds expert index ", mx,
                    ", beyond the supported 2^24 experts");
  return mx + 1;
}

// out[t] = sum_j w(t, j) * rows[src(t, j)] over pairs with src >= 0; rows [R, H], out [T, H] (contiguous).
// `src` and `w` are indexed t*k + j; w may be null (weight 1). `bias`/`expert` add bias[expert] to the row.
template <typename scalar_t, typename W>
void weighted_row_sum(const scalar_t* rows, int64_t H, const std::vector<int64_t>& src, const W* w, int64_t T,
                      int64_t k, scalar_t* out, const scalar_t* skip1, const scalar_t* skip2, const scalar_t* bias,
                      const std::vector<int64_t>* expert) {
  using A = acc_t<scalar_t>;
  at::parallel_for(0, T, row_grain(H * k), [&](int64_t t0, int64_t t1) {
    std::vector<A> acc(H);
    for (int64_t t = t0; t < t1; ++t) {
      for (int64_t h = 0; h < H; ++h)
        acc[h] = (skip1 ? static_cast<A>(skip1[t * H + h]) : A(0)) + (skip2 ? static_cast<A>(skip2[t * H + h]) : A(0));
      for (int64_t j = 0; j < k; ++j) {
        const int64_t r = src[t * k + j];
        if (r < 0) continue;
        const A s = w ? static_cast<A>(w[t * k + j]) : A(1);
        const scalar_t* row = rows + r * H;
        for (int64_t h = 0; h < H; ++h) acc[h] += s * static_cast<A>(row[h]);
        if (bias) {
          const scalar_t* b = bias + (*expert)[t * k + j] * H;
          for (int64_t h = 0; h < H; ++h) acc[h] += s * static_cast<A>(b[h]);
        }
      }
      for (int64_t h = 0; h < H; ++h) out[t * H + h] = static_cast<scalar_t>(acc[h]);
    }
  });
}

// The 2-D [N, H] view checks shared by the ops that take token rows.
void check_rows2d(const char* op, const char* name, const at::Tensor& t) {
  TORCH_CHECK_VALUE(t.dim() == 2, op, ": argument '", name, "' must be 2-D [num_tokens, H]; got shape ", t.sizes());
}

}  // namespace

// ---------------------------------------------------------------------------------------------------------------
// moe_init_routing (v1)
// ---------------------------------------------------------------------------------------------------------------
std::tuple<at::Tensor, at::Tensor, at::Tensor> moe_init_routing_cpu(const at::Tensor& x, const at::Tensor& row_idx,
                                                                    const at::Tensor& expert_idx, int64_t active_num) {
  const char* op = "moe_init_routing";
  check_rows2d(op, "x", x);
  moe::check_index(op, "row_idx", row_idx);
  moe::check_index(op, "expert_idx", expert_idx);
  TORCH_CHECK_VALUE(expert_idx.dim() == 2 && expert_idx.size(0) == x.size(0), op, ": argument 'expert_idx' of shape ",
                    expert_idx.sizes(), " must be [N, k] with N = x.size(0) = ", x.size(0));
  TORCH_CHECK_VALUE(row_idx.sizes() == expert_idx.sizes(), op, ": argument 'row_idx' of shape ", row_idx.sizes(),
                    " must match expert_idx's ", expert_idx.sizes());
  TORCH_CHECK_VALUE(active_num >= 0, op, ": argument 'active_num' must be >= 0; got ", active_num);
  const int64_t N = x.size(0), k = expert_idx.size(1), n = N * k;
  const int64_t kept = std::min(N, active_num) * k;
  const std::vector<int64_t> experts = moe::read_index(expert_idx);
  const std::vector<int64_t> rows = moe::read_index(row_idx);
  moe::check_destinations(op, "row_idx", rows, n, false);
  const moe::KeySort s = moe::counting_sort(experts, expert_buckets(op, "expert_idx", experts));
  at::Tensor expanded_row = at::empty({n}, x.options().dtype(at::kInt));
  at::Tensor expanded_expert = at::empty({n}, x.options().dtype(at::kInt));
  int32_t* erp = expanded_row.data_ptr<int32_t>();
  int32_t* eep = expanded_expert.data_ptr<int32_t>();
  std::vector<int64_t> src(kept);
  for (int64_t p = 0; p < n; ++p) {
    const int64_t f = s.order[p];
    erp[rows[f]] = static_cast<int32_t>(p);
    eep[p] = static_cast<int32_t>(experts[f]);
    if (p < kept) src[p] = rows[f] % N;
  }
  at::Tensor expanded_x = at::empty({kept, x.size(1)}, x.options());
  moe::gather_rows(x.contiguous(), expanded_x, src);
  return {expanded_x, expanded_row, expanded_expert};
}

// ---------------------------------------------------------------------------------------------------------------
// moe_init_routing_v2
// ---------------------------------------------------------------------------------------------------------------
namespace {

struct V2Plan {
  int64_t N, k, H;
  bool capacity;
  int64_t rows_out;                  // rows of expanded_x (flattened E*C in capacity mode)
  int64_t first_expert, num_counted; // experts [first, first + num_counted) in the counts output
  std::vector<int64_t> dest;         // per pair f: destination row or -1
  std::vector<int64_t> src;          // per output row: source pair f or -1
  std::vector<int64_t> counts;       // per counted expert
};

V2Plan plan_v2(const char* op, const at::Tensor& x, const at::Tensor& expert_idx, int64_t active_num,
               int64_t expert_capacity, int64_t expert_num, int64_t drop_pad_mode, at::IntArrayRef range) {
  check_rows2d(op, "x", x);
  moe::check_index(op, "expert_idx", expert_idx);
  TORCH_CHECK_VALUE((expert_idx.dim() == 2 || expert_idx.dim() == 1) && expert_idx.size(0) == x.size(0), op,
                    ": argument 'expert_idx' of shape ", expert_idx.sizes(), " must be [N, k] or [N] with N = ",
                    "x.size(0) = ", x.size(0));
  TORCH_CHECK_VALUE(drop_pad_mode == 0 || drop_pad_mode == 1, op, ": argument 'drop_pad_mode' must be 0 (dropless) ",
                    "or 1 (capacity drop/pad); got ", drop_pad_mode);
  V2Plan pl;
  pl.N = x.size(0);
  pl.k = expert_idx.dim() == 2 ? expert_idx.size(1) : 1;
  pl.H = x.size(1);
  pl.capacity = drop_pad_mode == 1;
  const int64_t n = pl.N * pl.k;
  const std::vector<int64_t> experts = moe::read_index(expert_idx);
  int64_t lo = 0, hi = -1;  // the experts routed: [lo, hi); hi = -1 means "any >= 0"
  bool drop_outside = false;
  if (!range.empty()) {
    TORCH_CHECK_VALUE(range.size() == 2 && range[0] >= 0 && range[0] < range[1], op, ": argument ",
                      "'active_expert_range' must be [start, end) with 0 <= start < end; got ", range);
    TORCH_CHECK_VALUE(!pl.capacity, op, ": argument 'active_expert_range' is supported in dropless mode ",
                      "(drop_pad_mode 0) only");
    lo = range[0];
    hi = range[1];
    drop_outside = true;
  } else if (expert_num > 0) {
    hi = expert_num;
  }
  if (pl.capacity) {
    TORCH_CHECK_VALUE(expert_num > 0, op, ": argument 'expert_num' must be > 0 in capacity mode (drop_pad_mode 1); ",
                      "got ", expert_num);
    TORCH_CHECK_VALUE(expert_capacity > 0, op, ": argument 'expert_capacity' must be > 0 in capacity mode ",
                      "(drop_pad_mode 1); got ", expert_capacity);
  }
  std::vector<int64_t> keys(n);
  int64_t buckets;
  if (hi >= 0) {  // keys relative to lo; experts outside the range go to the last bucket (sorted last, dropped)
    const int64_t width = hi - lo;
    for (int64_t f = 0; f < n; ++f) {
      const int64_t e = experts[f];
      const bool inside = e >= lo && e < hi;
      TORCH_CHECK_VALUE(inside || (drop_outside && e >= 0), op, ": argument 'expert_idx'[", f, "] = ", e,
                        " is out of range; expected an expert in [", lo, ", ", hi, ")",
                        drop_outside ? " or another non-negative expert (dropped)" : " (expert_num)");
      keys[f] = inside ? e - lo : width;
    }
    buckets = width + 1;
  } else {
    buckets = expert_buckets(op, "expert_idx", experts);
    keys = experts;
  }
  const moe::KeySort s = moe::counting_sort(keys, buckets);
  const int64_t width = hi >= 0 ? hi - lo : buckets;
  const int64_t routed = n - (hi >= 0 ? s.counts[buckets - 1] : 0);  // pairs inside the range
  pl.first_expert = lo;
  pl.num_counted = hi >= 0 ? width : 0;
  pl.dest.assign(n, -1);
  pl.counts.assign(pl.num_counted, 0);
  if (!pl.capacity) {
    pl.rows_out = active_num > 0 ? std::min(active_num, n) : n;
    pl.src.assign(pl.rows_out, -1);
    const int64_t kept = std::min(routed, pl.rows_out);
    for (int64_t p = 0; p < kept; ++p) {
      const int64_t f = s.order[p];
      pl.dest[f] = p;
      pl.src[p] = f;
      if (pl.num_counted) ++pl.counts[keys[f]];
    }
  } else {
    const int64_t C = expert_capacity;
    pl.rows_out = expert_num * C;
    pl.src.assign(pl.rows_out, -1);
    int64_t p = 0;
    for (int64_t e = 0; e < width; ++e) {
      for (int64_t pos = 0; pos < s.counts[e]; ++pos, ++p) {
        if (pos >= C) continue;
        const int64_t f = s.order[p];
        pl.dest[f] = e * C + pos;
        pl.src[e * C + pos] = f;
      }
      pl.counts[e] = s.counts[e];  // before dropping
    }
  }
  return pl;
}

}  // namespace

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> moe_init_routing_v2_cpu(
    const at::Tensor& x, const at::Tensor& expert_idx, const std::optional<at::Tensor>& scale,
    const std::optional<at::Tensor>& offset, int64_t active_num, int64_t expert_capacity, int64_t expert_num,
    int64_t drop_pad_mode, int64_t expert_tokens_num_type, bool expert_tokens_num_flag, int64_t quant_mode,
    at::IntArrayRef active_expert_range, int64_t row_idx_type) {
  const char* op = "moe_init_routing_v2";
  TORCH_CHECK_VALUE(quant_mode == -1, op, ": argument 'quant_mode' must be -1 (no quantization; the quantized modes ",
                    "are not implemented on CPU); got ", quant_mode);
  TORCH_CHECK_VALUE(!offset.has_value(), op, ": argument 'offset' is only used by the quantized modes; pass None");
  TORCH_CHECK_VALUE(row_idx_type == 0 || row_idx_type == 1, op, ": argument 'row_idx_type' must be 0 (gather index: ",
                    "destination row per pair) or 1 (scatter index: pair per sorted row); got ", row_idx_type);
  TORCH_CHECK_VALUE(row_idx_type == 0 || drop_pad_mode == 0, op, ": argument 'row_idx_type' 1 is supported in ",
                    "dropless mode (drop_pad_mode 0) only");
  TORCH_CHECK_VALUE(expert_tokens_num_type == 0 || expert_tokens_num_type == 1, op, ": argument ",
                    "'expert_tokens_num_type' must be 0 (cumsum) or 1 (count); got ", expert_tokens_num_type);
  V2Plan pl = plan_v2(op, x, expert_idx, active_num, expert_capacity, expert_num, drop_pad_mode, active_expert_range);
  if (expert_tokens_num_flag) {
    TORCH_CHECK_VALUE(pl.num_counted > 0, op, ": expert_tokens_num_flag needs 'expert_num' > 0 or an ",
                      "'active_expert_range' (the experts to count)");
    TORCH_CHECK_VALUE(!pl.capacity || expert_tokens_num_type == 1, op, ": in capacity mode (drop_pad_mode 1) the ",
                      "expert token numbers are counts: 'expert_tokens_num_type' must be 1; got ",
                      expert_tokens_num_type);
  }
  const int64_t n = pl.N * pl.k;
  at::Tensor expanded_x = pl.capacity ? at::empty({expert_num, expert_capacity, pl.H}, x.options())
                                      : at::empty({pl.rows_out, pl.H}, x.options());
  std::vector<int64_t> src_token(pl.rows_out);
  for (int64_t p = 0; p < pl.rows_out; ++p) src_token[p] = pl.src[p] < 0 ? -1 : pl.src[p] / pl.k;
  moe::gather_rows(x.contiguous(), expanded_x, src_token);
  at::Tensor row_out = at::empty({n}, x.options().dtype(at::kInt));
  int32_t* rp = row_out.data_ptr<int32_t>();
  if (row_idx_type == 0) {
    for (int64_t f = 0; f < n; ++f) rp[f] = static_cast<int32_t>(pl.dest[f]);
  } else {
    for (int64_t p = 0; p < n; ++p) rp[p] = p < pl.rows_out ? static_cast<int32_t>(pl.src[p]) : -1;
  }
  at::Tensor tokens = at::empty({expert_tokens_num_flag ? pl.num_counted : 0}, x.options().dtype(at::kLong));
  if (expert_tokens_num_flag) {
    int64_t* tp = tokens.data_ptr<int64_t>();
    int64_t run = 0;
    for (int64_t e = 0; e < pl.num_counted; ++e) {
      run += pl.counts[e];
      tp[e] = expert_tokens_num_type == 0 ? run : pl.counts[e];
    }
  }
  at::Tensor expanded_scale = at::empty({0}, x.options().dtype(at::kFloat));
  if (scale.has_value()) {
    TORCH_CHECK_TYPE(scale->scalar_type() == at::kFloat, op, ": argument 'scale' must be float32; got ",
                     scale->scalar_type());
    TORCH_CHECK_VALUE(scale->dim() == 1 && scale->size(0) == pl.N, op, ": argument 'scale' of shape ", scale->sizes(),
                      " must be [N] = [", pl.N, "] (one scale per token) in the unquantized mode");
    const at::Tensor sc = scale->contiguous();
    const float* sp = sc.data_ptr<float>();
    expanded_scale = at::empty({pl.rows_out}, x.options().dtype(at::kFloat));
    float* ep = expanded_scale.data_ptr<float>();
    for (int64_t p = 0; p < pl.rows_out; ++p) ep[p] = src_token[p] < 0 ? 0.f : sp[src_token[p]];
  }
  return {expanded_x, row_out, tokens, expanded_scale};
}

at::Tensor moe_init_routing_v2_grad_cpu(const at::Tensor& grad_expanded_x, const at::Tensor& expanded_row_idx,
                                        const at::Tensor& x, const at::Tensor& expert_idx, int64_t row_idx_type) {
  const char* op = "moe_init_routing_v2_grad";
  moe::check_float(op, "grad_expanded_x", grad_expanded_x);
  moe::check_index(op, "expanded_row_idx", expanded_row_idx);
  const int64_t N = x.size(0), H = x.size(1), k = expert_idx.dim() == 2 ? expert_idx.size(1) : 1, n = N * k;
  TORCH_CHECK_VALUE(expanded_row_idx.numel() == n, op, ": argument 'expanded_row_idx' must have N*k = ", n,
                    " entries; got ", expanded_row_idx.numel());
  TORCH_CHECK_VALUE(grad_expanded_x.dim() >= 2 && grad_expanded_x.size(-1) == H, op,
                    ": argument 'grad_expanded_x' of shape ", grad_expanded_x.sizes(), " must end in H = ", H);
  const int64_t R = grad_expanded_x.numel() / std::max<int64_t>(H, 1);
  const std::vector<int64_t> idx = moe::read_index(expanded_row_idx);
  std::vector<int64_t> dest(n, -1);  // the gather form: destination row per pair
  if (row_idx_type == 0) {
    dest = idx;
  } else {
    for (int64_t p = 0; p < n; ++p)
      if (idx[p] >= 0 && idx[p] < n && p < R) dest[idx[p]] = p;
  }
  moe::check_destinations(op, "expanded_row_idx", dest, R, true);
  const at::Tensor g = grad_expanded_x.to(x.scalar_type()).contiguous();
  at::Tensor dx = at::empty({N, H}, x.options());
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "moe_init_routing_v2_grad", [&] {
    weighted_row_sum<scalar_t, float>(g.data_ptr<scalar_t>(), H, dest, nullptr, N, k, dx.data_ptr<scalar_t>(), nullptr,
                                      nullptr, nullptr, nullptr);
  });
  return dx;
}

// ---------------------------------------------------------------------------------------------------------------
// moe_compute_expert_tokens
// ---------------------------------------------------------------------------------------------------------------
at::Tensor moe_compute_expert_tokens_cpu(const at::Tensor& sorted_expert_for_source_row, int64_t num_expert) {
  const char* op = "moe_compute_expert_tokens";
  moe::check_index(op, "sorted_expert_for_source_row", sorted_expert_for_source_row);
  TORCH_CHECK_VALUE(sorted_expert_for_source_row.dim() == 1, op, ": argument 'sorted_expert_for_source_row' must be ",
                    "1-D; got shape ", sorted_expert_for_source_row.sizes());
  TORCH_CHECK_VALUE(num_expert > 0, op, ": argument 'num_expert' must be > 0; got ", num_expert);
  const std::vector<int64_t> v = moe::read_index(sorted_expert_for_source_row);
  std::vector<int64_t> hist(num_expert, 0);
  for (size_t i = 0; i < v.size(); ++i) {
    TORCH_CHECK_VALUE(v[i] >= 0 && v[i] < num_expert, op, ": argument 'sorted_expert_for_source_row'[", i, "] = ",
                      v[i], " is out of range [0, num_expert = ", num_expert, ")");
    ++hist[v[i]];
  }
  at::Tensor out = at::empty({num_expert}, sorted_expert_for_source_row.options().dtype(at::kInt));
  int32_t* op_ = out.data_ptr<int32_t>();
  int64_t run = 0;
  for (int64_t e = 0; e < num_expert; ++e) op_[e] = static_cast<int32_t>(run += hist[e]);
  return out;
}

// ---------------------------------------------------------------------------------------------------------------
// moe_finalize_routing
// ---------------------------------------------------------------------------------------------------------------
namespace {

struct Finalize {
  int64_t N, k, H, R;
  std::vector<int64_t> src;     // per (i, j) at i*k + j: row of expanded or -1
  std::vector<int64_t> expert;  // per (i, j), when bias is given
  at::Tensor rows;              // expanded as contiguous [R, H]
};

Finalize plan_finalize(const char* op, const at::Tensor& expanded, const std::optional<at::Tensor>& skip1,
                       const std::optional<at::Tensor>& skip2, const std::optional<at::Tensor>& bias,
                       const std::optional<at::Tensor>& scales, const at::Tensor& dst_row,
                       const std::optional<at::Tensor>& experts, int64_t drop_pad_mode) {
  moe::check_float(op, "expanded_permuted_rows", expanded);
  TORCH_CHECK_VALUE(expanded.dim() >= 2, op, ": argument 'expanded_permuted_rows' must be [rows, H] (or [E, C, H]); ",
                    "got shape ", expanded.sizes());
  TORCH_CHECK_VALUE(drop_pad_mode >= 0 && drop_pad_mode <= 3, op, ": argument 'drop_pad_mode' must be 0-3 (0/1: ",
                    "column-major pairs j*N+i, 2/3: token-major i*k+j; 1/3 capacity layout); got ", drop_pad_mode);
  moe::check_index(op, "expanded_src_to_dst_row", dst_row);
  Finalize fz;
  fz.H = expanded.size(-1);
  fz.R = expanded.numel() / std::max<int64_t>(fz.H, 1);
  if (skip1.has_value()) fz.N = skip1->size(0);
  else if (scales.has_value()) fz.N = scales->size(0);
  else if (experts.has_value()) fz.N = experts->size(0);
  else TORCH_CHECK_VALUE(false, op, ": one of 'skip1', 'scales' or 'export_for_source_row' is needed to know the ",
                         "token count N");
  const int64_t n = dst_row.numel();
  TORCH_CHECK_VALUE(dst_row.dim() == 1 && (fz.N == 0 ? n == 0 : n % fz.N == 0), op, ": argument ",
                    "'expanded_src_to_dst_row' of shape ", dst_row.sizes(), " must be 1-D [N*k] with N = ", fz.N);
  fz.k = fz.N ? n / fz.N : 0;
  for (const auto& [name, t] : {std::pair<const char*, const std::optional<at::Tensor>*>{"skip1", &skip1},
                                {"skip2", &skip2}}) {
    if (!t->has_value()) continue;
    moe::check_same_dtype(op, name, **t, "expanded_permuted_rows", expanded);
    TORCH_CHECK_VALUE((*t)->dim() == 2 && (*t)->size(0) == fz.N && (*t)->size(1) == fz.H, op, ": argument '", name,
                      "' of shape ", (*t)->sizes(), " must be [N, H] = [", fz.N, ", ", fz.H, "]");
  }
  if (scales.has_value()) {
    moe::check_float(op, "scales", *scales);
    TORCH_CHECK_VALUE(scales->dim() == 2 && scales->size(0) == fz.N && scales->size(1) == fz.k, op,
                      ": argument 'scales' of shape ", scales->sizes(), " must be [N, k] = [", fz.N, ", ", fz.k, "]");
  }
  const std::vector<int64_t> raw = moe::read_index(dst_row);
  moe::check_destinations(op, "expanded_src_to_dst_row", raw, fz.R, true);
  const bool column_major = drop_pad_mode <= 1;
  fz.src.resize(n);
  for (int64_t i = 0; i < fz.N; ++i)
    for (int64_t j = 0; j < fz.k; ++j) fz.src[i * fz.k + j] = raw[column_major ? j * fz.N + i : i * fz.k + j];
  if (bias.has_value()) {
    moe::check_same_dtype(op, "bias", *bias, "expanded_permuted_rows", expanded);
    TORCH_CHECK_VALUE(bias->dim() == 2 && bias->size(1) == fz.H, op, ": argument 'bias' of shape ", bias->sizes(),
                      " must be [E, H] with H = ", fz.H);
    TORCH_CHECK_VALUE(experts.has_value(), op, ": argument 'export_for_source_row' (the expert of each pair) is ",
                      "required with bias");
    moe::check_index(op, "export_for_source_row", *experts);
    TORCH_CHECK_VALUE(experts->dim() == 2 && experts->size(0) == fz.N && experts->size(1) == fz.k, op,
                      ": argument 'export_for_source_row' of shape ", experts->sizes(), " must be [N, k] = [", fz.N,
                      ", ", fz.k, "]");
    fz.expert = moe::read_index(*experts);
    for (size_t f = 0; f < fz.expert.size(); ++f)
      TORCH_CHECK_VALUE(fz.expert[f] >= 0 && fz.expert[f] < bias->size(0), op, ": argument 'export_for_source_row'[",
                        f, "] = ", fz.expert[f], " is out of range [0, E = bias.size(0) = ", bias->size(0), ")");
  }
  fz.rows = expanded.contiguous();
  return fz;
}

}  // namespace

at::Tensor moe_finalize_routing_cpu(const at::Tensor& expanded_permuted_rows, const std::optional<at::Tensor>& skip1,
                                    const std::optional<at::Tensor>& skip2, const std::optional<at::Tensor>& bias,
                                    const std::optional<at::Tensor>& scales, const at::Tensor& expanded_src_to_dst_row,
                                    const std::optional<at::Tensor>& export_for_source_row, int64_t drop_pad_mode) {
  const char* op = "moe_finalize_routing";
  const Finalize fz = plan_finalize(op, expanded_permuted_rows, skip1, skip2, bias, scales, expanded_src_to_dst_row,
                                    export_for_source_row, drop_pad_mode);
  at::Tensor out = at::empty({fz.N, fz.H}, expanded_permuted_rows.options());
  if (out.numel() == 0) return out;
  const at::Tensor s1 = skip1.has_value() ? skip1->contiguous() : at::Tensor();
  const at::Tensor s2 = skip2.has_value() ? skip2->contiguous() : at::Tensor();
  const at::Tensor bc = bias.has_value() ? bias->contiguous() : at::Tensor();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, out.scalar_type(), "moe_finalize_routing", [&] {
    using A = acc_t<scalar_t>;
    const at::Tensor w = scales.has_value() ? scales->to(c10::CppTypeToScalarType<A>::value).contiguous() : at::Tensor();
    auto ptr = [](const at::Tensor& t) { return t.defined() ? t.data_ptr<scalar_t>() : nullptr; };
    weighted_row_sum<scalar_t, A>(fz.rows.data_ptr<scalar_t>(), fz.H, fz.src, w.defined() ? w.data_ptr<A>() : nullptr,
                                  fz.N, fz.k, out.data_ptr<scalar_t>(), ptr(s1), ptr(s2), ptr(bc), &fz.expert);
  });
  return out;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> moe_finalize_routing_grad_cpu(
    const at::Tensor& grad_out, const at::Tensor& expanded_permuted_rows, const std::optional<at::Tensor>& skip1,
    const std::optional<at::Tensor>& bias, const std::optional<at::Tensor>& scales,
    const at::Tensor& expanded_src_to_dst_row, const std::optional<at::Tensor>& export_for_source_row,
    int64_t drop_pad_mode) {
  const char* op = "moe_finalize_routing_grad";
  const Finalize fz = plan_finalize(op, expanded_permuted_rows, skip1, std::nullopt, bias, scales,
                                    expanded_src_to_dst_row, export_for_source_row, drop_pad_mode);
  moe::check_float(op, "grad_out", grad_out);
  TORCH_CHECK_VALUE(grad_out.dim() == 2 && grad_out.size(0) == fz.N && grad_out.size(1) == fz.H, op,
                    ": argument 'grad_out' of shape ", grad_out.sizes(), " must be [N, H] = [", fz.N, ", ", fz.H, "]");
  const auto dt = expanded_permuted_rows.scalar_type();
  const at::Tensor g = grad_out.to(dt).contiguous();
  at::Tensor d_rows = at::zeros(expanded_permuted_rows.sizes(), expanded_permuted_rows.options().memory_format(
                                                                    at::MemoryFormat::Contiguous));
  at::Tensor d_skip = g.clone();
  at::Tensor d_scales = scales.has_value() ? at::empty({fz.N, fz.k}, scales->options()) : at::empty({0}, g.options());
  at::Tensor d_bias = bias.has_value() ? at::empty(bias->sizes(), bias->options()) : at::empty({0}, g.options());
  if (fz.N == 0 || fz.H == 0) {
    if (d_scales.numel()) d_scales.zero_();
    if (d_bias.numel()) d_bias.zero_();
    return {d_rows, d_skip, d_scales, d_bias};
  }
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, dt, "moe_finalize_routing_grad", [&] {
    using A = acc_t<scalar_t>;
    const A* wp = nullptr;
    at::Tensor w;
    if (scales.has_value()) {
      w = scales->to(c10::CppTypeToScalarType<A>::value).contiguous();
      wp = w.data_ptr<A>();
    }
    const at::Tensor bc = bias.has_value() ? bias->contiguous() : at::Tensor();
    const scalar_t* bp = bc.defined() ? bc.data_ptr<scalar_t>() : nullptr;
    const scalar_t* gp = g.data_ptr<scalar_t>();
    const scalar_t* rp = fz.rows.data_ptr<scalar_t>();
    scalar_t* drp = d_rows.data_ptr<scalar_t>();
    const int64_t N = fz.N, k = fz.k, H = fz.H;
    at::Tensor dsc = at::zeros({N, k}, g.options().dtype(c10::CppTypeToScalarType<A>::value));
    A* dsp = dsc.data_ptr<A>();
    // Rows and scales: pair (i, j) writes only its own row of d_rows (destinations are distinct) and d_scales[i, j].
    at::parallel_for(0, N, row_grain(H * k), [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i) {
        for (int64_t j = 0; j < k; ++j) {
          const int64_t r = fz.src[i * k + j];
          if (r < 0) continue;
          const A s = wp ? wp[i * k + j] : A(1);
          const scalar_t* gi = gp + i * H;
          const scalar_t* row = rp + r * H;
          const scalar_t* b = bp ? bp + fz.expert[i * k + j] * H : nullptr;
          A dot = 0;
          for (int64_t h = 0; h < H; ++h) {
            const A gv = static_cast<A>(gi[h]);
            drp[r * H + h] = static_cast<scalar_t>(s * gv);
            dot += gv * (static_cast<A>(row[h]) + (b ? static_cast<A>(b[h]) : A(0)));
          }
          dsp[i * k + j] = dot;
        }
      }
    });
    if (scales.has_value()) d_scales.copy_(dsc);
    if (bias.has_value()) {  // parallel over column blocks: every thread owns whole columns of d_bias
      const int64_t E = bias->size(0);
      at::Tensor db = at::zeros({E, H}, g.options().dtype(c10::CppTypeToScalarType<A>::value));
      A* dbp = db.data_ptr<A>();
      at::parallel_for(0, H, 64, [&](int64_t h0, int64_t h1) {
        for (int64_t i = 0; i < N; ++i)
          for (int64_t j = 0; j < k; ++j) {
            if (fz.src[i * k + j] < 0) continue;
            const A s = wp ? wp[i * k + j] : A(1);
            A* dst = dbp + fz.expert[i * k + j] * H;
            for (int64_t h = h0; h < h1; ++h) dst[h] += s * static_cast<A>(gp[i * H + h]);
          }
      });
      d_bias.copy_(db);
    }
  });
  return {d_rows, d_skip, d_scales, d_bias};
}

// ---------------------------------------------------------------------------------------------------------------
// moe_token_permute / moe_token_unpermute
// ---------------------------------------------------------------------------------------------------------------
namespace {

int64_t topk_of(const at::Tensor& indices) { return indices.dim() == 2 ? indices.size(1) : 1; }

int64_t kept_rows(int64_t n, std::optional<int64_t> num_out_tokens) {
  const int64_t v = num_out_tokens.value_or(0);
  if (v == 0) return n;
  return v > 0 ? std::min(v, n) : std::max<int64_t>(n + v, 0);
}

}  // namespace

std::tuple<at::Tensor, at::Tensor> moe_token_permute_cpu(const at::Tensor& tokens, const at::Tensor& indices,
                                                         std::optional<int64_t> num_out_tokens, bool padded_mode) {
  const char* op = "moe_token_permute";
  TORCH_CHECK_VALUE(!padded_mode, op, ": argument 'padded_mode' must be False (padded mode is not implemented, as in ",
                    "CANN)");
  check_rows2d(op, "tokens", tokens);
  moe::check_index(op, "indices", indices);
  TORCH_CHECK_VALUE((indices.dim() == 1 || indices.dim() == 2) && indices.size(0) == tokens.size(0), op,
                    ": argument 'indices' of shape ", indices.sizes(), " must be [N, topk] or [N] with N = ",
                    "tokens.size(0) = ", tokens.size(0));
  const int64_t n = indices.numel(), R = kept_rows(n, num_out_tokens), topk = topk_of(indices);
  TORCH_CHECK_VALUE(topk <= 1024, op, ": argument 'indices' has topk = ", topk, "; at most 1024 is supported");
  const std::vector<int64_t> experts = moe::read_index(indices);
  const moe::KeySort s = moe::counting_sort(experts, expert_buckets(op, "indices", experts));
  at::Tensor sorted = at::empty({n}, indices.options().dtype(at::kInt));
  int32_t* sp = sorted.data_ptr<int32_t>();
  std::vector<int64_t> src(R);
  for (int64_t p = 0; p < n; ++p) {
    sp[s.order[p]] = static_cast<int32_t>(p);
    if (p < R) src[p] = s.order[p] / topk;
  }
  at::Tensor permuted = at::empty({R, tokens.size(1)}, tokens.options());
  moe::gather_rows(tokens.contiguous(), permuted, src);
  return {permuted, sorted};
}

at::Tensor moe_token_permute_grad_cpu(const at::Tensor& grad_permuted_tokens, const at::Tensor& sorted_indices,
                                      const at::Tensor& indices) {
  const char* op = "moe_token_permute_grad";
  moe::check_float(op, "grad_permuted_tokens", grad_permuted_tokens);
  check_rows2d(op, "grad_permuted_tokens", grad_permuted_tokens);
  moe::check_index(op, "sorted_indices", sorted_indices);
  const int64_t N = indices.size(0), topk = topk_of(indices), n = N * topk, R = grad_permuted_tokens.size(0);
  const int64_t H = grad_permuted_tokens.size(1);
  TORCH_CHECK_VALUE(sorted_indices.numel() == n, op, ": argument 'sorted_indices' must have N*topk = ", n,
                    " entries; got ", sorted_indices.numel());
  std::vector<int64_t> src = moe::read_index(sorted_indices);
  moe::check_destinations(op, "sorted_indices", src, n, false);
  for (auto& r : src)
    if (r >= R) r = -1;  // dropped by num_out_tokens
  const at::Tensor g = grad_permuted_tokens.contiguous();
  at::Tensor dt = at::empty({N, H}, g.options());
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, g.scalar_type(), "moe_token_permute_grad", [&] {
    weighted_row_sum<scalar_t, float>(g.data_ptr<scalar_t>(), H, src, nullptr, N, topk, dt.data_ptr<scalar_t>(),
                                      nullptr, nullptr, nullptr, nullptr);
  });
  return dt;
}

namespace {

struct Unpermute {
  int64_t N, topk, R, H;
  std::vector<int64_t> src;  // per pair: row of permuted_tokens or -1 (dropped)
};

Unpermute plan_unpermute(const char* op, const at::Tensor& permuted, const at::Tensor& sorted_indices,
                         const std::optional<at::Tensor>& probs, bool padded_mode) {
  TORCH_CHECK_VALUE(!padded_mode, op, ": argument 'padded_mode' must be False (padded mode is not implemented, as in ",
                    "CANN)");
  moe::check_float(op, "permuted_tokens", permuted);
  check_rows2d(op, "permuted_tokens", permuted);
  moe::check_index(op, "sorted_indices", sorted_indices);
  TORCH_CHECK_VALUE(sorted_indices.dim() == 1, op, ": argument 'sorted_indices' must be 1-D [N*topk]; got shape ",
                    sorted_indices.sizes());
  Unpermute u;
  const int64_t n = sorted_indices.numel();
  u.topk = probs.has_value() ? probs->size(-1) : 1;
  if (probs.has_value()) {
    moe::check_float(op, "probs", *probs);
    TORCH_CHECK_VALUE(probs->dim() == 2 && probs->numel() == n, op, ": argument 'probs' of shape ", probs->sizes(),
                      " must be [N, topk] with N*topk = sorted_indices.numel() = ", n);
  }
  u.N = u.topk ? n / u.topk : 0;
  u.R = permuted.size(0);
  u.H = permuted.size(1);
  TORCH_CHECK_VALUE(u.R <= n, op, ": argument 'permuted_tokens' has ", u.R, " rows, more than the ", n,
                    " (token, expert) pairs of sorted_indices");
  u.src = moe::read_index(sorted_indices);
  moe::check_destinations(op, "sorted_indices", u.src, n, false);
  for (auto& r : u.src)
    if (r >= u.R) r = -1;
  return u;
}

}  // namespace

at::Tensor moe_token_unpermute_cpu(const at::Tensor& permuted_tokens, const at::Tensor& sorted_indices,
                                   const std::optional<at::Tensor>& probs, bool padded_mode,
                                   at::OptionalIntArrayRef restore_shape) {
  const char* op = "moe_token_unpermute";
  const Unpermute u = plan_unpermute(op, permuted_tokens, sorted_indices, probs, padded_mode);
  at::Tensor out = at::empty({u.N, u.H}, permuted_tokens.options());
  if (out.numel() == 0) return out;
  const at::Tensor pc = permuted_tokens.contiguous();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, pc.scalar_type(), "moe_token_unpermute", [&] {
    using A = acc_t<scalar_t>;
    const at::Tensor w = probs.has_value() ? probs->to(c10::CppTypeToScalarType<A>::value).contiguous() : at::Tensor();
    weighted_row_sum<scalar_t, A>(pc.data_ptr<scalar_t>(), u.H, u.src, w.defined() ? w.data_ptr<A>() : nullptr, u.N,
                                  u.topk, out.data_ptr<scalar_t>(), nullptr, nullptr, nullptr, nullptr);
  });
  return out;
}

std::tuple<at::Tensor, at::Tensor> moe_token_unpermute_grad_cpu(const at::Tensor& permuted_tokens,
                                                                const at::Tensor& grad_unpermuted_tokens,
                                                                const at::Tensor& sorted_indices,
                                                                const std::optional<at::Tensor>& probs,
                                                                bool padded_mode,
                                                                at::OptionalIntArrayRef restore_shape) {
  const char* op = "moe_token_unpermute_grad";
  const Unpermute u = plan_unpermute(op, permuted_tokens, sorted_indices, probs, padded_mode);
  moe::check_float(op, "grad_unpermuted_tokens", grad_unpermuted_tokens);
  TORCH_CHECK_VALUE(grad_unpermuted_tokens.dim() == 2 && grad_unpermuted_tokens.size(0) == u.N &&
                        grad_unpermuted_tokens.size(1) == u.H,
                    op, ": argument 'grad_unpermuted_tokens' of shape ", grad_unpermuted_tokens.sizes(),
                    " must be [N, H] = [", u.N, ", ", u.H, "]");
  const auto dt = permuted_tokens.scalar_type();
  const at::Tensor g = grad_unpermuted_tokens.to(dt).contiguous();
  const at::Tensor pc = permuted_tokens.contiguous();
  at::Tensor d_perm = at::zeros({u.R, u.H}, permuted_tokens.options());
  at::Tensor d_probs = probs.has_value() ? at::empty(probs->sizes(), probs->options()) : at::empty({0}, g.options());
  if (u.N == 0 || u.H == 0) {
    if (d_probs.numel()) d_probs.zero_();
    return {d_perm, d_probs};
  }
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, dt, "moe_token_unpermute_grad", [&] {
    using A = acc_t<scalar_t>;
    const at::Tensor w = probs.has_value() ? probs->to(c10::CppTypeToScalarType<A>::value).contiguous() : at::Tensor();
    const A* wp = w.defined() ? w.data_ptr<A>() : nullptr;
    at::Tensor dpr = at::zeros({u.N, u.topk}, g.options().dtype(c10::CppTypeToScalarType<A>::value));
    A* dpp = dpr.data_ptr<A>();
    const scalar_t* gp = g.data_ptr<scalar_t>();
    const scalar_t* rp = pc.data_ptr<scalar_t>();
    scalar_t* dp = d_perm.data_ptr<scalar_t>();
    const int64_t H = u.H, k = u.topk;
    at::parallel_for(0, u.N, row_grain(H * k), [&](int64_t t0, int64_t t1) {
      for (int64_t t = t0; t < t1; ++t)
        for (int64_t j = 0; j < k; ++j) {
          const int64_t r = u.src[t * k + j];
          if (r < 0) continue;
          const A s = wp ? wp[t * k + j] : A(1);
          A dot = 0;
          for (int64_t h = 0; h < H; ++h) {
            const A gv = static_cast<A>(gp[t * H + h]);
            dp[r * H + h] = static_cast<scalar_t>(s * gv);
            dot += gv * static_cast<A>(rp[r * H + h]);
          }
          dpp[t * k + j] = dot;
        }
    });
    if (probs.has_value()) d_probs.copy_(dpr);
  });
  return {d_perm, d_probs};
}

}  // namespace npu_fa
