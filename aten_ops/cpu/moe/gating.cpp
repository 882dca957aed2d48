// CPU kernels of the MoE gating ops: moe_gating_top_k_softmax (v1, v2, grad) and moe_gating_top_k (DeepSeek-V3).
//
// One row of E logits is handled at a time (parallel over rows). Top-k is a partial sort of the expert indices,
// O(E log k), ordered by value descending then index ascending, so ties always go to the lower expert. NaN ranks
// above every number (as torch.topk). Selection is done on the logits: softmax is monotone, so it picks the same
// experts as ranking the probabilities, without fp32 rounding turning distinct logits into ties.
#include <ATen/Context.h>

#include <cmath>
#include <limits>

#include "cpu/moe/gating_kernels.h"
#include "cpu/moe/routing_helpers.h"
#include "generated/kernels.h"

namespace npu_fa {
namespace {

using moe::acc_t;

template <typename T>
bool ranks_before(T va, int64_t a, T vb, int64_t b) {
  const bool na = std::isnan(va), nb = std::isnan(vb);
  if (na != nb) return na;
  if (!na && va != vb) return va > vb;
  return a < b;
}

// The k best of v[0..E), best first, into idx. Small k: one pass keeping a sorted list of the best k (most
// candidates are rejected by one comparison with the current k-th); large k: a partial sort of the indices.
template <typename T>
void top_k(const T* v, int64_t E, int64_t k, std::vector<int64_t>& idx, std::vector<int64_t>& scratch) {
  if (k <= 16) {
    T val[16];
    int64_t who[16];
    int64_t filled = 0;
    // Experts arrive in increasing index, so a newcomer beats a kept one only by a strictly larger value (or by
    // being NaN over a number): ties keep the lower index.
    auto beats = [](T x, T kept) { return !std::isnan(kept) && (x > kept || std::isnan(x)); };
    for (int64_t e = 0; e < E; ++e) {
      const T x = v[e];
      if (filled == k && !beats(x, val[k - 1])) continue;
      int64_t pos = filled < k ? filled++ : k - 1;
      for (; pos > 0 && beats(x, val[pos - 1]); --pos) {
        val[pos] = val[pos - 1];
        who[pos] = who[pos - 1];
      }
      val[pos] = x;
      who[pos] = e;
    }
    idx.assign(who, who + k);
    return;
  }
  scratch.resize(E);
  std::iota(scratch.begin(), scratch.end(), 0);
  std::partial_sort(scratch.begin(), scratch.begin() + k, scratch.end(),
                    [&](int64_t a, int64_t b) { return ranks_before(v[a], a, v[b], b); });
  idx.assign(scratch.begin(), scratch.begin() + k);
}

// fp64 rows (gradcheck) stay scalar; fp32 rows use the vectorised copy for this CPU (cpu/moe/gating_kernels.h).
void softmax_inplace(double* v, int64_t n) {
  double m = -std::numeric_limits<double>::infinity();
  for (int64_t i = 0; i < n; ++i) m = std::max(m, v[i]);
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += (v[i] = std::exp(v[i] - m));
  for (int64_t i = 0; i < n; ++i) v[i] /= s;
}

void softmax_inplace(float* v, int64_t n) { cpu::moe_softmax_row_stub(v, n); }

// Rows per parallel task: ~64K scores, so small gatings (a few thousand rows of 8 experts) run on the calling
// thread instead of paying a fork/join that costs more than the work.
int64_t gating_grain(int64_t E) { return std::max<int64_t>(1, 65536 / std::max<int64_t>(E, 1)); }

// Forward of both gating versions. softmax_out (acc dtype, [rows, E]) is filled when defined (renorm 0 only).
std::tuple<at::Tensor, at::Tensor, at::Tensor> gating_forward(const char* op, const at::Tensor& x,
                                                              const std::optional<at::Tensor>& finished, int64_t k,
                                                              int64_t renorm, bool want_softmax, bool want_row_idx) {
  moe::check_gating_renorm(op, renorm);
  const moe::GatingShape g = moe::check_gating(op, x, finished, k);
  const at::ScalarType acc = x.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  at::Tensor y = at::empty(g.out_sizes, x.options());
  at::Tensor expert = at::empty(g.out_sizes, x.options().dtype(at::kInt));
  at::Tensor row_idx = want_row_idx ? at::empty(g.out_sizes, x.options().dtype(at::kInt))
                                    : at::empty({0}, x.options().dtype(at::kInt));
  std::vector<int64_t> sm_sizes(x.sizes().begin(), x.sizes().end());
  at::Tensor sm = (want_softmax && renorm == 0) ? at::empty(sm_sizes, x.options().dtype(acc))
                                                : at::empty({0}, x.options().dtype(acc));
  if (x.numel() == 0) return {y, expert, want_row_idx ? row_idx : sm};
  const at::Tensor xc = x.contiguous();
  const at::Tensor fin = finished.has_value() ? finished->contiguous() : at::Tensor();
  const bool* fp = fin.defined() ? fin.data_ptr<bool>() : nullptr;
  const int64_t N = g.rows, E = g.E;
  int32_t* ep = expert.data_ptr<int32_t>();
  int32_t* rp = want_row_idx ? row_idx.data_ptr<int32_t>() : nullptr;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "moe_gating_top_k_softmax", [&] {
    using A = acc_t<scalar_t>;
    const scalar_t* xp = xc.data_ptr<scalar_t>();
    scalar_t* yp = y.data_ptr<scalar_t>();
    A* smp = sm.numel() ? sm.data_ptr<A>() : nullptr;
    at::parallel_for(0, N, gating_grain(E), [&](int64_t r0, int64_t r1) {
      std::vector<A> v(E), p(E);
      std::vector<int64_t> idx, scratch;
      for (int64_t i = r0; i < r1; ++i) {
        for (int64_t e = 0; e < E; ++e) v[e] = static_cast<A>(xp[i * E + e]);
        top_k(v.data(), E, k, idx, scratch);
        if (renorm == 0) {
          p = v;
          softmax_inplace(p.data(), E);
          for (int64_t j = 0; j < k; ++j) yp[i * k + j] = static_cast<scalar_t>(p[idx[j]]);
          if (smp) std::copy(p.begin(), p.end(), smp + i * E);
        } else {
          std::vector<A> sel(k);
          for (int64_t j = 0; j < k; ++j) sel[j] = v[idx[j]];
          softmax_inplace(sel.data(), k);
          for (int64_t j = 0; j < k; ++j) yp[i * k + j] = static_cast<scalar_t>(sel[j]);
        }
        const bool done = fp && fp[i];
        for (int64_t j = 0; j < k; ++j) {
          ep[i * k + j] = static_cast<int32_t>(done ? E : idx[j]);
          if (rp) rp[i * k + j] = static_cast<int32_t>(j * N + i);
        }
      }
    });
  });
  return {y, expert, want_row_idx ? row_idx : sm};
}

}  // namespace

