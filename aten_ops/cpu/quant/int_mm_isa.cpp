// The exact int8 x int8 -> int32 product on AVX2 CPUs (cpu/quant/int_mm.h). Compiled three times by setup.py; only
// the AVX2 copy registers a kernel (AVX-512 CPUs take oneDNN's VNNI / AMX-INT8 GEMM, others the fp32 slices).
//
// Why not a library here: ATen's at::_int_mm runs a reference loop without VNNI, and the AVX2 int8 GEMMs of oneDNN
// and FBGEMM multiply with vpmaddubsw, whose int16 pair sums saturate (oneDNN documents possible saturation before
// VNNI), so their results are not the exact product. This kernel sign-extends both operands to int16 and multiplies
// with vpmaddwd (two int16 products summed into an int32 lane), which is exact.
#include "cpu/quant/int_mm.h"

#ifndef CPU_CAPABILITY
#error "this *_isa.cpp must be compiled with -DCPU_CAPABILITY=DEFAULT|AVX2|AVX512 (setup.py does this)"
#endif

#if defined(CPU_CAPABILITY_AVX2)
#include <ATen/Parallel.h>
#include <immintrin.h>

#include "cpu/int_dot.h"

#include <vector>

namespace npu_fa::cpu::CPU_CAPABILITY {
namespace {

constexpr int64_t kCols = 16;  // output columns per register block (two vectors of 8 int32)

// B's 16-column blocks as panels of row pairs: panel[k/2] holds the 32 bytes b[k, n], b[k+1, n] for n = 0..15,
// byte-interleaved (columns 0..7, then 8..15; a zero row pads odd K). One pass over B: the product then reads each
// panel front to back (a row-major B read 16 columns at a time touches a new page per row at N = 4096) and needs
// only a sign extension per 16 values.
void pack_panel(const int8_t* b, int64_t ldb, int64_t K, int8_t* panel) {
  for (int64_t k = 0; k < K; k += 2, panel += 32) {
    const __m128i r0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + k * ldb));
    const __m128i r1 = k + 1 < K ? _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + (k + 1) * ldb))
                                 : _mm_setzero_si128();
    _mm_storeu_si128(reinterpret_cast<__m128i*>(panel), _mm_unpacklo_epi8(r0, r1));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(panel + 16), _mm_unpackhi_epi8(r0, r1));
  }
}

// c[gg, 0:16] = Σ_k a[gg, k] · b[k, 0:16] for GN rows from a panel: each vpmaddwd adds a[k]·b[k, n] +
// a[k+1]·b[k+1, n] into the lane of column n, with the pair (a[gg, k], a[gg, k+1]) broadcast (ap: int32 element k/2
// holds it as int16 halves).
template <int GN>
void block(const int32_t* ap, int64_t ap_ld, const int8_t* panel, int64_t pairs, int32_t* c, int64_t ldc) {
  __m256i acc[GN][2];
  for (int gg = 0; gg < GN; ++gg) acc[gg][0] = acc[gg][1] = _mm256_setzero_si256();
  for (int64_t k2 = 0; k2 < pairs; ++k2, panel += 32) {
    const __m256i x0 = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(panel)));
    const __m256i x1 = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(panel + 16)));
    for (int gg = 0; gg < GN; ++gg) {
      const __m256i pair = _mm256_set1_epi32(ap[gg * ap_ld + k2]);
      acc[gg][0] = madd_acc(acc[gg][0], x0, pair);
      acc[gg][1] = madd_acc(acc[gg][1], x1, pair);
    }
  }
  for (int gg = 0; gg < GN; ++gg) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(c + gg * ldc), acc[gg][0]);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(c + gg * ldc + 8), acc[gg][1]);
  }
}

// Columns [n0, n1) (fewer than 16) of every row, in plain integer arithmetic.
void tail(const int8_t* a, int64_t lda, const int8_t* b, int64_t ldb, int32_t* c, int64_t ldc, int64_t M, int64_t K,
          int64_t n0, int64_t n1) {
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = n0; n < n1; ++n) {
      int32_t s = 0;
      for (int64_t k = 0; k < K; ++k) s += int32_t(a[m * lda + k]) * int32_t(b[k * ldb + n]);
      c[m * ldc + n] = s;
    }
}

// c [M, N] = a [M, K] · b [K, N]; rows of a, b, c at strides lda, ldb, ldc (unit column stride).
void int8_mm_exact(const int8_t* a, int64_t lda, const int8_t* b, int64_t ldb, int32_t* c, int64_t ldc, int64_t M,
                   int64_t K, int64_t N) {
  // a's rows as int16 pairs (k, k+1), K padded to even with a zero.
  const int64_t pairs = (K + 1) / 2;
  std::vector<int32_t> ap(M * pairs);
  for (int64_t m = 0; m < M; ++m) {
    int16_t* row = reinterpret_cast<int16_t*>(ap.data() + m * pairs);
    for (int64_t k = 0; k < 2 * pairs; ++k) row[k] = k < K ? a[m * lda + k] : 0;
  }
  const int64_t blocks = N / kCols;
  // Work items are column blocks: each packs its panel (thread-local, pairs * 32 bytes: 64 KiB at K = 4096, in L2)
  // and runs every row block over it. Grain: about 2^20 multiply-adds per item, so small products stay on one thread.
  const int64_t grain = std::max<int64_t>(1, (int64_t(1) << 20) / std::max<int64_t>(1, M * K * kCols));
  at::parallel_for(0, blocks, grain, [&](int64_t j0, int64_t j1) {
    std::vector<int8_t> panel(pairs * 32);
    for (int64_t j = j0; j < j1; ++j) {
      pack_panel(b + j * kCols, ldb, K, panel.data());
      for (int64_t m0 = 0; m0 < M;) {
        const int64_t gn = M - m0 >= 4 ? 4 : M - m0 >= 2 ? 2 : 1;
        const int32_t* apr = ap.data() + m0 * pairs;
        int32_t* cr = c + m0 * ldc + j * kCols;
        switch (gn) {
          case 4: block<4>(apr, pairs, panel.data(), pairs, cr, ldc); break;
          case 2: block<2>(apr, pairs, panel.data(), pairs, cr, ldc); break;
          default: block<1>(apr, pairs, panel.data(), pairs, cr, ldc); break;
        }
        m0 += gn;
      }
    }
  });
  if (blocks * kCols < N) tail(a, lda, b, ldb, c, ldc, M, K, blocks * kCols, N);
}

}  // namespace

NPU_FA_REGISTER_ISA_KERNEL(int8_mm_exact_stub, int8_mm_exact);

}  // namespace npu_fa::cpu::CPU_CAPABILITY
#endif
