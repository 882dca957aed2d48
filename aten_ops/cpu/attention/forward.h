// FlashAttention-2 forward on CPU. Included once per ISA by kernels_isa.cpp, so everything here lives in
// npu_fa::cpu::CPU_CAPABILITY and at::vec::Vectorized has that ISA's width.
//
// Work is split into items (sequence b, KV head n2, query heads [h0, h1) of that group, query rows [i0, i1)); an
// item's query rows of all its heads are packed into one [R, D] block, so a K/V tile is read once for every head
// sharing it (this matters when Sq is short, e.g. decoding with GQA). Per item we walk the KV tiles inside the
// band's key range, skip Empty tiles, mask Partial ones per element, and keep an online softmax (running max m,
// running sum l, fp32 accumulator acc) per row.
//
// Both products run on at::native::cpublas::brgemm (oneDNN's JIT micro-kernels, through cpu/brgemm.h; cpublas::gemm
// is not exported from libtorch). brgemm takes no transposes, so K is repacked as Kᵀ (keys contiguous) once per KV
// head; when a head feeds a single item (decoding) nothing is repacked: Sᵀ = K·Qᵀ reads K in place, and too few
// items are split along the keys and merged (flash-decoding). Two compute types: fp32 (fp32 inputs; fp16 inputs,
// and bf16 where the bf16 kernel is unavailable, are converted while packing) and bf16 with VNNI-packed operands
// (the fast path on CPUs with AVX512-BF16 or AMX).
#pragma once

#include <ATen/Context.h>
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <memory>
#include <type_traits>
#include <vector>

#include "common/inference/nz_cache.h"
#include "cpu/attention/kernels.h"
#include "cpu/attention/logits.h"
#include "cpu/attention/tiles.h"
#include "cpu/brgemm.h"
#include "cpu/online_softmax.h"
#include "cpu/softmax_exp.h"
#include "cpu/stage_timing.h"
#include "cpu/vec_convert.h"

namespace npu_fa::cpu::CPU_CAPABILITY {
namespace fa_fwd {

using Vec = at::vec::Vectorized<float>;
using at::BFloat16;
using online_softmax::nan_max;
using online_softmax::RowKind;
using St = stage_timing::Stage;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

inline int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

// Matrix products: c[m, n] (+)= a[m, k] · b[k, n], row-major; b is VNNI-packed for bf16 (cpu/brgemm.h).
using brgemm::mm;

// ---- Row primitives on fp32 score rows. ----

// s = s * scale (+ c * bias[j * bias_stride]) in place; returns the max of the new s.
inline float scale_bias_max(float* s, int64_t n, float scale, const float* bias, int64_t bias_stride, float c) {
  if (bias && bias_stride != 1) {
    float mx = kNegInf;
    for (int64_t j = 0; j < n; ++j) mx = nan_max(mx, s[j] = s[j] * scale + c * bias[j * bias_stride]);
    return mx;
  }
  const Vec vs(scale), vc(c);
  Vec vmax(kNegInf);
  for (int64_t j = 0; j < n; j += Vec::size()) {
    const int64_t cnt = std::min<int64_t>(Vec::size(), n - j);
    Vec x = Vec::loadu(s + j, cnt) * vs;
    if (bias) x = x + Vec::loadu(bias + j, cnt) * vc;
    x.store(s + j, cnt);
    vmax = at::vec::maximum(vmax, cnt == Vec::size() ? x : Vec::set(Vec(kNegInf), x, cnt));
  }
  return at::vec::vec_reduce_all<float>([](Vec a, Vec b) { return at::vec::maximum(a, b); }, vmax);
}

// Four independent maxima hide the max latency (at::vec::reduce_all keeps one dependency chain).
inline float row_max(const float* s, int64_t n) {
  constexpr int64_t kF = Vec::size();
  Vec m0(kNegInf), m1(kNegInf), m2(kNegInf), m3(kNegInf);
  int64_t j = 0;
  for (; j + 4 * kF <= n; j += 4 * kF) {
    m0 = at::vec::maximum(m0, Vec::loadu(s + j));
    m1 = at::vec::maximum(m1, Vec::loadu(s + j + kF));
    m2 = at::vec::maximum(m2, Vec::loadu(s + j + 2 * kF));
    m3 = at::vec::maximum(m3, Vec::loadu(s + j + 3 * kF));
  }
  for (; j < n; j += kF) {
    const int64_t cnt = std::min(kF, n - j);
    m0 = at::vec::maximum(m0, Vec::set(Vec(kNegInf), Vec::loadu(s + j, cnt), cnt));
  }
  const Vec m = at::vec::maximum(at::vec::maximum(m0, m1), at::vec::maximum(m2, m3));
  return at::vec::vec_reduce_all<float>([](Vec a, Vec b) { return at::vec::maximum(a, b); }, m);
}

// out[j] = 2^((s[j] − m)·a) = exp((s[j] − m)·scale) for a = scale·log2(e) (softmax_exp.h: the scale and the change
// of base are one multiply; m, the row maximum in the units of s, makes its own exponent exactly 0), stored in
// out's dtype (out may alias s); returns the fp32 sum of the unrounded values. R: for a float out, the dtype P is
// rounded through before P·V (FlashAttention-2 rounds P to the input dtype), float for none. kDeg: the polynomial
// degree for P's final precision. tile_max: also the largest score (one-pass softmax, ForwardKernel::fused_row).
template <int kDeg, typename OutT, typename R = float>
float exp_store(const float* s, int64_t n, float a, float m, OutT* out, float* tile_max = nullptr) {
  static_assert(std::is_same_v<OutT, float> || std::is_same_v<OutT, BFloat16>, "P is fp32 or bf16");
  constexpr bool kBf16Out = std::is_same_v<OutT, BFloat16>;
  constexpr bool kHalf = std::is_same_v<R, at::Half>;  // fp16 rounding through ATen (F16C): two vectors at a time
  constexpr int64_t kF = Vec::size(), kStep = kBf16Out || kHalf ? 2 * kF : kF;
  const Vec va(a), vm(m);
  Vec acc0(0.f), acc1(0.f), vmax(kNegInf);
  // Lanes past n load as -inf, i.e. P = 0.
  auto exp_at = [&](int64_t j, int64_t cnt) {
    const Vec x = cnt >= kF ? Vec::loadu(s + j) : Vec::set(Vec(kNegInf), Vec::loadu(s + j, cnt), cnt);
    if (tile_max) vmax = at::vec::clamp_min(vmax, x);  // one max; a NaN score shows in the sum instead
    return softmax_exp::exp2<kDeg>((x - vm) * va);
  };
  auto step = [&](int64_t j, int64_t cnt) {
    const Vec e0 = exp_at(j, cnt);
    acc0 = acc0 + e0;
    if constexpr (kStep == kF) {
      (std::is_same_v<R, BFloat16> ? softmax_exp::round_bf16(e0) : e0).store(out + j, cnt);
    } else {
      const Vec e1 = cnt > kF ? exp_at(j + kF, cnt - kF) : Vec(0.f);
      acc1 = acc1 + e1;
      if constexpr (kBf16Out) {
        softmax_exp::store_bf16(e0, e1, out + j, cnt);
      } else {  // rounded through fp16, kept in fp32
        const auto [r0, r1] = at::vec::convert_to_float<R>(at::vec::convert_from_float<R>(e0, e1));
        r0.store(out + j, std::min(cnt, kF));
        if (cnt > kF) r1.store(out + j + kF, cnt - kF);
      }
    }
  };
  int64_t j = 0;
  for (; j + kStep <= n; j += kStep) step(j, kStep);
  if (j < n) step(j, n - j);
  if (tile_max) *tile_max = at::vec::vec_reduce_all<float>([](Vec x, Vec y) { return at::vec::maximum(x, y); }, vmax);
  return at::vec::vec_reduce_all<float>([](Vec x, Vec y) { return x + y; }, acc0 + acc1);
}

// x[j] = x[j] rounded to T (and back to fp32), for the rows whose P is formed in fp32 first (dropout).
template <typename T>
inline void round_through(float* x, int64_t n) {
  if constexpr (!std::is_same_v<T, float>) {
    constexpr int64_t kF = Vec::size();
    int64_t j = 0;
    for (; j + 2 * kF <= n; j += 2 * kF) {
      const auto [r0, r1] = at::vec::convert_to_float<T>(
          at::vec::convert_from_float<T>(Vec::loadu(x + j), Vec::loadu(x + j + kF)));
      r0.store(x + j);
      r1.store(x + j + kF);
    }
    for (; j < n; ++j) x[j] = static_cast<float>(static_cast<T>(x[j]));
  }
}

inline void scale_row(float* x, int64_t n, float a) {
  at::vec::map([a](Vec v) { return v * Vec(a); }, x, x, n);
}

// ---- K/V repacking. ----

// Uninitialised storage (std::vector would zero it first, a wasted pass over memory).
template <typename C>
struct Buffer {
  std::unique_ptr<C[]> data;
  int64_t size = 0;
  C* get(int64_t n) {
    if (n > size) {
      data.reset(new C[n]);
      size = n;
    }
    return data.get();
  }
};

// Keys of one KV head (b, n2) as brgemm reads them. k: Kᵀ with row stride ldk: fp32 [D][ldk], bf16
// [ceil(D/2)][ldk][2] (VNNI pairs of the head dim). v: rows of stride ldv: fp32 [kv][vD] (fp32 inputs are read in
// place), bf16 [kv/2][vD][2] (VNNI pairs of keys). Key j sits at column j - k_base of k and row j - v_base of v;
// bf16 tiles start at an even j - v_base.
template <typename C>
struct KvView {
  static constexpr int64_t kW = std::is_same_v<C, BFloat16> ? 2 : 1;
  const C* k;
  int64_t ldk, k_base;
  const C* v;
  int64_t ldv, v_base;
  const C* k_at(int64_t j0) const { return k + (j0 - k_base) * kW; }
  const C* v_at(int64_t j0) const { return v + (j0 - v_base) * ldv; }
};

// Packs keys and values of one (b, n2) into the KvView layout. T: the key/value dtype — the query's, or int8_t for
// an int8 key/value (KV antiquant), dequantised here, tile by tile, as (x + offset) * scale and rounded to C: the
// only copy of the keys the kernel makes is this packed tile, as for any other dtype.
template <typename T, typename C>
class KvPacker {
 public:
  static constexpr bool kVnni = std::is_same_v<C, BFloat16>;
  static constexpr bool kInt8 = std::is_same_v<T, int8_t>;
  static constexpr int64_t kW = kVnni ? 2 : 1;  // elements per packed K unit

