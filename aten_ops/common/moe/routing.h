// Shared pieces of the MoE routing kernels: argument checks, the stable counting sort by expert, and row helpers.
#pragma once

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <type_traits>
#include <vector>

namespace npu_fa {
namespace moe {

// Accumulation type: fp32 for fp32/fp16/bf16, fp64 for fp64 (so gradcheck can run in float64).
template <typename scalar_t>
using acc_t = std::conditional_t<std::is_same_v<scalar_t, double>, double, float>;

inline void check_float(const char* op, const char* name, const at::Tensor& t) {
  const auto s = t.scalar_type();
  TORCH_CHECK_TYPE(s == at::kFloat || s == at::kHalf || s == at::kBFloat16 || s == at::kDouble, op, ": argument '",
                   name, "' must be float32, float16, bfloat16 or float64; got ", s);
}

inline void check_index(const char* op, const char* name, const at::Tensor& t) {
  TORCH_CHECK_TYPE(t.scalar_type() == at::kInt || t.scalar_type() == at::kLong, op, ": argument '", name,
                   "' must be int32 or int64; got ", t.scalar_type());
}

inline void check_same_dtype(const char* op, const char* name, const at::Tensor& t, const char* ref_name,
                             const at::Tensor& ref) {
  TORCH_CHECK_TYPE(t.scalar_type() == ref.scalar_type(), op, ": argument '", name, "' (", t.scalar_type(),
                   ") must have the dtype of '", ref_name, "' (", ref.scalar_type(), ")");
}

// The argument checks of moe_gating_top_k_softmax(_v2, _grad), shared by the CPU kernels (gating.cpp) and the
// npu kernels (aten_ops/npu/moe.cpp) so both backends raise identical errors.
struct GatingShape {
  int64_t rows, E;
  std::vector<int64_t> out_sizes;  // x.shape[:-1] + [k]
};

inline GatingShape check_gating(const char* op, const at::Tensor& x, const std::optional<at::Tensor>& finished,
                                int64_t k) {
  moe::check_float(op, "x", x);
  TORCH_CHECK_VALUE(x.dim() == 2 || x.dim() == 3, op, ": argument 'x' must be 2-D [N, E] or 3-D [B, S, E]; got shape ",
                    x.sizes());
  GatingShape g{1, x.size(-1), {}};
  for (int64_t d = 0; d + 1 < x.dim(); ++d) {
    g.rows *= x.size(d);
    g.out_sizes.push_back(x.size(d));
  }
  g.out_sizes.push_back(k);
  TORCH_CHECK_VALUE(k >= 1 && k <= g.E, op, ": argument 'k' must satisfy 1 <= k <= num_experts (x.size(-1) = ", g.E,
                    "); got k=", k);
  TORCH_CHECK_VALUE(k <= 1024, op, ": argument 'k' must be at most 1024; got k=", k);
  if (finished.has_value()) {
    TORCH_CHECK_TYPE(finished->scalar_type() == at::kBool, op, ": argument 'finished' must be bool; got ",
                     finished->scalar_type());
    TORCH_CHECK_VALUE(finished->sizes() == x.sizes().slice(0, x.dim() - 1), op, ": argument 'finished' of shape ",
                      finished->sizes(), " must be x.shape[:-1] = ", x.sizes().slice(0, x.dim() - 1));
  }
  return g;
}

inline void check_gating_renorm(const char* op, int64_t renorm) {
  TORCH_CHECK_VALUE(renorm == 0 || renorm == 1, op, ": argument 'renorm' must be 0 (softmax, then top-k) or 1 (top-k, ",
                    "then softmax over the k); got ", renorm);
}

// Index tensors are read as a contiguous int64 copy: simple, and their size (N*k) is small next to the rows.
inline std::vector<int64_t> read_index(const at::Tensor& t) {
  const at::Tensor c = t.to(at::kLong).contiguous();
  const int64_t* p = c.data_ptr<int64_t>();
  return std::vector<int64_t>(p, p + c.numel());
}

// Stable sort of n keys in [0, buckets) by key: a counting sort (linear), parallel over chunks of the input whose
// per-chunk histograms are laid out (key, chunk) so that chunk order — hence input order — is kept within a key.
// Returns order[p] = the input position at sorted position p, and the per-key counts.
struct KeySort {
  std::vector<int64_t> order;
  std::vector<int64_t> counts;
};

inline KeySort counting_sort(const std::vector<int64_t>& keys, int64_t buckets) {
  const int64_t n = static_cast<int64_t>(keys.size());
  KeySort s;
  s.order.resize(n);
  s.counts.assign(buckets, 0);
  const int64_t chunks = std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), n / 16384));
  std::vector<int64_t> hist(chunks * buckets, 0);  // [chunk][key]
  auto bounds = [&](int64_t c) { return std::make_pair(n * c / chunks, n * (c + 1) / chunks); };
  at::parallel_for(0, chunks, 1, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) {
      auto [b, e] = bounds(c);
      int64_t* h = hist.data() + c * buckets;
      for (int64_t i = b; i < e; ++i) ++h[keys[i]];
    }
  });
  int64_t run = 0;  // exclusive prefix over (key, chunk)
  for (int64_t k = 0; k < buckets; ++k) {
    for (int64_t c = 0; c < chunks; ++c) {
      const int64_t v = hist[c * buckets + k];
      hist[c * buckets + k] = run;
      run += v;
      s.counts[k] += v;
    }
  }
  at::parallel_for(0, chunks, 1, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) {
      auto [b, e] = bounds(c);
      int64_t* h = hist.data() + c * buckets;
      for (int64_t i = b; i < e; ++i) s.order[h[keys[i]]++] = i;
    }
  });
  return s;
}

// Copies whole rows (any dtype, byte-wise): dst row p <- src row src_row[p], or zeros when src_row[p] < 0.
inline void gather_rows(const at::Tensor& src, at::Tensor& dst, const std::vector<int64_t>& src_row) {
  const int64_t rows = static_cast<int64_t>(src_row.size());
  if (rows == 0) return;
  const size_t bytes = static_cast<size_t>(dst.numel() / std::max<int64_t>(rows, 1)) * dst.element_size();
  const char* s = static_cast<const char*>(src.data_ptr());
  char* d = static_cast<char*>(dst.data_ptr());
  const int64_t grain = std::max<int64_t>(1, 65536 / std::max<size_t>(bytes, 1));
  at::parallel_for(0, rows, grain, [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p) {
      if (src_row[p] >= 0)
        std::memcpy(d + p * bytes, s + src_row[p] * bytes, bytes);
      else
        std::memset(d + p * bytes, 0, bytes);
    }
  });
}

// Every value in [0, limit) or -1 (when allowed), and no value twice: the rows written through it must be distinct.
inline void check_destinations(const char* op, const char* name, const std::vector<int64_t>& v, int64_t limit,
                               bool allow_minus_one) {
  std::vector<uint8_t> seen(std::max<int64_t>(limit, 0), 0);
  for (size_t f = 0; f < v.size(); ++f) {
    const int64_t r = v[f];
    if (r == -1 && allow_minus_one) continue;
    TORCH_CHECK_VALUE(r >= 0 && r < limit, op, ": argument '", name, "'[", f, "] = ", r, " is out of range; expected ",
                      allow_minus_one ? "-1 (dropped) or " : "", "a row in [0, ", limit, ")");
    TORCH_CHECK_VALUE(!seen[r], op, ": argument '", name, "' names row ", r,
                      " more than once; every (token, slot) pair needs its own row");
    seen[r] = 1;
  }
}

}  // namespace moe
}  // namespace npu_fa
