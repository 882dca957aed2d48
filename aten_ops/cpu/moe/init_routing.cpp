// CPU kernels of the MoE dispatch side: moe_init_routing (v1), moe_init_routing_v2 and its backward, and
// moe_compute_expert_tokens.
#include "common/checked_math.h"
#include <limits>

#include "common/moe/init_routing.h"
#include "cpu/moe/routing_helpers.h"
#include "cpu/quant/quant_kernels.h"
#include "generated/kernels.h"

namespace npu_fa {

using moe::expert_buckets;
using moe::weighted_row_sum;
using moe::check_rows2d;

// ---------------------------------------------------------------------------------------------------------------
// moe_init_routing (v1)
// ---------------------------------------------------------------------------------------------------------------
std::tuple<at::Tensor, at::Tensor, at::Tensor> moe_init_routing_cpu(const MoeInitRoutingArgs& args) {
  const char* op = "moe_init_routing";
  check_rows2d(op, "x", args.x);
  moe::check_index(op, "row_idx", args.row_idx);
  moe::check_index(op, "expert_idx", args.expert_idx);
  TORCH_CHECK_VALUE(args.expert_idx.dim() == 2 && args.expert_idx.size(0) == args.x.size(0), op,
                    ": argument 'expert_idx' of shape ",
                    args.expert_idx.sizes(), " must be [N, k] with N = x.size(0) = ", args.x.size(0));
  TORCH_CHECK_VALUE(args.row_idx.sizes() == args.expert_idx.sizes(), op, ": argument 'row_idx' of shape ",
                    args.row_idx.sizes(),
                    " must match expert_idx's ", args.expert_idx.sizes());
  TORCH_CHECK_VALUE(args.active_num >= 0, op, ": argument 'active_num' must be >= 0; got ", args.active_num);
  const int64_t N = args.x.size(0), k = args.expert_idx.size(1), n = N * k;
  const int64_t kept = std::min(N, args.active_num) * k;
  const std::vector<int64_t> experts = moe::read_index(args.expert_idx);
  const std::vector<int64_t> rows = moe::read_index(args.row_idx);
  moe::check_destinations(op, "row_idx", rows, n, false);
  const moe::KeySort s = moe::counting_sort(experts, expert_buckets(op, "expert_idx", experts));
  at::Tensor expanded_row = at::empty({n}, args.x.options().dtype(at::kInt));
  at::Tensor expanded_expert = at::empty({n}, args.x.options().dtype(at::kInt));
  int32_t* erp = expanded_row.data_ptr<int32_t>();
  int32_t* eep = expanded_expert.data_ptr<int32_t>();
  std::vector<int64_t> src(kept);
  for (int64_t p = 0; p < n; ++p) {
    const int64_t f = s.order[p];
    erp[rows[f]] = static_cast<int32_t>(p);
    eep[p] = static_cast<int32_t>(experts[f]);
    if (p < kept) src[p] = rows[f] % N;
  }
  at::Tensor expanded_x = at::empty({kept, args.x.size(1)}, args.x.options());
  moe::gather_rows(args.x.contiguous(), expanded_x, src);
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
  std::vector<int64_t> dest;         // per pair f: its row_idx_type 0 entry (row, sorted position or -1)
  std::vector<int64_t> src;          // per output row: source pair f or -1
  std::vector<int64_t> order;        // per sorted position: pair f (routed pairs first, then the dropped ones)
  std::vector<int64_t> counts;       // per counted expert
  std::vector<int64_t> experts;      // per pair f: its expert
};

// The stable counting sort of the pairs by key (common/moe/init_routing.h: the checks shared with the npu kernel)
// and the destination of every pair.
V2Plan plan_v2(const char* op, const moe::InitRoutingV2Shape& sh, const at::Tensor& expert_idx,
               int64_t expert_capacity) {
  V2Plan pl;
  pl.N = sh.N;
  pl.k = sh.k;
  pl.H = sh.H;
  pl.capacity = sh.capacity;
  const int64_t n = sh.pairs, lo = sh.lo, hi = sh.hi;
  const std::vector<int64_t> experts = moe::read_index(expert_idx);
  const std::vector<int64_t> keys = moe::init_routing_v2_keys(op, sh, experts);
  const int64_t buckets = hi >= 0 ? hi - lo + 1 : expert_buckets(op, "expert_idx", experts);
  moe::KeySort s = moe::counting_sort(keys, buckets);
  pl.experts = experts;
  const int64_t width = hi >= 0 ? hi - lo : buckets;
  const int64_t routed = n - (hi >= 0 ? s.counts[buckets - 1] : 0);  // pairs inside the range
  // The dropped pairs (bucket `width`, in pair order) in the NPU's order among themselves (init_routing.h).
  std::stable_sort(s.order.begin() + routed, s.order.end(), [&](int64_t a, int64_t b) {
    return moe::dropped_sort_key(experts[a], lo) < moe::dropped_sort_key(experts[b], lo);
  });
  pl.first_expert = lo;
  pl.num_counted = sh.num_counted;
  pl.dest.assign(n, -1);
  pl.counts.assign(pl.num_counted, 0);
  pl.rows_out = sh.rows_out;
  pl.src.assign(pl.rows_out, -1);
  if (!pl.capacity) {
    // Every routed pair gets its sorted position, also past the rows kept by active_num (as the NPU writes it);
    // only the first `kept` positions are rows of expanded_x.
    const int64_t kept = std::min(routed, pl.rows_out);
    for (int64_t p = 0; p < routed; ++p) {
      const int64_t f = s.order[p];
      pl.dest[f] = p;
      if (p >= kept) continue;
      pl.src[p] = f;
      if (pl.num_counted) ++pl.counts[keys[f]];
    }
  } else {
    const int64_t C = expert_capacity;
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
  pl.order = std::move(s.order);
  return pl;
}

}  // namespace

namespace {

// The int8 rows of quant_mode 0 and 1 (written into expanded_x, [rows_out, H] int8); returns expanded_scale:
// empty for mode 0, the per-row dynamic scale (float32 [rows_out], 0 for empty rows) for mode 1.
//   mode 0 (static): y = clamp(rint(x * scale + offset), -128, 127), scale and offset one float32 each.
//   mode 1 (dynamic): v = x * smooth, y = rint(v / s) with s = max|v| / 127; smooth = none, scale [1, H] for every
//   row, or scale [W, H] indexed by the row's expert - start of the counted experts (W of them).
at::Tensor quantize_expanded(const char* op, const MoeInitRoutingV2Args& args, const V2Plan& pl,
                             const std::vector<int64_t>& src_token, at::Tensor& expanded_x) {
  const int64_t H = pl.H, R = pl.rows_out;
  const bool dynamic = args.quant_mode == 1;
  float st_scale = 1.f, st_offset = 0.f;
  at::Tensor smooth;
  int64_t smooth_rows = 0;
  if (!dynamic) {
    for (const char* name : {"scale", "offset"}) {
      const auto& t = std::string(name) == "scale" ? args.scale : args.offset;
      TORCH_CHECK_VALUE(t.has_value(), op, ": argument '", name, "' is required by the static quantisation ",
                        "(quant_mode 0): one float32 value, shape [1]");
      TORCH_CHECK_TYPE(t->scalar_type() == at::kFloat, op, ": argument '", name, "' must be float32; got ",
                       t->scalar_type());
      TORCH_CHECK_VALUE(t->numel() == 1 && t->dim() <= 1, op, ": argument '", name, "' of shape ", t->sizes(),
                        " must be [1] in the static quantisation (quant_mode 0)");
    }
    st_scale = args.scale->item<float>();
    st_offset = args.offset->item<float>();
  } else if (args.scale.has_value() && !(pl.N == 0 && args.scale->numel() == 0)) {
    // (An empty batch may come with an empty scale, as torch_npu accepts: nothing is scaled then.)
    TORCH_CHECK_TYPE(args.scale->scalar_type() == at::kFloat, op, ": argument 'scale' must be float32; got ",
                     args.scale->scalar_type());
    smooth_rows = args.scale->dim() == 2 ? args.scale->size(0) : -1;
    TORCH_CHECK_VALUE(args.scale->dim() == 2 && args.scale->size(1) == H &&
                          (smooth_rows == 1 || (pl.num_counted > 0 && smooth_rows == pl.num_counted)),
                      op, ": argument 'scale' of shape ", args.scale->sizes(), " must be the smooth scales [1, H] or ",
                      "[expert_end - expert_start, H] = [", pl.num_counted, ", ", H, "] in the dynamic ",
                      "quantisation (quant_mode 1)",
                      pl.num_counted > 0 ? "" : " (per-expert rows need expert_num or active_expert_range)");
    smooth = args.scale->contiguous();
  }
  at::Tensor scales = dynamic ? at::empty({R}, args.x.options().dtype(at::kFloat))
                              : at::empty({0}, args.x.options().dtype(at::kFloat));
  float* scp = dynamic ? scales.data_ptr<float>() : nullptr;
  const float* smp = smooth.defined() ? smooth.data_ptr<float>() : nullptr;
  int8_t* yp = expanded_x.data_ptr<int8_t>();
  const at::Tensor xc = args.x.contiguous();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, xc.scalar_type(), "moe_init_routing_v2_quant", [&] {
    const scalar_t* xp = xc.data_ptr<scalar_t>();
    at::parallel_for(0, R, moe::row_grain(H), [&](int64_t p0, int64_t p1) {
      std::vector<float> v(H), q(H);
      for (int64_t p = p0; p < p1; ++p) {
        const int64_t t = src_token[p];
        int8_t* y = yp + p * H;
        if (t < 0) {  // an empty row (past the routed pairs, or a free capacity slot)
          std::fill(y, y + H, int8_t{0});
          if (scp) scp[p] = 0.f;
          continue;
        }
        for (int64_t h = 0; h < H; ++h) v[h] = static_cast<float>(xp[t * H + h]);
        if (dynamic) {
          if (smp) {
            const int64_t row = smooth_rows == 1 ? 0 : pl.experts[pl.src[p]] - pl.first_expert;
            const float* sr = smp + row * H;
            for (int64_t h = 0; h < H; ++h) v[h] *= sr[h];
          }
          scp[p] = cpu::quantize_row_symmetric(v.data(), H, 127.f, q.data());
        } else {
          cpu::quant_round_stub(v.data(), H, st_scale, false, st_offset, -128.f, 127.f, q.data());
        }
        for (int64_t h = 0; h < H; ++h) y[h] = static_cast<int8_t>(q[h]);
      }
    });
  });
  return scales;
}

}  // namespace

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> moe_init_routing_v2_cpu(const MoeInitRoutingV2Args& args) {
  const char* op = "moe_init_routing_v2";
  const moe::InitRoutingV2Shape sh = moe::check_init_routing_v2(op, args);
  const bool quant = sh.quant;
  V2Plan pl = plan_v2(op, sh, args.expert_idx, args.expert_capacity);
  const int64_t n = pl.N * pl.k;
  const auto out_opts = quant ? args.x.options().dtype(at::kChar) : args.x.options();
  at::Tensor expanded_x = pl.capacity ? at::empty({args.expert_num, args.expert_capacity, pl.H}, out_opts)
                                      : at::empty({pl.rows_out, pl.H}, out_opts);
  std::vector<int64_t> src_token(pl.rows_out);
  for (int64_t p = 0; p < pl.rows_out; ++p) src_token[p] = pl.src[p] < 0 ? -1 : pl.src[p] / pl.k;
  if (!quant) moe::gather_rows(args.x.contiguous(), expanded_x, src_token);
  at::Tensor row_out = at::empty({n}, args.x.options().dtype(at::kInt));
  int32_t* rp = row_out.data_ptr<int32_t>();
  if (args.row_idx_type == 0) {
    for (int64_t f = 0; f < n; ++f) rp[f] = static_cast<int32_t>(pl.dest[f]);
  } else {  // the whole sorted order, dropped pairs included (they follow the rows of expanded_x)
    for (int64_t p = 0; p < n; ++p) rp[p] = static_cast<int32_t>(pl.order[p]);
  }
  at::Tensor tokens = at::empty({args.expert_tokens_num_flag ? pl.num_counted : 0}, args.x.options().dtype(at::kLong));
  if (args.expert_tokens_num_flag && args.expert_tokens_num_type == 2) {
    // The experts that received tokens, in expert order, with their counts; the rows after them are zero.
    tokens = at::zeros({args.expert_num, 2}, args.x.options().dtype(at::kLong));
    int64_t* tp = tokens.data_ptr<int64_t>();
    int64_t row = 0;
    for (int64_t e = 0; e < pl.num_counted; ++e) {
      if (pl.counts[e] == 0) continue;
      tp[2 * row] = pl.first_expert + e;
      tp[2 * row + 1] = pl.counts[e];
      ++row;
    }
  } else if (args.expert_tokens_num_flag) {
    int64_t* tp = tokens.data_ptr<int64_t>();
    int64_t run = 0;
    for (int64_t e = 0; e < pl.num_counted; ++e) {
      run += pl.counts[e];
      tp[e] = args.expert_tokens_num_type == 0 ? run : pl.counts[e];
    }
  }
  at::Tensor expanded_scale = at::empty({0}, args.x.options().dtype(at::kFloat));
  if (quant) {
    expanded_scale = quantize_expanded(op, args, pl, src_token, expanded_x);
  } else if (args.scale.has_value()) {  // checked by check_init_routing_v2
    const at::Tensor sc = args.scale->contiguous();
    const float* sp = sc.data_ptr<float>();
    expanded_scale = at::empty({pl.rows_out}, args.x.options().dtype(at::kFloat));
    float* ep = expanded_scale.data_ptr<float>();
    for (int64_t p = 0; p < pl.rows_out; ++p) ep[p] = src_token[p] < 0 ? 0.f : sp[src_token[p]];
  }
  return {expanded_x, row_out, tokens, expanded_scale};
}