  // V is used in place when brgemm can read it as it is (fp32 rows with a row stride of at least vD, not paged).
  KvPacker(const AttentionParams& p, const T* k, const T* v)
      : p_(p), k_(k), v_(v),
        pack_v_(!std::is_same_v<T, C> || kVnni || p.v.seq_stride < p.v_head_dim || p.v.paged()) {}

  // Row stride for `keys` columns; +16 keeps the stride off multiples of 4 KiB (brgemm reads column panels).
  static int64_t ldk(int64_t keys) { return round_up(std::max<int64_t>(keys, 1), 64) + 16; }
  int64_t k_elems(int64_t keys) const { return (p_.head_dim + kW - 1) / kW * kW * ldk(keys); }
  int64_t v_elems(int64_t keys) const { return pack_v_ ? round_up(keys, 2) * p_.v_head_dim : 0; }

  // Keys [j0, j1) go to column / row j - col0 of kbuf / vbuf; j0 - col0 is even.
  void pack(int64_t b, int64_t n2, int64_t j0, int64_t j1, int64_t col0, C* kbuf, int64_t ld, C* vbuf) const {
    if (!p_.k.rows_contiguous() || !p_.v.rows_contiguous()) gather_nz(b, n2, j0, j1);
    pack_k(b, n2, j0, j1, col0, kbuf, ld);
    if (pack_v_) pack_v(b, n2, j0, j1, col0, vbuf);
  }

  // V rows; VNNI interleaves rows 2q and 2q+1 (an odd last row is paired with zeros: its P column is 0).
  void pack_v(int64_t b, int64_t n2, int64_t j0, int64_t j1, int64_t col0, C* dst) const {
    const int64_t vD = p_.v_head_dim;
    if constexpr (kInt8) {
      if constexpr (!kVnni) {
        for (int64_t j = j0; j < j1; ++j)
          dequant_row(p_.v_quant, v_row(b, n2, j), b, n2, j, vD, dst + (j - col0) * vD);
      } else {
        std::vector<C> rows(2 * vD);
        for (int64_t j = j0; j < j1; j += 2) {
          const bool pair = j + 1 < j1;
          dequant_row(p_.v_quant, v_row(b, n2, j), b, n2, j, vD, rows.data());
          if (pair) dequant_row(p_.v_quant, v_row(b, n2, j + 1), b, n2, j + 1, vD, rows.data() + vD);
          brgemm::interleave_rows(rows.data(), pair ? rows.data() + vD : nullptr, vD, dst + (j - col0) * vD);
        }
      }
    } else if constexpr (!kVnni) {
      for (int64_t j = j0; j < j1; ++j) at::vec::convert(v_row(b, n2, j), dst + (j - col0) * vD, vD);
    } else {
      for (int64_t j = j0; j < j1; j += 2) {
        const T* r1 = j + 1 < j1 ? v_row(b, n2, j + 1) : nullptr;
        brgemm::interleave_rows(v_row(b, n2, j), r1, vD, dst + (j - col0) * vD);
      }
    }
  }

  KvView<C> view(int64_t b, int64_t n2, int64_t col0, const C* kbuf, int64_t ld, const C* vbuf) const {
    if (pack_v_) return {kbuf, ld, col0, vbuf, p_.v_head_dim, col0};
    return {kbuf, ld, col0, reinterpret_cast<const C*>(v_) + p_.v.at(b, n2, 0), p_.v.seq_stride, 0};
  }

 private:
  static constexpr int64_t kB = 16;  // K is transposed by kB x kB blocks

