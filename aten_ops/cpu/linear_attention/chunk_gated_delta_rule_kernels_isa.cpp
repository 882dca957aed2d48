// The chunked gated delta rule, forward and backward, compiled once per instruction set (cpu/isa_dispatch.h).
//
// Notation, per task (sequence b, value head h, key head h / (Nv / Nk)) and chunk of c <= 64 tokens. The state is
// kept transposed, H = Sᵀ in R^{Dk x Dv}, so that every product below is row-major. Within the chunk:
//   G_i = g_0 + .. + g_i (cumulative log decay), γ_i = e^{G_i}, D_ij = e^{G_i - G_j} for j <= i (else 0)
//   A_ij = β_i (k_i · k_j) D_ij for j < i,   T = (I + A)⁻¹ (unit lower triangular: the UT transform)
//   W = T diag(βγ) K,   U = T diag(β) V,   Vn = U - W H          (the new values the chunk writes)
//   O = diag(scale γ) Q H + P Vn,   P_ij = scale (q_i · k_j) D_ij for j <= i
//   H' = γ_c H + (diag(e^{G_c - G}) K)ᵀ Vn                     (the state carried to the next chunk)
// Unrolling the token recurrence over the chunk gives exactly these (the WY representation of the product of the
// rank-one updates). T is built by forward substitution (c³/6 multiply-adds, less than one c x c x Dk product);
// everything else is a blocked product on brgemm (fp32) or a plain loop (fp64, the reference dtype).
//
// The backward recomputes the chunk-start states H of a task (one forward sweep, kept in a per-task buffer), then
// walks the chunks backwards, carrying dH: reverse-mode differentiation of the formulas above, written out step by
// step in chunk_backward.
#include "cpu/linear_attention/chunk_gated_delta_rule_kernels.h"

#include "cpu/brgemm.h"
#include "cpu/vec_convert.h"

#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>

