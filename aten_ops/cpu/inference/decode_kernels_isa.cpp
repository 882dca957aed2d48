// Decode attention (one query token per sequence) over a contiguous or paged KV cache. Compiled three times by
// setup.py (-DCPU_CAPABILITY=DEFAULT|AVX2|AVX512), so at::vec::Vectorized has that ISA's width.
//
// Work items are (sequence b, KV head n2, chunk of keys). The G = N1/N2 query heads sharing a KV head are processed
// together, so every K/V row is read from memory once per group. Each item keeps an online softmax (running max m,
// running sum l, unnormalised fp32 accumulator) per query head over tiles of at most kTile keys (tiles never cross a
// cache block). The key axis is split into chunks whose size depends only on the shapes and lengths (never on the
// thread count), and the partial results of one (b, n2) are merged in chunk order with their log-sum-exp
// (flash-decoding), so results are bit-identical for any number of threads.
//
// Decode is memory-bound, so the inner loops are shaped around the K/V stream: Q·Kᵀ takes 4 keys x up to 4 query
// rows per register block (one shuffle tree sums 4 dot products), P·V walks the V rows in memory order with the
// accumulators in registers, and the next tile's K/V rows are prefetched while the current tile is computed.
//
// int8 caches (KV antiquant, x = (x_int8 + offset) * scale) are read as int8 and multiplied in integers (int16 query
// and probabilities, exact int32 sums: vpdpwssd with AVX512-VNNI, vpmaddwd with AVX2) or converted to fp32 in
// registers; the factors never touch the inner loops: per-channel key factors are folded into q (q·((k + o)·s) =
// (q·s)·k + (q·s)·o), per-token key factors scale each score, per-token value factors scale the probabilities and
// per-channel value factors apply to the normalised output, so the stream of cache bytes is half that of bf16.
#include "common/inference/nz_cache.h"
#include "cpu/inference/decode_kernels.h"
#include "cpu/int_dot.h"
#include "cpu/online_softmax.h"
#include "cpu/softmax_exp.h"
#include "cpu/stage_timing.h"

#ifndef CPU_CAPABILITY
#error "this *_isa.cpp must be compiled with -DCPU_CAPABILITY=DEFAULT|AVX2|AVX512 (setup.py does this)"
#endif

#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>

#if defined(CPU_CAPABILITY_AVX512) || defined(CPU_CAPABILITY_AVX2)
#include <immintrin.h>
#endif

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <vector>

namespace npu_fa::cpu::CPU_CAPABILITY {
namespace {

using Vec = at::vec::Vectorized<float>;
using attention::kNzBytes;
using online_softmax::nan_max;
constexpr int64_t kTile = 32;                         // keys per online-softmax step
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

inline int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

// Vec::size() values of row[0, VL) as fp32 (the caller guarantees they exist).
template <typename T>
inline Vec load_full(const T* row) {
  if constexpr (std::is_same_v<T, float>) {
    return Vec::loadu(row);
  } else if constexpr (std::is_same_v<T, int8_t>) {  // sign-extend to int32, then convert (exact)
#if defined(CPU_CAPABILITY_AVX512)
    return Vec(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row)))));
#elif defined(CPU_CAPABILITY_AVX2)
    return Vec(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(row)))));
#else
    alignas(64) float tmp[Vec::size()];
    for (int64_t i = 0; i < Vec::size(); ++i) tmp[i] = static_cast<float>(row[i]);
    return Vec::loadu(tmp);
#endif
  } else {
    Vec out;
    at::vec::load_to_float<T>(row, out);
    return out;
  }
}

// Vec::size() values of row[d, d + VL) as fp32; positions >= D read as 0. kFull: d + VL <= D is known.
template <bool kFull = false, typename T>
inline Vec load_f32(const T* row, int64_t d, int64_t D) {
  if (kFull || d + Vec::size() <= D) return load_full(row + d);
  alignas(64) float tmp[Vec::size()] = {};
  for (int64_t i = d; i < D; ++i) tmp[i - d] = static_cast<float>(row[i]);
  return Vec::loadu(tmp);
}

// The rows of the tile an item reads next, requested from memory a few lines at a time while the current tile is
// worked on, so their cache misses overlap with that work (the hardware prefetchers lose track at every tile/block
// boundary and on per-head strides). prefetcht1 (to L2): prefetcht0 (to L1) measured slower on the benchmark
// machine, likely because the L1 cannot hold the next tile next to the current one.
struct NextTile {
  const char *k = nullptr, *v = nullptr;  // the next tile's first K and V row (head h0)
  int64_t n = 0;                          // its keys (0: no next tile)
  int64_t k_seq = 0, k_head = 0, v_seq = 0, v_head = 0, row_bytes = 0;  // strides in bytes

  static void line(const char* a) {
#if defined(__x86_64__)
    // Inline asm: with GCC 12 the __builtin_prefetch calls of this kernel compiled to no instruction at all.
    asm volatile("prefetcht1 %0" : : "m"(*a));
#else
    __builtin_prefetch(a, 0, 2);
#endif
  }
  // NZ blocks: a row is `pieces` runs of 32 bytes, piece_k / piece_v bytes apart (pieces == 0: plain rows).
  int64_t pieces = 0, piece_k = 0, piece_v = 0;
  // K and V lines of key t, KV head hh of the next tile.
  void key(int64_t t, int64_t hh) const {
    if (t >= n) return;
    const char* kr = k + t * k_seq + hh * k_head;
    const char* vr = v + t * v_seq + hh * v_head;
    if (pieces) {  // one line per piece holds keys (t, t + 1): requested at the even key
      if (t & 1) return;
      for (int64_t c = 0; c < pieces; ++c) {
        line(kr + c * piece_k);
        line(vr + c * piece_v);
      }
      return;
    }
    for (int64_t o = 0; o < row_bytes; o += 64) {
      line(kr + o);
      line(vr + o);
    }
  }
};

// out[c] = Σ lanes of a[c] for c < KB. With AVX-512 four sums share one add/shuffle tree (~3 ops per sum instead of
// a full horizontal reduction each).
template <int KB>
inline void sum_lanes(const Vec* a, float* out) {
#if defined(CPU_CAPABILITY_AVX512)
  if constexpr (KB == 4) {
    const __m512 a0 = a[0], a1 = a[1], a2 = a[2], a3 = a[3];
    // Per 128-bit lane: t01 = [a0 02, a1 02, a0 13, a1 13] (pair sums), then u = [a0, a1, a2, a3] lane partials.
    const __m512 t01 = _mm512_add_ps(_mm512_unpacklo_ps(a0, a1), _mm512_unpackhi_ps(a0, a1));
    const __m512 t23 = _mm512_add_ps(_mm512_unpacklo_ps(a2, a3), _mm512_unpackhi_ps(a2, a3));
    const __m512 u = _mm512_add_ps(_mm512_shuffle_ps(t01, t23, _MM_SHUFFLE(1, 0, 1, 0)),
                                   _mm512_shuffle_ps(t01, t23, _MM_SHUFFLE(3, 2, 3, 2)));
    const __m256 h = _mm256_add_ps(_mm512_castps512_ps256(u),
                                   _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(u), 1)));
    _mm_storeu_ps(out, _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1)));
    return;
  }
#elif defined(CPU_CAPABILITY_AVX2)
  if constexpr (KB == 2 || KB == 4) {  // horizontal adds: per 128-bit lane [a0, a1, a2, a3] partials, then the lanes
    const __m256 h01 = _mm256_hadd_ps(a[0], a[1]);
    const __m256 h23 = KB == 4 ? _mm256_hadd_ps(a[KB / 2], a[KB - 1]) : h01;
    const __m256 h = _mm256_hadd_ps(h01, h23);
    const __m128 r = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
    if constexpr (KB == 4) {
      _mm_storeu_ps(out, r);
    } else {
      out[0] = _mm_cvtss_f32(r);
      out[1] = _mm_cvtss_f32(_mm_movehdup_ps(r));
    }
    return;
  }
#endif
  for (int c = 0; c < KB; ++c) out[c] = at::vec::vec_reduce_all<float>(std::plus<Vec>(), a[c]);
}