  // NZ caches: the rows [j0, j1) being packed, assembled from their head-dim pieces into this thread's buffers
  // (rows[j - j0]); packing then reads them like rows of an ND cache.
  struct NzRows {
    std::vector<T> k, v;
    int64_t j0 = 0;
  };
  static NzRows& nz_rows() {
    thread_local NzRows r;
    return r;
  }
  static void gather_rows(const T* base, const RowMap& m, int64_t b, int64_t n, int64_t j0, int64_t j1, int64_t D,
                          std::vector<T>& out) {
    out.resize((j1 - j0) * D);
    for (int64_t j = j0; j < j1; ++j)  // row by row: [j0, j1) may span blocks
      ::npu_fa::attention::nz_rows_to_nd(base + m.at(b, n, j), m.piece_stride, 0, m.nz_c0, 1, D,
                                         out.data() + (j - j0) * D);
  }
  void gather_nz(int64_t b, int64_t n2, int64_t j0, int64_t j1) const {
    NzRows& r = nz_rows();
    r.j0 = j0;
    gather_rows(k_, p_.k, b, n2, j0, j1, p_.head_dim, r.k);
    gather_rows(v_, p_.v, b, n2, j0, j1, p_.v_head_dim, r.v);
  }
  const T* k_row(int64_t b, int64_t n2, int64_t j) const {
    if (p_.k.rows_contiguous()) return k_ + p_.k.at(b, n2, j);
    return nz_rows().k.data() + (j - nz_rows().j0) * p_.head_dim;
  }
  const T* v_row(int64_t b, int64_t n2, int64_t j) const {
    if (p_.v.rows_contiguous()) return v_ + p_.v.at(b, n2, j);
    return nz_rows().v.data() + (j - nz_rows().j0) * p_.v_head_dim;
  }

  // Kᵀ by 16 x 16 blocks (of elements, or of head-dim pairs for VNNI), so reads and writes use whole cache lines.
  // An int8 key: each block's rows are dequantised to C first, then transposed like keys of dtype C.
  void pack_k(int64_t b, int64_t n2, int64_t j0, int64_t j1, int64_t col0, C* dst, int64_t ld) const {
    const int64_t D = p_.head_dim, units = (D + kW - 1) / kW;
    std::vector<C> deq(kInt8 ? kB * units * kW : 0);
    for (int64_t jb = j0; jb < j1; jb += kB) {
      const int64_t nj = std::min(kB, j1 - jb);
      if constexpr (kInt8) {
        for (int64_t jj = 0; jj < nj; ++jj) {
          C* row = deq.data() + jj * units * kW;
          dequant_row(p_.k_quant, k_row(b, n2, jb + jj), b, n2, jb + jj, D, row);
          std::fill(row + D, row + units * kW, C(0.f));
        }
      }
      for (int64_t u0 = 0; u0 < units; u0 += kB) {
        const int64_t nu = std::min(kB, units - u0);
        C* out = dst + (u0 * ld + jb - col0) * kW;
        if constexpr (kInt8) {
          const C* rows[kB];
          for (int64_t jj = 0; jj < nj; ++jj) rows[jj] = deq.data() + jj * units * kW + u0 * kW;
          transpose_units(rows, nj, nu, out, ld);
          continue;
        }
#if defined(CPU_CAPABILITY_AVX512)
        if constexpr (std::is_same_v<T, C>) {
          if (kW == 1 || D % 2 == 0) {  // whole 32-bit units: transpose in registers
            const C* rows[kB];
            for (int64_t jj = 0; jj < nj; ++jj) rows[jj] = k_row(b, n2, jb + jj) + u0 * kW;
            transpose_units(rows, nj, nu, out, ld);
            continue;
          }
        }
#endif
        C tile[kB][kB][kW];
        for (int64_t jj = 0; jj < nj; ++jj) {
          const T* src = k_row(b, n2, jb + jj) + u0 * kW;
          for (int64_t uu = 0; uu < nu; ++uu)
            for (int64_t w = 0; w < kW; ++w) {
              const int64_t d = (u0 + uu) * kW + w;
              tile[uu][jj][w] = d < D ? C(static_cast<float>(src[uu * kW + w])) : C(0.f);
            }
        }
        for (int64_t uu = 0; uu < nu; ++uu) std::copy_n(&tile[uu][0][0], nj * kW, out + uu * ld * kW);
      }
    }
  }

  // Units [0, nu) of rows[jj] (jj < nj; C values, whole units) become columns jj of the nu rows of dst (row stride
  // ld units).
  static void transpose_units(const C* const* rows, int64_t nj, int64_t nu, C* dst, int64_t ld) {
#if defined(CPU_CAPABILITY_AVX512)
    const __mmask16 load_mask = static_cast<__mmask16>((1u << nu) - 1), store_mask = static_cast<__mmask16>((1u << nj) - 1);
    __m512i r[16];
    for (int64_t jj = 0; jj < 16; ++jj)
      r[jj] = jj < nj ? _mm512_maskz_loadu_epi32(load_mask, rows[jj]) : _mm512_setzero_si512();
    transpose16x16(r);
    for (int64_t uu = 0; uu < nu; ++uu) _mm512_mask_storeu_epi32(dst + uu * ld * kW, store_mask, r[uu]);
#else
    for (int64_t uu = 0; uu < nu; ++uu)
      for (int64_t jj = 0; jj < nj; ++jj)
        for (int64_t w = 0; w < kW; ++w) dst[(uu * ld + jj) * kW + w] = rows[jj][uu * kW + w];
#endif
  }

  // out[0, n) = (x + offset) * scale of an int8 row at position j of sequence b, KV head n2, rounded to C.
  static void dequant_row(const attention::Antiquant& q, const int8_t* x, int64_t b, int64_t n2, int64_t j, int64_t n, C* out) {
    float buf[1024];
    const int64_t base = b * q.s_b + n2 * q.s_h + j * q.s_pos;
    for (int64_t c0 = 0; c0 < n; c0 += 1024) {
      const int64_t m = std::min<int64_t>(1024, n - c0);
      at::vec::convert(x + c0, buf, m);
      if (q.s_d == 0) {  // per-token or per-tensor: one factor for the row
        const float sc = q.scale[base], off = q.offset ? q.offset[base] : 0.f;
        at::vec::map([sc, off](Vec v) { return (v + Vec(off)) * Vec(sc); }, buf, buf, m);
      } else {
        const float* sc = q.scale + base + c0 * q.s_d;
        if (q.offset) at::vec::map2([](Vec v, Vec o) { return v + o; }, buf, buf, q.offset + base + c0 * q.s_d, m);
        at::vec::map2([](Vec v, Vec s) { return v * s; }, buf, buf, sc, m);
      }
      at::vec::convert(buf, out + c0, m);
    }
  }

#if defined(CPU_CAPABILITY_AVX512)
  // In-register transpose of 16 rows of 16 32-bit values: interleave 32-bit then 64-bit pairs inside 128-bit lanes,
  // then gather the 128-bit lanes.
  static void transpose16x16(__m512i r[16]) {
    __m512i t[16];
    for (int i = 0; i < 16; i += 2) {
      t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
      t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
    }
    __m512i u[4][4];  // u[g][c]: rows 4g..4g+3 of columns 4k + c in lane k
    for (int g = 0; g < 4; ++g) {
      u[g][0] = _mm512_unpacklo_epi64(t[4 * g], t[4 * g + 2]);
      u[g][1] = _mm512_unpackhi_epi64(t[4 * g], t[4 * g + 2]);
      u[g][2] = _mm512_unpacklo_epi64(t[4 * g + 1], t[4 * g + 3]);
      u[g][3] = _mm512_unpackhi_epi64(t[4 * g + 1], t[4 * g + 3]);
    }
    for (int c = 0; c < 4; ++c) {
      const __m512i v0 = _mm512_shuffle_i32x4(u[0][c], u[1][c], 0x44), v1 = _mm512_shuffle_i32x4(u[0][c], u[1][c], 0xEE);
      const __m512i v2 = _mm512_shuffle_i32x4(u[2][c], u[3][c], 0x44), v3 = _mm512_shuffle_i32x4(u[2][c], u[3][c], 0xEE);
      r[c] = _mm512_shuffle_i32x4(v0, v2, 0x88);
      r[4 + c] = _mm512_shuffle_i32x4(v0, v2, 0xDD);
      r[8 + c] = _mm512_shuffle_i32x4(v1, v3, 0x88);
      r[12 + c] = _mm512_shuffle_i32x4(v1, v3, 0xDD);
    }
  }
#endif