std::tuple<at::Tensor, at::Tensor, at::Tensor> moe_gating_top_k_softmax_cpu(const MoeGatingTopKSoftmaxArgs& args) {
  return gating_forward("moe_gating_top_k_softmax", args.x, args.finished, args.k, 0, false, true);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> moe_gating_top_k_softmax_v2_cpu(const MoeGatingTopKSoftmaxV2Args& args) {
  return gating_forward("moe_gating_top_k_softmax_v2", args.x, args.finished, args.k, args.renorm,
                        args.output_softmax_result_flag, false);
}

at::Tensor moe_gating_top_k_softmax_grad_cpu(const MoeGatingTopKSoftmaxGradArgs& args) {
  const char* op = "moe_gating_top_k_softmax_grad";
  TORCH_CHECK_VALUE(args.renorm == 0 || args.renorm == 1, op, ": argument 'renorm' must be 0 or 1; got ", args.renorm);
  const moe::GatingShape g = moe::check_gating(op, args.x, std::nullopt, args.k);
  moe::check_float(op, "grad_y", args.grad_y);
  TORCH_CHECK_VALUE(args.grad_y.sizes() == at::IntArrayRef(g.out_sizes), op, ": argument 'grad_y' of shape ",
                    args.grad_y.sizes(), " must be ", at::IntArrayRef(g.out_sizes));
  at::Tensor dx = at::empty(args.x.sizes(), args.x.options().memory_format(at::MemoryFormat::Contiguous));
  if (args.x.numel() == 0) return dx;
  const at::Tensor xc = args.x.contiguous();
  const at::Tensor gc = args.grad_y.to(args.x.scalar_type()).contiguous();
  const int64_t N = g.rows, E = g.E;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, args.x.scalar_type(), "moe_gating_top_k_softmax_grad", [&] {
    using A = acc_t<scalar_t>;
    const scalar_t* xp = xc.data_ptr<scalar_t>();
    const scalar_t* gp = gc.data_ptr<scalar_t>();
    scalar_t* dp = dx.data_ptr<scalar_t>();
    at::parallel_for(0, N, gating_grain(E), [&](int64_t r0, int64_t r1) {
      std::vector<A> v(E), d(E);
      std::vector<int64_t> idx, scratch;
      for (int64_t i = r0; i < r1; ++i) {
        for (int64_t e = 0; e < E; ++e) v[e] = static_cast<A>(xp[i * E + e]);
        top_k(v.data(), E, args.k, idx, scratch);
        std::fill(d.begin(), d.end(), A(0));
        if (args.renorm == 0) {  // y_j = p[idx_j]: dx = p * (g_full - sum_j g_j p[idx_j])
          softmax_inplace(v.data(), E);
          A dot = 0;
          for (int64_t j = 0; j < args.k; ++j) {
            const A gj = static_cast<A>(gp[i * args.k + j]);
            d[idx[j]] += gj;
            dot += gj * v[idx[j]];
          }
          for (int64_t e = 0; e < E; ++e) d[e] = v[e] * (d[e] - dot);
        } else {  // y = softmax(v[idx]): dv[idx_j] = y_j (g_j - sum g.y)
          std::vector<A> sel(args.k);
          for (int64_t j = 0; j < args.k; ++j) sel[j] = v[idx[j]];
          softmax_inplace(sel.data(), args.k);
          A dot = 0;
          for (int64_t j = 0; j < args.k; ++j) dot += static_cast<A>(gp[i * args.k + j]) * sel[j];
          for (int64_t j = 0; j < args.k; ++j) d[idx[j]] = sel[j] * (static_cast<A>(gp[i * args.k + j]) - dot);
        }
        for (int64_t e = 0; e < E; ++e) dp[i * E + e] = static_cast<scalar_t>(d[e]);
      }
    });
  });
  return dx;
}