namespace npu_fa::cpu::CPU_CAPABILITY {

namespace {

template <typename T>
using acc_type_t = std::conditional_t<std::is_same_v<T, double>, double, float>;

// c[m, n] (+)= a[m, k] · b[k, n], row-major: brgemm for fp32 when usable, else a plain loop (fp64: speed does not
// matter there, and a loop keeps results independent of any BLAS threading).
template <typename A>
void mm(int64_t m, int64_t n, int64_t k, const A* a, int64_t lda, const A* b, int64_t ldb, A* c, int64_t ldc,
        bool add, bool use_brgemm) {
  if (m == 0 || n == 0) return;
  if (k == 0) {
    if (!add)
      for (int64_t i = 0; i < m; ++i) std::fill(c + i * ldc, c + i * ldc + n, A(0));
    return;
  }
  if constexpr (std::is_same_v<A, float>) {
    if (use_brgemm) {
      brgemm::mm<float>(m, n, k, a, lda, b, ldb, c, ldc, add);
      return;
    }
  }
  for (int64_t i = 0; i < m; ++i) {
    A* ci = c + i * ldc;
    if (!add) std::fill(ci, ci + n, A(0));
    for (int64_t p = 0; p < k; ++p) {
      const A aip = a[i * lda + p];
      const A* bp = b + p * ldb;
      for (int64_t j = 0; j < n; ++j) ci[j] += aip * bp[j];
    }
  }
}

template <typename A>
A dot(const A* x, const A* y, int64_t n) {
  A s = 0;
  for (int64_t i = 0; i < n; ++i) s += x[i] * y[i];
  return s;
}

// x[i * ld + j] = -x[i * ld + j] for i < rows, j < cols.
template <typename A>
void negate_rows(A* x, int64_t ld, int64_t rows, int64_t cols) {
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) x[i * ld + j] = -x[i * ld + j];
}

// Asks for the cache lines of row[0 .. n) (a read, kept in all levels).
template <typename T>
inline void prefetch_row(const T* row, int64_t n) {
  const char* p = reinterpret_cast<const char*>(row);
  for (int64_t b = 0; b < n * static_cast<int64_t>(sizeof(T)); b += 64) __builtin_prefetch(p + b, 0, 3);
}

// The buffers of one chunk (C = kGdnChunk rows at most), in the accumulation type. Forward quantities first, then the
// backward's. Operands are stacked so that one product does two jobs (fewer and larger brgemm calls: on these
// small shapes the call overhead and the kernels' edges are a visible share):
//   kq    K in rows C - c .. C - 1 and Q in rows C .. C + c - 1: [K; Q] Kᵀ gives KKᵀ and QKᵀ in one product
//   kvb   [diag(βγ) K | diag(β) V], c x (Dk + Dv): T kvb gives [W | U] in one product
//   wu    [W | U] in rows 0 .. c - 1, Qg = diag(scale γ) Q in rows c .. 2c - 1 (first Dk columns): [W; Qg] H
//         gives W H and Qg H in one product (whq)
template <typename A>
struct ChunkBuffers {
  int64_t Dk, Dv, ld;                                        // ld: row stride of kvb and wu (Dk + Dv)
  std::vector<A> kq, v, beta, G, gam, e;                     // inputs of the chunk and its decays
  std::vector<A> kt, kkqk, D, Tm, kvb, wu, whq, vn, p, kdt;  // forward
  A *k = nullptr, *q = nullptr;                              // this chunk's rows of kq
  A *kk = nullptr, *qk = nullptr;                            // KKᵀ and QKᵀ: rows of kkqk
  std::vector<A> kd, h0t, dht, d_o, vnt, pt, qgt, dkd, dvn, dP, dqg, dqk, dqkt, dwp, wnt, dT, kbnt, vbt, tt, dkb,
      dvb, x, dA, sym, dq, dk, dv, dbeta, dG;
  ChunkBuffers(int64_t Dk_, int64_t Dv_) : Dk(Dk_), Dv(Dv_), ld(Dk_ + Dv_) {
    const int64_t C = kGdnChunk;
    kq.resize(2 * C * Dk);
    for (auto* b : {&kd, &dkd, &dqg, &dwp, &dkb, &dq, &dk}) b->resize(C * Dk);
    for (auto* b : {&v, &vn, &d_o, &dvn, &dvb, &dv}) b->resize(C * Dv);
    for (auto* b : {&kt, &kdt, &qgt, &wnt, &kbnt}) b->resize(Dk * C);
    for (auto* b : {&vnt, &vbt}) b->resize(Dv * C);
    for (auto* b : {&D, &Tm, &p, &pt, &dP, &dqk, &dqkt, &dT, &tt, &x, &dA, &sym}) b->resize(C * C);
    kkqk.resize(2 * C * C);
    kvb.resize(C * ld);
    wu.resize(2 * C * ld);
    whq.resize(2 * C * Dv);
    for (auto* b : {&beta, &G, &gam, &e, &dbeta, &dG}) b->resize(C);
    for (auto* b : {&h0t, &dht}) b->resize(Dv * Dk);
  }
  A* W() { return wu.data(); }
  A* U() { return wu.data() + Dk; }
};

template <typename scalar_t>
class ChunkRule {
  using A = acc_type_t<scalar_t>;

 public:
  explicit ChunkRule(const GdnChunkParams& p)
      : p_(p), group_(p.Nv / p.Nk), brgemm_(std::is_same_v<A, float> && brgemm_usable(at::kFloat)) {}

  void forward() {
    run_tasks([&](int64_t b, int64_t h, ChunkBuffers<A>& s, std::vector<A>& H) {
      load_state(static_cast<const A*>(p_.state0), b, h, H.data());
      for (int64_t t0 = p_.starts[b]; t0 < p_.starts[b + 1]; t0 += kGdnChunk) {
        const int64_t c = std::min(kGdnChunk, p_.starts[b + 1] - t0);
        load_chunk(s, t0, c, h);
        intra_chunk(s, c);
        state_chunk(s, c, H.data(), /*write_out=*/true, t0, h);
      }
      store_state(H.data(), b, h, static_cast<A*>(p_.state));
    });
  }