  const AttentionParams& p_;
  const T *k_, *v_;
  const bool pack_v_;
};

// ---- Work decomposition. ----

struct Item {
  int64_t b, n2, h0, h1, i0, i1;  // h0/h1: query heads within the group
  int64_t cost;                   // ~ visible (row, key) pairs, for scheduling
};

// The items of one KV head (b, n2) are contiguous: items[begin, end).
struct Group {
  int64_t b, n2, begin, end, cost;
};

struct Plan {
  std::vector<Item> items;
  std::vector<Group> groups;
  int64_t max_rows = 0;  // largest R = (h1 - h0) * (i1 - i0)
};

// About block_q packed rows per item. The heads of a group are packed together when a sequence's query is short
// (decode rows, also inside a mixed batch with a long prefill: each sequence decides for itself), so one pass over
// a K/V tile serves them all; rows are split further while there are fewer than 4 items per thread.
inline Plan make_plan(const AttentionParams& p, int64_t block_q) {
  const int64_t threads = at::get_num_threads(), G = p.group;
  auto divisor_at_most = [G](int64_t h) {  // the largest divisor of G that is <= h
    h = std::clamp<int64_t>(h, 1, G);
    while (G % h) --h;
    return h;
  };
  std::vector<int64_t> heads(p.batch), span(p.batch);
  for (int64_t b = 0; b < p.batch; ++b) {
    heads[b] = divisor_at_most(block_q / std::max<int64_t>(p.q_len[b], 1));
    span[b] = std::max<int64_t>(1, block_q / heads[b]);
  }
  auto count = [&]() {
    int64_t n = 0;
    for (int64_t b = 0; b < p.batch; ++b) n += (p.q_len[b] + span[b] - 1) / span[b] * (G / heads[b]);
    return n * p.kv_heads;
  };
  for (bool changed = true; changed && count() < 4 * threads;) {
    changed = false;
    for (int64_t b = 0; b < p.batch; ++b) {
      if (heads[b] > 1) {
        heads[b] = divisor_at_most(heads[b] - 1);
        changed = true;
      } else if (span[b] > 16) {
        span[b] = std::max<int64_t>(16, span[b] / 2);
        changed = true;
      }
    }
  }
  Plan plan;
  for (int64_t b = 0; b < p.batch; ++b) {
    for (int64_t n2 = 0; n2 < p.kv_heads; ++n2) {
      Group g{b, n2, static_cast<int64_t>(plan.items.size()), 0, 0};
      for (int64_t h0 = 0; h0 < G; h0 += heads[b]) {
        for (int64_t i0 = 0; i0 < p.q_len[b]; i0 += span[b]) {
          const int64_t i1 = std::min(p.q_len[b], i0 + span[b]);
          const auto kr = p.key_range(b, i0, i1);
          const int64_t keys = std::max<int64_t>(0, kr.second - kr.first);
          plan.items.push_back({b, n2, h0, h0 + heads[b], i0, i1, heads[b] * (i1 - i0) * (keys + 16)});
          plan.max_rows = std::max(plan.max_rows, heads[b] * (i1 - i0));
          g.cost += plan.items.back().cost;
        }
      }
      g.end = static_cast<int64_t>(plan.items.size());
      if (g.end > g.begin) plan.groups.push_back(g);
    }
  }
  return plan;
}

// First key of the item's KV tiles and their count. VNNI pairs keys, so bf16 tiles start at an even key (the extra
// key lies outside the band and is masked).
inline std::pair<int64_t, int64_t> item_tiles(const AttentionParams& p, const Item& it, int64_t block_kv, bool vnni) {
  const auto kr = p.key_range(it.b, it.i0, it.i1);
  if (kr.first >= kr.second) return {0, 0};
  const int64_t start = vnni ? kr.first & ~int64_t(1) : kr.first;
  return {start, (kr.second - start + block_kv - 1) / block_kv};
}

// Largest first, so a dynamic schedule ends on short work (causal, band and varlen costs are uneven).
template <typename X>
void sort_by_cost(std::vector<X>& v) {
  std::stable_sort(v.begin(), v.end(), [](const X& x, const X& y) { return x.cost > y.cost; });
}

// ---- The per-thread kernel. T: input dtype, C: compute dtype of the products (float or BFloat16), KT: the
// key/value dtype (T, or int8_t for an int8 key/value). ----

template <typename T, typename C, typename KT = T>
class ForwardKernel {
  static constexpr bool kVnni = std::is_same_v<C, BFloat16>;
  // P is rounded to the input dtype before P·V, as FlashAttention-2 does.
  static constexpr bool kRoundP = !std::is_same_v<T, float> && !kVnni;

 public:
  ForwardKernel(const AttentionParams& p, const AttentionInputs& in, ForwardOutputs& o, const KvPacker<KT, C>& packer,
                int64_t max_rows, int64_t block_kv)
      : p_(p), packer_(packer), bkv_(block_kv),
        D_(p.head_dim), Dp_(kVnni ? round_up(p.head_dim, 2) : p.head_dim), vD_(p.v_head_dim),
        lds_(round_up(bkv_, 16) + 16), q_(in.query.const_data_ptr<T>()), k_(in.key.const_data_ptr<KT>()),
        v_(in.value.const_data_ptr<KT>()),
        out_(o.out.data_ptr<T>()), max_(o.softmax_max.data_ptr<float>()), sum_(o.softmax_sum.data_ptr<float>()) {
    // Scratch for one thread, sized for the largest item and reused for every item and tile.
    qpack_.assign(max_rows * Dp_, C(0.f));
    s_.resize(max_rows * lds_);
    if (kVnni) p_lowp_.resize(max_rows * lds_);
    else p32_.resize(max_rows * lds_);
    acc_.resize(max_rows * vD_);
    m_.resize(max_rows);
    mt_.resize(max_rows);
    l_.resize(max_rows);
    keep_.resize(bkv_ + 1);
    if (p.has_logit_transform()) tmp_.resize(bkv_ + 1);
  }

