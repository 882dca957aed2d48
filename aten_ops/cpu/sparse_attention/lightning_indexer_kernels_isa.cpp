// The lightning-indexer loops (see lightning_indexer_kernels.h), compiled once per instruction set.
//
// Forward: work units of (sequence, key head, block of kQueryBlock query tokens). A unit walks the keys its last
// token sees in chunks of kKeyChunk. The chunk's products with every head of every token of the block are one
// brgemm product C = K_chunk · [q_i0 .. q_i1-1]ᵀ (the queries packed once per unit as B, D x (tokens * G)): 16-bit
// keys are A as they sit in the cache (B VNNI-packed, where brgemm multiplies that dtype), other keys are converted
// to fp32 rows first (fp64, or where brgemm refuses: at::vec dot products). Each token then folds its columns into
// the chunk's scores, sum_h w_h * ReLU(x), a vectorised pass over the heads, a few keys side by side. The top K of a
// token's score row are found by a radix select on the scores' order-preserving integer images (O(keys), see
// select_images) and only those K are sorted. With at least as many units as threads, units run in parallel; with
// fewer (decode: one token per sequence), the threads claim each unit's chunks one at a time instead, each also
// making the images of its chunks' scores and counting their first digits, so only the rest of the selection
// follows the products. The buffers are per thread and kept across calls (ThreadScratch).
// Backward and KL loss: one unit per query token; the key gradient is scattered into per-thread buffers that are
// summed at the end (no atomics; the sum order depends on the thread count only through the buffer split).
#include "cpu/sparse_attention/lightning_indexer_kernels.h"

#include "cpu/brgemm.h"
#include "cpu/vec_convert.h"

#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

