// The sparse flash attention forward (see sparse_flash_attention_kernels.h), compiled once per instruction set.
//
// Work item = (query row t, KV head n2); its G query heads share the item's M selected cache rows. The rows are
// gathered once into an fp32 tile K̃ [M, Dqk] (fp64 for fp64 inputs; Ṽ [M, Dv] too unless value is key's latent
// part) and the item runs in three phases over fixed blocks of the selected rows:
//   1. per block of kRowBlock rows: gather, Sᵀ = K̃_block · Qᵀ [rows, G] (one brgemm product, the queries packed
//      once as B), scale, and the block's column maxima (one per head, the heads in the vector lanes);
//   2. per block: E = exp(Sᵀ - max) in place and the block's column sums, then Eᵀ into P [G, M] (8x8 / 16x16 register
//      transposes), so the second product reads P row-major;
//   3. per block of kColBlock output columns: O = P · Ṽ, a brgemm product accumulated over the row blocks.
// The heads' maxima and sums combine the blocks in block order, so the result does not depend on the thread count.
// A decode step has fewer items than threads: its items run one after another and each phase splits its blocks
// across the threads; with more items than threads the items run in parallel and the phases inline. The softmax
// runs over the whole selected row in two passes (the row is gathered already, so the online rescaling of
// FlashAttention would only add work). The quantised op rounds its dequantised rows and P to the query's dtype, as
// upstream's golden does. Products use oneDNN brgemm in fp32 where it is usable, else at::mm (fp64 always).
#include "cpu/sparse_attention/sparse_flash_attention_kernels.h"

#include "cpu/brgemm.h"

#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

namespace npu_fa::cpu::CPU_CAPABILITY {

namespace {

using sparse_attention::SfaGeometry;

constexpr int64_t kRowBlock = 256;  // selected rows per task of phases 1 and 2 (and per step of phase 3's sum)
constexpr int64_t kColBlock = 64;   // output columns per task of phase 3

template <typename T>
using acc_type_t = std::conditional_t<std::is_same_v<T, double>, double, float>;

// c[m, n] (+)= a[m, k] · b[k, n], row-major, in the accumulation type A: brgemm for fp32 when usable, else at::mm.
template <typename A>
void mm(int64_t m, int64_t n, int64_t k, const A* a, int64_t lda, const A* b, int64_t ldb, A* c, int64_t ldc,
        bool add, bool use_brgemm) {
  if constexpr (std::is_same_v<A, float>) {
    if (use_brgemm) {
      brgemm::mm<float>(m, n, k, a, lda, b, ldb, c, ldc, add);
      return;
    }
  }
  const auto opt = at::TensorOptions().dtype(c10::CppTypeToScalarType<A>::value);
  const auto A_ = at::from_blob(const_cast<A*>(a), {m, k}, {lda, 1}, opt);
  const auto B_ = at::from_blob(const_cast<A*>(b), {k, n}, {ldb, 1}, opt);
  auto C_ = at::from_blob(c, {m, n}, {ldc, 1}, opt);
  if (add)
    C_.addmm_(A_, B_);
  else
    at::mm_out(C_, A_, B_);
}

// max(a, b) that returns a NaN when either is one (a NaN score must reach the output, as in the attention kernels).
template <typename A>
inline A nan_max(A a, A b) {
  return (a < b || b != b) ? b : a;
}

template <typename A>
inline at::vec::Vectorized<A> vexp(const at::vec::Vectorized<A>& x) {
  if constexpr (std::is_same_v<A, float>)
    return x.exp_u20();  // ATen's degree-5 polynomial (20 ulp), well inside the fp32 tolerance
  else
    return x.exp();
}

// One thread's item buffers, kept across calls (they only grow): fresh multi-MiB vectors would be page-faulted in
// again on every decode step.
template <typename A>
struct ItemScratch {
  std::vector<int64_t> rows;
  std::vector<A> q, qt, k, v, st, p, o, bmax, bsum, mx, sm;
};

template <typename A>
ItemScratch<A>& scratch() {
  thread_local ItemScratch<A> s;
  return s;
}

template <typename V>
V* grow(std::vector<V>& v, size_t n) {
  if (v.size() < n) v.resize(n);
  return v.data();
}

template <typename scalar_t>
class Forward {
  using A = acc_type_t<scalar_t>;
  using Vec = at::vec::Vectorized<A>;
  static constexpr A kNegInf = -std::numeric_limits<A>::infinity();

 public:
  explicit Forward(const SfaForwardParams& p)
      : p_(p), g_(*p.geo), cv_(p.cv), Dqk_(cv_.Dn + cv_.Dr), G_(g_.G),
        brgemm_(std::is_same_v<A, float> && brgemm_usable(at::kFloat)) {}

  void run() {
    const int64_t items = g_.T1 * g_.N2;
    auto body = [&](int64_t i0, int64_t i1) {
      for (int64_t it = i0; it < i1; ++it) item(it / g_.N2, it % g_.N2);
    };
    if (items >= at::get_num_threads())
      at::parallel_for(0, items, 1, body);
    else if (items > 0)
      body(0, items);
  }