  void backward() {
    run_tasks([&](int64_t b, int64_t h, ChunkBuffers<A>& s, std::vector<A>& H) {
      const int64_t t_begin = p_.starts[b], t_end = p_.starts[b + 1];
      const int64_t n_chunks = (t_end - t_begin + kGdnChunk - 1) / kGdnChunk;
      const int64_t hsize = p_.Dk * p_.Dv;
      // The state at the start of every chunk (one forward sweep), then the chunks backwards.
      std::vector<A> starts(n_chunks * hsize);
      load_state(static_cast<const A*>(p_.state0), b, h, H.data());
      for (int64_t j = 0; j < n_chunks; ++j) {
        const int64_t t0 = t_begin + j * kGdnChunk, c = std::min(kGdnChunk, t_end - t0);
        std::copy(H.begin(), H.end(), starts.begin() + j * hsize);
        load_chunk(s, t0, c, h);
        intra_chunk(s, c);
        state_chunk(s, c, H.data(), /*write_out=*/false, t0, h);
      }
      std::vector<A> dH(hsize), dH_prev(hsize);
      load_state(static_cast<const A*>(p_.d_state), b, h, dH.data());
      for (int64_t j = n_chunks - 1; j >= 0; --j) {
        const int64_t t0 = t_begin + j * kGdnChunk, c = std::min(kGdnChunk, t_end - t0);
        load_chunk(s, t0, c, h);
        intra_chunk(s, c);
        chunk_backward(s, c, starts.data() + j * hsize, dH.data(), dH_prev.data(), t0, h);
        std::swap(dH, dH_prev);
      }
      store_state(dH.data(), b, h, static_cast<A*>(p_.d_state0));
    });
  }

 private:
  // Runs body(b, h, buffers, H) for every (sequence, value head), in parallel over tasks; each task on one thread.
  template <typename F>
  void run_tasks(const F& body) {
    const int64_t tasks = p_.B * p_.Nv;
    at::parallel_for(0, tasks, 1, [&](int64_t i0, int64_t i1) {
      ChunkBuffers<A> s(p_.Dk, p_.Dv);
      std::vector<A> H(p_.Dk * p_.Dv);
      for (int64_t i = i0; i < i1; ++i) body(i / p_.Nv, i % p_.Nv, s, H);
      if (brgemm_) brgemm::release(false);
    });
  }

  // H = S0ᵀ of task (b, h): src [B, Nv, Dv, Dk] (null: zeros).
  void load_state(const A* src, int64_t b, int64_t h, A* H) const {
    if (src == nullptr) {
      std::fill(H, H + p_.Dk * p_.Dv, A(0));
      return;
    }
    transpose_tiles(src + (b * p_.Nv + h) * p_.Dv * p_.Dk, p_.Dk, p_.Dv, p_.Dk, H, p_.Dv);
  }

  void store_state(const A* H, int64_t b, int64_t h, A* dst) const {
    transpose_tiles(H, p_.Dv, p_.Dk, p_.Dv, dst + (b * p_.Nv + h) * p_.Dv * p_.Dk, p_.Dk);
  }

  // Rows t0 .. t0 + c - 1 of q, k (key head of h), v, beta, g in the accumulation type; G, γ, D.
  void load_chunk(ChunkBuffers<A>& s, int64_t t0, int64_t c, int64_t h) const {
    const int64_t C = kGdnChunk, Dk = p_.Dk, Dv = p_.Dv, kh = h / group_;
    const auto* q = static_cast<const scalar_t*>(p_.q);
    const auto* k = static_cast<const scalar_t*>(p_.k);
    const auto* v = static_cast<const scalar_t*>(p_.v);
    const auto* beta = static_cast<const A*>(p_.beta);
    const auto* g = static_cast<const A*>(p_.g);
    s.k = s.kq.data() + (C - c) * Dk;
    s.q = s.kq.data() + C * Dk;
    // The next chunk's rows, requested now so that they arrive while this chunk's products run: a head's rows are
    // strided (one row of every token), and waiting for them was a tenth of the forward's time.
    for (int64_t t = t0 + C; t < std::min(t0 + 2 * C, p_.T); ++t) {
      prefetch_row(q + (t * p_.Nk + kh) * Dk, Dk);
      prefetch_row(k + (t * p_.Nk + kh) * Dk, Dk);
      prefetch_row(v + (t * p_.Nv + h) * Dv, Dv);
    }
    for (int64_t i = 0; i < c; ++i) {
      const int64_t t = t0 + i;
      to_acc(q + (t * p_.Nk + kh) * Dk, Dk, s.q + i * Dk);
      to_acc(k + (t * p_.Nk + kh) * Dk, Dk, s.k + i * Dk);
      to_acc(v + (t * p_.Nv + h) * Dv, Dv, s.v.data() + i * Dv);
      s.beta[i] = beta == nullptr ? A(1) : beta[t * p_.Nv + h];
      const A gi = g == nullptr ? A(0) : g[t * p_.Nv + h];
      s.G[i] = i == 0 ? gi : s.G[i - 1] + gi;
    }
    // D_ij = e^{G_i - G_j}: c² exponentials a chunk, vectorised (scalar exp would cost as much as a product).
    // A row's last vector may run past j = i (up to a multiple of the vector width, within the C columns) before
    // the zeros are written; columns from c on are never read.
    using Vec = at::vec::Vectorized<A>;
    for (int64_t i = 0; i < c; ++i) {
      s.gam[i] = std::exp(s.G[i]);
      s.e[i] = std::exp(s.G[c - 1] - s.G[i]);
      A* Di = s.D.data() + i * C;
      const Vec Gi(s.G[i]);
      for (int64_t j = 0; j <= i; j += Vec::size()) (Gi - Vec::loadu(s.G.data() + j)).exp().store(Di + j);
      std::fill(Di + i + 1, Di + c, A(0));
    }
  }