  // This thread's packed K/V: one whole head when heads are not shared between threads, or one tile.
  Buffer<C> kbuf, vbuf;
  // This worker's stage times (bench stages); every lap below is one branch when timing is off.
  StageClock clock;

  // Tiles [t0, t1) of the item. view: the packed head, or null to pack each tile here. Without `partial` the rows
  // are finished; with it, each row's (m, l, acc) is stored there (vD + 2 floats per row) for merge().
  void run(const Item& it, const KvView<C>* view, int64_t t0, int64_t t1, float* partial = nullptr) {
    const int64_t mq = it.i1 - it.i0, R = (it.h1 - it.h0) * mq;
    // Unpacked K/V are read in place when the input already has the compute dtype (no reuse to pay for packing).
    const bool direct = !view && std::is_same_v<T, C> && std::is_same_v<KT, C> && D_ == Dp_ && p_.k.seq_stride >= D_ &&
                        p_.v.seq_stride >= vD_ && !p_.k.paged() && !p_.v.paged();
    pack_queries(it, mq, R, direct);
    std::fill_n(m_.data(), R, kNegInf);
    std::fill_n(mt_.data(), R, kNegInf);
    std::fill_n(l_.data(), R, 0.f);
    std::fill_n(acc_.data(), R * vD_, 0.f);
    clock.lap(St::kFwdPack);
    const auto [start, n_tiles] = item_tiles(p_, it, bkv_, kVnni);
    const int64_t end = p_.key_range(it.b, it.i0, it.i1).second;
    for (int64_t t = t0; t < std::min(t1, n_tiles); ++t) {
      const int64_t j0 = start + t * bkv_, j1 = std::min(end, j0 + bkv_);
      const attention::TileKind kind = p_.classify(it.b, it.i0, it.i1, j0, j1);
      if (kind == attention::TileKind::Empty) continue;
      const bool partial_tile = kind == attention::TileKind::Partial;
      if (view) {
        tile(it, mq, R, j0, j1, partial_tile, *view);
      } else if (direct) {
        tile_direct(it, mq, R, j0, j1, partial_tile);
      } else {
        const int64_t ld = KvPacker<KT, C>::ldk(bkv_);
        C* kd = kbuf.get(packer_.k_elems(bkv_));
        C* vd = vbuf.get(packer_.v_elems(bkv_));
        packer_.pack(it.b, it.n2, j0, j1, j0, kd, ld, vd);
        clock.lap(St::kFwdPack);
        tile(it, mq, R, j0, j1, partial_tile, packer_.view(it.b, it.n2, j0, kd, ld, vd));
      }
    }
    for (int64_t r = 0; r < R; ++r) {
      settle(r);
      if (partial) {
        float* dst = partial + r * (vD_ + 2);
        dst[0] = m_[r] * unit_;
        dst[1] = l_[r];
        std::copy_n(acc_.data() + r * vD_, vD_, dst + 2);
      } else {
        write_row(it.b, head(it, r, mq), it.i0 + r % mq, m_[r] * unit_, l_[r], acc_.data() + r * vD_);
      }
    }
    clock.lap(St::kFwdFinish);
  }

  // Combines `splits` partial states of each row of the item (flash-decoding) and writes the rows.
  void merge(const Item& it, const float* partial, int64_t splits, int64_t stride) {
    const int64_t mq = it.i1 - it.i0, R = (it.h1 - it.h0) * mq, w = vD_ + 2;
    for (int64_t r = 0; r < R; ++r) {
      float m = kNegInf;
      for (int64_t x = 0; x < splits; ++x) m = nan_max(m, partial[x * stride + r * w]);  // a NaN part: NaN row
      float l = 0.f;
      float* a = acc_.data();
      std::fill_n(a, vD_, 0.f);
      if (m != kNegInf) {
        for (int64_t x = 0; x < splits; ++x) {
          const float* src = partial + x * stride + r * w;
          if (src[0] == kNegInf) continue;
          const float f = std::exp(src[0] - m);
          l += src[1] * f;
          at::vec::map2([f](Vec y, Vec z) { return y + z * Vec(f); }, a, a, src + 2, vD_);
        }
      }
      write_row(it.b, head(it, r, mq), it.i0 + r % mq, m, l, a);
    }
    clock.lap(St::kFwdFinish);
  }

 private:
  int64_t head(const Item& it, int64_t r, int64_t mq) const { return it.n2 * p_.group + it.h0 + r / mq; }

  // Q rows [R, Dp]; for the direct path also Qᵀ [Dp, R] (VNNI pairs of the head dim for bf16) as brgemm's B.
  void pack_queries(const Item& it, int64_t mq, int64_t R, bool transposed) {
    for (int64_t r = 0; r < R; ++r) {
      const T* src = q_ + p_.q.at(it.b, head(it, r, mq), it.i0 + r % mq);
      C* dst = qpack_.data() + r * Dp_;
      if constexpr (std::is_same_v<T, C>) std::copy_n(src, D_, dst);
      else at::vec::convert(src, dst, D_);  // vectorised for 16-bit T to fp32 C
    }
    if (!transposed) return;
    if (qt_.size() < static_cast<size_t>(R * Dp_)) qt_.resize(R * Dp_);
    for (int64_t r = 0; r < R; ++r) brgemm::store_transposed_row(qpack_.data() + r * Dp_, Dp_, r, R, qt_.data());
  }

  // One KV tile [j0, j1) for all R packed rows: scores, masking, online softmax, P·V.
  void tile(const Item& it, int64_t mq, int64_t R, int64_t j0, int64_t j1, bool partial, const KvView<C>& kv) {
    const int64_t nk = j1 - j0;
    mm(R, nk, Dp_, qpack_.data(), Dp_, kv.k_at(j0), kv.ldk, s_.data(), lds_, false);
    clock.lap(St::kFwdQk);
    softmax_rows(it, mq, R, j0, nk, partial);
    if constexpr (kVnni) {
      const int64_t kk = round_up(nk, 2);  // the odd tail's partner key has P = 0
      mm(R, vD_, kk, p_lowp_.data(), lds_, kv.v_at(j0), kv.ldv, acc_.data(), vD_, true);
    } else {
      mm(R, vD_, nk, p32_.data(), lds_, kv.v_at(j0), kv.ldv, acc_.data(), vD_, true);
    }
    clock.lap(St::kFwdPv);
  }

