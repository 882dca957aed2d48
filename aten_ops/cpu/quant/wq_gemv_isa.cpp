// The fused dequantise-and-multiply of weight_quant_batchmatmul for a few rows of x (cpu/quant/wq_gemv.h). Compiled
// three times by setup.py (-DCPU_CAPABILITY=DEFAULT|AVX2|AVX512), so at::vec::Vectorized has that ISA's width.
//
// Every weight is dequantised once per call, in registers: (w + offset) * scale in fp32, rounded to x's dtype
// (as the NPU's antiquant and the GEMM path do), then multiplied with fp32 accumulation.
// - N-major weights (columns adjacent), kKc rows at a time: for one or two rows of x the dequantised weights go
//   straight from registers into 4 vector accumulators per kSub columns; for more rows they are stored in an L1
//   panel that every row of x runs its accumulators down. k ascending either way.
// - K-major weights (rows adjacent): a column is dequantised into a buffer along K, then every row of x takes a dot
//   product with it in four vector accumulators, summed in a fixed order.
// Columns are independent and each is computed the same way wherever it falls, so the result does not depend on how
// at::parallel_for splits the blocks over the threads.
#include "cpu/quant/wq_gemv.h"

#ifndef CPU_CAPABILITY
#error "this *_isa.cpp must be compiled with -DCPU_CAPABILITY=DEFAULT|AVX2|AVX512 (setup.py does this)"
#endif

#include <ATen/Parallel.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <tuple>
#include <vector>