  // T = (I + A)⁻¹ row by row: T_i = e_i - Σ_{m<i} A_im T_m. Rows are zero right of their diagonal and the buffer's
  // rows are zeroed across all C columns, so each update runs over whole vectors (up to column m rounded up to the
  // vector width: the extra columns add zeros) instead of a scalar tail per row.
  void ut_transform(ChunkBuffers<A>& s, int64_t c) const {
    using Vec = at::vec::Vectorized<A>;
    constexpr int64_t V = Vec::size();
    const int64_t C = kGdnChunk;
    A* Tm = s.Tm.data();
    for (int64_t i = 0; i < c; ++i) {
      A* ti = Tm + i * C;
      std::fill(ti, ti + C, A(0));
      ti[i] = 1;
      for (int64_t m = 0; m < i; ++m) {
        const Vec a(s.beta[i] * s.kk[i * C + m] * s.D[i * C + m]);
        const A* tm = Tm + m * C;
        for (int64_t j = 0; j <= m; j += V) (Vec::loadu(ti + j) - a * Vec::loadu(tm + j)).store(ti + j);
      }
    }
  }

  // The parts of a chunk that do not depend on the state: KKᵀ, QKᵀ, T, [W | U], P, Kdᵀ.
  void intra_chunk(ChunkBuffers<A>& s, int64_t c) const {
    const int64_t C = kGdnChunk, Dk = p_.Dk, Dv = p_.Dv, ld = s.ld;
    const A scale = static_cast<A>(p_.scale);
    transpose_tiles(s.k, Dk, c, Dk, s.kt.data(), C);
    mm(2 * c, c, Dk, s.k, Dk, s.kt.data(), C, s.kkqk.data(), C, false, brgemm_);  // [KKᵀ; QKᵀ]
    s.kk = s.kkqk.data();
    s.qk = s.kkqk.data() + c * C;
    ut_transform(s, c);
    for (int64_t i = 0; i < c; ++i) {
      const A bg = s.beta[i] * s.gam[i], b = s.beta[i];
      const A* ki = s.k + i * Dk;
      const A* vi = s.v.data() + i * Dv;
      A* kvb = s.kvb.data() + i * ld;
      for (int64_t d = 0; d < Dk; ++d) kvb[d] = bg * ki[d];
      for (int64_t d = 0; d < Dv; ++d) kvb[Dk + d] = b * vi[d];
      A* pi = s.p.data() + i * C;
      const A* qki = s.qk + i * C;
      const A* Di = s.D.data() + i * C;
      for (int64_t j = 0; j <= i; ++j) pi[j] = scale * qki[j] * Di[j];
      std::fill(pi + i + 1, pi + c, A(0));
    }
    for (int64_t d = 0; d < Dk; ++d)  // Kdᵀ = Kᵀ diag(e), from the transpose made for KKᵀ
      for (int64_t i = 0; i < c; ++i) s.kdt[d * C + i] = s.kt[d * C + i] * s.e[i];
    mm(c, ld, c, s.Tm.data(), C, s.kvb.data(), ld, s.wu.data(), ld, false, brgemm_);  // [W | U]
  }

  // W H (and Qg H, rows c .. 2c - 1 of s.whq, with qh), then the new values Vn = U - W H into s.vn.
  void new_values(ChunkBuffers<A>& s, int64_t c, const A* H, bool qh) const {
    const int64_t Dk = p_.Dk, Dv = p_.Dv;
    mm(qh ? 2 * c : c, Dv, Dk, s.wu.data(), s.ld, H, Dv, s.whq.data(), Dv, false, brgemm_);
    for (int64_t i = 0; i < c; ++i) {
      const A* u = s.U() + i * s.ld;
      const A* wh = s.whq.data() + i * Dv;
      A* vn = s.vn.data() + i * Dv;
      for (int64_t d = 0; d < Dv; ++d) vn[d] = u[d] - wh[d];
    }
  }