  // The same tile from K and V in place (T == C): Sᵀ = K·Qᵀ needs no transposed K, and P·V takes V as it is
  // (fp32), or V rows one by one for a few bf16 rows, or a VNNI copy of the V tile.
  void tile_direct(const Item& it, int64_t mq, int64_t R, int64_t j0, int64_t j1, bool partial) {
    const int64_t nk = j1 - j0;
    const C* k = reinterpret_cast<const C*>(k_) + p_.k.at(it.b, it.n2, j0);
    if (st_.size() < static_cast<size_t>(nk * R)) st_.resize(nk * R);
    mm(nk, R, Dp_, k, p_.k.seq_stride, qt_.data(), R, st_.data(), R, false);
    clock.lap(St::kFwdQk);
    transpose_tiles(st_.data(), R, nk, R, s_.data(), lds_);
    clock.lap(St::kFwdPack);
    softmax_rows(it, mq, R, j0, nk, partial);
    const C* v = reinterpret_cast<const C*>(v_) + p_.v.at(it.b, it.n2, j0);
    const int64_t ldv = p_.v.seq_stride;
    if constexpr (!kVnni) {
      mm(R, vD_, nk, p32_.data(), lds_, v, ldv, acc_.data(), vD_, true);
    } else if (R <= 8) {
      pv_few_rows(R, nk, v, ldv);
    } else {
      const int64_t ld = KvPacker<KT, C>::ldk(bkv_);
      C* kd = kbuf.get(packer_.k_elems(bkv_));
      C* vd = vbuf.get(packer_.v_elems(bkv_));
      const KvView<C> view = packer_.view(it.b, it.n2, j0, kd, ld, vd);
      packer_.pack_v(it.b, it.n2, j0, j1, j0, vd);
      clock.lap(St::kFwdPack);
      mm(R, vD_, round_up(nk, 2), p_lowp_.data(), lds_, view.v_at(j0), view.ldv, acc_.data(), vD_, true);
    }
    clock.lap(St::kFwdPv);
  }

  // acc[r, :] += P[r, :] · V for R <= 8 rows, bf16 V read in place: 4 rows x one bf16 vector of columns stay in
  // registers while the tile's keys stream by (decoding is bound by reading V once).
  void pv_few_rows(int64_t R, int64_t nk, const BFloat16* v, int64_t ldv) {
    using VecB = at::vec::Vectorized<BFloat16>;
    constexpr int64_t kF = Vec::size(), kB = VecB::size();  // kB == 2 * kF
    if (zeros_.size() < static_cast<size_t>(nk)) zeros_.assign(nk, 0.f);
    for (int64_t r = 0; r < R; ++r)  // P as rounded for P·V, back in fp32
      at::vec::convert(p_lowp_.data() + r * lds_, s_.data() + r * lds_, nk);
    for (int64_t r0 = 0; r0 < R; r0 += 4) {
      const float* pr[4];
      for (int64_t x = 0; x < 4; ++x) pr[x] = r0 + x < R ? s_.data() + (r0 + x) * lds_ : zeros_.data();
      for (int64_t c = 0; c < vD_; c += kB) {
        const int64_t cnt = std::min(kB, vD_ - c), c0 = std::min(kF, cnt), c1 = cnt - c0;
        Vec a[4][2];
        for (int64_t x = 0; x < 4; ++x) {
          float* acc = acc_.data() + (r0 + x) * vD_ + c;
          a[x][0] = r0 + x < R ? Vec::loadu(acc, c0) : Vec(0.f);
          a[x][1] = r0 + x < R && c1 > 0 ? Vec::loadu(acc + kF, c1) : Vec(0.f);
        }
        for (int64_t j = 0; j < nk; ++j) {
          auto [lo, hi] = at::vec::convert_bfloat16_float(VecB::loadu(v + j * ldv + c, cnt));
          for (int64_t x = 0; x < 4; ++x) {
            const Vec pj(pr[x][j]);
            a[x][0] = at::vec::fmadd(pj, lo, a[x][0]);
            a[x][1] = at::vec::fmadd(pj, hi, a[x][1]);
          }
        }
        for (int64_t x = 0; x < 4 && r0 + x < R; ++x) {
          float* acc = acc_.data() + (r0 + x) * vD_ + c;
          a[x][0].store(acc, c0);
          if (c1 > 0) a[x][1].store(acc + kF, c1);
        }
      }
    }
  }

  // Scale, pse, masking and the online softmax update of the R rows of a tile's scores.
  void softmax_rows(const Item& it, int64_t mq, int64_t R, int64_t j0, int64_t nk, bool partial) {
    const bool transform = p_.has_logit_transform(), raw = raw_;
    for (int64_t r = 0; r < R; ++r) {
      const int64_t n = head(it, r, mq), i = it.i0 + r % mq;
      float* s = s_.data() + r * lds_;
      float mx;
      if (raw) {
        if (partial) p_.mask_row(it.b, n, i, j0, nk, s);
        if (lazy_ && online_softmax::row_kind(m_[r] * unit_) == RowKind::Regular) {
          clock.lap(St::kFwdMax);
          if (fused_row(s, nk, r)) {
            clock.lap(St::kFwdExp);
            continue;
          }
        }
        mx = row_max(s, nk);
      } else if (transform) {
        fa_logits::transform_logits(p_, it.b, n, i, j0, nk, s, nullptr, tmp_.data());
        if (partial) p_.mask_row(it.b, n, i, j0, nk, s);
        mx = row_max(s, nk);
      } else {
        const float* bias = p_.pse ? p_.pse->row(it.b, n, i) + j0 * p_.pse->sj : nullptr;
        const int64_t bias_stride = p_.pse ? p_.pse->sj : 0;
        mx = scale_bias_max(s, nk, p_.scale, bias, bias_stride, p_.pse_type == 1 ? p_.scale : 1.f);
        if (partial) {
          p_.mask_row(it.b, n, i, j0, nk, s);
          mx = row_max(s, nk);
        }
      }
      clock.lap(St::kFwdMax);
      softmax_row(it.b, n, i, j0, nk, s, mx, r);
    }
  }

  // Online softmax update of row r with scores s[0, nk) (their max: row_mx), in units of s (see unit_): rescales
  // acc and leaves P (after dropout, in the dtype of the P·V product) for P·V. P = 2^((s − m)·a), a = unit·log2(e):
  // the row maximum's exponent is exactly 0 at any magnitude (softmax_exp.h).
  void softmax_row(int64_t b, int64_t n, int64_t i, int64_t j0, int64_t nk, float* s, float row_mx, int64_t r) {
    const float m_old = m_[r];
    const float m_new = nan_max(m_old, row_mx);
    C* pl = kVnni ? reinterpret_cast<C*>(p_lowp_.data() + r * lds_) : nullptr;
    float* pf = kVnni ? s : p32_.data() + r * lds_;  // fp32 P: the product's operand, or scratch before the cast
    const float m_scaled = m_new * unit_;  // +inf when the scale overflows a finite raw maximum: a NaN row
    if (!(std::abs(m_scaled) < online_softmax::kHugeMax)) {  // one compare per row and tile; the rare rows below
      switch (online_softmax::row_kind(m_scaled)) {
        case RowKind::Unseen:  // nothing visible yet: P = 0, state unchanged
          zero_p(pf, pl, nk);
          return;
        case RowKind::NaN:  // a NaN score (or +inf): the row is NaN from here on, P = 0 adds nothing
          zero_p(pf, pl, nk);
          m_[r] = l_[r] = online_softmax::kNaN;
          std::fill_n(acc_.data() + r * vD_, vD_, online_softmax::kNaN);
          return;
        default:  // huge finite scores: s − m is exact near the maximum, so the fast path holds
          break;
      }
    }
    const float alpha = m_old == kNegInf ? 0.f : std::exp((m_old - m_new) * unit_);
    const float a = exp_scale_;
    constexpr int kDeg = softmax_exp::degree_for<T>;
    float sum;
    if (!p_.has_dropout()) {
      sum = exp_row(s, nk, a, m_new, pl, pf);
    } else {
      sum = exp_store<kDeg>(s, nk, a, m_new, pf);
      apply_dropout(b, n, i, j0, nk, pf);
      if constexpr (kVnni) at::vec::convert(pf, pl, nk);
      if constexpr (kRoundP) round_through<T>(pf, nk);
    }
    if constexpr (kVnni) {
      if (nk % 2) pl[nk] = C(0.f);
    }
    l_[r] = l_[r] * alpha + sum;  // the sum uses probabilities before dropout
    m_[r] = m_new;
    clock.lap(St::kFwdExp);
    if (alpha != 1.f) scale_row(acc_.data() + r * vD_, vD_, alpha);
    clock.lap(St::kFwdRescale);
  }