namespace {

// Per pair: whether it was routed, i.e. its expert lies in active_expert_range (every pair without a range).
std::vector<uint8_t> routed_pairs(const char* op, const MoeInitRoutingV2GradArgs& a, int64_t n) {
  const at::IntArrayRef range = a.active_expert_range;
  if (range.empty()) return std::vector<uint8_t>(n, 1);
  TORCH_CHECK_VALUE(range.size() == 2 && range[0] >= 0 && range[0] < range[1], op, ": argument ",
                    "'active_expert_range' must be [start, end) with 0 <= start < end; got ", range);
  TORCH_CHECK_VALUE(a.expert_idx.numel() == n, op, ": argument 'expert_idx' must have N*k = ", n, " entries; got ",
                    a.expert_idx.numel());
  const std::vector<int64_t> experts = moe::read_index(a.expert_idx);
  std::vector<uint8_t> routed(n);
  for (int64_t f = 0; f < n; ++f) routed[f] = experts[f] >= range[0] && experts[f] < range[1];
  return routed;
}

// row_idx_type 0: entry f is pair f's row, or (dropless with active_num) its sorted position past the R rows of
// grad_expanded_x, or -1; only rows carry a gradient. Entries name distinct rows / positions.
std::vector<int64_t> grad_rows_from_gather_index(const char* op, const std::vector<int64_t>& idx, int64_t R) {
  const int64_t n = static_cast<int64_t>(idx.size());
  moe::check_destinations(op, "expanded_row_idx", idx, std::max(R, n), true);
  std::vector<int64_t> dest(idx);
  for (int64_t& r : dest)
    if (r >= R) r = -1;
  return dest;
}

// row_idx_type 1: entry p is the pair at sorted position p — a permutation of the pairs (-1 accepted for an empty
// position). The pair's gradient is row p when p is a row of grad_expanded_x and the pair was routed (the pairs
// outside active_expert_range follow the routed ones, over zero rows). An entry outside [0, N*k) or a pair named
// twice has no meaning, and skipping or overwriting it would return a wrong gradient silently.
std::vector<int64_t> grad_rows_from_scatter_index(const char* op, const std::vector<int64_t>& idx, int64_t R,
                                                  const std::vector<uint8_t>& routed) {
  const int64_t n = static_cast<int64_t>(idx.size());
  std::vector<int64_t> dest(n, -1), position(n, -1);
  for (int64_t p = 0; p < n; ++p) {
    const int64_t v = idx[p];
    if (v == -1) continue;
    TORCH_CHECK_VALUE(v >= 0 && v < n, op, ": argument 'expanded_row_idx'[", p, "] = ", v,
                      " is out of range; expected -1 (empty row) or a (token, slot) pair in [0, N*k = ", n, ")");
    TORCH_CHECK_VALUE(position[v] == -1, op, ": argument 'expanded_row_idx' names pair ", v, " at positions ",
                      position[v], " and ", p, "; expected every pair at most once (a permutation)");
    position[v] = p;
    if (p < R && routed[v]) dest[v] = p;
  }
  return dest;
}

}  // namespace

