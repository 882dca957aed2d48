// The loops of recurrent_gated_delta_rule and rms_norm_gated for one instruction set (see
// recurrent_gated_delta_rule_kernels.h). The recurrence runs each state row of a (sequence, value head) through
// the sequence's tokens: per token one decay, one dot product with k, one update along k and one dot product with
// q, all along the contiguous Dk dimension in Vectorized<A>.
#include "cpu/linear_attention/recurrent_gated_delta_rule_kernels.h"

#ifndef CPU_CAPABILITY
#error "this *_isa.cpp must be compiled with -DCPU_CAPABILITY=DEFAULT|AVX2|AVX512 (setup.py does this)"
#endif

#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>

#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>

#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

#include "cpu/norm/rms_norm_row.h"

namespace npu_fa::cpu::CPU_CAPABILITY {

namespace {

using norm::load_row;

template <typename A>
A reduce_sum(const at::vec::Vectorized<A>& v) {
  return at::vec::vec_reduce_all<A>([](at::vec::Vectorized<A>& x, at::vec::Vectorized<A>& y) { return x + y; }, v);
}

// Converts n values of A to T and back in place: the rounding the reference applies when it stores a
// T tensor. A no-op when T is A.
template <typename T, typename A>
void round_through(A* row, int64_t n, std::vector<T>& tmp) {
  if constexpr (!std::is_same_v<T, A>) {
    tmp.resize(static_cast<size_t>(n));
    at::vec::convert(row, tmp.data(), n);
    at::vec::convert(tmp.data(), row, n);
  }
}

// A row of a tensor whose dtype is T or float32 (the state, the gate) into / out of an A buffer.
template <typename T, typename A>
void load_either(const void* base, bool is_float, int64_t offset, int64_t n, A* dst) {
  if (is_float) {
    load_row(static_cast<const float*>(base) + offset, n, dst);
  } else {
    load_row(static_cast<const T*>(base) + offset, n, dst);
  }
}

template <typename T, typename A>
void store_either(const A* src, int64_t n, void* base, bool is_float, int64_t offset) {
  if (is_float) {
    load_row(src, n, static_cast<float*>(base) + offset);
  } else {
    load_row(src, n, static_cast<T*>(base) + offset);
  }
}

// ---- recurrence ----

// The rows of the state never mix: row i of S (its Dk values for value dimension i) evolves from its own past, the
// token's k, q, gates and v[i] only. So an item runs row by row through all of its tokens, one Dk-long row in
// registers / L1 at a time: each row of the cache is read once (from the sequence's first slot) and written once
// per token (to the token's slot), with no [Dv, Dk] scratch copy in between.

// State rows updated together (gdr_rows).
constexpr int kRows = 4;

// The tokens of one (sequence, head) work item in A and its current state rows, reused across the items of a
// thread.
template <typename A>
struct GdrScratch {
  std::vector<A> q, k, v, decay, alpha, beta, row;
  void resize(int64_t L, int64_t Dk, int64_t Dv, bool per_column) {
    q.resize(static_cast<size_t>(L * Dk));
    k.resize(static_cast<size_t>(L * Dk));
    v.resize(static_cast<size_t>(L * Dv));
    decay.resize(per_column ? static_cast<size_t>(L * Dk) : 0);
    alpha.resize(static_cast<size_t>(L));
    beta.resize(static_cast<size_t>(L));
    row.resize(static_cast<size_t>(kRows * Dk));
  }
};

// One token on R state rows of n = Dk values each (rows[r * n + j]): per row, row *= d (d = alpha, or the
// per-column decay); x = row · k; row += beta (v[r] - x) k; o[r] = scale (row · q). The R rows are independent,
// so working on them together gives each pass R independent accumulator chains (one row alone is latency bound: it
// is only Dk / W vectors) and loads k, q and the decay once for R rows. Per row, the order of the sums depends on n
// only.
template <typename A, int R>
void gdr_rows(A* rows, int64_t n, const A* q, const A* k, const A* v, const A* decay, A alpha, A beta, A scale,
              A* o) {
  using Vec = at::vec::Vectorized<A>;
  constexpr int64_t W = Vec::size();
  Vec acc[R];
  for (int r = 0; r < R; ++r) acc[r] = Vec(A(0));
  int64_t j = 0;
  for (; j + W <= n; j += W) {
    const Vec kj = Vec::loadu(k + j);
    const Vec dj = decay ? Vec::loadu(decay + j) : Vec(alpha);
    for (int r = 0; r < R; ++r) {
      const Vec x = Vec::loadu(rows + r * n + j) * dj;
      x.store(rows + r * n + j);
      acc[r] = at::vec::fmadd(x, kj, acc[r]);
    }
  }
  const int64_t tail = j;
  A y[R];
  for (int r = 0; r < R; ++r) {
    A* row = rows + r * n;
    A x = reduce_sum(acc[r]);
    for (int64_t jj = tail; jj < n; ++jj) {
      row[jj] *= decay ? decay[jj] : alpha;
      x += row[jj] * k[jj];
    }
    y[r] = beta * (v[r] - x);
    acc[r] = Vec(A(0));
  }
  for (j = 0; j + W <= n; j += W) {
    const Vec kj = Vec::loadu(k + j);
    const Vec qj = Vec::loadu(q + j);
    for (int r = 0; r < R; ++r) {
      const Vec x = at::vec::fmadd(Vec(y[r]), kj, Vec::loadu(rows + r * n + j));
      x.store(rows + r * n + j);
      acc[r] = at::vec::fmadd(x, qj, acc[r]);
    }
  }
  for (int r = 0; r < R; ++r) {
    A* row = rows + r * n;
    A dot = reduce_sum(acc[r]);
    for (int64_t jj = tail; jj < n; ++jj) {
      row[jj] += y[r] * k[jj];
      dot += row[jj] * q[jj];
    }
    o[r] = scale * dot;
  }
}

// decay[j] = alpha * exp(gk[j]), j < n.
template <typename A>
void column_decay(const A* gk, int64_t n, A alpha, A* decay) {
  using Vec = at::vec::Vectorized<A>;
  constexpr int64_t W = Vec::size();
  int64_t j = 0;
  for (; j + W <= n; j += W) (Vec::loadu(gk + j).exp() * Vec(alpha)).store(decay + j);
  for (; j < n; ++j) decay[j] = alpha * std::exp(gk[j]);
}

// State rows i .. i + R of a work item (its tokens already in s): read from the first slot, then per token
// updated, their outputs written, and stored to the token's slot.
template <typename T, typename A, int R>
void run_rows(const RecurrentGdrParams& p, int64_t b, int64_t h, int64_t i, GdrScratch<A>& s, A scale) {
  const int64_t Dk = p.Dk, Dv = p.Dv, Nv = p.Nv;
  const int64_t t0 = p.seq_start[b], L = p.seq_start[b + 1] - t0;
  const bool state_float = p.state_dtype == at::kFloat && !std::is_same_v<T, float>;
  T* out = static_cast<T*>(p.out);
  A* rows = s.row.data();
  // the R rows are consecutive in the cache: one [R, Dk] block per slot
  load_either<T>(p.state, state_float, ((p.first_slot[b] * Nv + h) * Dv + i) * Dk, R * Dk, rows);
  A v[R], o[R];
  for (int64_t l = 0; l < L; ++l) {
    const int64_t t = t0 + l;
    for (int r = 0; r < R; ++r) v[r] = s.v[l * Dv + i + r];
    gdr_rows<A, R>(rows, Dk, s.q.data() + l * Dk, s.k.data() + l * Dk, v, s.decay.empty() ? nullptr :
                   s.decay.data() + l * Dk, s.alpha[l], s.beta[l], scale, o);
    for (int r = 0; r < R; ++r) out[(t * Nv + h) * Dv + i + r] = static_cast<T>(o[r]);
    store_either<T>(rows, R * Dk, p.state, state_float, ((p.slot[t] * Nv + h) * Dv + i) * Dk);
  }
}

// One sequence b, value head h: its tokens converted to A once, then the state, kRows rows at a time, through them.
template <typename T, typename A>
void gdr_item(const RecurrentGdrParams& p, int64_t b, int64_t h, GdrScratch<A>& s) {
  const int64_t Dk = p.Dk, Dv = p.Dv, Nv = p.Nv, Nk = p.Nk;
  const int64_t hk = h / (Nv / Nk);
  const int64_t t0 = p.seq_start[b], L = p.seq_start[b + 1] - t0;
  const T* q = static_cast<const T*>(p.query);
  const T* k = static_cast<const T*>(p.key);
  const T* v = static_cast<const T*>(p.value);
  const A* beta = static_cast<const A*>(p.beta);
  const A* g = static_cast<const A*>(p.g);
  const A* gk = static_cast<const A*>(p.gk);
  s.resize(L, Dk, Dv, gk != nullptr);
  for (int64_t l = 0; l < L; ++l) {
    const int64_t t = t0 + l;
    load_row(q + (t * Nk + hk) * Dk, Dk, s.q.data() + l * Dk);
    load_row(k + (t * Nk + hk) * Dk, Dk, s.k.data() + l * Dk);
    load_row(v + (t * Nv + h) * Dv, Dv, s.v.data() + l * Dv);
    s.alpha[l] = g ? std::exp(g[t * Nv + h]) : A(1);
    s.beta[l] = beta ? beta[t * Nv + h] : A(1);
    if (gk != nullptr) column_decay(gk + (t * Nv + h) * Dk, Dk, s.alpha[l], s.decay.data() + l * Dk);
  }
  const A scale = static_cast<A>(p.scale);
  for (int64_t i = 0; i < Dv; i += kRows) {
    if (i + kRows <= Dv) {
      run_rows<T, A, kRows>(p, b, h, i, s, scale);
    } else {
      for (int64_t r = i; r < Dv; ++r) run_rows<T, A, 1>(p, b, h, r, s, scale);
    }
  }
}

template <typename T>
void recurrent(const RecurrentGdrParams& p) {
  using A = norm::acc_of<T>;
  at::parallel_for(0, p.B * p.Nv, 1, [&](int64_t w0, int64_t w1) {
    GdrScratch<A> s;
    for (int64_t w = w0; w < w1; ++w) gdr_item<T, A>(p, w / p.Nv, w % p.Nv, s);
  });
}

void recurrent_gdr(const RecurrentGdrParams& p) {
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, p.dtype, "recurrent_gated_delta_rule",
                                  [&] { recurrent<scalar_t>(p); });
}

// ---- gated RMSNorm ----

// Rows per task of at::parallel_for: about 16K values.
int64_t grain(int64_t n) { return std::max<int64_t>(1, (int64_t{1} << 14) / std::max<int64_t>(n, 1)); }

// silu(g) = g / (1 + e^-g) over n values, in place.
template <typename A>
void silu_row(A* g, int64_t n) {
  using Vec = at::vec::Vectorized<A>;
  constexpr int64_t W = Vec::size();
  const Vec one(A(1));
  int64_t j = 0;
  for (; j + W <= n; j += W) {
    const Vec x = Vec::loadu(g + j);
    (x / (one + x.neg().exp())).store(g + j);
  }
  for (; j < n; ++j) g[j] = g[j] / (A(1) + std::exp(-g[j]));
}

template <typename T>
void gated_forward(const RmsNormGatedParams& p) {
  using A = norm::acc_of<T>;
  using Vec = at::vec::Vectorized<A>;
  constexpr int64_t W = Vec::size();
  const int64_t n = p.n;
  const T* x = static_cast<const T*>(p.x);
  const A* w = static_cast<const A*>(p.weight);
  const bool gate_float = p.gate_dtype == at::kFloat && !std::is_same_v<T, float>;
  T* y = static_cast<T*>(p.y);
  A* rstd = static_cast<A*>(p.rstd);
  at::parallel_for(0, p.rows, grain(n), [&](int64_t r0, int64_t r1) {
    std::vector<A> h(n), gv(p.gate ? n : 0);
    std::vector<T> tmp;
    for (int64_t r = r0; r < r1; ++r) {
      load_row(x + r * n, n, h.data());
      const A rs = norm::rstd_of(h.data(), n, p.eps);
      rstd[r] = rs;
      int64_t j = 0;
      for (; j + W <= n; j += W) (Vec::loadu(h.data() + j) * Vec(rs)).store(h.data() + j);
      for (; j < n; ++j) h[j] *= rs;
      round_through(h.data(), n, tmp);  // the normalised row is rounded to x's dtype before the weight
      j = 0;
      for (; j + W <= n; j += W) (Vec::loadu(h.data() + j) * Vec::loadu(w + j)).store(h.data() + j);
      for (; j < n; ++j) h[j] *= w[j];
      if (p.round_product) round_through(h.data(), n, tmp);  // weight * h is a product of two x-dtype tensors
      if (p.gate != nullptr) {
        load_either<T>(p.gate, gate_float, r * n, n, gv.data());
        silu_row(gv.data(), n);
        j = 0;
        for (; j + W <= n; j += W) (Vec::loadu(h.data() + j) * Vec::loadu(gv.data() + j)).store(h.data() + j);
        for (; j < n; ++j) h[j] *= gv[j];
      }
      load_row(h.data(), n, y + r * n);
    }
  });
}

// One row of the backward; adds the row's u * h to dw. g (nullptr: no gate) is overwritten with dgate.
template <typename A>
void gated_grad_row(const A* x, const A* dy, A* g, int64_t n, const A* w, A rs, A* dx, A* dw) {
  using Vec = at::vec::Vectorized<A>;
  constexpr int64_t W = Vec::size();
  const Vec one(A(1)), rv(rs);
  Vec macc(A(0));
  int64_t j = 0;
  // dx holds w * u until the second pass; m = sum of w u h
  for (; j + W <= n; j += W) {
    const Vec h = Vec::loadu(x + j) * rv, d = Vec::loadu(dy + j), wj = Vec::loadu(w + j);
    Vec u = d;
    if (g != nullptr) {
      const Vec gj = Vec::loadu(g + j);
      const Vec sig = one / (one + gj.neg().exp());
      u = d * gj * sig;
      (d * wj * h * sig * (one + gj * (one - sig))).store(g + j);
    }
    (Vec::loadu(dw + j) + u * h).store(dw + j);
    const Vec wu = wj * u;
    wu.store(dx + j);
    macc = at::vec::fmadd(wu, h, macc);
  }
  A m = reduce_sum(macc);
  for (; j < n; ++j) {
    const A h = x[j] * rs;
    A u = dy[j];
    if (g != nullptr) {
      const A sig = A(1) / (A(1) + std::exp(-g[j]));
      u = dy[j] * g[j] * sig;
      g[j] = dy[j] * w[j] * h * sig * (A(1) + g[j] * (A(1) - sig));
    }
    dw[j] += u * h;
    dx[j] = w[j] * u;
    m += dx[j] * h;
  }
  const Vec mv(m / static_cast<A>(n));
  j = 0;
  for (; j + W <= n; j += W) (rv * (Vec::loadu(dx + j) - Vec::loadu(x + j) * rv * mv)).store(dx + j);
  for (; j < n; ++j) dx[j] = rs * (dx[j] - x[j] * rs * (m / static_cast<A>(n)));
}

template <typename T>
void gated_backward(const RmsNormGatedGradParams& p) {
  using A = norm::acc_of<T>;
  const int64_t n = p.n, rows = p.rows;
  const T* dy = static_cast<const T*>(p.dy);
  const T* x = static_cast<const T*>(p.x);
  const A* w = static_cast<const A*>(p.weight);
  const A* rstd = static_cast<const A*>(p.rstd);
  const bool gate_float = p.gate_dtype == at::kFloat && !std::is_same_v<T, float>;
  T* dx = static_cast<T*>(p.dx);
  A* dweight = static_cast<A*>(p.dweight);
  // dweight: one partial sum per chunk of rows (the chunks depend on the row count only), summed in chunk order.
  const int64_t chunks = std::min<int64_t>(rows, 64);
  const int64_t per_chunk = chunks ? (rows + chunks - 1) / chunks : 0;
  std::vector<A> partial(static_cast<size_t>(chunks * n), A(0));
  at::parallel_for(0, chunks, 1, [&](int64_t c0, int64_t c1) {
    std::vector<A> xa(n), da(n), ga(p.gate ? n : 0), out(n);
    for (int64_t c = c0; c < c1; ++c) {
      for (int64_t r = c * per_chunk; r < std::min(rows, (c + 1) * per_chunk); ++r) {
        load_row(x + r * n, n, xa.data());
        load_row(dy + r * n, n, da.data());
        if (p.gate != nullptr) load_either<T>(p.gate, gate_float, r * n, n, ga.data());
        gated_grad_row(xa.data(), da.data(), p.gate ? ga.data() : nullptr, n, w, rstd[r], out.data(),
                       partial.data() + c * n);
        load_row(out.data(), n, dx + r * n);
        if (p.gate != nullptr) store_either<T>(ga.data(), n, p.dgate, gate_float, r * n);
      }
    }
  });
  std::fill(dweight, dweight + n, A(0));
  for (int64_t c = 0; c < chunks; ++c)
    for (int64_t j = 0; j < n; ++j) dweight[j] += partial[c * n + j];
}

void rms_norm_gated_rows(const RmsNormGatedParams& p) {
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, p.dtype, "rms_norm_gated",
                                  [&] { gated_forward<scalar_t>(p); });
}

void rms_norm_gated_grad_rows(const RmsNormGatedGradParams& p) {
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, p.dtype, "rms_norm_gated_grad",
                                  [&] { gated_backward<scalar_t>(p); });
}

}  // namespace

NPU_FA_REGISTER_ISA_KERNEL(recurrent_gdr_stub, recurrent_gdr);
NPU_FA_REGISTER_ISA_KERNEL(rms_norm_gated_rows_stub, rms_norm_gated_rows);
NPU_FA_REGISTER_ISA_KERNEL(rms_norm_gated_grad_rows_stub, rms_norm_gated_grad_rows);

}  // namespace npu_fa::cpu::CPU_CAPABILITY