namespace {

struct GroupParams {
  int64_t k, k_group, group_count, group_size, mode;
};

GroupParams check_group_gating(const char* op, const at::Tensor& x, const std::optional<at::Tensor>& bias, int64_t k,
                               int64_t k_group, int64_t group_count, int64_t group_select_mode, int64_t renorm,
                               int64_t norm_type) {
  moe::check_float(op, "x", x);
  TORCH_CHECK_VALUE(x.dim() == 2, op, ": argument 'x' must be 2-D [N, E]; got shape ", x.sizes());
  const int64_t E = x.size(1);
  TORCH_CHECK_VALUE(group_count >= 1 && E % group_count == 0, op, ": argument 'group_count' must be >= 1 and divide ",
                    "the expert count E=", E, "; got ", group_count);
  TORCH_CHECK_VALUE(k_group >= 1 && k_group <= group_count, op, ": argument 'k_group' must satisfy 1 <= k_group <= ",
                    "group_count=", group_count, "; got ", k_group);
  const int64_t group_size = E / group_count;
  TORCH_CHECK_VALUE(k >= 1 && k <= k_group * group_size, op, ": argument 'k' must satisfy 1 <= k <= k_group * E / ",
                    "group_count = ", k_group * group_size, " (the experts of the kept groups); got k=", k);
  TORCH_CHECK_VALUE(k <= 1024, op, ": argument 'k' must be at most 1024; got k=", k);
  TORCH_CHECK_VALUE(group_select_mode == 0 || group_select_mode == 1, op, ": argument 'group_select_mode' must be 0 ",
                    "(group max) or 1 (sum of the group's top 2); got ", group_select_mode);
  TORCH_CHECK_VALUE(group_select_mode == 0 || group_size >= 2 || group_count == 1, op,
                    ": group_select_mode 1 (top-2 sum) needs at least 2 experts per group; got ", group_size);
  TORCH_CHECK_VALUE(renorm == 0, op, ": argument 'renorm' must be 0 (normalise, then top-k; the only mode CANN ",
                    "implements); got ", renorm);
  TORCH_CHECK_VALUE(norm_type == 0 || norm_type == 1, op, ": argument 'norm_type' must be 0 (softmax) or 1 ",
                    "(sigmoid); got ", norm_type);
  if (bias.has_value()) {
    moe::check_float(op, "bias", *bias);
    TORCH_CHECK_VALUE(bias->dim() == 1 && bias->size(0) == E, op, ": argument 'bias' of shape ", bias->sizes(),
                      " must be [E] = [", E, "]");
  }
  return {k, k_group, group_count, group_size, group_select_mode};
}

}  // namespace