namespace npu_fa::cpu::CPU_CAPABILITY {

namespace {

constexpr int64_t kQueryBlock = 8;
constexpr int64_t kKeyChunk = 256;

using sparse_attention::IndexerGeometry;

// out[h * ldo + j] = q[h] . k[j] for h < G, j < n; q [G, D], k [n, D] row-major.
template <typename T>
void dots(const T* q, int64_t G, const T* k, int64_t n, int64_t D, T* out, int64_t ldo) {
  using V = at::vec::Vectorized<T>;
  constexpr int64_t L = V::size();
  const int64_t Dv = D - D % L;
  for (int64_t j = 0; j < n; ++j) {
    const T* kj = k + j * D;
    int64_t h = 0;
    for (; h + 4 <= G; h += 4) {
      const T* q0 = q + h * D;
      const T* q1 = q0 + D;
      const T* q2 = q1 + D;
      const T* q3 = q2 + D;
      V a0(T(0)), a1(T(0)), a2(T(0)), a3(T(0));
      for (int64_t d = 0; d < Dv; d += L) {
        const V kv = V::loadu(kj + d);
        a0 = at::vec::fmadd(V::loadu(q0 + d), kv, a0);
        a1 = at::vec::fmadd(V::loadu(q1 + d), kv, a1);
        a2 = at::vec::fmadd(V::loadu(q2 + d), kv, a2);
        a3 = at::vec::fmadd(V::loadu(q3 + d), kv, a3);
      }
      T s0 = at::vec::vec_reduce_all<T>([](V& x, V& y) { return x + y; }, a0);
      T s1 = at::vec::vec_reduce_all<T>([](V& x, V& y) { return x + y; }, a1);
      T s2 = at::vec::vec_reduce_all<T>([](V& x, V& y) { return x + y; }, a2);
      T s3 = at::vec::vec_reduce_all<T>([](V& x, V& y) { return x + y; }, a3);
      for (int64_t d = Dv; d < D; ++d) {
        s0 += q0[d] * kj[d];
        s1 += q1[d] * kj[d];
        s2 += q2[d] * kj[d];
        s3 += q3[d] * kj[d];
      }
      out[h * ldo + j] = s0;
      out[(h + 1) * ldo + j] = s1;
      out[(h + 2) * ldo + j] = s2;
      out[(h + 3) * ldo + j] = s3;
    }
    for (; h < G; ++h) {
      const T* qh = q + h * D;
      V a(T(0));
      for (int64_t d = 0; d < Dv; d += L) a = at::vec::fmadd(V::loadu(qh + d), V::loadu(kj + d), a);
      T s = at::vec::vec_reduce_all<T>([](V& x, V& y) { return x + y; }, a);
      for (int64_t d = Dv; d < D; ++d) s += qh[d] * kj[d];
      out[h * ldo + j] = s;
    }
  }
}

// y[0..n) += a * x[0..n)
template <typename T>
inline void axpy(T a, const T* x, T* y, int64_t n) {
  using V = at::vec::Vectorized<T>;
  constexpr int64_t L = V::size();
  const V av(a);
  int64_t d = 0;
  for (; d + L <= n; d += L) at::vec::fmadd(av, V::loadu(x + d), V::loadu(y + d)).store(y + d);
  for (; d < n; ++d) y[d] += a * x[d];
}

// ---- top-k selection --------------------------------------------------------------------------------------

// The order-preserving unsigned image of a score: a < b (as numbers) iff key(a) < key(b). -0 is folded into +0
// (they compare equal, so their ties go by position like any other), and NaN maps to -inf's image: it ranks last,
// level with -inf.
template <typename A>
using KeyOf = std::conditional_t<std::is_same_v<A, double>, uint64_t, uint32_t>;

template <typename A>
inline KeyOf<A> score_key(A x) {
  using U = KeyOf<A>;
  constexpr int top = 8 * sizeof(U) - 1;
  if (std::isnan(x)) x = -std::numeric_limits<A>::infinity();
  x += A(0);  // -0 + 0 = +0
  U u;
  std::memcpy(&u, &x, sizeof(U));
  // negative: all bits flipped (larger magnitude, smaller image); positive: the sign bit set. Branch-free, so the
  // loop over a row vectorises.
  const U neg = U(0) - (u >> top);
  return u ^ (neg | (U(1) << top));
}

// One thread's buffers for top_k, reused across its rows.
template <typename A>
struct TopKScratch {
  std::vector<KeyOf<A>> keys;                     // the row's images
  std::vector<int32_t> hist;                      // one digit's histogram
  std::vector<int32_t> first;                     // the row's first-digit histogram
  std::vector<std::pair<KeyOf<A>, int32_t>> top;  // (image, position): the row's leaders, ascending position
  std::vector<int32_t> cand;                      // entries of top whose digits so far equal the k-th image's
};

constexpr int kDigitBits = 11;  // 2048 counters: the histogram stays in L1

// The digit of `width` bits at bit `lo` of every candidate's image, counted into ts.hist.
template <typename A>
void count_digits(TopKScratch<A>& ts, int lo, int width) {
  using U = KeyOf<A>;
  const U mask = (U(1) << width) - 1;
  ts.hist.assign(size_t(1) << width, 0);
  for (int32_t c : ts.cand) ++ts.hist[(ts.top[c].first >> lo) & mask];
}

// The digit where counting the histogram down from its largest digit reaches `rank`; rank becomes the rank within
// that digit.
inline int64_t kth_digit(const std::vector<int32_t>& hist, int64_t& rank) {
  int64_t d = static_cast<int64_t>(hist.size()) - 1, above = 0;
  while (above + hist[d] < rank) above += hist[d--];
  rank -= above;
  return d;
}

constexpr int64_t kBins = int64_t(1) << kDigitBits;

// Images of the scores sc[s0, s1) into key[s0, s1); NaN scores are rewritten to -inf (the values the op returns).
template <typename A>
void score_images(A* sc, int64_t s0, int64_t s1, KeyOf<A>* key) {
  constexpr A kNegInf = -std::numeric_limits<A>::infinity();
  for (int64_t s = s0; s < s1; ++s) {
    const A v = std::isnan(sc[s]) ? kNegInf : sc[s];
    sc[s] = v;
    key[s] = score_key(v);
  }
}

// Adds the first digits (the top kDigitBits bits) of the images key[s0, s1) into h4: four interleaved histograms of
// kBins counters (neighbouring scores often share a first digit, and one counter incremented back to back waits on
// its own store each time), summed by fold_histograms. The counts are integers, so any split of a row into ranges
// counted separately and summed gives the same histogram.
template <typename U>
void count_first_digits(const U* key, int64_t s0, int64_t s1, int32_t* h4) {
  constexpr int lo0 = 8 * sizeof(U) - kDigitBits;
  int64_t t = s0;
  for (; t + 4 <= s1; t += 4) {
    ++h4[key[t] >> lo0];
    ++h4[kBins + (key[t + 1] >> lo0)];
    ++h4[2 * kBins + (key[t + 2] >> lo0)];
    ++h4[3 * kBins + (key[t + 3] >> lo0)];
  }
  for (; t < s1; ++t) ++h4[key[t] >> lo0];
}

// hist[d] += the count of digit d in the four histograms of h4.
inline void fold_histograms(const int32_t* h4, int32_t* hist) {
  for (int64_t d = 0; d < kBins; ++d) hist[d] += h4[d] + h4[kBins + d] + h4[2 * kBins + d] + h4[3 * kBins + d];
}

// The kk (<= n) largest of a row of n scores by (score descending, position ascending), their positions written to
// idx in that order, from the scores' images key[0..n) and (when kk < n) the histogram `first` of their first digits.
// A radix select on the images, most significant digit first: the first digit's histogram fixes the k-th image's
// first digit d0; one pass over the row keeps (image, position) of everything with a first digit >= d0 (the leaders:
// the kk - rank above the k-th image's digit and the candidates level with it). The next digits' histograms run over
// the candidates only, until the k-th image T is known whole; then the leaders above T and the first `rank` level
// with T (the lowest positions) are the top kk, and only those are sorted. O(n) with no data-dependent comparisons
// of the row, unlike an index-array nth_element.
template <typename A>
void select_images(const KeyOf<A>* key, int64_t n, int64_t kk, const int32_t* first, TopKScratch<A>& ts,
                   int32_t* idx) {
  using U = KeyOf<A>;
  constexpr int kBits = 8 * sizeof(U), lo0 = kBits - kDigitBits;
  auto& top = ts.top;
  top.clear();
  if (kk == n) {
    for (int64_t s = 0; s < n; ++s) top.emplace_back(key[s], static_cast<int32_t>(s));
  } else {
    ts.hist.assign(first, first + kBins);
    int64_t rank = kk;
    const U d0 = static_cast<U>(kth_digit(ts.hist, rank));
    ts.cand.clear();
    for (int64_t s = 0; s < n; ++s) {
      const U d = key[s] >> lo0;
      if (d < d0) continue;
      if (d == d0) ts.cand.push_back(static_cast<int32_t>(top.size()));
      top.emplace_back(key[s], static_cast<int32_t>(s));
    }
    U T = d0 << lo0;
    for (int hi = lo0; hi > 0;) {
      const int width = std::min(kDigitBits, hi), lo = hi - width;
      count_digits(ts, lo, width);
      const U d = static_cast<U>(kth_digit(ts.hist, rank));
      T |= d << lo;
      size_t m = 0;  // keep the candidates with this digit, in order
      for (int32_t c : ts.cand)
        if (((top[c].first >> lo) & ((U(1) << width) - 1)) == d) ts.cand[m++] = c;
      ts.cand.resize(m);
      hi = lo;
    }
    // T is the k-th image: keep the leaders above it and the first `rank` level with it
    size_t m = 0;
    for (const auto& e : top)
      if (e.first > T || (e.first == T && rank-- > 0)) top[m++] = e;
    top.resize(m);
  }
  std::sort(top.begin(), top.end(), [](const auto& a, const auto& b) {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
  });
  for (int64_t j = 0; j < kk; ++j) idx[j] = top[j].second;
}

// The top kk (<= n) of sc[0..n) as select_images orders them; NaN scores are rewritten to -inf.
template <typename A>
void top_k(A* sc, int64_t n, int64_t kk, TopKScratch<A>& ts, int32_t* idx) {
  ts.keys.resize(n);
  score_images(sc, 0, n, ts.keys.data());
  ts.first.assign(kBins, 0);
  if (kk < n) {
    ts.hist.assign(4 * kBins, 0);
    count_first_digits(ts.keys.data(), 0, n, ts.hist.data());
    fold_histograms(ts.hist.data(), ts.first.data());
  }
  select_images(ts.keys.data(), n, kk, ts.first.data(), ts, idx);
}

// ---- forward -------------------------------------------------------------------------------------------------

// Keys folded together by score_chunk: each key's sum is one chain of dependent multiply-adds over the heads, so
// several keys side by side keep the FMA units busy instead of waiting on one chain's latency.
constexpr int64_t kFoldKeys = 4;

// out[r] += sum_h w_h * ReLU(x_r,h) for the R keys r whose products x_r = x + r * ldx (G heads), x scaled by qs_h and
// ks[r] when qs is given (quant). Every key's sum runs in the same order whatever R is (vector lanes over the
// heads, their reduction, then the heads past the last full vector), so R changes the speed only.
template <int64_t R, typename A>
inline void fold_keys(const A* x, int64_t ldx, int64_t G, const A* w, const A* qs, const A* ks, A* out) {
  using V = at::vec::Vectorized<A>;
  constexpr int64_t L = V::size();
  V acc[R];
  for (int64_t r = 0; r < R; ++r) acc[r] = V(A(0));
  int64_t h = 0;
  for (; h + L <= G; h += L) {
    const V wv = V::loadu(w + h);
    for (int64_t r = 0; r < R; ++r) {
      V v = V::loadu(x + r * ldx + h);
      if (qs) v = v * V::loadu(qs + h) * V(ks[r]);
      acc[r] = at::vec::fmadd(at::vec::maximum(v, V(A(0))), wv, acc[r]);
    }
  }
  for (int64_t r = 0; r < R; ++r) {
    A sum = at::vec::vec_reduce_all<A>([](V& a, V& b) { return a + b; }, acc[r]);
    const A* xr = x + r * ldx;
    for (int64_t t = h; t < G; ++t) {
      const A v = qs ? xr[t] * qs[t] * ks[r] : xr[t];
      sum += w[t] * (v > A(0) ? v : A(0));
    }
    out[r] += sum;
  }
}

// A work unit of the forward: a block of query tokens [i0, i1) of sequence b against key head n2.
struct Unit {
  int64_t b, n2, i0, i1;
};

// How a unit's chunk products run. kVnni: the 16-bit key rows are brgemm's A operand as they sit in the cache
// (no conversion), against the unit's queries packed once as a VNNI B = [q_1 .. q_nb]ᵀ. kFp32: the chunk is converted
// to fp32 rows, against the fp32 B. kDots: at::vec dot products (fp64, or a machine where brgemm refuses both).
enum class Product { kVnni, kFp32, kDots };

// One thread's buffers for a unit: the packed queries (B [D, nb * G]), a chunk of keys in A and their dequant
// scales, and the chunk's products C [kKeyChunk, nb * G] (row j: key j against every head of every token; kDots
// builds them through `t`).
template <typename A, typename key_t>
struct ChunkScratch {
  std::vector<key_t> b16;  // kVnni
  std::vector<A> b, kbuf, kscale, dots, t;
  void size_for(int64_t D, int64_t cols) {
    kbuf.resize(kKeyChunk * D);
    kscale.resize(kKeyChunk);
    dots.resize(kKeyChunk * cols);
  }
};

// A thread's buffers, kept from call to call: they only grow (to the largest call the thread served), so a stream
// of decode steps allocates nothing large. Allocated per call, a 128k-key row's buffers (512 KiB of scores, as much
// of images) would depend on the allocator keeping them mapped: glibc can serve blocks of 128 KiB and more by mmap,
// whose pages the kernel zero-fills again on first touch.
template <typename A, typename key_t>
struct ThreadScratch {
  ChunkScratch<A, key_t> chunk;
  TopKScratch<A> order;
  std::vector<A> scores;  // the score rows of the unit this thread prepares
  // decode: the images of those rows, and every thread's four-way first-digit histograms of every row
  std::vector<KeyOf<A>> images;
  std::vector<int32_t> counts;
};

template <typename A, typename key_t>
ThreadScratch<A, key_t>& thread_scratch() {
  static thread_local ThreadScratch<A, key_t> scratch;
  return scratch;
}

template <typename A, typename key_t>
class IndexerForward {
 public:
  explicit IndexerForward(const IndexerForwardParams& p)
      : p_(p), g_(*p.geo), q_(static_cast<const A*>(p.q)), w_(static_cast<const A*>(p.w)),
        qs_(static_cast<const A*>(p.qscale)), key_(static_cast<const key_t*>(p.key)), product_(choose_product()),
        panel_(product_ == Product::kVnni ? brgemm_vnni_panel(c10::CppTypeToScalarType<key_t>::value) : 0) {}