  // P of a row in the product's dtype (pl for bf16 products, else pf, rounded to the input dtype when that is
  // 16-bit); returns the fp32 sum. With tile_max, also the row's largest score.
  float exp_row(const float* s, int64_t nk, float a, float m, C* pl, float* pf, float* tile_max = nullptr) {
    constexpr int kDeg = softmax_exp::degree_for<T>;
    if constexpr (kVnni) return exp_store<kDeg>(s, nk, a, m, pl, tile_max);
    else if constexpr (kRoundP) return exp_store<kDeg, float, T>(s, nk, a, m, pf, tile_max);
    else return exp_store<kDeg>(s, nk, a, m, pf, tile_max);
  }

  // One pass instead of two for a row that has a regular running maximum m: P = 2^((s − m)·a) against that stale
  // maximum while the pass finds the tile's own. Kept when no score exceeds m by more than kLazyRescale in the
  // exponent (P ≤ 2^8: no overflow, the same relative precision), so the row maximum pass and the rescaling of
  // the accumulator are skipped; the true maximum is carried in mt_ and settled once at the end. Otherwise (a
  // larger maximum, or a NaN score: a NaN sum) returns false and the caller takes the two-pass update; its P
  // went to pl / pf, the scores are intact.
  bool fused_row(const float* s, int64_t nk, int64_t r) {
    const float m = m_[r], a = exp_scale_;
    C* pl = kVnni ? reinterpret_cast<C*>(p_lowp_.data() + r * lds_) : nullptr;
    float* pf = kVnni ? nullptr : p32_.data() + r * lds_;
    float tile_max;
    const float sum = exp_row(s, nk, a, m, pl, pf, &tile_max);
    if (!(sum == sum) || !((tile_max - m) * a <= kLazyRescale)) return false;
    if constexpr (kVnni) {
      if (nk % 2) pl[nk] = C(0.f);
    }
    l_[r] += sum;
    mt_[r] = std::max(mt_[r], tile_max);
    return true;
  }

  // Brings row r's state to its true maximum: (m, l, acc) against mt_ when fused rows ran against a lower one.
  void settle(int64_t r) {
    if (!(mt_[r] > m_[r])) return;  // also NaN rows
    const float f = std::exp((m_[r] - mt_[r]) * unit_);
    l_[r] *= f;
    scale_row(acc_.data() + r * vD_, vD_, f);
    m_[r] = mt_[r];
  }

  // P = 0 for the nk keys of a row (and its low-precision copy for P·V).
  void zero_p(float* s, C* pl, int64_t nk) {
    std::fill_n(s, nk, 0.f);
    if constexpr (kVnni) std::fill_n(pl, round_up(nk, 2), C(0.f));
  }

  void apply_dropout(int64_t b, int64_t n, int64_t i, int64_t j0, int64_t nk, float* s) {
    p_.dropout_keep(b, n, i, j0, nk, keep_.data());
    const float inv = 1.f / p_.keep_prob;
    for (int64_t j = 0; j < nk; ++j) s[j] = keep_[j] ? s[j] * inv : 0.f;
  }

  // out = acc / l in q's dtype (acc is scaled in place); softmax_max/sum repeated 8 times. A row that saw no key
  // gets 0, -inf, 0 (with a sink: 0, sink, 1).
  void write_row(int64_t b, int64_t n, int64_t i, float m, float l, float* acc) {
    if (p_.sink) add_sink(p_.sink[n], m, l, acc);
    const bool empty = l == 0.f;
    if (empty) std::fill_n(acc, vD_, 0.f);
    else scale_row(acc, vD_, 1.f / l);
    at::vec::convert(acc, out_ + p_.out.at(b, n, i), vD_);
    const int64_t st = p_.stats.at(b, n, i);
    std::fill_n(max_ + st, 8, empty ? kNegInf : m);
    std::fill_n(sum_ + st, 8, empty ? 0.f : l);
  }

  // The sink as one more key of the online softmax (online_softmax::add_sink), the accumulator rescaled with it: a
  // row without a visible key holds zeros, a NaN row NaN.
  void add_sink(float s, float& m, float& l, float* acc) {
    const float factor = online_softmax::add_sink(s, m, l);
    if (factor == 0.f || factor != factor) std::fill_n(acc, vD_, factor);
    else if (factor != 1.f) scale_row(acc, vD_, factor);
  }