std::tuple<at::Tensor, at::Tensor, at::Tensor> moe_gating_top_k_cpu(const MoeGatingTopKArgs& args) {
  const char* op = "moe_gating_top_k";
  const GroupParams gp = check_group_gating(op, args.x, args.bias, args.k, args.k_group, args.group_count,
                                            args.group_select_mode, args.renorm, args.norm_type);
  // Non-finite factors would turn every weight into NaN or inf without an error.
  TORCH_CHECK_VALUE(std::isfinite(args.routed_scaling_factor), op, ": argument 'routed_scaling_factor' must be ",
                    "finite; got ", args.routed_scaling_factor);
  TORCH_CHECK_VALUE(std::isfinite(args.eps) && args.eps >= 0, op, ": argument 'eps' must be finite and >= 0; got ",
                    args.eps);
  const int64_t N = args.x.size(0), E = args.x.size(1);
  at::Tensor y = at::empty({N, args.k}, args.x.options());
  at::Tensor expert = at::empty({N, args.k}, args.x.options().dtype(at::kInt));
  at::Tensor out = args.out_flag ? at::empty({N, E}, args.x.options().dtype(at::kFloat)) : at::empty({0}, args.x.options().dtype(at::kFloat));
  if (N == 0) return {y, expert, out};
  const at::Tensor xc = args.x.contiguous().to(at::kFloat);
  const at::Tensor bc = args.bias.has_value() ? args.bias->contiguous().to(at::kFloat) : at::Tensor();
  const float* xp = xc.data_ptr<float>();
  const float* bp = bc.defined() ? bc.data_ptr<float>() : nullptr;
  float* op_ = args.out_flag ? out.data_ptr<float>() : nullptr;
  int32_t* ep = expert.data_ptr<int32_t>();
  const float ninf = -std::numeric_limits<float>::infinity();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, args.x.scalar_type(), "moe_gating_top_k", [&] {
    scalar_t* yp = y.data_ptr<scalar_t>();
    at::parallel_for(0, N, gating_grain(E), [&](int64_t r0, int64_t r1) {
      std::vector<float> s(E), sel(E), gscore(gp.group_count), two(2);
      std::vector<int64_t> idx, gidx, scratch;
      for (int64_t i = r0; i < r1; ++i) {
        for (int64_t e = 0; e < E; ++e) s[e] = xp[i * E + e];
        if (args.norm_type == 0) {
          softmax_inplace(s.data(), E);
        } else {
          for (int64_t e = 0; e < E; ++e) s[e] = 1.f / (1.f + std::exp(-s[e]));
        }
        for (int64_t e = 0; e < E; ++e) sel[e] = bp ? s[e] + bp[e] : s[e];
        if (gp.group_count > 1) {
          for (int64_t grp = 0; grp < gp.group_count; ++grp) {
            const float* gv = sel.data() + grp * gp.group_size;
            if (gp.mode == 0) {
              gscore[grp] = *std::max_element(gv, gv + gp.group_size);
            } else {
              top_k(gv, gp.group_size, 2, gidx, scratch);
              gscore[grp] = gv[gidx[0]] + gv[gidx[1]];
            }
          }
          top_k(gscore.data(), gp.group_count, gp.k_group, gidx, scratch);
          std::vector<uint8_t> keep(gp.group_count, 0);
          for (int64_t g : gidx) keep[g] = 1;
          for (int64_t e = 0; e < E; ++e)
            if (!keep[e / gp.group_size]) sel[e] = ninf;
        }
        top_k(sel.data(), E, args.k, idx, scratch);
        // Sigmoid scores are normalised over the k selected; softmax probabilities are used as they are (CANN).
        float sum = 0;
        for (int64_t j = 0; j < args.k; ++j) sum += s[idx[j]];
        const float scale = args.norm_type == 1
                                ? static_cast<float>(args.routed_scaling_factor) / (sum + static_cast<float>(args.eps))
                                : static_cast<float>(args.routed_scaling_factor);
        for (int64_t j = 0; j < args.k; ++j) {
          yp[i * args.k + j] = static_cast<scalar_t>(s[idx[j]] * scale);
          ep[i * args.k + j] = static_cast<int32_t>(idx[j]);
        }
        if (op_) std::copy(s.begin(), s.end(), op_ + i * E);
      }
    });
  });
  return {y, expert, out};
}