  void run() {
    std::vector<Unit> units;
    for (int64_t b = 0; b < g_.B; ++b)
      for (int64_t n2 = 0; n2 < g_.N2; ++n2)
        for (int64_t i0 = 0; i0 < g_.q_len[b]; i0 += kQueryBlock)
          units.push_back({b, n2, i0, std::min(g_.q_len[b], i0 + kQueryBlock)});
    const int64_t n_units = static_cast<int64_t>(units.size());
    const int64_t cols = kQueryBlock * g_.G;
    if (n_units >= at::get_num_threads()) {
      // Enough units for every thread: each unit scores and selects on one thread, its buffers reused.
      at::parallel_for(0, n_units, 1, [&](int64_t u0, int64_t u1) {
        ThreadScratch<A, key_t>& ts = thread_scratch<A, key_t>();
        ts.chunk.size_for(g_.D, cols);
        for (int64_t u = u0; u < u1; ++u) {
          const int64_t vmax = prepare(units[u], ts.scores);
          pack_queries(units[u], ts.chunk);
          for (int64_t c0 = 0; c0 < vmax; c0 += kKeyChunk) score_chunk(units[u], vmax, c0, ts.chunk, ts.scores.data());
          for (int64_t i = units[u].i0; i < units[u].i1; ++i)
            select_top(units[u], vmax, i, ts.scores.data(), ts.order);
        }
        release();
      });
      return;
    }
    // Decode and other short batches: fewer units than threads, so the threads share each unit's keys instead
    // (the chunks' score columns are disjoint). Each thread also takes the images of the scores it produced and
    // counts their first digits while they are in cache, so of each token's selection only select_images (one pass
    // over the row's images, then the candidates) is left for after the keys. The rows are this thread's.
    ThreadScratch<A, key_t>& mine = thread_scratch<A, key_t>();
    const int64_t n_threads = at::get_num_threads();
    for (const Unit& un : units) {
      const int64_t vmax = prepare(un, mine.scores);
      const int64_t nb = un.i1 - un.i0, chunks = (vmax + kKeyChunk - 1) / kKeyChunk;
      mine.images.resize(nb * vmax);
      mine.counts.assign(n_threads * nb * 4 * kBins, 0);
      // The threads claim the chunks one at a time rather than a fixed half each: on cores shared with other
      // processes a thread that is descheduled for a while leaves its chunks to the others instead of holding up
      // the whole step. A chunk's scores do not depend on the thread that makes them, and the histograms are
      // summed, so the results are the same for any claiming order.
      std::atomic<int64_t> next_chunk{0};
      at::parallel_for(0, std::min(n_threads, chunks), 1, [&](int64_t, int64_t) {
        ThreadScratch<A, key_t>& ts = thread_scratch<A, key_t>();
        ts.chunk.size_for(g_.D, cols);
        pack_queries(un, ts.chunk);
        // (clamped: called inside an outer parallel region, the body runs inline on a thread of that region)
        const int64_t t = std::min<int64_t>(at::get_thread_num(), n_threads - 1);
        int32_t* counts = mine.counts.data() + t * nb * 4 * kBins;
        for (int64_t c = next_chunk++; c < chunks; c = next_chunk++) {
          score_chunk(un, vmax, c * kKeyChunk, ts.chunk, mine.scores.data());
          image_chunk(un, vmax, c * kKeyChunk, mine.scores.data(), mine.images.data(), counts);
        }
        release();
      });
      at::parallel_for(un.i0, un.i1, 1, [&](int64_t i0, int64_t i1) {
        TopKScratch<A>& order = thread_scratch<A, key_t>().order;
        for (int64_t i = i0; i < i1; ++i) {
          const int64_t r = i - un.i0;
          order.first.assign(kBins, 0);
          for (int64_t t = 0; t < n_threads; ++t)
            fold_histograms(mine.counts.data() + (t * nb + r) * 4 * kBins, order.first.data());
          select_top(un, vmax, i, mine.scores.data(), order, mine.images.data() + r * vmax);
        }
      });
    }
  }