// Raw dot products s[gg * ld + c] = q_gg · k_c of GN query rows (qr, row stride Dp) and KB key rows (k0, stride
// k_seq). GN and KB are compile-time constants so the GN x KB accumulators stay in registers; each loaded q chunk
// serves KB keys and each key chunk GN rows.
template <int GN, int KB, typename T>
inline void qk_block(const float* qr, int64_t Dp, const T* k0, int64_t k_seq, int64_t D, float* s, int64_t ld) {
  Vec a[GN][KB];
  for (int gg = 0; gg < GN; ++gg)
    for (int c = 0; c < KB; ++c) a[gg][c] = Vec(0.f);
  auto step = [&](int64_t d, auto full) {
    Vec kv[KB];
    for (int c = 0; c < KB; ++c) kv[c] = load_f32<decltype(full)::value>(k0 + c * k_seq, d, D);
    for (int gg = 0; gg < GN; ++gg) {
      const Vec qv = Vec::loadu(qr + gg * Dp + d);
      for (int c = 0; c < KB; ++c) a[gg][c] = at::vec::fmadd(qv, kv[c], a[gg][c]);
    }
  };
  int64_t d = 0;
  for (; d + Vec::size() <= D; d += Vec::size()) step(d, std::true_type());
  if (d < D) step(d, std::false_type());  // the zero-padded tail of a head dim that is no multiple of VL
  for (int gg = 0; gg < GN; ++gg) sum_lanes<KB>(a[gg], s + gg * ld);
}

// Rows handled together by the blocked Q·Kᵀ (at most 4, so 4 rows x kQkKeys keys of accumulators fit in registers).
inline int qk_row_block(int64_t remaining) { return remaining >= 4 ? 4 : remaining >= 2 ? 2 : 1; }
// Keys per Q·Kᵀ register block: 4 with AVX-512's 32 vector registers; 2 with the 16 of AVX2, where 4 x 4
// accumulators plus the key and query vectors do not fit and the compiler spills accumulators every step.
constexpr int kQkKeys = Vec::size() >= 16 ? 4 : 2;

// The register blocks of a tile's Q·Kᵀ: keys [t0, t1) KB at a time (one at a time at the tail), the G query rows of
// each of HT heads 4, 2 or 1 at a time; block(gn, kb, t, hh, g0) gets gn and kb as std::integral_constant so the
// kernel it calls has compile-time sizes. The next tile's lines of each key are prefetched on the way. (Not for the
// functions with their own ISA attributes below: a lambda would lose those.)
template <int KB, typename Block>
inline void for_qk_blocks(int64_t G, int64_t HT, int64_t t0, int64_t t1, const NextTile& next, const Block& block) {
  for (int64_t t = t0; t < t1;) {
    const bool full = t + KB <= t1;
    for (int64_t hh = 0; hh < HT; ++hh) {
      for (int c = 0; c < (full ? KB : 1); ++c) next.key(t + c, hh);
      for (int64_t g0 = 0; g0 < G;) {
        const int gn = qk_row_block(G - g0);
        const auto rows = [&](auto kb) {
          switch (gn) {
            case 4: return block(std::integral_constant<int, 4>(), kb, t, hh, g0);
            case 2: return block(std::integral_constant<int, 2>(), kb, t, hh, g0);
            default: return block(std::integral_constant<int, 1>(), kb, t, hh, g0);
          }
        };
        if (full) {
          rows(std::integral_constant<int, KB>());
        } else {
          rows(std::integral_constant<int, 1>());
        }
        g0 += gn;
      }
    }
    t += full ? KB : 1;
  }
}

// Raw dot products s[r * ld + t] for the R = HT*G query rows (qbuf, stride Dp) and keys [t0, t1) of a tile.
template <typename T>
void qk_keys(const float* qbuf, int64_t Dp, int64_t G, int64_t HT, const T* k0, int64_t k_seq, int64_t k_head,
             int64_t D, int64_t t0, int64_t t1, float* s, int64_t ld, const NextTile& next) {
  for_qk_blocks<kQkKeys>(G, HT, t0, t1, next, [&](auto gn, auto kb, int64_t t, int64_t hh, int64_t g0) {
    const int64_t r = hh * G + g0;
    qk_block<gn.value, kb.value>(qbuf + r * Dp, Dp, k0 + t * k_seq + hh * k_head, k_seq, D, s + r * ld + t, ld);
  });
}

// acc[gg, d : d + NV*VL] += Σ_t p[gg, t] · v_t[d : d + NV*VL] for GN rows over the n keys of a tile. The GN x NV
// accumulators stay in registers while the keys stream by, so each V row segment is read once, in memory order.
template <int GN, int NV, bool kFull, typename T>
inline void pv_rows(float* acc, int64_t Dp, const float* p, const T* vh, int64_t v_seq, int64_t n, int64_t d,
                    int64_t D) {
  Vec a[GN][NV];
  for (int gg = 0; gg < GN; ++gg)
    for (int c = 0; c < NV; ++c) a[gg][c] = Vec::loadu(acc + gg * Dp + d + c * Vec::size());
  for (int64_t t = 0; t < n; ++t) {
    const T* vrow = vh + t * v_seq;
    Vec vv[NV];
    for (int c = 0; c < NV; ++c) vv[c] = load_f32<kFull>(vrow, d + c * Vec::size(), D);
    for (int gg = 0; gg < GN; ++gg) {
      const Vec pg(p[gg * kTile + t]);
      for (int c = 0; c < NV; ++c) a[gg][c] = at::vec::fmadd(pg, vv[c], a[gg][c]);
    }
  }
  for (int gg = 0; gg < GN; ++gg)
    for (int c = 0; c < NV; ++c) a[gg][c].store(acc + gg * Dp + d + c * Vec::size());
}

// P·V for GN (compile-time) rows over all of Dp: chunks of NV vectors (about 16 accumulators), then single vectors.
template <int GN, typename T>
inline void pv_rows_all(float* acc, int64_t Dp, const float* p, const T* vh, int64_t v_seq, int64_t n, int64_t D) {
  // About 8 accumulators with AVX2's 16 vector registers, 16 with AVX-512's 32; at most 4 vectors per chunk.
  constexpr int NV = std::clamp((Vec::size() >= 16 ? 16 : 8) / GN, 1, 4);
  int64_t d = 0;
  for (; d + NV * Vec::size() <= D; d += NV * Vec::size()) pv_rows<GN, NV, true>(acc, Dp, p, vh, v_seq, n, d, D);
  for (; d < Dp; d += Vec::size()) pv_rows<GN, 1, false>(acc, Dp, p, vh, v_seq, n, d, D);
}

// Rows [g0, g0 + gn) handled by the widest register block that fits: 8, 4, 2 or 1.
inline int row_block(int64_t remaining) { return remaining >= 8 ? 8 : remaining >= 4 ? 4 : remaining >= 2 ? 2 : 1; }

#if defined(CPU_CAPABILITY_AVX512)
inline bool bf16_dot_available() {
  static const bool ok = __builtin_cpu_supports("avx512bf16") && std::getenv("NPU_FA_NO_BF16_DOT") == nullptr;
  return ok;
}

// Raw dot products s[gg * ld + c] = q_gg · k_c of GN query rows (bf16, [GN, D]) and KB key rows (stride k_seq) with
// vdpbf16ps (pairs of bf16 products summed in fp32). D % 32 == 0.
template <int GN, int KB>
__attribute__((target("avx512f,avx512bw,avx512dq,avx512bf16"))) inline void qk_block_bf16(
    const uint16_t* qr, int64_t D, const uint16_t* k0, int64_t k_seq, float* s, int64_t ld) {
  Vec a[GN][KB];
  for (int gg = 0; gg < GN; ++gg)
    for (int c = 0; c < KB; ++c) a[gg][c] = Vec(0.f);
  for (int64_t d = 0; d < D; d += 32) {
    __m512bh kv[KB];
    for (int c = 0; c < KB; ++c) kv[c] = (__m512bh)_mm512_loadu_si512(k0 + c * k_seq + d);
    for (int gg = 0; gg < GN; ++gg) {
      const __m512bh qv = (__m512bh)_mm512_loadu_si512(qr + gg * D + d);
      for (int c = 0; c < KB; ++c) a[gg][c] = Vec(_mm512_dpbf16_ps(a[gg][c], qv, kv[c]));
    }
  }
  for (int gg = 0; gg < GN; ++gg) sum_lanes<KB>(a[gg], s + gg * ld);
}

