// Decode attention (one query token per sequence) over a contiguous or paged KV cache. Compiled three times by
// setup.py (-DCPU_CAPABILITY=DEFAULT|AVX2|AVX512), so at::vec::Vectorized has that ISA's width.
//
// Work items are (sequence b, KV head n2, chunk of keys). The G = N1/N2 query heads sharing a KV head are processed
// together, so every K/V row is read from memory once per group. Each item keeps an online softmax (running max m,
// running sum l, unnormalised fp32 accumulator) per query head over tiles of at most kTile keys (tiles never cross a
// cache block). The key axis is split into chunks whose size depends only on the shapes and lengths (never on the
// thread count), and the partial results of one (b, n2) are merged in chunk order with their log-sum-exp
// (flash-decoding), so results are bit-identical for any number of threads.
#include "cpu/incre_attention/kernels.h"

#ifndef CPU_CAPABILITY
#error "kernels_isa.cpp must be compiled with -DCPU_CAPABILITY=DEFAULT|AVX2|AVX512 (setup.py does this)"
#endif

#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>

#if defined(CPU_CAPABILITY_AVX512)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <limits>
#include <vector>

namespace npu_fa::cpu::CPU_CAPABILITY {
namespace {

using Vec = at::vec::Vectorized<float>;
constexpr int64_t kTile = 32;                         // keys per online-softmax step
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

inline int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

// Vec::size() values of row[d, d + VL) as fp32; positions >= D read as 0.
template <typename T>
inline Vec load_f32(const T* row, int64_t d, int64_t D) {
  if (d + Vec::size() <= D) {
    if constexpr (std::is_same_v<T, float>) {
      return Vec::loadu(row + d);
    } else {
      Vec out;
      at::vec::load_to_float<T>(row + d, out);
      return out;
    }
  }
  alignas(64) float tmp[Vec::size()] = {};
  for (int64_t i = d; i < D; ++i) tmp[i - d] = static_cast<float>(row[i]);
  return Vec::loadu(tmp);
}

// Scores of GN query rows (qr, row stride Dp) against one key row: out[gg] = q_gg · k. GN is a compile-time
// constant so the accumulators stay in registers.
template <int GN, typename T>
inline void qk_rows(const float* qr, int64_t Dp, const T* krow, int64_t D, float* out) {
  Vec a[GN];
  for (int gg = 0; gg < GN; ++gg) a[gg] = Vec(0.f);
  for (int64_t d = 0; d < Dp; d += Vec::size()) {
    const Vec kv = load_f32(krow, d, D);
    for (int gg = 0; gg < GN; ++gg) a[gg] = at::vec::fmadd(Vec::loadu(qr + gg * Dp + d), kv, a[gg]);
  }
  for (int gg = 0; gg < GN; ++gg) out[gg] = at::vec::vec_reduce_all<float>(std::plus<Vec>(), a[gg]);
}

// acc[gg, d : d + VL] += Σ_t p[gg, t] · v_t[d : d + VL] for GN rows over the n keys of a tile.
template <int GN, typename T>
inline void pv_rows(float* acc, int64_t Dp, const float* p, const T* vh, int64_t v_seq, int64_t n, int64_t d,
                    int64_t D) {
  Vec a[GN];
  for (int gg = 0; gg < GN; ++gg) a[gg] = Vec::loadu(acc + gg * Dp + d);
  for (int64_t t = 0; t < n; ++t) {
    const Vec vv = load_f32(vh + t * v_seq, d, D);
    for (int gg = 0; gg < GN; ++gg) a[gg] = at::vec::fmadd(Vec(p[gg * kTile + t]), vv, a[gg]);
  }
  for (int gg = 0; gg < GN; ++gg) a[gg].store(acc + gg * Dp + d);
}

// Rows [g0, g0 + gn) handled by the widest register block that fits: 8, 4, 2 or 1.
inline int row_block(int64_t remaining) { return remaining >= 8 ? 8 : remaining >= 4 ? 4 : remaining >= 2 ? 2 : 1; }

#if defined(CPU_CAPABILITY_AVX512)
inline bool bf16_dot_available() {
  static const bool ok = __builtin_cpu_supports("avx512bf16") && std::getenv("NPU_FA_NO_BF16_DOT") == nullptr;
  return ok;
}

// Raw dot products out[r, t] = q_r · k_t for the R query rows (bf16, [R, D]) and the n key rows of a tile, with
// vdpbf16ps (pairs of bf16 products summed in fp32). D % 32 == 0. Not inlined: only this function needs the ISA flag.
template <int GN>
__attribute__((target("avx512f,avx512bw,avx512bf16"))) inline void qk_rows_bf16(const uint16_t* qr, int64_t D,
                                                                                const uint16_t* krow, float* out) {
  __m512 a[GN];
  for (int gg = 0; gg < GN; ++gg) a[gg] = _mm512_setzero_ps();
  for (int64_t d = 0; d < D; d += 32) {
    const __m512bh kv = (__m512bh)_mm512_loadu_si512(krow + d);
    for (int gg = 0; gg < GN; ++gg)
      a[gg] = _mm512_dpbf16_ps(a[gg], (__m512bh)_mm512_loadu_si512(qr + gg * D + d), kv);
  }
  for (int gg = 0; gg < GN; ++gg) out[gg] = _mm512_reduce_add_ps(a[gg]);
}

__attribute__((target("avx512f,avx512bw,avx512bf16"), noinline)) void qk_tile_bf16(
    const at::BFloat16* q, int64_t R, int64_t G, int64_t D, const uint16_t* k0, int64_t n, int64_t k_seq, int64_t HT,
    int64_t k_head, float* s, int64_t ld) {
  const uint16_t* qb = reinterpret_cast<const uint16_t*>(q);
  for (int64_t t = 0; t < n; ++t)
    for (int64_t hh = 0; hh < HT; ++hh) {
      const uint16_t* krow = k0 + t * k_seq + hh * k_head;
      float sc[8];
      for (int64_t g0 = 0; g0 < G;) {
        const int gn = row_block(G - g0);
        const uint16_t* qr = qb + (hh * G + g0) * D;
        switch (gn) {
          case 8: qk_rows_bf16<8>(qr, D, krow, sc); break;
          case 4: qk_rows_bf16<4>(qr, D, krow, sc); break;
          case 2: qk_rows_bf16<2>(qr, D, krow, sc); break;
          default: qk_rows_bf16<1>(qr, D, krow, sc); break;
        }
        for (int gg = 0; gg < gn; ++gg) s[(hh * G + g0 + gg) * ld + t] = sc[gg];
        g0 += gn;
      }
    }
}
#endif

struct Task {
  int64_t b, h0, h1, j0, j1;  // logical keys [j0, j1) of sequence b, KV heads [h0, h1)
};

template <typename T>
void run(const DecodeParams& p, const float* q32, const T* kc, const T* vc, T* out) {
  const int64_t B = p.batch, N1 = p.q_heads, N2 = p.kv_heads, G = p.group, D = p.head_dim;
  const int64_t Dp = round_up(D, Vec::size());
  // When the KV heads of one position are adjacent in memory (BSH/BSND caches, paged (blocks, block, N2*D)), one
  // item takes all of them, so each cache row of N2*D values is read front to back; otherwise one head per item.
  const bool heads_together = std::abs(p.k_head) <= D && std::abs(p.v_head) <= D;
  const int64_t HT = heads_together ? N2 : 1;  // KV heads per item
  const int64_t R = HT * G;                     // query rows per item
  // bf16 caches on CPUs with AVX512-BF16: Q·Kᵀ with bf16 pair dot products (exact products, fp32 sums), the
  // scale applied to the dot product instead of to q.
  bool use_bf16_dot = false;
#if defined(CPU_CAPABILITY_AVX512)
  use_bf16_dot = std::is_same_v<T, at::BFloat16> && D % 32 == 0 && bf16_dot_available();
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

  at::parallel_for(0, n_tasks, 1, [&](int64_t t0, int64_t t1) {
    std::vector<float> qbuf(R * Dp), s(R * kTile);
    std::vector<at::BFloat16> qb16(use_bf16_dot ? R * D : 0);
    for (int64_t ti = t0; ti < t1; ++ti) {
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
        if (use_bf16_dot)
          for (int64_t d = 0; d < D; ++d) qb16[r * D + d] = static_cast<at::BFloat16>(src[d]);  // exact: q was bf16
        std::fill(qbuf.data() + r * Dp + D, qbuf.data() + (r + 1) * Dp, 0.f);
      }
      const uint8_t* mrow = p.mask ? p.mask + b * p.mask_sb : nullptr;

      int64_t j = tk.j0;
      while (j < tk.j1) {
        // The tile: keys [j, j + n), inside one cache block.
        int64_t blk, blk_first, pos0;
        int64_t n = std::min(kTile, tk.j1 - j);
        if (p.paged) {
          const int64_t lb = j / p.block_size;
          blk = p.block_table[b * p.max_blocks + lb];
          blk_first = lb * p.block_size;
          n = std::min(n, blk_first + p.block_size - j);
          pos0 = j;
        } else {
          blk = b;
          blk_first = 0;
          pos0 = p.kv_start[b] + j;
        }
        const int64_t in_blk = pos0 - blk_first;
        const T* k0 = kc + blk * p.k_blk + tk.h0 * p.k_head + in_blk * p.k_seq;
        const T* v0 = vc + blk * p.v_blk + tk.h0 * p.v_head + in_blk * p.v_seq;

        // Scores s[r, t] = q_r · k_t (q pre-scaled) + pse, masked -> -inf; columns >= n are -inf.
#if defined(CPU_CAPABILITY_AVX512)
        if constexpr (std::is_same_v<T, at::BFloat16>) {
          if (use_bf16_dot) {
            qk_tile_bf16(qb16.data(), R, G, D, reinterpret_cast<const uint16_t*>(k0), n, p.k_seq, HT, p.k_head,
                         s.data(), kTile);
            for (int64_t r = 0; r < R; ++r)
              for (int64_t t = 0; t < n; ++t) {
                float v = s[r * kTile + t] * p.scale;
                if (p.pse) v += p.pse[b * p.pse_sb + (tk.h0 * G + r) * p.pse_sn + pos0 + t];
                s[r * kTile + t] = (mrow && mrow[pos0 + t]) ? kNegInf : v;
              }
          }
        }
#endif
        for (int64_t t = 0; t < n && !use_bf16_dot; ++t) {
          const int64_t pos = pos0 + t;
          if (mrow && mrow[pos]) {
            for (int64_t r = 0; r < R; ++r) s[r * kTile + t] = kNegInf;
            continue;
          }
          for (int64_t hh = 0; hh < HT; ++hh) {
            const T* krow = k0 + t * p.k_seq + hh * p.k_head;
            float sc[8];
            for (int64_t g0 = 0; g0 < G;) {
              const int gn = row_block(G - g0);
              const float* qr = qbuf.data() + (hh * G + g0) * Dp;
              switch (gn) {
                case 8: qk_rows<8>(qr, Dp, krow, D, sc); break;
                case 4: qk_rows<4>(qr, Dp, krow, D, sc); break;
                case 2: qk_rows<2>(qr, Dp, krow, D, sc); break;
                default: qk_rows<1>(qr, Dp, krow, D, sc); break;
              }
              for (int gg = 0; gg < gn; ++gg) {
                const int64_t r = hh * G + g0 + gg;
                float v = sc[gg];
                if (p.pse) v += p.pse[b * p.pse_sb + (tk.h0 * G + r) * p.pse_sn + pos];
                s[r * kTile + t] = v;
              }
              g0 += gn;
            }
          }
        }
        for (int64_t r = 0; r < R; ++r)
          for (int64_t t = n; t < kTile; ++t) s[r * kTile + t] = kNegInf;

        // Online softmax update per query row; s becomes the probabilities exp(s - m_new).
        bool any = false;
        for (int64_t r = 0; r < R; ++r) {
          float* sr = s.data() + r * kTile;
          Vec vmax(kNegInf);
          for (int64_t t = 0; t < kTile; t += Vec::size()) vmax = at::vec::maximum(vmax, Vec::loadu(sr + t));
          const float mt = at::vec::vec_reduce_all<float>([](Vec& x, Vec& y) { return at::vec::maximum(x, y); }, vmax);
          const float mnew = std::max(m[r], mt);
          if (mnew == kNegInf) {  // nothing visible yet for this row
            std::fill(sr, sr + kTile, 0.f);
            continue;
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
            const Vec e = (Vec::loadu(sr + t) - vm).exp_u20();
            e.store(sr + t);
            sum = sum + e;
          }
          l[r] += at::vec::vec_reduce_all<float>([](Vec& x, Vec& y) { return x + y; }, sum);
          m[r] = mnew;
        }

        // acc_r += Σ_t p[r, t] · v_t: accumulators of up to 8 rows stay in registers over the tile.
        if (any) {
          for (int64_t hh = 0; hh < HT; ++hh) {
            const T* vh = v0 + hh * p.v_head;
            for (int64_t d = 0; d < Dp; d += Vec::size()) {
              for (int64_t g0 = 0; g0 < G;) {
                const int gn = row_block(G - g0);
                const int64_t r0 = hh * G + g0;
                float* ar = acc + r0 * Dp;
                const float* pr = s.data() + r0 * kTile;
                switch (gn) {
                  case 8: pv_rows<8>(ar, Dp, pr, vh, p.v_seq, n, d, D); break;
                  case 4: pv_rows<4>(ar, Dp, pr, vh, p.v_seq, n, d, D); break;
                  case 2: pv_rows<2>(ar, Dp, pr, vh, p.v_seq, n, d, D); break;
                  default: pv_rows<1>(ar, Dp, pr, vh, p.v_seq, n, d, D); break;
                }
                g0 += gn;
              }
            }
          }
        }
        j += n;
      }
    }
  });

