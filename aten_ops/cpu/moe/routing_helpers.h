// CPU-only pieces of the MoE routing kernels (init_routing.cpp, finalize_routing.cpp, token_permute.cpp, gating.cpp):
// the accumulation type, the stable counting sort by expert and the row helpers. The argument checks shared with the
// npu kernels are in aten_ops/common/moe/routing.h.
//
// Every routing op routes N*k (token, slot) pairs. The sort by expert is a stable counting sort (linear in N*k); the
// row work (copy, weighted sum) is parallel over rows of H values, each row written by exactly one thread, so results
// are deterministic. Weighted sums accumulate in fp32 (fp64 for fp64).
#pragma once

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cstring>
#include <type_traits>
#include <vector>

#include "common/moe/routing.h"

namespace npu_fa::moe {

// Accumulation type: fp32 for fp32/fp16/bf16, fp64 for fp64 (so gradcheck can run in float64).
template <typename scalar_t>
using acc_t = std::conditional_t<std::is_same_v<scalar_t, double>, double, float>;

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

inline int64_t row_grain(int64_t H) { return std::max<int64_t>(1, 16384 / std::max<int64_t>(H, 1)); }

// Expert keys checked to be >= 0; returns the bucket count for the counting sort (max + 1).
inline int64_t expert_buckets(const char* op, const char* name, const std::vector<int64_t>& keys) {
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

}  // namespace npu_fa::moe