at::Tensor moe_init_routing_v2_grad_cpu(const MoeInitRoutingV2GradArgs& args) {
  const char* op = "moe_init_routing_v2_grad";
  moe::check_float(op, "grad_expanded_x", args.grad_expanded_x);
  moe::check_index(op, "expanded_row_idx", args.expanded_row_idx);
  const int64_t N = args.x.size(0), H = args.x.size(1), k = args.expert_idx.dim() == 2 ? args.expert_idx.size(1) : 1, n = N * k;
  TORCH_CHECK_VALUE(args.expanded_row_idx.numel() == n, op, ": argument 'expanded_row_idx' must have N*k = ", n,
                    " entries; got ", args.expanded_row_idx.numel());
  TORCH_CHECK_VALUE(args.grad_expanded_x.dim() >= 2 && args.grad_expanded_x.size(-1) == H, op,
                    ": argument 'grad_expanded_x' of shape ", args.grad_expanded_x.sizes(), " must end in H = ", H);
  const int64_t R = args.grad_expanded_x.numel() / std::max<int64_t>(H, 1);
  TORCH_CHECK_VALUE(args.row_idx_type == 0 || args.row_idx_type == 1, op,
                    ": argument 'row_idx_type' must be 0 (gather index) or 1 (scatter index); got ", args.row_idx_type);
  const std::vector<int64_t> idx = moe::read_index(args.expanded_row_idx);
  const std::vector<int64_t> dest = args.row_idx_type == 0
                                        ? grad_rows_from_gather_index(op, idx, R)
                                        : grad_rows_from_scatter_index(op, idx, R, routed_pairs(op, args, n));
  const at::Tensor g = args.grad_expanded_x.to(args.x.scalar_type()).contiguous();
  at::Tensor dx = at::empty({N, H}, args.x.options());
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, args.x.scalar_type(), "moe_init_routing_v2_grad", [&] {
    weighted_row_sum<scalar_t, float>(g.data_ptr<scalar_t>(), H, dest, nullptr, N, k, dx.data_ptr<scalar_t>(), nullptr,
                                      nullptr, nullptr, nullptr);
  });
  return dx;
}