  // Merge the chunks of each (b, head group) in order with their log-sum-exp; rows with no visible key get zeros.
  // Cheap: run inline (no second parallel region) unless there is a lot of it (~256K multiply-adds per thread).
  const int64_t merge_work = R * D * (n_tasks / std::max<int64_t>(n_groups, 1) + 1);  // per (b, head group)
  const int64_t merge_grain = std::max<int64_t>(1, (int64_t(1) << 18) / std::max<int64_t>(1, merge_work));
  at::parallel_for(0, n_groups, merge_grain, [&](int64_t i0, int64_t i1) {
    std::vector<float> o(Dp);
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t b = i / (N2 / HT), h0 = (i % (N2 / HT)) * HT;
      for (int64_t r = 0; r < R; ++r) {
        float M = kNegInf;
        for (int64_t t = first[i]; t < first[i + 1]; ++t) M = std::max(M, part[t * part_stride + R * Dp + r]);
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
        const float inv = L > 0.f ? 1.f / L : 0.f;
        for (int64_t d = 0; d < D; ++d) dst[d] = static_cast<T>(o[d] * inv);
      }
    }
  });
}

}  // namespace

void decode_attention(const DecodeParams& p, const at::Tensor& q32, const at::Tensor& key, const at::Tensor& value,
                      at::Tensor& out) {
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

}  // namespace npu_fa::cpu::CPU_CAPABILITY