  // Vn, the chunk's output rows (write_out) and H <- γ_c H + Kdᵀ Vn.
  void state_chunk(ChunkBuffers<A>& s, int64_t c, A* H, bool write_out, int64_t t0, int64_t h) const {
    const int64_t C = kGdnChunk, Dk = p_.Dk, Dv = p_.Dv;
    if (write_out) {
      const A scale = static_cast<A>(p_.scale);
      for (int64_t i = 0; i < c; ++i) {  // Qg = diag(scale γ) Q below [W | U]
        const A sg = scale * s.gam[i];
        A* qg = s.wu.data() + (c + i) * s.ld;
        for (int64_t d = 0; d < Dk; ++d) qg[d] = sg * s.q[i * Dk + d];
      }
    }
    new_values(s, c, H, write_out);
    if (write_out) {
      A* o = s.whq.data() + c * Dv;  // O = Qg H + P Vn
      mm(c, Dv, c, s.p.data(), C, s.vn.data(), Dv, o, Dv, true, brgemm_);
      auto* out = static_cast<scalar_t*>(p_.out);
      for (int64_t i = 0; i < c; ++i) from_acc(o + i * Dv, Dv, out + ((t0 + i) * p_.Nv + h) * Dv);
    }
    const A gc = s.gam[c - 1];
    for (int64_t i = 0; i < Dk * Dv; ++i) H[i] *= gc;
    mm(Dk, Dv, c, s.kdt.data(), C, s.vn.data(), Dv, H, Dv, true, brgemm_);
  }