// qk_keys for bf16 query/key rows with vdpbf16ps. Not inlined: only this function needs the ISA flag.
__attribute__((target("avx512f,avx512bw,avx512dq,avx512bf16"), noinline)) void qk_keys_bf16(
    const at::BFloat16* q, int64_t G, int64_t HT, int64_t D, const uint16_t* k0, int64_t k_seq, int64_t k_head,
    int64_t t0, int64_t t1, float* s, int64_t ld, const NextTile& next) {
  const uint16_t* qb = reinterpret_cast<const uint16_t*>(q);
  for (int64_t t = t0; t < t1;) {
    const bool four = t + 4 <= t1;
    for (int64_t hh = 0; hh < HT; ++hh) {
      for (int c = 0; c < (four ? 4 : 1); ++c) next.key(t + c, hh);
      const uint16_t* kb = k0 + t * k_seq + hh * k_head;
      for (int64_t g0 = 0; g0 < G;) {
        const int gn = qk_row_block(G - g0);
        const uint16_t* qr = qb + (hh * G + g0) * D;
        float* sr = s + (hh * G + g0) * ld + t;
        if (four) {
          switch (gn) {
            case 4: qk_block_bf16<4, 4>(qr, D, kb, k_seq, sr, ld); break;
            case 2: qk_block_bf16<2, 4>(qr, D, kb, k_seq, sr, ld); break;
            default: qk_block_bf16<1, 4>(qr, D, kb, k_seq, sr, ld); break;
          }
        } else {
          switch (gn) {
            case 4: qk_block_bf16<4, 1>(qr, D, kb, k_seq, sr, ld); break;
            case 2: qk_block_bf16<2, 1>(qr, D, kb, k_seq, sr, ld); break;
            default: qk_block_bf16<1, 1>(qr, D, kb, k_seq, sr, ld); break;
          }
        }
        g0 += gn;
      }
    }
    t += four ? 4 : 1;
  }
}
#endif

#if defined(CPU_CAPABILITY_AVX512) || defined(CPU_CAPABILITY_AVX2)
// The query rows of one item as int16 for the integer Q·Kᵀ (vpdpwssd / vpmaddwd): q' ≈ sq · q16 with sq = max|q'| / 32767 per row (rounding
// ~1.5e-5 of the row's max, far below bf16's 2^-9; the products with the int8 keys are exact integers).
struct Int8Query {
  std::vector<int16_t> q16;  // [R, D]
  std::vector<float> sq;     // [R]
};

// q' rows (fp32, stride Dp) -> int16; false when a row is not finite (that item takes the fp32 path).
inline bool quantise_query(const float* qbuf, int64_t Dp, int64_t R, int64_t D, Int8Query& iq) {
  for (int64_t r = 0; r < R; ++r) {
    const float* qr = qbuf + r * Dp;
    float mx = 0.f;
    for (int64_t d = 0; d < D; ++d) mx = std::max(mx, std::abs(qr[d]));
    if (!std::isfinite(mx)) return false;
    iq.sq[r] = mx / 32767.f;
    const float inv = mx > 0.f ? 32767.f / mx : 0.f;
    for (int64_t d = 0; d < D; ++d) {  // round half away from zero (vectorisable, unlike nearbyint)
      const float x = qr[d] * inv;
      iq.q16[r * D + d] = static_cast<int16_t>(std::clamp(x + (x >= 0.f ? 0.5f : -0.5f), -32767.f, 32767.f));
    }
  }
  return true;
}

#endif

#if defined(CPU_CAPABILITY_AVX512)
inline bool int8_dot_available() {  // the variable is read per call, for A/B timing in one process
  static const bool cpu = __builtin_cpu_supports("avx512vnni");
  return cpu && std::getenv("NPU_FA_NO_INT8_DOT") == nullptr;
}

// acc += Σ pairs a·b in int32 lanes (vpdpwssd), as inline asm: with the intrinsic GCC copies every accumulator of
// an unrolled register block to a fresh register and back around each instruction (measured: ~half the
// instructions of the int8 inner loops were such moves).
__attribute__((target("avx512f,avx512bw,avx512dq,avx512vnni"), always_inline)) inline __m512i dpwssd(
    __m512i acc, __m512i a, __m512i b) {
  asm("vpdpwssd %2, %1, %0" : "+v"(acc) : "v"(a), "v"(b));
  return acc;
}

// Integer dot products of GN int16 query rows (stride D) and KB int8 key rows (stride k_seq), the keys sign-extended
// to int16 in registers and multiplied with vpdpwssd (2 products summed into each int32 lane; exact). The lane sums
// are converted to fp32 (rounding ~6e-8 relative), reduced and scaled by the row's query scale:
// s[gg * ld + c] = sq[gg] · (q16_gg · k_c). D % 32 == 0; ND = D / 32 when known at compile time (0: runtime D), so
// the D loop unrolls and the GN x KB accumulators stay in registers.
template <int GN, int KB, int ND>
__attribute__((target("avx512f,avx512bw,avx512dq,avx512vnni"), always_inline)) inline void qk_block_i16(
    const int16_t* q, int64_t D, const int8_t* k0, int64_t k_seq, const float* sq, float* s, int64_t ld) {
  __m512i a[GN][KB];
  for (int gg = 0; gg < GN; ++gg)
    for (int c = 0; c < KB; ++c) a[gg][c] = _mm512_setzero_si512();
  const int64_t dn = ND > 0 ? ND * 32 : D;
#pragma GCC unroll 8
  for (int64_t d = 0; d < dn; d += 32) {
    __m512i kv[KB];
    for (int c = 0; c < KB; ++c)
      kv[c] = _mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(k0 + c * k_seq + d)));
    for (int gg = 0; gg < GN; ++gg) {
      const __m512i qv = _mm512_loadu_si512(q + gg * D + d);
      for (int c = 0; c < KB; ++c) a[gg][c] = dpwssd(a[gg][c], qv, kv[c]);
    }
  }
  for (int gg = 0; gg < GN; ++gg) {
    if constexpr (KB == 4) {  // the add/shuffle tree of sum_lanes in int32 (exact), one conversion per 4 sums
      const __m512i t01 = _mm512_add_epi32(_mm512_unpacklo_epi32(a[gg][0], a[gg][1]),
                                           _mm512_unpackhi_epi32(a[gg][0], a[gg][1]));
      const __m512i t23 = _mm512_add_epi32(_mm512_unpacklo_epi32(a[gg][2], a[gg][3]),
                                           _mm512_unpackhi_epi32(a[gg][2], a[gg][3]));
      const __m512 f01 = _mm512_castsi512_ps(t01), f23 = _mm512_castsi512_ps(t23);
      const __m512i u = _mm512_add_epi32(_mm512_castps_si512(_mm512_shuffle_ps(f01, f23, _MM_SHUFFLE(1, 0, 1, 0))),
                                         _mm512_castps_si512(_mm512_shuffle_ps(f01, f23, _MM_SHUFFLE(3, 2, 3, 2))));
      const __m256i h = _mm256_add_epi32(_mm512_castsi512_si256(u), _mm512_extracti64x4_epi64(u, 1));
      const __m128 f = _mm_cvtepi32_ps(_mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1)));
      _mm_storeu_ps(s + gg * ld, _mm_mul_ps(f, _mm_set1_ps(sq[gg])));
    } else {
      for (int c = 0; c < KB; ++c)
        s[gg * ld + c] = sq[gg] * static_cast<float>(_mm512_reduce_add_epi32(a[gg][c]));
    }
  }
}

// qk_keys for an int8 key cache with vpdpwssd: scores s[r * ld + t] = q'_r · k_t for keys [0, n) of a tile.
template <int ND>
__attribute__((target("avx512f,avx512bw,avx512dq,avx512vnni"), always_inline)) inline void qk_keys_i16_nd(
    const Int8Query& iq, int64_t r0, int64_t G, int64_t HT, int64_t D, const int8_t* k0, int64_t k_seq,
    int64_t k_head, int64_t n, float* s, int64_t ld, const NextTile& next) {
  for (int64_t t = 0; t < n;) {
    const bool four = t + 4 <= n;
    for (int64_t hh = 0; hh < HT; ++hh) {
      for (int c = 0; c < (four ? 4 : 1); ++c) next.key(t + c, hh);
      const int8_t* kb = k0 + t * k_seq + hh * k_head;
      for (int64_t g0 = 0; g0 < G;) {
        const int gn = qk_row_block(G - g0);
        const int16_t* qr = iq.q16.data() + (r0 + hh * G + g0) * D;
        const float* sq = iq.sq.data() + r0 + hh * G + g0;
        float* sr = s + (hh * G + g0) * ld + t;
        if (four) {
          switch (gn) {
            case 4: qk_block_i16<4, 4, ND>(qr, D, kb, k_seq, sq, sr, ld); break;
            case 2: qk_block_i16<2, 4, ND>(qr, D, kb, k_seq, sq, sr, ld); break;
            default: qk_block_i16<1, 4, ND>(qr, D, kb, k_seq, sq, sr, ld); break;
          }
        } else {
          switch (gn) {
            case 4: qk_block_i16<4, 1, ND>(qr, D, kb, k_seq, sq, sr, ld); break;
            case 2: qk_block_i16<2, 1, ND>(qr, D, kb, k_seq, sq, sr, ld); break;
            default: qk_block_i16<1, 1, ND>(qr, D, kb, k_seq, sq, sr, ld); break;
          }
        }
        g0 += gn;
      }
    }
    t += four ? 4 : 1;
  }
}