 private:
  void item(int64_t t, int64_t n2) {
    auto& s = scratch<A>();
    g_.select(t, n2, s.rows);
    const int64_t M = static_cast<int64_t>(s.rows.size());
    A* mx = grow(s.mx, G_);
    A* sm = grow(s.sm, G_);
    A* o = grow(s.o, G_ * cv_.Dv);
    const A* sinks = static_cast<const A*>(p_.sinks);
    const bool sink = sinks != nullptr && g_.row_batch[t] >= 0;
    for (int64_t h = 0; h < G_; ++h) {
      mx[h] = sink ? sinks[n2 * G_ + h] : kNegInf;
      sm[h] = 0;
    }
    std::fill(o, o + G_ * cv_.Dv, A(0));
    if (M > 0) attend(t, n2, M, s, sink ? sinks + n2 * G_ : nullptr);
    if (sink)
      for (int64_t h = 0; h < G_; ++h) sm[h] += std::exp(sinks[n2 * G_ + h] - mx[h]);
    finish(t, n2, s);
  }

  // Phases 1-3 for an item with M > 0 selected rows; leaves the heads' max and sum in s.mx / s.sm and the
  // unnormalised output (normalised for input_precision) in s.o.
  void attend(int64_t t, int64_t n2, int64_t M, ItemScratch<A>& s, const A* sinks) {
    const int64_t nb = (M + kRowBlock - 1) / kRowBlock, Dv = cv_.Dv;
    pack_queries(t, n2, s);
    A* k = grow(s.k, M * Dqk_);
    A* v = cv_.value_is_key ? k : grow(s.v, M * Dv);
    const int64_t ldv = cv_.value_is_key ? Dqk_ : Dv;
    A* st = grow(s.st, M * G_);
    // P's row stride: M padded off a power of two (a stride of 2^k bytes maps P's rows to the same cache sets
    // while phase 3 streams them)
    const int64_t ldp = (M + 15) / 16 * 16 + 16;
    A* pm = grow(s.p, G_ * ldp);
    A* bmax = grow(s.bmax, nb * G_);
    A* bsum = grow(s.bsum, nb * G_);
    const A scale = static_cast<A>(g_.scale);
    at::parallel_for(0, nb, 1, [&](int64_t b0, int64_t b1) {
      for (int64_t b = b0; b < b1; ++b) {
        const int64_t r0 = b * kRowBlock, r1 = std::min(M, r0 + kRowBlock);
        for (int64_t m = r0; m < r1; ++m)
          load_row<scalar_t, A>(cv_, s.rows[m], n2, k + m * Dqk_, cv_.value_is_key ? nullptr : v + m * Dv);
        mm<A>(r1 - r0, G_, Dqk_, k + r0 * Dqk_, Dqk_, s.qt.data(), G_, st + r0 * G_, G_, false, brgemm_);
        scale_and_max(st + r0 * G_, r1 - r0, scale, bmax + b * G_);
      }
      if (brgemm_) brgemm::release(false);
    });
    for (int64_t b = 0; b < nb; ++b)
      for (int64_t h = 0; h < G_; ++h) s.mx[h] = nan_max(s.mx[h], bmax[b * G_ + h]);
    at::parallel_for(0, nb, 1, [&](int64_t b0, int64_t b1) {
      for (int64_t b = b0; b < b1; ++b) {
        const int64_t r0 = b * kRowBlock, r1 = std::min(M, r0 + kRowBlock);
        exp_and_sum(st + r0 * G_, r1 - r0, s.mx.data(), bsum + b * G_);
        transpose_tiles(st + r0 * G_, G_, r1 - r0, G_, pm + r0, ldp);
      }
    });
    for (int64_t b = 0; b < nb; ++b)
      for (int64_t h = 0; h < G_; ++h) s.sm[h] += bsum[b * G_ + h];
    if (cv_.input_precision) round_probabilities(pm, M, ldp, s, sinks);
    A* o = s.o.data();
    at::parallel_for(0, (Dv + kColBlock - 1) / kColBlock, 1, [&](int64_t c0, int64_t c1) {
      for (int64_t c = c0; c < c1; ++c) {
        const int64_t d0 = c * kColBlock, w = std::min(kColBlock, Dv - d0);
        for (int64_t r0 = 0; r0 < M; r0 += kRowBlock)
          mm<A>(G_, w, std::min(kRowBlock, M - r0), pm + r0, ldp, v + r0 * ldv + d0, ldv, o + d0, Dv, r0 > 0,
                brgemm_);
      }
      if (brgemm_) brgemm::release(false);
    });
  }