 private:
  Product choose_product() const {
    if constexpr (!std::is_same_v<A, float>) {
      return Product::kDots;
    } else {
      constexpr bool k16 = std::is_same_v<key_t, c10::BFloat16> || std::is_same_v<key_t, c10::Half>;
      if constexpr (k16) {
        // (the query was converted from the key's dtype, so packing it back to 16 bits is exact)
        if (g_.D % 2 == 0 && p_.qscale == nullptr && brgemm_vnni_panel(c10::CppTypeToScalarType<key_t>::value) > 0)
          return Product::kVnni;
      }
      return brgemm_usable(at::kFloat) ? Product::kFp32 : Product::kDots;
    }
  }

  void release() const {
    if (product_ != Product::kDots) brgemm::release(product_ == Product::kVnni);
  }

  // Sizes the unit's score rows (one per token, as long as its last token's visible keys) and zeroes them.
  int64_t prepare(const Unit& un, std::vector<A>& scores) const {
    int64_t vmax = 0;
    for (int64_t i = un.i0; i < un.i1; ++i) vmax = std::max(vmax, g_.visible_keys(un.b, i));
    scores.assign((un.i1 - un.i0) * std::max<int64_t>(vmax, 1), A(0));
    return vmax;
  }

  const A* query(const Unit& un, int64_t i) const {
    return q_ + ((g_.q_start[un.b] + i) * g_.N1 + un.n2 * g_.G) * g_.D;
  }