// Not inlined into the caller: only these functions need the ISA flags. The common head dims get an unrolled D loop.
__attribute__((target("avx512f,avx512bw,avx512dq,avx512vnni"), noinline)) void qk_keys_i16(
    const Int8Query& iq, int64_t r0, int64_t G, int64_t HT, int64_t D, const int8_t* k0, int64_t k_seq,
    int64_t k_head, int64_t n, float* s, int64_t ld, const NextTile& next) {
  switch (D) {
    case 64: return qk_keys_i16_nd<2>(iq, r0, G, HT, D, k0, k_seq, k_head, n, s, ld, next);
    case 128: return qk_keys_i16_nd<4>(iq, r0, G, HT, D, k0, k_seq, k_head, n, s, ld, next);
    case 256: return qk_keys_i16_nd<8>(iq, r0, G, HT, D, k0, k_seq, k_head, n, s, ld, next);
    default: return qk_keys_i16_nd<0>(iq, r0, G, HT, D, k0, k_seq, k_head, n, s, ld, next);
  }
}

// acc[gg, :] += Σ_t p[gg, t] · v_t for GN rows over the n keys of a tile, in integers: p' = sp · p16 (int16, sp =
// max p / 32767 per row: rounding ~1.5e-5 of the row's max, far below bf16's), and pairs of keys (t, t+1) of each
// 64-column chunk interleaved byte-wise and sign-extended to int16 so that vpdpwssd sums p16_t·v_t + p16_t+1·v_t+1
// into each int32 lane (exact). The interleave runs per 128-bit lane, so the four int32 vectors of a chunk hold, in
// their two 256-bit halves, the columns base + [0, 8) and base + 16 + [0, 8) with base = 0, 32, 8, 40.
template <int GN>
__attribute__((target("avx512f,avx512bw,avx512dq,avx512vnni"))) inline void pv_block_i16(
    float* acc, int64_t Dp, const int32_t* pp, int64_t pp_ld, const float* sp, const int8_t* vh, int64_t v_seq,
    int64_t n, int64_t D) {
  static constexpr int kBase[4] = {0, 32, 8, 40};
  const int64_t pairs = (n + 1) / 2;
  for (int64_t d0 = 0; d0 < D; d0 += 64) {
    __m512i a[GN][4];
    for (int gg = 0; gg < GN; ++gg)
      for (int j = 0; j < 4; ++j) a[gg][j] = _mm512_setzero_si512();
    const int8_t* vr = vh + d0;
    for (int64_t t2 = 0; t2 < pairs; ++t2, vr += 2 * v_seq) {  // (a lambda would lose the function's ISA flags)
      const __m512i r0 = _mm512_loadu_si512(vr);
      const __m512i r1 = 2 * t2 + 1 < n ? _mm512_loadu_si512(vr + v_seq) : _mm512_setzero_si512();
      const __m512i u = _mm512_unpacklo_epi8(r0, r1), w = _mm512_unpackhi_epi8(r0, r1);
      const __m512i x[4] = {_mm512_cvtepi8_epi16(_mm512_castsi512_si256(u)),
                            _mm512_cvtepi8_epi16(_mm512_extracti64x4_epi64(u, 1)),
                            _mm512_cvtepi8_epi16(_mm512_castsi512_si256(w)),
                            _mm512_cvtepi8_epi16(_mm512_extracti64x4_epi64(w, 1))};
      for (int gg = 0; gg < GN; ++gg) {
        const __m512i pb = _mm512_set1_epi32(pp[gg * pp_ld + t2]);
        for (int j = 0; j < 4; ++j) a[gg][j] = dpwssd(a[gg][j], x[j], pb);
      }
    }
    for (int gg = 0; gg < GN; ++gg) {
      const __m512 sc = _mm512_set1_ps(sp[gg]);
      float* ar = acc + gg * Dp + d0;
      for (int j = 0; j < 4; ++j) {
        const __m512 f = _mm512_mul_ps(_mm512_cvtepi32_ps(a[gg][j]), sc);
        float* lo = ar + kBase[j];
        float* hi = lo + 16;
        _mm256_storeu_ps(lo, _mm256_add_ps(_mm256_loadu_ps(lo), _mm512_castps512_ps256(f)));
        _mm256_storeu_ps(hi, _mm256_add_ps(_mm256_loadu_ps(hi), _mm512_extractf32x8_ps(f, 1)));
      }
    }
  }
}

// P·V of the G rows of one KV head (probabilities p, stride kTile, 0 from column n on) for an int8 value cache,
// D % 64 == 0; false (nothing done) when a row's probabilities are not finite (the caller takes the fp32 path).
// pp: >= G*(kTile/2) scratch, sp: >= G.
__attribute__((target("avx512f,avx512bw,avx512dq,avx512vnni"), noinline)) bool pv_i16(
    float* acc, int64_t Dp, const float* p, int64_t G, const int8_t* vh, int64_t v_seq, int64_t n, int64_t D,
    int32_t* pp, float* sp) {
  constexpr int64_t ld = kTile / 2;
  static_assert(kTile % 16 == 0);
  for (int64_t r = 0; r < G; ++r) {
    const float* pr = p + r * kTile;
    __m512 m = _mm512_setzero_ps();
    // max |p|: per-token value factors (p · scale) may be negative
    for (int64_t t = 0; t < kTile; t += 16) m = _mm512_max_ps(m, _mm512_abs_ps(_mm512_loadu_ps(pr + t)));
    const float mx = _mm512_reduce_max_ps(m);
    if (!std::isfinite(mx)) return false;
    sp[r] = mx / 32767.f;
    const __m512 inv = _mm512_set1_ps(mx > 0.f ? 32767.f / mx : 0.f);
    // int16 values in key order: read back as int32, element t/2 holds keys (t, t+1) as (low, high) halves.
    for (int64_t t = 0; t < kTile; t += 16)
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(pp + r * ld + t / 2),
                          _mm512_cvtepi32_epi16(_mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(pr + t), inv))));
  }
  for (int64_t g0 = 0; g0 < G;) {
    const int gn = qk_row_block(G - g0);
    float* ar = acc + g0 * Dp;
    switch (gn) {
      case 4: pv_block_i16<4>(ar, Dp, pp + g0 * ld, ld, sp + g0, vh, v_seq, n, D); break;
      case 2: pv_block_i16<2>(ar, Dp, pp + g0 * ld, ld, sp + g0, vh, v_seq, n, D); break;
      default: pv_block_i16<1>(ar, Dp, pp + g0 * ld, ld, sp + g0, vh, v_seq, n, D); break;
    }
    g0 += gn;
  }
  return true;
}
#endif

#if defined(CPU_CAPABILITY_AVX2)
// int8 caches on AVX2 CPUs: the same integer products as the AVX512-VNNI path above with vpmaddwd (pairs of int16
// products summed into int32 lanes, exact) followed by vpaddd. Against converting each int8 to fp32 (two
// conversions per 8 values), one sign extension per 16 values remains. The loops also read NZ blocks in place:
// value d of a row sits at (d / 32) * piece + d % 32 from the row's start (ND rows: piece = 32, so at d), and every
// 16-value step stays inside one 32-byte piece.
inline bool int8_dot_available() {  // the variable is read per call, for A/B timing in one process
  return std::getenv("NPU_FA_NO_INT8_DOT") == nullptr;
}

inline const int8_t* piece_at(const int8_t* row, int64_t d, int64_t piece) { return row + (d >> 5) * piece + (d & 31); }