  // One chunk backwards: H0 the state entering it, dH1 the gradient of the state leaving it; writes dH0 and the
  // chunk's gradients (dq, dk summed per value head into the [T, Nv, Dk] scratch, the rest directly).
  void chunk_backward(ChunkBuffers<A>& s, int64_t c, const A* H0, const A* dH1, A* dH0, int64_t t0,
                      int64_t h) const {
    const int64_t C = kGdnChunk, Dk = p_.Dk, Dv = p_.Dv;
    const A scale = static_cast<A>(p_.scale);
    const auto* d_out = static_cast<const scalar_t*>(p_.d_out);
    new_values(s, c, H0, /*qh=*/false);
    const A* Vn = s.vn.data();
    for (int64_t i = 0; i < c; ++i) to_acc(d_out + ((t0 + i) * p_.Nv + h) * Dv, Dv, s.d_o.data() + i * Dv);
    std::fill(s.dG.begin(), s.dG.begin() + c, A(0));
    std::fill(s.dq.begin(), s.dq.begin() + c * Dk, A(0));
    transpose_tiles(H0, Dv, Dk, Dv, s.h0t.data(), Dk);
    transpose_tiles(dH1, Dv, Dk, Dv, s.dht.data(), Dk);

    // H1 = γ_c H0 + Kdᵀ Vn, Kd_i = e_i k_i
    const A gc = s.gam[c - 1];
    for (int64_t i = 0; i < Dk * Dv; ++i) dH0[i] = gc * dH1[i];
    s.dG[c - 1] += gc * dot(H0, dH1, Dk * Dv);
    mm(c, Dk, Dv, Vn, Dv, s.dht.data(), Dk, s.dkd.data(), Dk, false, brgemm_);      // dKd = Vn dH1ᵀ
    transpose_tiles(s.kdt.data(), C, Dk, c, s.kd.data(), Dk);                        // Kd rows
    mm(c, Dv, Dk, s.kd.data(), Dk, dH1, Dv, s.dvn.data(), Dv, false, brgemm_);      // dVn = Kd dH1
    for (int64_t i = 0; i < c; ++i) {
      const A de = dot(s.k + i * Dk, s.dkd.data() + i * Dk, Dk);
      for (int64_t d = 0; d < Dk; ++d) s.dk[i * Dk + d] = s.e[i] * s.dkd[i * Dk + d];
      s.dG[c - 1] += s.e[i] * de;
      s.dG[i] -= s.e[i] * de;
    }

    // O = Qg H0 + P Vn, Qg = diag(scale γ) Q
    transpose_tiles(Vn, Dv, c, Dv, s.vnt.data(), C);
    mm(c, c, Dv, s.d_o.data(), Dv, s.vnt.data(), C, s.dP.data(), C, false, brgemm_);  // dP = dO Vnᵀ
    transpose_tiles(s.p.data(), C, c, c, s.pt.data(), C);
    mm(c, Dv, c, s.pt.data(), C, s.d_o.data(), Dv, s.dvn.data(), Dv, true, brgemm_);  // dVn += Pᵀ dO
    for (int64_t i = 0; i < c; ++i)
      for (int64_t d = 0; d < Dk; ++d) s.qgt[d * C + i] = scale * s.gam[i] * s.q[i * Dk + d];
    mm(Dk, Dv, c, s.qgt.data(), C, s.d_o.data(), Dv, dH0, Dv, true, brgemm_);        // dH0 += Qgᵀ dO
    mm(c, Dk, Dv, s.d_o.data(), Dv, s.h0t.data(), Dk, s.dqg.data(), Dk, false, brgemm_);  // dQg = dO H0ᵀ
    for (int64_t i = 0; i < c; ++i) {
      const A sg = scale * s.gam[i];
      for (int64_t d = 0; d < Dk; ++d) s.dq[i * Dk + d] += sg * s.dqg[i * Dk + d];
      s.dG[i] += sg * dot(s.q + i * Dk, s.dqg.data() + i * Dk, Dk);
    }
    // P_ij = scale QK_ij D_ij (j <= i): dQK = scale dP ⊙ D; the D part of the gradient goes to dD (s.x below)
    A* dD = s.x.data();
    for (int64_t i = 0; i < c; ++i)
      for (int64_t j = 0; j < c; ++j) {
        const A dp = j <= i ? s.dP[i * C + j] : A(0);
        s.dqk[i * C + j] = scale * dp * s.D[i * C + j];
        dD[i * C + j] = scale * dp * s.qk[i * C + j];
      }
    transpose_tiles(s.dqk.data(), C, c, c, s.dqkt.data(), C);
    mm(c, Dk, c, s.dqk.data(), C, s.k, Dk, s.dq.data(), Dk, true, brgemm_);   // dQ += dQK K
    mm(c, Dk, c, s.dqkt.data(), C, s.q, Dk, s.dk.data(), Dk, true, brgemm_);  // dK += dQKᵀ Q

    // Vn = U - W H0: dU = dVn, dW = -dVn H0ᵀ (dwp holds dVn H0ᵀ), dH0 -= Wᵀ dVn
    mm(c, Dk, Dv, s.dvn.data(), Dv, s.h0t.data(), Dk, s.dwp.data(), Dk, false, brgemm_);
    transpose_tiles(s.W(), s.ld, c, Dk, s.wnt.data(), C);
    negate_rows(s.wnt.data(), C, Dk, c);
    mm(Dk, Dv, c, s.wnt.data(), C, s.dvn.data(), Dv, dH0, Dv, true, brgemm_);
    // W = T Kb, U = T Vb: dT = dW Kbᵀ + dU Vbᵀ, dKb = Tᵀ dW, dVb = Tᵀ dU; -Kbᵀ and Vbᵀ from [Kb | Vb] (s.kvb)
    transpose_tiles(s.kvb.data(), s.ld, c, Dk, s.kbnt.data(), C);
    negate_rows(s.kbnt.data(), C, Dk, c);
    transpose_tiles(s.kvb.data() + Dk, s.ld, c, Dv, s.vbt.data(), C);
    mm(c, c, Dv, s.dvn.data(), Dv, s.vbt.data(), C, s.dT.data(), C, false, brgemm_);
    mm(c, c, Dk, s.dwp.data(), Dk, s.kbnt.data(), C, s.dT.data(), C, true, brgemm_);
    transpose_tiles(s.Tm.data(), C, c, c, s.tt.data(), C);
    mm(c, Dk, c, s.tt.data(), C, s.dwp.data(), Dk, s.dkb.data(), Dk, false, brgemm_);  // -dKb
    mm(c, Dv, c, s.tt.data(), C, s.dvn.data(), Dv, s.dvb.data(), Dv, false, brgemm_);  // dVb
    // Kb_i = β_i γ_i k_i, Vb_i = β_i v_i
    for (int64_t i = 0; i < c; ++i) {
      const A kdkb = -dot(s.k + i * Dk, s.dkb.data() + i * Dk, Dk);
      const A bg = s.beta[i] * s.gam[i];
      for (int64_t d = 0; d < Dk; ++d) s.dk[i * Dk + d] -= bg * s.dkb[i * Dk + d];
      s.dbeta[i] = s.gam[i] * kdkb + dot(s.v.data() + i * Dv, s.dvb.data() + i * Dv, Dv);
      s.dG[i] += bg * kdkb;
      for (int64_t d = 0; d < Dv; ++d) s.dv[i * Dv + d] = s.beta[i] * s.dvb[i * Dv + d];
    }
    // T = (I + A)⁻¹: dA = -Tᵀ dT Tᵀ on the strict lower triangle (s.sym holds Tᵀ dT first)
    mm(c, c, c, s.tt.data(), C, s.dT.data(), C, s.sym.data(), C, false, brgemm_);
    mm(c, c, c, s.sym.data(), C, s.tt.data(), C, s.dA.data(), C, false, brgemm_);
    // A_ij = β_i KK_ij D_ij (j < i): dβ, dD and dKK; KK = K Kᵀ gives dK += (dKK + dKKᵀ) K
    std::fill(s.sym.begin(), s.sym.begin() + C * c, A(0));
    for (int64_t i = 0; i < c; ++i)
      for (int64_t j = 0; j < i; ++j) {
        const A da = -s.dA[i * C + j];
        const A kk = s.kk[i * C + j], d = s.D[i * C + j];
        s.dbeta[i] += da * kk * d;
        dD[i * C + j] += da * s.beta[i] * kk;
        const A dkk = da * s.beta[i] * d;
        s.sym[i * C + j] += dkk;
        s.sym[j * C + i] += dkk;
      }
    mm(c, Dk, c, s.sym.data(), C, s.k, Dk, s.dk.data(), Dk, true, brgemm_);
    // D_ij = e^{G_i - G_j} (j <= i); then G = cumsum(g): dg_j = Σ_{i >= j} dG_i
    for (int64_t i = 0; i < c; ++i)
      for (int64_t j = 0; j <= i; ++j) {
        const A m = dD[i * C + j] * s.D[i * C + j];
        s.dG[i] += m;
        s.dG[j] -= m;
      }
    auto* dq = static_cast<A*>(p_.dq);
    auto* dk = static_cast<A*>(p_.dk);
    auto* dv = static_cast<A*>(p_.dv);
    auto* dbeta = static_cast<A*>(p_.dbeta);
    auto* dg = static_cast<A*>(p_.dg);
    A acc = 0;
    for (int64_t i = c - 1; i >= 0; --i) {
      const int64_t t = t0 + i;
      acc += s.dG[i];
      // dq / dk: [T, Nv, Dk] per value head here; the caller sums each key head's group
      std::memcpy(dq + (t * p_.Nv + h) * Dk, s.dq.data() + i * Dk, Dk * sizeof(A));
      std::memcpy(dk + (t * p_.Nv + h) * Dk, s.dk.data() + i * Dk, Dk * sizeof(A));
      std::memcpy(dv + (t * p_.Nv + h) * Dv, s.dv.data() + i * Dv, Dv * sizeof(A));
      dbeta[t * p_.Nv + h] = s.dbeta[i];
      dg[t * p_.Nv + h] = acc;
    }
  }

  const GdnChunkParams& p_;
  const int64_t group_;
  const bool brgemm_;
};

void chunk_gated_delta_rule_forward(const GdnChunkParams& p) {
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, p.dtype, "chunk_gated_delta_rule", [&] {
    ChunkRule<scalar_t>(p).forward();
  });
}

void chunk_gated_delta_rule_backward(const GdnChunkParams& p) {
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, p.dtype, "chunk_gated_delta_rule_backward", [&] {
    ChunkRule<scalar_t>(p).backward();
  });
}

}  // namespace

NPU_FA_REGISTER_ISA_KERNEL(chunk_gated_delta_rule_forward_stub, chunk_gated_delta_rule_forward);
NPU_FA_REGISTER_ISA_KERNEL(chunk_gated_delta_rule_backward_stub, chunk_gated_delta_rule_backward);

}  // namespace npu_fa::cpu::CPU_CAPABILITY