  // B = [q_i0 .. q_i1-1]ᵀ, D x (nb * G): column (i - i0) * G + h is query head h of token i.
  void pack_queries(const Unit& un, ChunkScratch<A, key_t>& cs) const {
    if (product_ == Product::kDots) return;
    const int64_t G = g_.G, D = g_.D, cols = (un.i1 - un.i0) * G;
    std::vector<A>& b = cs.b;
    b.assign(D * cols, A(0));
    for (int64_t i = un.i0; i < un.i1; ++i) {
      const A* qi = query(un, i);
      for (int64_t h = 0; h < G; ++h)
        for (int64_t d = 0; d < D; ++d) b[d * cols + (i - un.i0) * G + h] = qi[h * D + d];
    }
    if constexpr (sizeof(key_t) == 2) {
      if (product_ == Product::kVnni) {
        std::vector<key_t> rows(b.size());
        for (size_t e = 0; e < b.size(); ++e) rows[e] = static_cast<key_t>(b[e]);
        cs.b16.resize(b.size());
        brgemm::pack_rows_vnni(rows.data(), cols, D, cols, panel_, cs.b16.data());
      }
    }
  }

  // C[j, (i - i0) * G + h] = q_i,h . key (c0 + j) for the chunk [c0, c1), and the keys' dequant scales.
  void chunk_products(const Unit& un, int64_t c0, int64_t c1, ChunkScratch<A, key_t>& cs) const {
    const int64_t D = g_.D, N2 = g_.N2, G = g_.G, nb = un.i1 - un.i0, cols = nb * G;
    for (int64_t s = c0; s < c1;) {
      int64_t run = 0;
      const int64_t row = g_.key_row(un.b, s, c1 - s, &run);
      const int64_t j = s - c0;
      const key_t* src = key_ + (row * N2 + un.n2) * D;
      if (p_.kscale)
        for (int64_t r = 0; r < run; ++r) cs.kscale[j + r] = static_cast<A>(p_.kscale[(row + r) * N2 + un.n2]);
      if (product_ == Product::kVnni) {
        if constexpr (std::is_same_v<A, float> && sizeof(key_t) == 2)
          brgemm::mm_panels(run, cols, D, src, N2 * D, cs.b16.data(), cols, cs.dots.data() + j * cols, cols, false,
                            panel_);
      } else {
        for (int64_t r = 0; r < run; ++r) to_acc(src + r * N2 * D, D, cs.kbuf.data() + (j + r) * D);
      }
      s += run;
    }
    const int64_t n = c1 - c0;
    if (product_ == Product::kFp32) {
      if constexpr (std::is_same_v<A, float>)
        brgemm::mm(n, cols, D, cs.kbuf.data(), D, cs.b.data(), cols, cs.dots.data(), cols, false);
    } else if (product_ == Product::kDots) {
      // [G, n] per token, transposed into C's layout
      std::vector<A>& t = cs.t;
      t.resize(G * n);
      for (int64_t i = un.i0; i < un.i1; ++i) {
        dots(query(un, i), G, cs.kbuf.data(), n, D, t.data(), n);
        for (int64_t h = 0; h < G; ++h)
          for (int64_t jj = 0; jj < n; ++jj) cs.dots[jj * cols + (i - un.i0) * G + h] = t[h * n + jj];
      }
    }
  }

