// CPU kernel of top_k_top_p (torch_npu's npu_top_k_top_p): the logits a sampler may draw from, the others -inf.
//
// Per row b of logits [B, V] (upstream's definition, on the ascending stable sort of the row):
//   top-k: keep the values >= the k[b]-th largest (ties with it kept);
//   top-p: softmax (fp32) over the kept values, cumulative sums from the smallest; drop the positions whose sum is
//          <= 1 - p[b], but never the largest.
// The k-th largest is found by selection (std::nth_element, O(V)); only the kept candidates (k[b] plus ties, or the
// whole row without k) are sorted for top-p. Rows run in parallel (at::parallel_for); the output row is filled with
// -inf (at::vec) and the kept logits are copied back to their positions.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/cpu/vec/vec.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "generated/kernels.h"

namespace npu_fa {

namespace {

void check_float(const char* op, const char* name, const at::Tensor& t) {
  const auto s = t.scalar_type();
  TORCH_CHECK_TYPE(s == at::kFloat || s == at::kHalf || s == at::kBFloat16 || s == at::kDouble, op, ": argument '",
                   name, "' must be float32, float16, bfloat16 or float64; got ", s);
}

}  // namespace

at::Tensor top_k_top_p_cpu(const TopKTopPArgs& args) {
  const char* op = "top_k_top_p";
  const at::Tensor& logits = args.logits;
  check_float(op, "logits", logits);
  TORCH_CHECK_VALUE(logits.dim() == 2, op, ": argument 'logits' must be 2-D [batch, vocab]; got shape ",
                    logits.sizes());
  const int64_t B = logits.size(0), V = logits.size(1);
  std::vector<int64_t> ks;
  std::vector<double> ps;
  if (args.k.has_value()) {
    const at::Tensor& k = *args.k;
    TORCH_CHECK_TYPE(k.scalar_type() == at::kInt || k.scalar_type() == at::kLong, op,
                     ": argument 'k' must be int32 or int64; got ", k.scalar_type());
    TORCH_CHECK_VALUE(k.dim() == 1 && k.size(0) == B, op, ": argument 'k' must be 1-D [batch] = [", B,
                      "] (one k per row of logits); got shape ", k.sizes());
    const at::Tensor kl = k.to(at::kLong).contiguous();
    ks.assign(kl.data_ptr<int64_t>(), kl.data_ptr<int64_t>() + B);
    for (int64_t b = 0; b < B; ++b)
      TORCH_CHECK_VALUE(ks[b] >= 1 && ks[b] <= V, op, ": argument 'k' must lie in [1, vocab=", V, "]; got ", ks[b],
                        " for row ", b);
  }
  if (args.p.has_value()) {
    const at::Tensor& p = *args.p;
    check_float(op, "p", p);
    TORCH_CHECK_VALUE(p.dim() == 1 && p.size(0) == B, op, ": argument 'p' must be 1-D [batch] = [", B,
                      "] (one p per row of logits); got shape ", p.sizes());
    const at::Tensor pf = p.to(at::kDouble).contiguous();
    for (int64_t b = 0; b < B; ++b) {
      const double v = pf.data_ptr<double>()[b];
      TORCH_CHECK_VALUE(v >= 0.0 && v <= 1.0, op, ": argument 'p' must lie in [0, 1]; got ", v, " for row ", b);
    }
    // the bound 1 - p rounded in p's dtype (upstream computes it there), compared with fp32 cumulative sums
    const at::Tensor limit = at::rsub(p, 1).to(at::kDouble).contiguous();
    ps.assign(limit.data_ptr<double>(), limit.data_ptr<double>() + B);
  }
  at::Tensor out = at::empty({B, V}, logits.options());
  if (out.numel() == 0) return out;
  const at::Tensor x = logits.contiguous();
  const bool has_k = !ks.empty(), has_p = !ps.empty();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "top_k_top_p", [&] {
    using acc_t = std::conditional_t<std::is_same_v<scalar_t, double>, double, float>;
    const scalar_t* xp = x.data_ptr<scalar_t>();
    scalar_t* op_ = out.data_ptr<scalar_t>();
    const int64_t grain = std::max<int64_t>(1, 65536 / std::max<int64_t>(V, 1));
    at::parallel_for(0, B, grain, [&](int64_t b0, int64_t b1) {
      std::vector<acc_t> row(V), sel;
      std::vector<int64_t> cand;
      std::vector<float> prob;
      for (int64_t b = b0; b < b1; ++b) {
        const scalar_t* src = xp + b * V;
        scalar_t* dst = op_ + b * V;
        at::vec::convert(src, row.data(), V);
        // top-k: the candidates are the values >= the k-th largest (all of them without k)
        cand.clear();
        if (has_k && ks[b] < V) {
          sel.assign(row.begin(), row.end());
          std::nth_element(sel.begin(), sel.begin() + (V - ks[b]), sel.end());
          const acc_t kth = sel[V - ks[b]];
          for (int64_t v = 0; v < V; ++v)
            if (row[v] >= kth) cand.push_back(v);
        } else {
          cand.resize(V);
          std::iota(cand.begin(), cand.end(), int64_t{0});
        }
        size_t first = 0;  // cand[first:] are kept (after sorting for top-p)
        if (has_p) {
          // ascending stable order of (value, index), as upstream's sort(stable=True)
          std::stable_sort(cand.begin(), cand.end(), [&](int64_t a, int64_t c) { return row[a] < row[c]; });
          const size_t n = cand.size();
          prob.resize(n);
          const float mx = static_cast<float>(row[cand[n - 1]]);
          float sum = 0.f;
          for (size_t i = 0; i < n; ++i) sum += (prob[i] = std::exp(static_cast<float>(row[cand[i]]) - mx));
          const double limit = ps[b];
          float acc = 0.f;
          while (first + 1 < n) {  // the largest is always kept
            acc += prob[first] / sum;
            if (!(static_cast<double>(acc) <= limit)) break;
            ++first;
          }
        }
        std::fill(dst, dst + V, -std::numeric_limits<scalar_t>::infinity());
        for (size_t i = first; i < cand.size(); ++i) dst[cand[i]] = src[cand[i]];
      }
    });
  });
  return out;
}

}  // namespace npu_fa