namespace npu_fa::cpu::CPU_CAPABILITY {

namespace {

using Vec = at::vec::Vectorized<float>;
using IVec = at::vec::Vectorized<int32_t>;
constexpr int64_t W = Vec::size();
constexpr int64_t kSub = 4 * W;   // columns per N-major micro-kernel: 4 vector accumulators per row of x
constexpr int64_t kNBMax = 512;  // columns per N-major panel block at most (a multiple of kSub for every ISA)
constexpr int64_t kNBFused = 2048;  // columns per N-major block at most for 1 or 2 rows of x (no panel)
constexpr int64_t kKc = 8;       // rows per N-major panel: kKc * kNBMax fp32 = 16 KiB, inside L1; divides 32, so
                                 // a panel never straddles two groups (multiples of 32 rows)
constexpr int64_t kPrefetchRows = 16;  // N-major: rows of the weight requested ahead of the ones dequantised
constexpr int64_t kMinTask = 1 << 15;  // weights per task at least, so tiny products do not pay for a fork

// W int8 -> fp32.
inline Vec load_int8(const int8_t* p) {
#if defined(CPU_CAPABILITY_AVX2) || defined(CPU_CAPABILITY_AVX512)
  return at::vec::convert_to_fp_of_same_size<float>(at::vec::convert_to_int32<int8_t>(p));
#else
  float f[W];
  for (int64_t i = 0; i < W; ++i) f[i] = static_cast<float>(p[i]);
  return Vec::loadu(f);
#endif
}

// The W int4 held by W / 8 consecutive words (element j of a word in bits 4j..4j+3) -> fp32. Shifting nibble j to
// the top and back arithmetically sign-extends it.
inline Vec load_int4(const int32_t* words) {
  alignas(64) static const int32_t kShl[16] = {28, 24, 20, 16, 12, 8, 4, 0, 28, 24, 20, 16, 12, 8, 4, 0};
  IVec v;
  if constexpr (W == 8) {
    v = IVec(words[0]);
  } else {
    int32_t rep[W];
    for (int64_t i = 0; i < W; ++i) rep[i] = words[i / 8];
    v = IVec::loadu(rep);
  }
  const IVec shl = IVec::loadu(kShl);
  return at::vec::convert_to_fp_of_same_size<float>((v << shl) >> IVec(28));
}

inline int32_t int4_at(const int32_t* words, int64_t j) {  // element j of the packed run starting at words
  const uint32_t word = static_cast<uint32_t>(words[j / 8]);
  return static_cast<int32_t>(((word >> (4 * (j % 8))) & 15u) ^ 8u) - 8;
}

// The bits of v as int32 lanes (a register reinterpretation where the ISA has one).
inline IVec float_bits(Vec v) {
#if defined(CPU_CAPABILITY_AVX2)
  return _mm256_castps_si256(v);
#elif defined(CPU_CAPABILITY_AVX512)
  return _mm512_castps_si512(v);
#else
  return at::vec::cast<int32_t>(v);
#endif
}

// v rounded to the nearest bfloat16, half to even (c10::BFloat16's rule), kept as fp32: the low 16 bits are rounded
// away in the register, where converting to a bf16 vector and back (packing and unpacking lanes) costs about as
// much as the rest of the dequantisation. NaN stays NaN.
inline Vec round_bf16(Vec v) {
  const IVec b = float_bits(v);
  const IVec r = (b + ((b >> IVec(16)) & IVec(1)) + IVec(0x7fff)) & IVec(static_cast<int32_t>(0xffff0000u));
  return Vec::blendv(v, at::vec::cast<float>(r), v == v);
}

// Rounds two vectors to x's dtype and back (round half to even, as c10's scalar conversion).
template <WqRound Rd>
inline void round_pair(Vec& a, Vec& b) {
  if constexpr (Rd == WqRound::kBFloat16) {
    a = round_bf16(a);
    b = round_bf16(b);
  } else if constexpr (Rd == WqRound::kHalf) {
    std::tie(a, b) = at::vec::convert_to_float<c10::Half>(at::vec::convert_from_float<c10::Half>(a, b));
  }
}

template <WqRound Rd>
inline float round_one(float v) {
  if constexpr (Rd == WqRound::kBFloat16) return static_cast<float>(c10::BFloat16(v));
  if constexpr (Rd == WqRound::kHalf) return static_cast<float>(c10::Half(v));
  return v;
}

// (q + o) * s: the same two fp32 operations in the vector and the scalar code (no contraction is possible).
inline Vec dequant(Vec q, Vec s, const Vec* o) { return o ? (q + *o) * s : q * s; }
inline float dequant(float q, float s, const float* o) { return o ? (q + *o) * s : q * s; }

// Weight (k, n) as a scalar, for the ragged edges.
template <WqWeight F>
inline float weight_at(const WqGemvParams& p, int64_t k, int64_t n) {
  if constexpr (F == WqWeight::kInt8NMajor || F == WqWeight::kInt8KMajor)
    return static_cast<const int8_t*>(p.w)[k * p.w_sk + n * p.w_sn];
  const int32_t* w = static_cast<const int32_t*>(p.w);
  if constexpr (F == WqWeight::kInt4NMajor) return int4_at(w + k * p.w_sk + (n / 8) * p.w_sn, n % 8);
  return int4_at(w + (k / 8) * p.w_sk + n * p.w_sn, k % 8);
}

// ---- N-major -----------------------------------------------------------------------------------------------------
// W consecutive columns n.. of row k (n a multiple of 8 for int4).
template <WqWeight F>
inline Vec load_row(const WqGemvParams& p, int64_t k, int64_t n) {
  if constexpr (F == WqWeight::kInt8NMajor) return load_int8(static_cast<const int8_t*>(p.w) + k * p.w_sk + n);
  return load_int4(static_cast<const int32_t*>(p.w) + k * p.w_sk + n / 8);
}

// Asks for the bytes of columns [n0, n0 + T) of row k (if it exists) ahead of use: consecutive rows of a block are a
// page apart for serving N, where the hardware prefetchers do not follow, and the loads alone keep too few misses in
// flight to stream the weight.
template <WqWeight F>
inline void prefetch_row(const WqGemvParams& p, int64_t k, int64_t n0, int64_t T) {
  if (k >= p.K) return;
  const char* base;
  int64_t bytes;
  if constexpr (F == WqWeight::kInt8NMajor) {
    base = static_cast<const char*>(p.w) + k * p.w_sk + n0;
    bytes = T;
  } else {
    base = reinterpret_cast<const char*>(static_cast<const int32_t*>(p.w) + k * p.w_sk + n0 / 8);
    bytes = (T + 1) / 2;
  }
  for (int64_t b = 0; b < bytes; b += 64) __builtin_prefetch(base + b);
}

// panel[kk, :] = the dequantised rows k0 + kk (kk < kn) of columns [n0, n0 + T), row stride kNBMax; the columns
// from T up to the next multiple of kSub are zero.
template <WqWeight F, WqRound Rd>
void dequant_panel(const WqGemvParams& p, int64_t k0, int64_t kn, int64_t n0, int64_t T, float* panel) {
  const int64_t Tv = T / (2 * W) * (2 * W), Tz = (T + kSub - 1) / kSub * kSub;
  for (int64_t kk = 0; kk < kn; ++kk) {
    const int64_t k = k0 + kk, g = k / p.group;
    const float* s = p.scale + g * p.N + n0;
    const float* o = p.offset ? p.offset + g * p.N + n0 : nullptr;
    float* dst = panel + kk * kNBMax;
    for (int64_t j = 0; j < Tv; j += 2 * W) {
      Vec a = load_row<F>(p, k, n0 + j), b = load_row<F>(p, k, n0 + j + W);
      if (o) a = a + Vec::loadu(o + j), b = b + Vec::loadu(o + j + W);
      a = a * Vec::loadu(s + j), b = b * Vec::loadu(s + j + W);
      round_pair<Rd>(a, b);
      a.store(dst + j);
      b.store(dst + j + W);
    }
    for (int64_t j = Tv; j < T; ++j)
      dst[j] = round_one<Rd>(dequant(weight_at<F>(p, k, n0 + j), s[j], o ? o + j : nullptr));
    std::fill(dst + T, dst + Tz, 0.f);
  }
}

// acc[r, :kSub] += sum over kk < kn of x[r, kk] * panel[kk, :kSub], kk ascending.
inline void panel_fma(const float* x, const float* panel, int64_t kn, float* acc) {
  Vec a0 = Vec::loadu(acc), a1 = Vec::loadu(acc + W), a2 = Vec::loadu(acc + 2 * W), a3 = Vec::loadu(acc + 3 * W);
  for (int64_t kk = 0; kk < kn; ++kk) {
    const Vec xv(x[kk]);
    const float* row = panel + kk * kNBMax;
    a0 = at::vec::fmadd(xv, Vec::loadu(row), a0);
    a1 = at::vec::fmadd(xv, Vec::loadu(row + W), a1);
    a2 = at::vec::fmadd(xv, Vec::loadu(row + 2 * W), a2);
    a3 = at::vec::fmadd(xv, Vec::loadu(row + 3 * W), a3);
  }
  a0.store(acc), a1.store(acc + W), a2.store(acc + 2 * W), a3.store(acc + 3 * W);
}

// For RB <= 2 rows of x the dequantised weights stay in registers: acc[r, :kSub] (row stride ld) += the rows
// k0 .. k0 + kn of columns n.. times x[r, k], k ascending. Same arithmetic per column as dequant_panel + panel_fma.
// The rows share one group (a group is a multiple of 32 rows, kKc divides 32).
template <WqWeight F, WqRound Rd, int RB>
void fused_sub(const WqGemvParams& p, int64_t k0, int64_t kn, int64_t n, float* acc, int64_t ld) {
  const int64_t g = k0 / p.group;
  Vec s[4], o[4];
  for (int64_t v = 0; v < 4; ++v) {
    s[v] = Vec::loadu(p.scale + g * p.N + n + v * W);
    o[v] = p.offset ? Vec::loadu(p.offset + g * p.N + n + v * W) : Vec(0.f);
  }
  Vec a[RB][4];
  for (int r = 0; r < RB; ++r)
    for (int64_t v = 0; v < 4; ++v) a[r][v] = Vec::loadu(acc + r * ld + v * W);
  for (int64_t k = k0; k < k0 + kn; ++k) {
    Vec d[4];
    for (int64_t v = 0; v < 4; ++v) d[v] = load_row<F>(p, k, n + v * W);
    if (p.offset)
      for (int64_t v = 0; v < 4; ++v) d[v] = d[v] + o[v];
    for (int64_t v = 0; v < 4; ++v) d[v] = d[v] * s[v];
    round_pair<Rd>(d[0], d[1]);
    round_pair<Rd>(d[2], d[3]);
    for (int r = 0; r < RB; ++r) {
      const Vec xv(p.x[r * p.K + k]);
      for (int64_t v = 0; v < 4; ++v) a[r][v] = at::vec::fmadd(xv, d[v], a[r][v]);
    }
  }
  for (int r = 0; r < RB; ++r)
    for (int64_t v = 0; v < 4; ++v) a[r][v].store(acc + r * ld + v * W);
}

// Column blocks (narrower when N is small, so every thread gets blocks): each row of the weight is read as one
// contiguous run of the block's bytes; with narrow blocks every row is a new page, which the hardware prefetchers
// do not follow. Up to two rows of x keep the dequantised weights in registers and take blocks of up to
// kNBFused columns; more rows go through the L1 panel, kNBMax columns wide. The block width does not change any
// column's arithmetic.
template <WqWeight F, WqRound Rd>
void gemv_n_major(const WqGemvParams& p) {
  const bool fused = p.R <= 2;
  const int64_t threads = at::get_num_threads();
  const int64_t want = (p.N + threads - 1) / threads;
  const int64_t nb = std::clamp<int64_t>((want + kSub - 1) / kSub * kSub, kSub, fused ? kNBFused : kNBMax);
  const int64_t blocks = (p.N + nb - 1) / nb;
  const int64_t grain = std::max<int64_t>(1, kMinTask / std::max<int64_t>(1, p.K * nb));
  at::parallel_for(0, blocks, grain, [&](int64_t b0, int64_t b1) {
    std::vector<float> panel_buf(kKc * kNBMax), acc_buf(p.R * nb);
    float* panel = panel_buf.data();
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t n0 = b * nb, T = std::min(nb, p.N - n0);
      // Fused: the whole kSub-wide column groups from registers, a ragged rest (< kSub columns) through the panel.
      const int64_t Tf = fused ? T / kSub * kSub : 0;
      std::fill(acc_buf.begin(), acc_buf.end(), 0.f);
      for (int64_t k0 = 0; k0 < p.K; k0 += kKc) {
        const int64_t kn = std::min(kKc, p.K - k0);
        for (int64_t k = k0 + kPrefetchRows; k < std::min(p.K, k0 + kn + kPrefetchRows); ++k)
          prefetch_row<F>(p, k, n0, T);
        for (int64_t j = 0; j < Tf; j += kSub) {
          if (p.R == 1)
            fused_sub<F, Rd, 1>(p, k0, kn, n0 + j, acc_buf.data() + j, nb);
          else
            fused_sub<F, Rd, 2>(p, k0, kn, n0 + j, acc_buf.data() + j, nb);
        }
        if (Tf == T) continue;
        dequant_panel<F, Rd>(p, k0, kn, n0 + Tf, T - Tf, panel);
        for (int64_t r = 0; r < p.R; ++r)
          for (int64_t j = 0; j < T - Tf; j += kSub)
            panel_fma(p.x + r * p.K + k0, panel + j, kn, acc_buf.data() + r * nb + Tf + j);
      }
      for (int64_t r = 0; r < p.R; ++r) std::copy_n(acc_buf.data() + r * nb, T, p.y + r * p.N + n0);
    }
  });
}

// ---- K-major -----------------------------------------------------------------------------------------------------
// W consecutive rows k.. of column n (k a multiple of 8 for int4).
template <WqWeight F>
inline Vec load_col(const WqGemvParams& p, int64_t k, int64_t n) {
  if constexpr (F == WqWeight::kInt8KMajor) return load_int8(static_cast<const int8_t*>(p.w) + n * p.w_sn + k);
  return load_int4(static_cast<const int32_t*>(p.w) + n * p.w_sn + k / 8);
}

// col[k] = the dequantised weight (k, n) for all K rows; per-group parameters are constant over a group's rows.
template <WqWeight F, WqRound Rd>
void dequant_column(const WqGemvParams& p, int64_t n, float* col) {
  for (int64_t k0 = 0; k0 < p.K; k0 += p.group) {
    const int64_t k1 = std::min(p.K, k0 + p.group), g = k0 / p.group;
    const float s = p.scale[g * p.N + n];
    const float* o = p.offset ? p.offset + g * p.N + n : nullptr;
    const Vec sv(s), ov(o ? *o : 0.f);
    int64_t k = k0;
    for (; k + 2 * W <= k1; k += 2 * W) {  // k0 is a multiple of 32 (the group rule), so int4 words align
      Vec a = dequant(load_col<F>(p, k, n), sv, o ? &ov : nullptr);
      Vec b = dequant(load_col<F>(p, k + W, n), sv, o ? &ov : nullptr);
      round_pair<Rd>(a, b);
      a.store(col + k);
      b.store(col + k + W);
    }
    for (; k < k1; ++k) col[k] = round_one<Rd>(dequant(weight_at<F>(p, k, n), s, o));
  }
}

// sum_k x[k] * col[k]: four vector accumulators, then one, then the scalar tail, always in this order.
inline float dot(const float* x, const float* col, int64_t K) {
  Vec a0(0.f), a1(0.f), a2(0.f), a3(0.f);
  int64_t k = 0;
  for (; k + 4 * W <= K; k += 4 * W) {
    a0 = at::vec::fmadd(Vec::loadu(x + k), Vec::loadu(col + k), a0);
    a1 = at::vec::fmadd(Vec::loadu(x + k + W), Vec::loadu(col + k + W), a1);
    a2 = at::vec::fmadd(Vec::loadu(x + k + 2 * W), Vec::loadu(col + k + 2 * W), a2);
    a3 = at::vec::fmadd(Vec::loadu(x + k + 3 * W), Vec::loadu(col + k + 3 * W), a3);
  }
  for (; k + W <= K; k += W) a0 = at::vec::fmadd(Vec::loadu(x + k), Vec::loadu(col + k), a0);
  float lanes[W];
  ((a0 + a1) + (a2 + a3)).store(lanes);
  float sum = 0.f;
  for (int64_t i = 0; i < W; ++i) sum += lanes[i];
  for (; k < K; ++k) sum += x[k] * col[k];
  return sum;
}

template <WqWeight F, WqRound Rd>
void gemv_k_major(const WqGemvParams& p) {
  const int64_t grain = std::max<int64_t>(1, kMinTask / std::max<int64_t>(1, p.K));
  at::parallel_for(0, p.N, grain, [&](int64_t n0, int64_t n1) {
    std::vector<float> col(p.K);
    for (int64_t n = n0; n < n1; ++n) {
      dequant_column<F, Rd>(p, n, col.data());
      for (int64_t r = 0; r < p.R; ++r) p.y[r * p.N + n] = dot(p.x + r * p.K, col.data(), p.K);
    }
  });
}

template <WqRound Rd>
void gemv_form(const WqGemvParams& p) {
  switch (p.form) {
    case WqWeight::kInt8NMajor: return gemv_n_major<WqWeight::kInt8NMajor, Rd>(p);
    case WqWeight::kInt4NMajor: return gemv_n_major<WqWeight::kInt4NMajor, Rd>(p);
    case WqWeight::kInt8KMajor: return gemv_k_major<WqWeight::kInt8KMajor, Rd>(p);
    case WqWeight::kInt4KMajor: return gemv_k_major<WqWeight::kInt4KMajor, Rd>(p);
  }
}

}  // namespace

void wq_gemv(const WqGemvParams& p) {
  switch (p.round) {
    case WqRound::kFloat: return gemv_form<WqRound::kFloat>(p);
    case WqRound::kBFloat16: return gemv_form<WqRound::kBFloat16>(p);
    case WqRound::kHalf: return gemv_form<WqRound::kHalf>(p);
  }
}

NPU_FA_REGISTER_ISA_KERNEL(wq_gemv_stub, wq_gemv);

}  // namespace npu_fa::cpu::CPU_CAPABILITY