// s[gg * ld + c] = sq[gg] · (q16_gg · k_c) for GN int16 query rows (stride D) and KB int8 key rows (stride k_seq).
template <int GN, int KB>
inline void qk_block_i16(const int16_t* q, int64_t D, const int8_t* k0, int64_t k_seq, int64_t piece,
                         const float* sq, float* s, int64_t ld) {
  __m256i a[GN][KB];
  for (int gg = 0; gg < GN; ++gg)
    for (int c = 0; c < KB; ++c) a[gg][c] = _mm256_setzero_si256();
  for (int64_t d = 0; d < D; d += 16) {
    const int8_t* kd = piece_at(k0, d, piece);
    __m256i kv[KB];
    for (int c = 0; c < KB; ++c)
      kv[c] = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(kd + c * k_seq)));
    for (int gg = 0; gg < GN; ++gg) {
      const __m256i qv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + gg * D + d));
      for (int c = 0; c < KB; ++c) a[gg][c] = madd_acc(a[gg][c], qv, kv[c]);
    }
  }
  for (int gg = 0; gg < GN; ++gg) {  // integer horizontal sums (exact), then one conversion
    const __m256i h = _mm256_hadd_epi32(a[gg][0], a[gg][KB - 1]);
    const __m128i x = _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
    const __m128 f = _mm_mul_ps(_mm_cvtepi32_ps(_mm_hadd_epi32(x, x)), _mm_set1_ps(sq[gg]));  // [k_0, k_last, ...]
    s[gg * ld] = _mm_cvtss_f32(f);
    if constexpr (KB == 2) s[gg * ld + 1] = _mm_cvtss_f32(_mm_movehdup_ps(f));
  }
}

// Scores s[r * ld + t] = q'_r · k_t of the G rows of HT heads for keys [0, n) of a tile (rows r0 + ... of iq).
void qk_keys_i16(const Int8Query& iq, int64_t r0, int64_t G, int64_t HT, int64_t D, const int8_t* k0,
                 int64_t k_seq, int64_t k_head, int64_t piece, int64_t n, float* s, int64_t ld, const NextTile& next) {
  for_qk_blocks<2>(G, HT, 0, n, next, [&](auto gn, auto kb, int64_t t, int64_t hh, int64_t g0) {
    const int64_t r = hh * G + g0;
    qk_block_i16<gn.value, kb.value>(iq.q16.data() + (r0 + r) * D, D, k0 + t * k_seq + hh * k_head, k_seq, piece,
                                     iq.sq.data() + r0 + r, s + r * ld + t, ld);
  });
}

// acc[gg, :] += sp[gg] · Σ_t p16[gg, t] · v_t for GN rows over the n keys of a tile: per 16 columns, the rows of
// keys (t, t+1) interleaved byte-wise and sign-extended to int16 pairs, so that vpmaddwd with the broadcast pair
// (p16_t, p16_t+1) gives p16_t·v_t + p16_t+1·v_t+1 per column (exact). pp: int32 element t/2 holds (p16_t, p16_t+1).
template <int GN>
inline void pv_block_i16(float* acc, int64_t Dp, const int32_t* pp, int64_t pp_ld, const float* sp,
                         const int8_t* vh, int64_t v_seq, int64_t piece, int64_t n, int64_t D) {
  const int64_t pairs = (n + 1) / 2;
  for (int64_t d0 = 0; d0 < D; d0 += 16) {
    __m256i a[GN][2];
    for (int gg = 0; gg < GN; ++gg) a[gg][0] = a[gg][1] = _mm256_setzero_si256();
    const int8_t* vr = piece_at(vh, d0, piece);
    for (int64_t t2 = 0; t2 < pairs; ++t2, vr += 2 * v_seq) {
      const __m128i r0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(vr));
      const __m128i r1 = 2 * t2 + 1 < n ? _mm_loadu_si128(reinterpret_cast<const __m128i*>(vr + v_seq))
                                        : _mm_setzero_si128();
      const __m256i x0 = _mm256_cvtepi8_epi16(_mm_unpacklo_epi8(r0, r1));  // columns d0 + [0, 8)
      const __m256i x1 = _mm256_cvtepi8_epi16(_mm_unpackhi_epi8(r0, r1));  // columns d0 + [8, 16)
      for (int gg = 0; gg < GN; ++gg) {
        const __m256i pb = _mm256_set1_epi32(pp[gg * pp_ld + t2]);
        a[gg][0] = madd_acc(a[gg][0], x0, pb);
        a[gg][1] = madd_acc(a[gg][1], x1, pb);
      }
    }
    for (int gg = 0; gg < GN; ++gg) {
      const __m256 sc = _mm256_set1_ps(sp[gg]);
      float* ar = acc + gg * Dp + d0;
      for (int j = 0; j < 2; ++j)
        _mm256_storeu_ps(ar + 8 * j, _mm256_fmadd_ps(_mm256_cvtepi32_ps(a[gg][j]), sc, _mm256_loadu_ps(ar + 8 * j)));
    }
  }
}

// P·V of the G rows of one KV head (probabilities p, stride kTile, 0 from column n on) for an int8 value cache;
// false (nothing done) when a row's probabilities are not finite (the caller takes the fp32 path). p' = sp · p16
// with sp = max |p| / 32767 per row (rounding ~1.5e-5 of the row's max, far below bf16's). pp: >= G*(kTile/2), sp: >= G.
bool pv_i16(float* acc, int64_t Dp, const float* p, int64_t G, const int8_t* vh, int64_t v_seq, int64_t piece,
            int64_t n, int64_t D, int32_t* pp, float* sp) {
  constexpr int64_t ld = kTile / 2;
  static_assert(kTile % 8 == 0);
  for (int64_t r = 0; r < G; ++r) {
    const float* pr = p + r * kTile;
    __m256 m = _mm256_setzero_ps();
    const __m256 sign = _mm256_set1_ps(-0.f);  // max |p|: per-token value factors (p · scale) may be negative
    for (int64_t t = 0; t < kTile; t += 8) m = _mm256_max_ps(m, _mm256_andnot_ps(sign, _mm256_loadu_ps(pr + t)));
    const float mx = at::vec::vec_reduce_all<float>([](Vec& x, Vec& y) { return at::vec::maximum(x, y); }, Vec(m));
    if (!std::isfinite(mx)) return false;
    sp[r] = mx / 32767.f;
    const __m256 inv = _mm256_set1_ps(mx > 0.f ? 32767.f / mx : 0.f);
    int16_t* p16 = reinterpret_cast<int16_t*>(pp + r * ld);
    for (int64_t t = 0; t < kTile; t += 8) {  // round to nearest even; |values| <= 32767, so the pack never saturates
      const __m256i w = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(pr + t), inv));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(p16 + t),
                       _mm_packs_epi32(_mm256_castsi256_si128(w), _mm256_extracti128_si256(w, 1)));
    }
  }
  for (int64_t g0 = 0; g0 < G;) {
    const int gn = qk_row_block(G - g0);
    float* ar = acc + g0 * Dp;
    switch (gn) {
      case 4: pv_block_i16<4>(ar, Dp, pp + g0 * ld, ld, sp + g0, vh, v_seq, piece, n, D); break;
      case 2: pv_block_i16<2>(ar, Dp, pp + g0 * ld, ld, sp + g0, vh, v_seq, piece, n, D); break;
      default: pv_block_i16<1>(ar, Dp, pp + g0 * ld, ld, sp + g0, vh, v_seq, piece, n, D); break;
    }
    g0 += gn;
  }
  return true;
}
#endif

// Rows [0, n) of D values of one head from an NZ block (docs/kv_cache.md "NZ layout") into dst.
template <typename C>
inline void gather_nz_rows(const C* src, int64_t piece, int64_t n, int64_t D, C* dst) {
  constexpr int64_t c0 = kNzBytes / static_cast<int64_t>(sizeof(C));
  attention::nz_rows_to_nd(src, piece, c0, c0, n, D, dst);
}

struct Task {
  int64_t b, h0, h1, j0, j1;  // logical keys [j0, j1) of sequence b, KV heads [h0, h1)
};

// The factor of an antiquant tensor for (b, KV head h, cache position pos, d).
inline float aq_at(const float* f, const attention::Antiquant& a, int64_t b, int64_t h, int64_t pos, int64_t d) {
  return f[b * a.s_b + h * a.s_h + pos * a.s_pos + d * a.s_d];
}

