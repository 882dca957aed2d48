// RMSNorm of one row, forward and backward: the row routines every CPU kernel with an RMSNorm shares (the norm
// family's ops, kv_rms_norm_rope_cache and mla_prolog through cpu/mla/latent_rows.h).
//   rms_norm_row       y = x * rstd * gamma, rstd = 1 / sqrt(mean(x^2) + eps); returns rstd
//   add_row            x1 + x2 into an A row (the residual add of the add_rms_norm ops)
//   rms_norm_grad_row  dx of one row and its term of dgamma, given the forward's rstd
// A is the accumulation type (float for float/half/bfloat16 rows, double for double rows); the rows are converted
// to A once, so a row is rounded once, when it is written.
//
// The functions are templates in an inline namespace named after the including file's CPU_CAPABILITY (as at::vec):
// a per-ISA file (*_isa.cpp) gets SIMD of its ISA width, any other file the portable at::vec code, and copies built
// with different flags never share a symbol.
#pragma once

#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>

namespace npu_fa::norm {
inline namespace CPU_CAPABILITY {

// The accumulation type of rows of T: double for double, float otherwise.
template <typename T>
using acc_of = std::conditional_t<std::is_same_v<T, double>, double, float>;

// dst[j] = A(src[j]), j < n (also A values converted to a narrower output type).
template <typename T, typename A>
inline void load_row(const T* src, int64_t n, A* dst) {
  if constexpr (std::is_same_v<T, A>) {
    std::copy(src, src + n, dst);
  } else {
    at::vec::convert(src, dst, n);
  }
}

namespace detail {

// sum of a[j] * b[j], j < n, in A.
template <typename A>
inline A dot(const A* a, const A* b, int64_t n) {
  using Vec = at::vec::Vectorized<A>;
  constexpr int64_t W = Vec::size();
  Vec acc(A(0));
  int64_t j = 0;
  for (; j + W <= n; j += W) acc = at::vec::fmadd(Vec::loadu(a + j), Vec::loadu(b + j), acc);
  A s = at::vec::vec_reduce_all<A>([](Vec& x, Vec& y) { return x + y; }, acc);
  for (; j < n; ++j) s += a[j] * b[j];
  return s;
}

}  // namespace detail

// 1 / sqrt(mean(x^2) + eps) of n values of A (n == 0: 1 / sqrt(eps)).
template <typename A>
inline A rstd_of(const A* x, int64_t n, double eps) {
  const A ss = detail::dot(x, x, n);
  return A(1) / std::sqrt(ss / static_cast<A>(n > 0 ? n : 1) + static_cast<A>(eps));
}

// out[j] = x[j] * rstd * gamma[j] (+ beta[j]), j < n, rstd = 1 / sqrt(mean(x^2) + eps); returns rstd. gamma (and
// beta, nullptr for none) are given in A (convert them once per call of the op, not per row). out may be x itself
// when T == A.
template <typename T, typename A>
inline A rms_norm_row(const T* x, int64_t n, const A* gamma, double eps, A* out, const A* beta = nullptr) {
  using Vec = at::vec::Vectorized<A>;
  constexpr int64_t W = Vec::size();
  load_row(x, n, out);
  const A r = rstd_of(out, n, eps);
  const Vec rv(r);
  int64_t j = 0;
  if (beta == nullptr) {
    for (; j + W <= n; j += W) (Vec::loadu(out + j) * rv * Vec::loadu(gamma + j)).store(out + j);
    for (; j < n; ++j) out[j] = out[j] * r * gamma[j];
  } else {
    for (; j + W <= n; j += W)
      at::vec::fmadd(Vec::loadu(out + j) * rv, Vec::loadu(gamma + j), Vec::loadu(beta + j)).store(out + j);
    for (; j < n; ++j) out[j] = out[j] * r * gamma[j] + beta[j];
  }
  return r;
}

// out[j] = A(x1[j]) + A(x2[j]), j < n.
template <typename T, typename A>
inline void add_row(const T* x1, const T* x2, int64_t n, A* tmp, A* out) {
  using Vec = at::vec::Vectorized<A>;
  constexpr int64_t W = Vec::size();
  load_row(x1, n, out);
  load_row(x2, n, tmp);
  int64_t j = 0;
  for (; j + W <= n; j += W) (Vec::loadu(out + j) + Vec::loadu(tmp + j)).store(out + j);
  for (; j < n; ++j) out[j] += tmp[j];
}

// The backward of y = x * rstd * gamma for one row (x and dy in A, n values):
//   dx[j]      = rstd * gamma[j] * dy[j] - x[j] * rstd^3 * sum_k(gamma[k] * dy[k] * x[k]) / n
//   dgamma[j] += dy[j] * x[j] * rstd
// gdy is scratch of n values (gamma * dy); dx may be dy itself.
template <typename A>
inline void rms_norm_grad_row(const A* x, const A* dy, int64_t n, const A* gamma, A rstd, A* gdy, A* dx,
                              A* dgamma) {
  using Vec = at::vec::Vectorized<A>;
  constexpr int64_t W = Vec::size();
  const Vec rv(rstd);
  int64_t j = 0;
  for (; j + W <= n; j += W) {
    const Vec d = Vec::loadu(dy + j), xv = Vec::loadu(x + j);
    (Vec::loadu(gamma + j) * d).store(gdy + j);
    at::vec::fmadd(d * xv, rv, Vec::loadu(dgamma + j)).store(dgamma + j);
  }
  for (; j < n; ++j) {
    gdy[j] = gamma[j] * dy[j];
    dgamma[j] += dy[j] * x[j] * rstd;
  }
  const A c = rstd * rstd * rstd * detail::dot(gdy, x, n) / static_cast<A>(n > 0 ? n : 1);
  const Vec cv(c);
  j = 0;
  for (; j + W <= n; j += W) (Vec::loadu(gdy + j) * rv - Vec::loadu(x + j) * cv).store(dx + j);
  for (; j < n; ++j) dx[j] = gdy[j] * rstd - x[j] * c;
}

}  // namespace CPU_CAPABILITY
}  // namespace npu_fa::norm