  // Adds sum_h w_h * ReLU(q_h . k) of the chunk starting at c0 into every token's score row.
  void score_chunk(const Unit& un, int64_t vmax, int64_t c0, ChunkScratch<A, key_t>& cs, A* scores) const {
    const int64_t c1 = std::min(vmax, c0 + kKeyChunk), N1 = g_.N1, G = g_.G, cols = (un.i1 - un.i0) * G;
    chunk_products(un, c0, c1, cs);
    for (int64_t i = un.i0; i < un.i1; ++i) {
      const int64_t vi = g_.visible_keys(un.b, i);
      if (vi <= c0) continue;
      const int64_t n = std::min(c1, vi) - c0;
      const int64_t row = g_.q_start[un.b] + i;
      const A* wrow = w_ + row * N1 + un.n2 * G;
      const A* qsrow = qs_ ? qs_ + row * N1 + un.n2 * G : nullptr;
      A* sc = scores + (i - un.i0) * vmax + c0;
      const A* x = cs.dots.data() + (i - un.i0) * G;
      const A* ks = qsrow ? cs.kscale.data() : nullptr;
      int64_t j = 0;
      for (; j + kFoldKeys <= n; j += kFoldKeys)
        fold_keys<kFoldKeys>(x + j * cols, cols, G, wrow, qsrow, ks ? ks + j : nullptr, sc + j);
      for (; j < n; ++j) fold_keys<1>(x + j * cols, cols, G, wrow, qsrow, ks ? ks + j : nullptr, sc + j);
    }
  }

  // The images and first-digit counts (into each row's four-way histogram of `counts`) of the chunk starting at c0,
  // for the decode selection.
  void image_chunk(const Unit& un, int64_t vmax, int64_t c0, A* scores, KeyOf<A>* images, int32_t* counts) const {
    const int64_t c1 = std::min(vmax, c0 + kKeyChunk);
    for (int64_t i = un.i0; i < un.i1; ++i) {
      const int64_t r = i - un.i0, s1 = std::min(c1, g_.visible_keys(un.b, i));
      if (s1 <= c0) continue;
      score_images(scores + r * vmax, c0, s1, images + r * vmax);
      count_first_digits(images + r * vmax, c0, s1, counts + r * 4 * kBins);
    }
  }

  // The top K of token i's row (descending score, ties by the lower position; NaN ranks as -inf), by the radix
  // selection of top_k, written to indices and values. With `images`, the row's images and its first-digit
  // histogram (ts.first) are already made (image_chunk), and only select_images runs.
  void select_top(const Unit& un, int64_t vmax, int64_t i, A* scores, TopKScratch<A>& ts,
                  const KeyOf<A>* images = nullptr) const {
    const int64_t vi = g_.visible_keys(un.b, i), K = p_.K, N2 = g_.N2;
    if (vi == 0) return;
    A* sc = scores + (i - un.i0) * vmax;
    const int64_t kk = std::min(K, vi);
    const int64_t o = ((g_.q_start[un.b] + i) * N2 + un.n2) * K;
    if (images)
      select_images(images, vi, kk, ts.first.data(), ts, p_.indices + o);
    else
      top_k(sc, vi, kk, ts, p_.indices + o);
    A* values = static_cast<A*>(p_.values);
    if (values)
      for (int64_t j = 0; j < kk; ++j) values[o + j] = sc[p_.indices[o + j]];
  }