// T: the query/output dtype; C: the cache's (T, or int8_t for an int8 cache with p.k_quant / p.v_quant).
template <typename T, typename C = T>
void run(const DecodeParams& p, const float* q32, const C* kc, const C* vc, T* out) {
  constexpr bool kInt8 = std::is_same_v<C, int8_t>;
  const attention::Antiquant& kq = p.k_quant;
  const attention::Antiquant& vq = p.v_quant;
  const int64_t B = p.batch, N1 = p.q_heads, N2 = p.kv_heads, G = p.group, D = p.head_dim;
  const int64_t Dp = round_up(D, Vec::size());
  // When the KV heads of one position are adjacent in memory (BSH/BSND caches, paged (blocks, block, N2*D)), one
  // item takes all of them, so each cache row of N2*D values is read front to back; otherwise one head per item.
  const bool heads_together = std::abs(p.k_head) <= D && std::abs(p.v_head) <= D;
  const int64_t HT = heads_together ? N2 : 1;  // KV heads per item
  const int64_t R = HT * G;                     // query rows per item
  // Within a tile of such an item, 16-bit caches take one KV head at a time (Q·Kᵀ, softmax, P·V) rather than all
  // heads' scores first and then all P·V: that head's 32 K and V rows (8 KiB each at D=128) are still in L1 for
  // P·V, and the next tile's prefetches spread over the whole tile instead of bunching in the Q·Kᵀ phase. Measured
  // (one thread, B=4 N=32/8 S=8192 D=128 block 128, paged (blocks, block, N2*D)): bf16 1.07x -> 0.87-0.92x the
  // contiguous BNSD time with the item prefetch below, fp16 likewise; fp32 caches measured 5-10% slower per head
  // and int8 ones no faster, so they keep all heads together. Per-row math is unchanged, so results are identical either way.
  const int64_t hs_step = sizeof(C) == 2 ? 1 : HT;
  // bf16 caches on CPUs with AVX512-BF16: Q·Kᵀ with bf16 pair dot products (exact products, fp32 sums), the
  // scale applied to the dot product instead of to q.
  bool use_bf16_dot = false;
#if defined(CPU_CAPABILITY_AVX512)
  use_bf16_dot = std::is_same_v<C, at::BFloat16> && D % 32 == 0 && bf16_dot_available();
#endif
  // int8 caches: Q·Kᵀ and P·V in integers (the keys / values sign-extended to int16 against an int16 query /
  // probabilities; vpdpwssd with AVX512-VNNI, vpmaddwd with AVX2). D <= 512 keeps every int32 sum in range (at
  // most D products of magnitude <= 32767 · 128 = 4194176 < 2^31 / 512).
  bool use_i8_dot = false;
#if defined(CPU_CAPABILITY_AVX512) || defined(CPU_CAPABILITY_AVX2)
  use_i8_dot = kInt8 && D % 32 == 0 && D <= 512 && int8_dot_available();
#endif
  // With AVX2 the integer loops read NZ blocks in place (their 16-value steps never cross a 32-byte piece); the
  // AVX-512 ones take rows of D values, gathered per tile like the fp32 path's.
#if defined(CPU_CAPABILITY_AVX2)
  constexpr bool kI8InPlace = kInt8;
#else
  constexpr bool kI8InPlace = false;
#endif
  // int8 streams skip the software prefetch with AVX-512 only (see the measurements at pf_n below).
#if defined(CPU_CAPABILITY_AVX512)
  constexpr bool kI8StreamNoPrefetch = kInt8;
#else
  constexpr bool kI8StreamNoPrefetch = false;
#endif

  // Chunk size from shapes only: aim for >= 64 items overall, chunks of 256..8192 keys, whole blocks when paged.
  int64_t total_keys = 0;
  for (int64_t b = 0; b < B; ++b) total_keys += p.kv_len[b] * (N2 / HT);
  int64_t chunk = std::clamp<int64_t>((total_keys + 63) / 64, 256, 8192);
  chunk = round_up(chunk, p.paged ? std::max<int64_t>(p.block_size, kTile) : kTile);

  std::vector<Task> tasks;
  const int64_t n_groups = B * (N2 / HT);
  std::vector<int64_t> first(n_groups + 1, 0);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h0 = 0; h0 < N2; h0 += HT) {
      first[b * (N2 / HT) + h0 / HT] = static_cast<int64_t>(tasks.size());
      for (int64_t j0 = 0; j0 < p.kv_len[b]; j0 += chunk)
        tasks.push_back({b, h0, h0 + HT, j0, std::min(j0 + chunk, p.kv_len[b])});
    }
  first[n_groups] = static_cast<int64_t>(tasks.size());
  const int64_t n_tasks = first[n_groups];
  const int64_t part_stride = R * (Dp + 2);  // acc [R, Dp], m [R], l [R]
  std::vector<float> part(static_cast<size_t>(std::max<int64_t>(n_tasks, 1) * part_stride));

  // Items are handed out one at a time from a shared counter rather than as fixed ranges per thread: on a machine
  // shared with other processes a descheduled thread then delays only its current item, and the other threads take
  // the rest (with fixed ranges the call waits for the slowest thread's whole share). Each item writes its own
  // partial result, merged in chunk order below, so the output does not depend on which thread ran what.
  std::atomic<int64_t> next_task{0};
  const int64_t n_slots = std::min<int64_t>(n_tasks, at::get_num_threads());
  using St = stage_timing::Stage;
  at::parallel_for(0, n_slots, 1, [&](int64_t, int64_t) {
    StageClock clock;  // this worker's stage times (bench stages): one branch per lap when off
    std::vector<float> qbuf(R * Dp), s(R * kTile);
    std::vector<at::BFloat16> qb16(use_bf16_dot ? R * D : 0);
    // int8 key: kconst[r] = (q_r·s)·o (per-channel offset), qsum[r] = Σ q_r (per-token offset).
    std::vector<float> kconst(kInt8 ? R : 0), qsum(kInt8 ? R : 0);
#if defined(CPU_CAPABILITY_AVX512) || defined(CPU_CAPABILITY_AVX2)
    Int8Query iq;
    std::vector<int32_t> pp;
    std::vector<float> sp;
    if (use_i8_dot) {
      iq.q16.resize(R * D);
      iq.sq.resize(R);
      pp.resize(G * (kTile / 2));
      sp.resize(G);
    }
#endif
    // NZ caches: the tile's K and V rows assembled from their head-dim pieces (below), so the loops see rows.
    const bool nz = p.nz_c0 > 0;
    std::vector<C> kz(nz ? kTile * D : 0), vz(nz ? kTile * D : 0);
    // The tile of item `task` at logical key j: keys [j, j + n), inside one cache block, its first cache position.
    struct Tile {
      const C *k0, *v0;
      int64_t n, pos0;
    };
    auto locate = [&](const Task& task, int64_t j) {
      const int64_t b = task.b;
      int64_t blk = b, blk_first = 0, pos0 = p.kv_start[b] + j;
      int64_t n = std::min(kTile, task.j1 - j);
      if (p.paged) {
        const int64_t lb = j / p.block_size;
        blk = p.block_table[b * p.max_blocks + lb];
        blk_first = lb * p.block_size;
        n = std::min(n, blk_first + p.block_size - j);
        pos0 = j;
      }
      const int64_t in_blk = pos0 - blk_first;
      return Tile{kc + blk * p.k_blk + task.h0 * p.k_head + in_blk * p.k_seq,
                  vc + blk * p.v_blk + task.h0 * p.v_head + in_blk * p.v_seq, n, pos0};
    };
    // An item's last tile claims the next item and prefetches its first tile: with all KV heads per item (BSH,
    // paged (blocks, block, N2*D)) that first tile is N2 x 32 rows (128 KiB in the benchmark case), and reading it
    // cold at every item start measured ~5% of the paged bf16 decode time. Claiming early changes only which
    // thread runs an item, never the result.
    for (int64_t ti = next_task++, ti_next = -1; ti < n_tasks; ti = ti_next >= 0 ? ti_next : next_task++) {
      ti_next = -1;
      const Task& tk = tasks[ti];
      const int64_t b = tk.b;
      float* acc = part.data() + ti * part_stride;
      float* m = acc + R * Dp;
      float* l = m + R;
      std::fill(acc, acc + R * Dp, 0.f);
      std::fill(m, m + R, kNegInf);
      std::fill(l, l + R, 0.f);
      for (int64_t r = 0; r < R; ++r) {  // row r = query head tk.h0*G + r
        const float* src = q32 + (b * N1 + tk.h0 * G + r) * D;
        for (int64_t d = 0; d < D; ++d) qbuf[r * Dp + d] = src[d] * p.scale;
        if constexpr (kInt8) {
          const int64_t h = tk.h0 + r / G;
          float* qr = qbuf.data() + r * Dp;
          if (!kq.per_token)
            for (int64_t d = 0; d < D; ++d) qr[d] *= aq_at(kq.scale, kq, b, h, 0, d);
          float c = 0.f, sum = 0.f;
          if (kq.offset && !kq.per_token)
            for (int64_t d = 0; d < D; ++d) c += qr[d] * aq_at(kq.offset, kq, b, h, 0, d);
          if (kq.offset && kq.per_token)
            for (int64_t d = 0; d < D; ++d) sum += qr[d];
          kconst[r] = c;
          qsum[r] = sum;
        }
        if (use_bf16_dot)
          for (int64_t d = 0; d < D; ++d) qb16[r * D + d] = static_cast<at::BFloat16>(src[d]);  // exact: q was bf16
        std::fill(qbuf.data() + r * Dp + D, qbuf.data() + (r + 1) * Dp, 0.f);
      }
      const uint8_t* mrow = p.mask ? p.mask + b * p.mask_sb : nullptr;
      bool item_i8 = false;
#if defined(CPU_CAPABILITY_AVX512) || defined(CPU_CAPABILITY_AVX2)
      if (use_i8_dot) item_i8 = quantise_query(qbuf.data(), Dp, R, D, iq);
#endif

      clock.lap(St::kDecFinish);
      int64_t j = tk.j0;
      Tile cur = locate(tk, j);
      while (j < tk.j1) {
        const int64_t n = cur.n, pos0 = cur.pos0;
        const C *k0 = cur.k0, *v0 = cur.v0;
        Tile nx{nullptr, nullptr, 0, 0};
        if (j + n < tk.j1) {
          nx = locate(tk, j + n);
        } else {
          ti_next = next_task++;
          if (ti_next < n_tasks) nx = locate(tasks[ti_next], tasks[ti_next].j0);
        }
        constexpr int64_t es = sizeof(C);
        // int8 with AVX-512: no software prefetch when the next tile continues the current one in memory as a dense
        // stream of short rows (one head's keys of a contiguous BNSD cache or of a (blocks, N2, block, D) block): the
        // hardware prefetchers follow it, and the prefetch instructions only queued behind its misses (measured: B=4
        // N2=8 S=8192 BNSD int8 decode 6.9 -> 5.6 ms on one thread). With AVX2 (slower loops, a 4 KiB tile = one
        // page, where the hardware prefetchers stop) the prefetch gains instead: same shape, one thread, 22.4 ->
        // 20.3 ms, paged head-major 22.1 -> 19.6 ms; two threads 15.8 -> 13.1 and 15.2 -> 12.0 ms (AMD EPYC, AVX2).
        const bool stream = nx.k0 == k0 + n * p.k_seq && nx.v0 == v0 + n * p.v_seq && p.k_seq == D && p.v_seq == D;
        const int64_t pf_n = kI8StreamNoPrefetch && stream ? 0 : nx.n;
        NextTile next{reinterpret_cast<const char*>(nx.k0), reinterpret_cast<const char*>(nx.v0), pf_n,
                      p.k_seq * es, p.k_head * es, p.v_seq * es, p.v_head * es, D * es};
        int64_t k_seq = p.k_seq, v_seq = p.v_seq;
        // Elements from piece 0 of a row to piece 1 for the AVX2 integer loops: 32 in a row of D values (ND caches
        // and gathered tiles), the NZ block's piece stride when they read it in place.
        int64_t k_piece = 32, v_piece = 32;
        const bool in_place = nz && kI8InPlace && item_i8;
        if (nz) {
          // A tile of an NZ block is D / c0 runs of n * 32 bytes: the next tile's lines are prefetched key by key
          // (each of its pieces at every other key; requesting whole runs in the first key steps measured slower:
          // B=4 N=32/8 S=8192 D=128 block 128 int8, 16.9 -> 14.4 ms on one thread, 14.0 -> 11.6 ms on two, AVX2).
          // This tile's runs are assembled into rows of D values unless the loops read the pieces in place.
          next.pieces = D / p.nz_c0;
          next.piece_k = p.k_piece * es;
          next.piece_v = p.v_piece * es;
          if (in_place) {
            k_piece = p.k_piece;
            v_piece = p.v_piece;
          } else {
            gather_nz_rows(k0, p.k_piece, n, D, kz.data());
            gather_nz_rows(v0, p.v_piece, n, D, vz.data());
            k0 = kz.data();
            v0 = vz.data();
            k_seq = v_seq = D;
          }
        }

        // The tile's KV heads, hs_step at a time: scores, softmax and P·V of one head before the next.
        for (int64_t hs = 0; hs < HT; hs += hs_step) {
          const int64_t hn = std::min(hs_step, HT - hs), r_lo = hs * G, r_hi = (hs + hn) * G;
          NextTile nh = next;
          if (nh.n) nh.k += hs * nh.k_head, nh.v += hs * nh.v_head;
          // Scores s[r, t] = q_r · k_t · scale + pse, masked -> -inf; columns >= n are -inf.
          const C* kh = k0 + hs * p.k_head;
          float* sh = s.data() + r_lo * kTile;
#if defined(CPU_CAPABILITY_AVX2)
          if (item_i8)
            qk_keys_i16(iq, r_lo, G, hn, D, reinterpret_cast<const int8_t*>(kh), k_seq, p.k_head, k_piece, n, sh,
                        kTile, nh);
          else
#endif
#if defined(CPU_CAPABILITY_AVX512)
          if (item_i8)
            qk_keys_i16(iq, r_lo, G, hn, D, reinterpret_cast<const int8_t*>(kh), k_seq, p.k_head, n, sh, kTile, nh);
          else if (use_bf16_dot)
            qk_keys_bf16(qb16.data() + r_lo * D, G, hn, D, reinterpret_cast<const uint16_t*>(kh), k_seq, p.k_head, 0,
                         n, sh, kTile, nh);
          else
#endif
            qk_keys(qbuf.data() + r_lo * Dp, Dp, G, hn, kh, k_seq, p.k_head, D, 0, n, sh, kTile, nh);
          clock.lap(St::kDecQk);
          const float post_scale = use_bf16_dot ? p.scale : 1.f;  // the fp32 path's q rows are pre-scaled
          for (int64_t r = r_lo; r < r_hi; ++r) {
            float* sr = s.data() + r * kTile;
            if (post_scale != 1.f)
              for (int64_t t = 0; t < n; ++t) sr[t] *= post_scale;
            if constexpr (kInt8) {
              const int64_t h = tk.h0 + r / G;
              if (kq.per_token) {  // s = sc_t · (q·k_t + o_t·Σq)
                const float* sc = kq.scale + b * kq.s_b + h * kq.s_h + pos0 * kq.s_pos;
                if (kq.offset) {
                  const float* of = kq.offset + b * kq.s_b + h * kq.s_h + pos0 * kq.s_pos;
                  for (int64_t t = 0; t < n; ++t) sr[t] = sc[t * kq.s_pos] * (sr[t] + of[t * kq.s_pos] * qsum[r]);
                } else {
                  for (int64_t t = 0; t < n; ++t) sr[t] *= sc[t * kq.s_pos];
                }
              } else if (kq.offset) {
                for (int64_t t = 0; t < n; ++t) sr[t] += kconst[r];
              }
            }
            if (p.pse) {
              const float* pr = p.pse + b * p.pse_sb + (tk.h0 * G + r) * p.pse_sn + pos0;
              for (int64_t t = 0; t < n; ++t) sr[t] += pr[t];
            }
            if (mrow)
              for (int64_t t = 0; t < n; ++t)
                if (mrow[pos0 + t]) sr[t] = kNegInf;
            for (int64_t t = n; t < kTile; ++t) sr[t] = kNegInf;
          }
          clock.lap(St::kDecMask);

          // Online softmax update per query row; s becomes the probabilities exp(s - m_new).
          bool any = false;
          for (int64_t r = r_lo; r < r_hi; ++r) {
            float* sr = s.data() + r * kTile;
            Vec vmax(kNegInf);
            for (int64_t t = 0; t < kTile; t += Vec::size()) vmax = at::vec::maximum(vmax, Vec::loadu(sr + t));
            const float mt =
                at::vec::vec_reduce_all<float>([](Vec& x, Vec& y) { return at::vec::maximum(x, y); }, vmax);
            const float mnew = nan_max(m[r], mt);
            // Scores are rounded fp32 values, so exp(s - mnew) is exactly 1 for the max even when it is huge: only
            // rows with no visible key yet (-inf) and NaN rows (a NaN or +inf score) leave the fast path.
            if (!(std::abs(mnew) < online_softmax::kHugeMax)) {
              const online_softmax::RowKind kind = online_softmax::row_kind(mnew);
              if (kind != online_softmax::RowKind::Huge) {
                std::fill(sr, sr + kTile, 0.f);  // P = 0
                if (kind == online_softmax::RowKind::NaN) {  // NaN from here on (P·V adds 0 to a NaN accumulator)
                  m[r] = l[r] = online_softmax::kNaN;
                  std::fill(acc + r * Dp, acc + (r + 1) * Dp, online_softmax::kNaN);
                }
                continue;
              }
            }
            any = true;
            const float alpha = m[r] == kNegInf ? 0.f : std::exp(m[r] - mnew);
            if (alpha != 1.f) {
              float* ar = acc + r * Dp;
              const Vec va(alpha);
              for (int64_t d = 0; d < Dp; d += Vec::size()) (Vec::loadu(ar + d) * va).store(ar + d);
              l[r] *= alpha;
            }
            const Vec vm(mnew);
            Vec sum(0.f);
            for (int64_t t = 0; t < kTile; t += Vec::size()) {
              const Vec e = softmax_exp::exp<float>(Vec::loadu(sr + t) - vm);  // fp32 P: degree 5
              e.store(sr + t);
              sum = sum + e;
            }
            l[r] += at::vec::vec_reduce_all<float>([](Vec& x, Vec& y) { return x + y; }, sum);
            m[r] = mnew;
          }

          // int8 value, per-token: Σ_t p_t·sc_t·(v_t + o_t) = Σ_t (p_t·sc_t)·v_t + Σ_t p_t·sc_t·o_t, the last term
          // the same for every d. (l keeps the plain sum of p.)
          if constexpr (kInt8) {
            if (any && vq.per_token) {
              for (int64_t r = r_lo; r < r_hi; ++r) {
                const int64_t h = tk.h0 + r / G;
                float* sr = s.data() + r * kTile;
                const float* sc = vq.scale + b * vq.s_b + h * vq.s_h + pos0 * vq.s_pos;
                float e = 0.f;
                for (int64_t t = 0; t < n; ++t) {
                  const float w = sr[t] * sc[t * vq.s_pos];
                  if (vq.offset) e += w * vq.offset[b * vq.s_b + h * vq.s_h + (pos0 + t) * vq.s_pos];
                  sr[t] = w;
                }
                if (e != 0.f) {
                  float* ar = acc + r * Dp;
                  for (int64_t d = 0; d < D; ++d) ar[d] += e;
                }
              }
            }
          }

          clock.lap(St::kDecSoftmax);
          // acc_r += Σ_t p[r, t] · v_t: accumulators of up to 8 rows stay in registers over the tile.
          if (any) {
            for (int64_t hh = hs; hh < hs + hn; ++hh) {
              const C* vh = v0 + hh * p.v_head;
              int64_t vs = v_seq;
#if defined(CPU_CAPABILITY_AVX512)
              if constexpr (kInt8) {
                if (item_i8 && D % 64 == 0 &&
                    pv_i16(acc + hh * G * Dp, Dp, s.data() + hh * G * kTile, G, vh, v_seq, n, D, pp.data(),
                           sp.data()))
                  continue;
              }
#elif defined(CPU_CAPABILITY_AVX2)
              if constexpr (kInt8) {
                if (item_i8 && pv_i16(acc + hh * G * Dp, Dp, s.data() + hh * G * kTile, G, vh, v_seq, v_piece, n, D,
                                      pp.data(), sp.data()))
                  continue;
                if (in_place) {  // non-finite probabilities: the fp32 loops below take rows of D values
                  gather_nz_rows(vh, p.v_piece, n, D, vz.data());
                  vh = vz.data();
                  vs = D;
                }
              }
#endif
              for (int64_t g0 = 0; g0 < G;) {
                const int gn = row_block(G - g0);
                const int64_t r0 = hh * G + g0;
                float* ar = acc + r0 * Dp;
                const float* pr = s.data() + r0 * kTile;
                switch (gn) {
                  case 8: pv_rows_all<8>(ar, Dp, pr, vh, vs, n, D); break;
                  case 4: pv_rows_all<4>(ar, Dp, pr, vh, vs, n, D); break;
                  case 2: pv_rows_all<2>(ar, Dp, pr, vh, vs, n, D); break;
                  default: pv_rows_all<1>(ar, Dp, pr, vh, vs, n, D); break;
                }
                g0 += gn;
              }
            }
          }
          clock.lap(St::kDecPv);
        }
        j += n;
        if (j < tk.j1) cur = nx;
      }
    }
  });

  // Merge the chunks of each (b, head group) in order with their log-sum-exp; rows with no visible key get zeros.
  // Cheap: run inline unless each thread would get ~1M multiply-adds. A second parallel region has to wake the
  // worker threads again, which on a busy machine costs far more than this merge (measured: with a 256K threshold
  // the paged bench case, 4 groups x 16 chunks x 32 rows, went parallel and took ~1.3x the wall time).
  const int64_t merge_work = R * D * (n_tasks / std::max<int64_t>(n_groups, 1) + 1);  // per (b, head group)
  const int64_t merge_grain = std::max<int64_t>(1, (int64_t(1) << 20) / std::max<int64_t>(1, merge_work));
  at::parallel_for(0, n_groups, merge_grain, [&](int64_t i0, int64_t i1) {
    StageClock clock;
    std::vector<float> o(Dp);
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t b = i / (N2 / HT), h0 = (i % (N2 / HT)) * HT;
      for (int64_t r = 0; r < R; ++r) {
        float M = kNegInf;
        for (int64_t t = first[i]; t < first[i + 1]; ++t) M = nan_max(M, part[t * part_stride + R * Dp + r]);
        std::fill(o.begin(), o.end(), 0.f);
        float L = 0.f;
        if (M != kNegInf) {
          for (int64_t t = first[i]; t < first[i + 1]; ++t) {
            const float* base = part.data() + t * part_stride;
            const float mt = base[R * Dp + r];
            if (mt == kNegInf) continue;
            const float w = std::exp(mt - M);
            L += w * base[R * Dp + R + r];
            const float* a = base + r * Dp;
            for (int64_t d = 0; d < D; ++d) o[d] += w * a[d];
          }
        }
        T* dst = out + (b * N1 + h0 * G + r) * D;
        // A sink joins the denominator only (its value row is 0): L += e^(sink - M). Without a visible key the row
        // stays 0, as in the prefill kernels; a NaN sink makes the row NaN, an overflowing one drives it to 0.
        if (p.sink && L != 0.f) L += std::exp(p.sink[h0 * G + r] - M);
        const float inv = L == 0.f ? 0.f : 1.f / L;  // 0: no visible key; a NaN L (NaN row) stays NaN
        if (kInt8 && !vq.per_token && inv != 0.f) {  // int8 value, per-channel: (Σ p·v / l + o) · sc
          const int64_t h = h0 + r / G;
          for (int64_t d = 0; d < D; ++d) {
            const float off = vq.offset ? aq_at(vq.offset, vq, b, h, 0, d) : 0.f;
            dst[d] = static_cast<T>((o[d] * inv + off) * aq_at(vq.scale, vq, b, h, 0, d));
          }
          continue;
        }
        for (int64_t d = 0; d < D; ++d) dst[d] = static_cast<T>(o[d] * inv);
      }
    }
    clock.lap(St::kDecFinish);
  });
}

}  // namespace