// ---------------------------------------------------------------------------------------------------------------
// moe_compute_expert_tokens
// ---------------------------------------------------------------------------------------------------------------
at::Tensor moe_compute_expert_tokens_cpu(const MoeComputeExpertTokensArgs& args) {
  const char* op = "moe_compute_expert_tokens";
  moe::check_index(op, "sorted_expert_for_source_row", args.sorted_expert_for_source_row);
  TORCH_CHECK_VALUE(args.sorted_expert_for_source_row.dim() == 1, op,
                    ": argument 'sorted_expert_for_source_row' must be ",
                    "1-D; got shape ", args.sorted_expert_for_source_row.sizes());
  TORCH_CHECK_VALUE(args.num_expert > 0, op, ": argument 'num_expert' must be > 0; got ", args.num_expert);
  // A histogram (int64) and the output (int32) per expert.
  check_alloc(op, "argument 'num_expert' (a counter per expert)", args.num_expert, 12);
  const std::vector<int64_t> v = moe::read_index(args.sorted_expert_for_source_row);
  std::vector<int64_t> hist(args.num_expert, 0);
  for (size_t i = 0; i < v.size(); ++i) {
    TORCH_CHECK_VALUE(v[i] >= 0, op, ": argument 'sorted_expert_for_source_row'[", i, "] = ", v[i],
                      " is out of range; expert indices must be >= 0");
    // Indices >= num_expert (e.g. the index E of finished rows) sort after every expert: counted by none.
    if (v[i] < args.num_expert) ++hist[v[i]];
  }
  at::Tensor out = at::empty({args.num_expert}, args.sorted_expert_for_source_row.options().dtype(at::kInt));
  int32_t* op_ = out.data_ptr<int32_t>();
  int64_t run = 0;
  for (int64_t e = 0; e < args.num_expert; ++e) op_[e] = static_cast<int32_t>(run += hist[e]);
  return out;
}

}  // namespace npu_fa