  // Qᵀ [Dqk, G] of row t, head group n2, in the accumulation type: the B operand of phase 1.
  void pack_queries(int64_t t, int64_t n2, ItemScratch<A>& s) {
    const scalar_t* q = static_cast<const scalar_t*>(p_.q);
    const scalar_t* qr = static_cast<const scalar_t*>(p_.qr);
    A* rows = grow(s.q, G_ * Dqk_);
    for (int64_t h = 0; h < G_; ++h) {
      const int64_t head = n2 * G_ + h;
      const scalar_t* src = q + (t * g_.N1 + head) * p_.Dq;
      A* dst = rows + h * Dqk_;
      for (int64_t d = 0; d < cv_.Dn; ++d) dst[d] = static_cast<A>(src[d]);
      const scalar_t* srcr = qr != nullptr ? qr + (t * g_.N1 + head) * cv_.Dr : src + cv_.Dn;
      for (int64_t d = 0; d < cv_.Dr; ++d) dst[cv_.Dn + d] = static_cast<A>(srcr[d]);
    }
    transpose_tiles(rows, Dqk_, G_, Dqk_, grow(s.qt, Dqk_ * G_), G_);
  }

  // st[r, h] *= scale over `rows` rows of G heads; bmax[h] = the block's largest (a NaN wins).
  void scale_and_max(A* st, int64_t rows, A scale, A* bmax) const {
    const int64_t Gv = G_ - G_ % Vec::size();
    for (int64_t h = 0; h < Gv; h += Vec::size()) {
      Vec m(kNegInf);
      for (int64_t r = 0; r < rows; ++r) {
        const Vec x = Vec::loadu(st + r * G_ + h) * Vec(scale);
        x.store(st + r * G_ + h);
        m = at::vec::maximum(m, x);
      }
      m.store(bmax + h);
    }
    for (int64_t h = Gv; h < G_; ++h) {
      A m = kNegInf;
      for (int64_t r = 0; r < rows; ++r) {
        st[r * G_ + h] *= scale;
        m = nan_max(m, st[r * G_ + h]);
      }
      bmax[h] = m;
    }
  }

  // st[r, h] = exp(st[r, h] - mx[h]) over `rows` rows; bsum[h] = the block's sum of head h, rows in order.
  void exp_and_sum(A* st, int64_t rows, const A* mx, A* bsum) const {
    const int64_t Gv = G_ - G_ % Vec::size();
    for (int64_t h = 0; h < Gv; h += Vec::size()) {
      const Vec m = Vec::loadu(mx + h);
      Vec sum(A(0));
      for (int64_t r = 0; r < rows; ++r) {
        const Vec e = vexp<A>(Vec::loadu(st + r * G_ + h) - m);
        e.store(st + r * G_ + h);
        sum = sum + e;
      }
      sum.store(bsum + h);
    }
    for (int64_t h = Gv; h < G_; ++h) {
      A sum = 0;
      for (int64_t r = 0; r < rows; ++r) {
        st[r * G_ + h] = std::exp(st[r * G_ + h] - mx[h]);
        sum += st[r * G_ + h];
      }
      bsum[h] = sum;
    }
  }

  // The quantised op's P = E / (sum + sink term), rounded to the query's dtype; its output is then P Ṽ itself.
  void round_probabilities(A* pm, int64_t M, int64_t ldp, const ItemScratch<A>& s, const A* sinks) const {
    for (int64_t h = 0; h < G_; ++h) {
      A den = s.sm[h];
      if (sinks != nullptr) den += std::exp(sinks[h] - s.mx[h]);
      A* row = pm + h * ldp;
      for (int64_t j = 0; j < M; ++j) row[j] = static_cast<A>(static_cast<scalar_t>(row[j] / den));
    }
  }

  // out = O / sum (O itself for input_precision; zero rows without keys) and the statistics.
  void finish(int64_t t, int64_t n2, const ItemScratch<A>& s) const {
    const int64_t Dv = cv_.Dv;
    scalar_t* out = static_cast<scalar_t*>(p_.out);
    for (int64_t h = 0; h < G_; ++h) {
      scalar_t* dst = out + (t * g_.N1 + n2 * G_ + h) * Dv;
      const A inv = cv_.input_precision ? A(1) : s.sm[h] > 0 ? A(1) / s.sm[h] : A(0);
      const A* src = s.o.data() + h * Dv;
      for (int64_t d = 0; d < Dv; ++d) dst[d] = static_cast<scalar_t>(src[d] * inv);
    }
    if (p_.smax == nullptr) return;
    A* smax = static_cast<A*>(p_.smax);
    A* ssum = static_cast<A*>(p_.ssum);
    const int64_t base = g_.stat_offset(t, n2);
    for (int64_t h = 0; h < G_; ++h) {
      smax[base + h] = s.mx[h];
      ssum[base + h] = s.sm[h];
    }
  }

  const SfaForwardParams& p_;
  const SfaGeometry& g_;
  const CacheView& cv_;
  const int64_t Dqk_, G_;
  const bool brgemm_;
};

void sparse_flash_attention_forward(const SfaForwardParams& p) {
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, p.dtype, "sparse_flash_attention", [&] {
    Forward<scalar_t>(p).run();
  });
}

}  // namespace

NPU_FA_REGISTER_ISA_KERNEL(sparse_flash_attention_forward_stub, sparse_flash_attention_forward);

}  // namespace npu_fa::cpu::CPU_CAPABILITY