void decode_attention(const DecodeParams& p, const at::Tensor& q32, const at::Tensor& key, const at::Tensor& value,
                      at::Tensor& out) {
  if (key.scalar_type() == at::kChar) {  // int8 cache, fp16/bf16 query and output
    if (out.scalar_type() == at::kBFloat16)
      return run<at::BFloat16, int8_t>(p, q32.data_ptr<float>(), key.data_ptr<int8_t>(), value.data_ptr<int8_t>(),
                                       out.data_ptr<at::BFloat16>());
    TORCH_CHECK(out.scalar_type() == at::kHalf, "incre_flash_attention: int8 cache with query ", out.scalar_type());
    return run<at::Half, int8_t>(p, q32.data_ptr<float>(), key.data_ptr<int8_t>(), value.data_ptr<int8_t>(),
                                 out.data_ptr<at::Half>());
  }
  switch (key.scalar_type()) {
    case at::kFloat:
      return run<float>(p, q32.data_ptr<float>(), key.data_ptr<float>(), value.data_ptr<float>(), out.data_ptr<float>());
    case at::kBFloat16:
      return run<at::BFloat16>(p, q32.data_ptr<float>(), key.data_ptr<at::BFloat16>(), value.data_ptr<at::BFloat16>(),
                               out.data_ptr<at::BFloat16>());
    case at::kHalf:
      return run<at::Half>(p, q32.data_ptr<float>(), key.data_ptr<at::Half>(), value.data_ptr<at::Half>(),
                           out.data_ptr<at::Half>());
    default:
      TORCH_CHECK(false, "incre_flash_attention: unsupported dtype ", key.scalar_type());
  }
}

NPU_FA_REGISTER_ISA_KERNEL(decode_attention_stub, decode_attention);

}  // namespace npu_fa::cpu::CPU_CAPABILITY