  const AttentionParams& p_;
  const KvPacker<KT, C>& packer_;
  const int64_t bkv_, D_, Dp_, vD_, lds_;
  const T* q_;
  const KT *k_, *v_;
  T* out_;
  float *max_, *sum_;
  std::vector<C> qpack_, qt_;
  std::vector<float> st_, zeros_;
  std::vector<BFloat16> p_lowp_;
  // Without pse, softcap and ALiBi (and scale > 0) the scores stay raw Q·Kᵀ and the scale is folded into the
  // exponent (one pass fewer over the tile): the running maxima m_ are then in raw units, unit_ = scale converts.
  const bool raw_ = !p_.pse && p_.scale > 0.f && !p_.has_logit_transform();
  const float unit_ = raw_ ? p_.scale : 1.f;
  const float exp_scale_ = unit_ * softmax_exp::kLog2e;  // P = 2^((s − m)·exp_scale_)
  // fused_row for raw rows without dropout (dropout needs fp32 P against the row's final maximum of the tile).
  static constexpr float kLazyRescale = 8.f;
  const bool lazy_ = raw_ && !p_.has_dropout();
  // s_: scores; p32_: fp32 P (fp32 products); m_: the maximum P is computed against, mt_: the largest seen.
  std::vector<float> s_, p32_, acc_, m_, mt_, l_, tmp_;
  std::vector<uint8_t> keep_;
};

template <typename T, typename C, typename KT = T>
void forward_impl(const AttentionParams& p, const AttentionInputs& in, ForwardOutputs& o) {
  constexpr bool kVnni = std::is_same_v<C, BFloat16>;
  attention::TileConfig tc = attention::tile_config(p.head_dim, static_cast<int64_t>(sizeof(C)));
  if (kVnni) tc.block_kv = round_up(tc.block_kv, 2);  // VNNI tiles start at even keys
  auto n_tiles = [&](const Item& it) { return item_tiles(p, it, tc.block_kv, kVnni).second; };
  Plan plan = make_plan(p, tc.block_q);
  const KvPacker<KT, C> packer(p, in.key.const_data_ptr<KT>(), in.value.const_data_ptr<KT>());
  const int64_t threads = at::get_num_threads();
  const int64_t n_items = static_cast<int64_t>(plan.items.size());
  const int64_t n_groups = static_cast<int64_t>(plan.groups.size());
  // No query row anywhere (every length 0): nothing to compute, and the work split below divides by the item count.
  if (n_items == 0) return;
  std::atomic<int64_t> next{0};
  // Each worker takes the next unit from a shared counter, so uneven units balance out.
  auto workers = [&](int64_t units, const auto& body) {
    next = 0;
    at::parallel_for(0, std::min(threads, units), 1, [&](int64_t, int64_t) {
      ForwardKernel<T, C, KT> kernel(p, in, o, packer, plan.max_rows, tc.block_kv);
      for (int64_t u = next.fetch_add(1); u < units; u = next.fetch_add(1)) body(kernel, u);
      brgemm::release(kVnni);
      kernel.clock.lap(St::kFwdFinish);
    });
  };

  if (n_items == n_groups) {
    // Each KV head feeds a single item (decoding, short Sq): nothing to reuse, so pack tile by tile. When there are
    // too few items for the threads, split their key ranges and merge the partial softmax states afterwards.
    sort_by_cost(plan.items);
    int64_t max_tiles = 0;
    for (const Item& it : plan.items) max_tiles = std::max(max_tiles, n_tiles(it));
    const int64_t splits = std::max<int64_t>(1, std::min((4 * threads + n_items - 1) / n_items, max_tiles));
    if (splits == 1 || threads == 1) {
      workers(n_items, [&](ForwardKernel<T, C, KT>& kernel, int64_t u) {
        kernel.run(plan.items[u], nullptr, 0, max_tiles);
      });
      return;
    }
    const int64_t stride = plan.max_rows * (p.v_head_dim + 2);
    std::vector<float> partial(n_items * splits * stride);
    workers(n_items * splits, [&](ForwardKernel<T, C, KT>& kernel, int64_t u) {
      const Item& it = plan.items[u / splits];
      const int64_t x = u % splits, n = n_tiles(it);
      kernel.run(it, nullptr, x * n / splits, (x + 1) * n / splits, partial.data() + u * stride);
    });
    workers(n_items, [&](ForwardKernel<T, C, KT>& kernel, int64_t u) {
      kernel.merge(plan.items[u], partial.data() + u * splits * stride, splits, stride);
    });
    return;
  }
  if (n_groups >= 4 * threads || threads == 1) {
    // Many KV heads: a worker takes a whole head, packs it into its own buffer (reused, so it stays in cache and
    // costs no page faults) and runs all of that head's items.
    sort_by_cost(plan.groups);
    workers(n_groups, [&](ForwardKernel<T, C, KT>& kernel, int64_t u) {
      const Group& g = plan.groups[u];
      const int64_t len = p.kv_len[g.b], ld = KvPacker<KT, C>::ldk(len);
      C* kd = kernel.kbuf.get(packer.k_elems(len));
      C* vd = kernel.vbuf.get(packer.v_elems(len));
      packer.pack(g.b, g.n2, 0, len, 0, kd, ld, vd);
      kernel.clock.lap(St::kFwdPack);
      const KvView<C> view = packer.view(g.b, g.n2, 0, kd, ld, vd);
      for (int64_t i = g.begin; i < g.end; ++i) kernel.run(plan.items[i], &view, 0, n_tiles(plan.items[i]));
    });
    return;
  }
  // Few KV heads (long sequences): pack them all at once in parallel chunks of keys, then share them by items.
  constexpr int64_t kChunk = 256;
  std::vector<int64_t> k_off(n_groups + 1, 0), v_off(n_groups + 1, 0), chunk0(n_groups + 1, 0);
  for (int64_t x = 0; x < n_groups; ++x) {
    const int64_t len = p.kv_len[plan.groups[x].b];
    k_off[x + 1] = k_off[x] + packer.k_elems(len);
    v_off[x + 1] = v_off[x] + packer.v_elems(len);
    chunk0[x + 1] = chunk0[x] + (len + kChunk - 1) / kChunk;
  }
  Buffer<C> kall, vall;
  C* kd = kall.get(k_off.back());
  C* vd = vall.get(v_off.back());
  at::parallel_for(0, chunk0.back(), 1, [&](int64_t c0, int64_t c1) {
    StageClock clock;
    for (int64_t c = c0; c < c1; ++c) {
      const int64_t x = std::upper_bound(chunk0.begin(), chunk0.end(), c) - chunk0.begin() - 1;
      const Group& g = plan.groups[x];
      const int64_t j0 = (c - chunk0[x]) * kChunk, len = p.kv_len[g.b];
      packer.pack(g.b, g.n2, j0, std::min(len, j0 + kChunk), 0, kd + k_off[x], KvPacker<KT, C>::ldk(len), vd + v_off[x]);
    }
    clock.lap(St::kFwdPack);
  });
  std::vector<KvView<C>> views(n_groups);
  std::vector<int64_t> group_of(p.batch * p.kv_heads, 0);
  for (int64_t x = 0; x < n_groups; ++x) {
    const Group& g = plan.groups[x];
    views[x] = packer.view(g.b, g.n2, 0, kd + k_off[x], KvPacker<KT, C>::ldk(p.kv_len[g.b]), vd + v_off[x]);
    group_of[g.b * p.kv_heads + g.n2] = x;
  }
  sort_by_cost(plan.items);
  workers(n_items, [&](ForwardKernel<T, C, KT>& kernel, int64_t u) {
    const Item& it = plan.items[u];
    kernel.run(it, &views[group_of[it.b * p.kv_heads + it.n2]], 0, n_tiles(it));
  });
}

template <typename T>
void forward_typed(const AttentionParams& p, const AttentionInputs& in, ForwardOutputs& o) {
  if constexpr (std::is_same_v<T, BFloat16>) {
    if (brgemm_usable(at::kBFloat16)) {
      if (p.int8_kv()) return forward_impl<T, BFloat16, int8_t>(p, in, o);
      return forward_impl<T, BFloat16>(p, in, o);
    }
  }
  if constexpr (!std::is_same_v<T, float>) {  // an int8 key/value comes with an fp16/bf16 query
    if (p.int8_kv()) return forward_impl<T, float, int8_t>(p, in, o);
  }
  forward_impl<T, float>(p, in, o);
}

}  // namespace fa_fwd

void attention_forward(const AttentionParams& p, const AttentionInputs& in, ForwardOutputs& o) {
  AT_DISPATCH_SWITCH(in.query.scalar_type(), "flash_attention_score_cpu",
                     AT_DISPATCH_CASE(at::kFloat, [&] { fa_fwd::forward_typed<scalar_t>(p, in, o); })
                     AT_DISPATCH_CASE(at::kHalf, [&] { fa_fwd::forward_typed<scalar_t>(p, in, o); })
                     AT_DISPATCH_CASE(at::kBFloat16, [&] { fa_fwd::forward_typed<scalar_t>(p, in, o); }));
}

}  // namespace npu_fa::cpu::CPU_CAPABILITY