// Backward of moe_gating_top_k (and torch_npu's npu_moe_gating_top_k_backward): the weights y depend on the scores s
// of the selected experts only (the selection itself is piecewise constant). With g = s[expert]:
//   sigmoid: y_j = rsf * g_j / (sum g + eps)  ->  dg_j = rsf * (gy_j / D - sum_i gy_i g_i / D^2),  D = sum g + eps
//   softmax: y_j = rsf * g_j                  ->  dg_j = rsf * gy_j
// then ds = dg scattered to the experts, and dx = ds * s(1 - s) (sigmoid) or s * (ds - sum ds s) (softmax).
at::Tensor moe_gating_top_k_grad_cpu(const MoeGatingTopKGradArgs& args) {
  const char* op = "moe_gating_top_k_grad";
  moe::check_float(op, "grad_y", args.grad_y);
  moe::check_index(op, "expert_idx", args.expert_idx);
  TORCH_CHECK_VALUE(args.grad_y.dim() == 2, op, ": argument 'grad_y' must be 2-D [N, k]; got shape ",
                    args.grad_y.sizes());
  TORCH_CHECK_VALUE(args.expert_idx.sizes() == args.grad_y.sizes(), op, ": argument 'expert_idx' of shape ",
                    args.expert_idx.sizes(), " must match grad_y's ", args.grad_y.sizes());
  TORCH_CHECK_VALUE(args.renorm == 0, op, ": argument 'renorm' must be 0; got ", args.renorm);
  TORCH_CHECK_VALUE(args.norm_type == 0 || args.norm_type == 1, op, ": argument 'norm_type' must be 0 (softmax) ",
                    "or 1 (sigmoid); got ", args.norm_type);
  TORCH_CHECK_VALUE(std::isfinite(args.routed_scaling_factor), op, ": argument 'routed_scaling_factor' must be ",
                    "finite; got ", args.routed_scaling_factor);
  TORCH_CHECK_VALUE(std::isfinite(args.eps) && args.eps >= 0, op, ": argument 'eps' must be finite and >= 0; got ",
                    args.eps);
  const int64_t N = args.grad_y.size(0), k = args.grad_y.size(1);
  // The scores: x_norm as given, or (x_norm empty, the forward without out_flag) recomputed from x like the forward.
  const bool recompute = args.x_norm.numel() == 0 && args.x.has_value();
  const at::Tensor& src = recompute ? *args.x : args.x_norm;
  const char* src_name = recompute ? "x" : "x_norm";
  moe::check_float(op, src_name, src);
  TORCH_CHECK_VALUE(src.dim() == 2 && src.size(0) == N, op, ": argument '", src_name, "' of shape ", src.sizes(),
                    " must be [N, E] with N = grad_y.size(0) = ", N,
                    recompute ? "" : " (or empty, with the forward's input 'x' given)");
  const int64_t E = src.size(1);
  const std::vector<int64_t> experts = moe::read_index(args.expert_idx);
  for (size_t f = 0; f < experts.size(); ++f)
    TORCH_CHECK_VALUE(experts[f] >= 0 && experts[f] < E, op, ": argument 'expert_idx'[", f, "] = ", experts[f],
                      " is out of range [0, E = ", E, ")");
  const at::ScalarType out_dtype = recompute ? args.x->scalar_type() : args.grad_y.scalar_type();
  at::Tensor dx = at::empty({N, E}, args.grad_y.options().dtype(out_dtype));
  if (dx.numel() == 0) return dx;
  const at::Tensor sc = src.to(at::kFloat).contiguous();
  const at::Tensor gc = args.grad_y.to(at::kFloat).contiguous();
  const float* sp = sc.data_ptr<float>();
  const float* gp = gc.data_ptr<float>();
  const float rsf = static_cast<float>(args.routed_scaling_factor), eps = static_cast<float>(args.eps);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, out_dtype, "moe_gating_top_k_grad", [&] {
    scalar_t* dp = dx.data_ptr<scalar_t>();
    at::parallel_for(0, N, gating_grain(E), [&](int64_t r0, int64_t r1) {
      std::vector<float> s(E), ds(E);
      for (int64_t i = r0; i < r1; ++i) {
        std::copy(sp + i * E, sp + (i + 1) * E, s.begin());
        if (recompute && args.norm_type == 0) {
          softmax_inplace(s.data(), E);
        } else if (recompute) {
          for (int64_t e = 0; e < E; ++e) s[e] = 1.f / (1.f + std::exp(-s[e]));
        }
        std::fill(ds.begin(), ds.end(), 0.f);
        const int64_t* ex = experts.data() + i * k;
        const float* gy = gp + i * k;
        if (args.norm_type == 1) {
          float sum = 0, dot = 0;
          for (int64_t j = 0; j < k; ++j) {
            sum += s[ex[j]];
            dot += gy[j] * s[ex[j]];
          }
          const float d = sum + eps;
          for (int64_t j = 0; j < k; ++j) ds[ex[j]] += rsf * (gy[j] / d - dot / (d * d));
          for (int64_t e = 0; e < E; ++e) dp[i * E + e] = static_cast<scalar_t>(ds[e] * s[e] * (1.f - s[e]));
        } else {
          for (int64_t j = 0; j < k; ++j) ds[ex[j]] += rsf * gy[j];
          float t = 0;  // ds is zero outside the selected experts
          for (int64_t e = 0; e < E; ++e) t += ds[e] * s[e];
          for (int64_t e = 0; e < E; ++e) dp[i * E + e] = static_cast<scalar_t>(s[e] * (ds[e] - t));
        }
      }
    });
  });
  return dx;
}

}  // namespace npu_fa