  const IndexerForwardParams& p_;
  const IndexerGeometry& g_;
  const A* q_;
  const A* w_;
  const A* qs_;
  const key_t* key_;
  const Product product_;
  const int64_t panel_;
};

template <typename A, typename key_t>
void forward_impl(const IndexerForwardParams& p) {
  IndexerForward<A, key_t>(p).run();
}

void lightning_indexer_forward(const IndexerForwardParams& p) {
  if (p.dbl) {
    TORCH_CHECK(p.key_dtype == at::kDouble, "lightning_indexer: float64 accumulation needs a float64 key");
    forward_impl<double, double>(p);
    return;
  }
  switch (p.key_dtype) {
    case at::kFloat: forward_impl<float, float>(p); break;
    case at::kHalf: forward_impl<float, c10::Half>(p); break;
    case at::kBFloat16: forward_impl<float, c10::BFloat16>(p); break;
    case at::kChar: forward_impl<float, int8_t>(p); break;
    default: TORCH_CHECK(false, "lightning_indexer: unsupported key dtype ", p.key_dtype);
  }
}

// ---- backward ------------------------------------------------------------------------------------------------

// Per-thread accumulation buffers for a gradient that many units scatter into; summed into `out` at the end.
template <typename A>
struct ScatterBuffers {
  int64_t n;
  std::vector<std::vector<A>> per_thread;
  explicit ScatterBuffers(int64_t n_) : n(n_), per_thread(at::get_num_threads()) {}
  A* mine() {
    auto& v = per_thread[at::get_thread_num()];
    if (v.empty()) v.assign(n, A(0));
    return v.data();
  }
  void sum_into(A* out) const {
    for (const auto& v : per_thread)
      if (!v.empty())
        for (int64_t i = 0; i < n; ++i) out[i] += v[i];
  }
};

template <typename A>
void grad_impl(const IndexerGradParams& p) {
  const IndexerGeometry& g = *p.geo;
  const int64_t N1 = g.N1, N2 = g.N2, G = g.G, D = g.D, K = p.K;
  const A* q = static_cast<const A*>(p.q);
  const A* k = static_cast<const A*>(p.k);
  const A* w = static_cast<const A*>(p.w);
  const A* dy = static_cast<const A*>(p.dy);
  A* dq = static_cast<A*>(p.dq);
  A* dw = static_cast<A*>(p.dw);
  std::vector<std::pair<int64_t, int64_t>> units;  // (b, i)
  for (int64_t b = 0; b < g.B; ++b)
    for (int64_t i = 0; i < g.q_len[b]; ++i) units.emplace_back(b, i);
  ScatterBuffers<A> dk_bufs(g.k_rows * N2 * D);
  at::parallel_for(0, static_cast<int64_t>(units.size()), 1, [&](int64_t u0, int64_t u1) {
    std::vector<A> kbuf, S, coef;
    std::vector<int64_t> krow, jsel;
    A* dk = dk_bufs.mine();
    for (int64_t u = u0; u < u1; ++u) {
      const int64_t b = units[u].first, i = units[u].second;
      const int64_t row = g.q_start[b] + i, vis = g.visible_keys(b, i);
      for (int64_t n2 = 0; n2 < N2; ++n2) {
        const int64_t* ir = p.idx + (row * N2 + n2) * K;
        const A* dyr = dy + (row * N2 + n2) * K;
        krow.clear();
        jsel.clear();
        for (int64_t j = 0; j < K; ++j)
          if (ir[j] >= 0 && ir[j] < vis) {
            krow.push_back(g.key_row(b, ir[j], 1, nullptr));
            jsel.push_back(j);
          }
        const int64_t n = static_cast<int64_t>(krow.size());
        if (n == 0) continue;
        kbuf.resize(n * D);
        for (int64_t j = 0; j < n; ++j) std::copy_n(k + (krow[j] * N2 + n2) * D, D, kbuf.data() + j * D);
        S.resize(G * n);
        coef.resize(G * n);
        const A* qr = q + (row * N1 + n2 * G) * D;
        dots(qr, G, kbuf.data(), n, D, S.data(), n);
        for (int64_t h = 0; h < G; ++h) {
          const A wh = w[row * N1 + n2 * G + h];
          A dwh = 0;
          for (int64_t j = 0; j < n; ++j) {
            const A s = S[h * n + j], d = dyr[jsel[j]];
            dwh += s > A(0) ? d * s : A(0);
            coef[h * n + j] = s > A(0) ? d * wh : A(0);
          }
          dw[row * N1 + n2 * G + h] += dwh;
          A* dqh = dq + (row * N1 + n2 * G + h) * D;
          for (int64_t j = 0; j < n; ++j)
            if (coef[h * n + j] != A(0)) axpy(coef[h * n + j], kbuf.data() + j * D, dqh, D);
        }
        for (int64_t j = 0; j < n; ++j) {
          A* dkr = dk + (krow[j] * N2 + n2) * D;
          for (int64_t h = 0; h < G; ++h)
            if (coef[h * n + j] != A(0)) axpy(coef[h * n + j], qr + h * D, dkr, D);
        }
      }
    }
  });
  dk_bufs.sum_into(static_cast<A*>(p.dk));
}

void lightning_indexer_grad(const IndexerGradParams& p) {
  if (p.dbl)
    grad_impl<double>(p);
  else
    grad_impl<float>(p);
}

// ---- KL loss -------------------------------------------------------------------------------------------------

template <typename A>
void kl_impl(const IndexerKlParams& p) {
  const IndexerGeometry& g = *p.geo;
  const int64_t Ni = g.N1, Di = g.D, N1 = p.N1, D = p.D, Dr = p.Dr, K = p.K;
  const A* q = static_cast<const A*>(p.q);
  const A* k = static_cast<const A*>(p.k);
  const A* qr = static_cast<const A*>(p.qr);
  const A* kr = static_cast<const A*>(p.kr);
  const A* smax = static_cast<const A*>(p.smax);
  const A* ssum = static_cast<const A*>(p.ssum);
  const A* sinks = static_cast<const A*>(p.sinks);
  const A* qi = static_cast<const A*>(p.qi);
  const A* ki = static_cast<const A*>(p.ki);
  const A* w = static_cast<const A*>(p.w);
  A* dqi = static_cast<A*>(p.dqi);
  A* dw = static_cast<A*>(p.dw);
  std::vector<std::pair<int64_t, int64_t>> units;
  for (int64_t b = 0; b < g.B; ++b)
    for (int64_t i = 0; i < g.q_len[b]; ++i) units.emplace_back(b, i);
  ScatterBuffers<A> dk_bufs(g.k_rows * Di);
  std::vector<double> loss_part(units.size(), 0.0);
  at::parallel_for(0, static_cast<int64_t>(units.size()), 1, [&](int64_t u0, int64_t u1) {
    std::vector<A> kb, krb, kib, L, Lr, S, target, pi, coef;
    std::vector<int64_t> krow;
    A* dk = dk_bufs.mine();
    for (int64_t u = u0; u < u1; ++u) {
      const int64_t b = units[u].first, i = units[u].second;
      const int64_t row = g.q_start[b] + i, vis = g.visible_keys(b, i);
      const int64_t* ir = p.idx + row * K;
      krow.clear();
      for (int64_t j = 0; j < K; ++j)
        if (ir[j] >= 0 && ir[j] < vis) krow.push_back(g.key_row(b, ir[j], 1, nullptr));
      const int64_t n = static_cast<int64_t>(krow.size());
      if (n == 0) continue;
      kb.resize(n * D);
      kib.resize(n * Di);
      for (int64_t j = 0; j < n; ++j) {
        std::copy_n(k + krow[j] * D, D, kb.data() + j * D);
        std::copy_n(ki + krow[j] * Di, Di, kib.data() + j * Di);
      }
      // target: per head probabilities of the selected keys, summed over heads, L1-normalised
      L.resize(N1 * n);
      dots(q + row * N1 * D, N1, kb.data(), n, D, L.data(), n);
      if (Dr > 0) {
        krb.resize(n * Dr);
        Lr.resize(N1 * n);
        for (int64_t j = 0; j < n; ++j) std::copy_n(kr + krow[j] * Dr, Dr, krb.data() + j * Dr);
        dots(qr + row * N1 * Dr, N1, krb.data(), n, Dr, Lr.data(), n);
        for (int64_t x = 0; x < N1 * n; ++x) L[x] += Lr[x];
      }
      target.assign(n, A(0));
      for (int64_t h = 0; h < N1; ++h) {
        const A m = smax[row * N1 + h];
        A den = ssum[row * N1 + h];
        if (sinks) den += std::exp(sinks[h] - m);
        for (int64_t j = 0; j < n; ++j) target[j] += std::exp(static_cast<A>(p.scale) * L[h * n + j] - m) / den;
      }
      A tsum = 0;
      for (int64_t j = 0; j < n; ++j) tsum += target[j];
      if (!(tsum > A(0))) continue;
      for (int64_t j = 0; j < n; ++j) target[j] /= tsum;
      // the indexer's scores and their softmax
      S.resize(Ni * n);
      dots(qi + row * Ni * Di, Ni, kib.data(), n, Di, S.data(), n);
      pi.assign(n, A(0));
      for (int64_t h = 0; h < Ni; ++h) {
        const A wh = w[row * Ni + h];
        for (int64_t j = 0; j < n; ++j) pi[j] += S[h * n + j] > A(0) ? wh * S[h * n + j] : A(0);
      }
      A mx = -std::numeric_limits<A>::infinity();
      for (int64_t j = 0; j < n; ++j) mx = std::max(mx, pi[j]);
      A z = 0;
      for (int64_t j = 0; j < n; ++j) z += std::exp(pi[j] - mx);
      const A logz = std::log(z) + mx;
      double loss = 0;
      for (int64_t j = 0; j < n; ++j) {
        const A logpi = pi[j] - logz;
        if (target[j] > A(0)) loss += static_cast<double>(target[j] * (std::log(target[j]) - logpi));
        pi[j] = std::exp(logpi) - target[j];  // dI
      }
      loss_part[u] = loss;
      coef.resize(Ni * n);
      for (int64_t h = 0; h < Ni; ++h) {
        const A wh = w[row * Ni + h];
        A dwh = 0;
        for (int64_t j = 0; j < n; ++j) {
          const A s = S[h * n + j];
          dwh += s > A(0) ? pi[j] * s : A(0);
          coef[h * n + j] = s > A(0) ? pi[j] * wh : A(0);
        }
        dw[row * Ni + h] = dwh;
        A* dqh = dqi + (row * Ni + h) * Di;
        for (int64_t j = 0; j < n; ++j)
          if (coef[h * n + j] != A(0)) axpy(coef[h * n + j], kib.data() + j * Di, dqh, Di);
      }
      for (int64_t j = 0; j < n; ++j) {
        A* dkr = dk + krow[j] * Di;
        const A* qh = qi + row * Ni * Di;
        for (int64_t h = 0; h < Ni; ++h)
          if (coef[h * n + j] != A(0)) axpy(coef[h * n + j], qh + h * Di, dkr, Di);
      }
    }
  });
  dk_bufs.sum_into(static_cast<A*>(p.dki));
  double total = 0;
  for (double v : loss_part) total += v;  // a fixed order: independent of the thread count
  *p.loss = total;
}

void lightning_indexer_kl(const IndexerKlParams& p) {
  if (p.dbl)
    kl_impl<double>(p);
  else
    kl_impl<float>(p);
}

}  // namespace

NPU_FA_REGISTER_ISA_KERNEL(lightning_indexer_forward_stub, lightning_indexer_forward);
NPU_FA_REGISTER_ISA_KERNEL(lightning_indexer_grad_stub, lightning_indexer_grad);
NPU_FA_REGISTER_ISA_KERNEL(lightning_indexer_kl_stub, lightning_indexer_kl);

}  // namespace npu_fa::cpu::CPU_CAPABILITY
