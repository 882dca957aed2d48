// Absorbed MLA attention: every query head of a sequence shares one KV head (the latent cache), so the query rows of
// all heads (x query positions) form one matrix that meets each key tile in one GEMM. Compiled three times by
// setup.py (-DCPU_CAPABILITY=DEFAULT|AVX2|AVX512), so at::vec::Vectorized has that ISA's width.
//
// Work items are (sequence b, tile of query positions, chunk of keys). An item packs its R = heads x positions query
// rows once as Qᵀ and walks its keys in tiles of at most kKeyTile rows that never cross a cache block. Per tile:
//   Sᵀ[L, R]  = K·Q_nopeᵀ + K_rope·Q_ropeᵀ   (brgemm, K and K_rope read in place: bf16 VNNI B = Qᵀ, A = cache rows)
//   online softmax over the tile's keys, vectorised along R (rows of Sᵀ are contiguous in R)
//   acc[R, Dv] += P·V                          (brgemm; fp32 reads V in place, bf16 packs the tile to VNNI)
// so every latent row is streamed from memory once per step for all heads, and when value is key the V tile is
// the K tile still in cache. Key chunks (flash-decoding, when few items) have sizes that depend only on the shapes
// and lengths, never on the thread count, and are merged in chunk order by their log-sum-exp: results are
// bit-identical for any number of threads.
#include "common/inference/nz_cache.h"
#include "cpu/brgemm.h"
#include "cpu/inference/mla_kernels.h"
#include "cpu/online_softmax.h"
#include "cpu/softmax_exp.h"

#ifndef CPU_CAPABILITY
#error "this *_isa.cpp must be compiled with -DCPU_CAPABILITY=DEFAULT|AVX2|AVX512 (setup.py does this)"
#endif

#include <ATen/Context.h>
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

namespace npu_fa::cpu::CPU_CAPABILITY {
namespace {

using Vec = at::vec::Vectorized<float>;
using at::BFloat16;
using online_softmax::nan_max;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr int64_t kKeyTile = 128;      // keys per online-softmax step
constexpr int64_t kMaxRows = 128;      // query rows (heads x positions) per item, unless one position has more heads
constexpr int64_t kTargetItems = 64;   // fewer row tiles than this are split along the keys
constexpr int64_t kMinChunk = 512;     // smallest key chunk worth a partial result
constexpr int64_t kBig = int64_t(1) << 40;

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// c[m, n] (+)= a[m, k] · b[k, n], row-major; b VNNI-packed for bf16 (cpu/brgemm.h).
using brgemm::mm;

struct Band {
  int64_t lo, hi;  // key j is visible to query position i iff i + lo <= j <= i + hi
};

Band band_of(const MlaParams& p, int64_t b) {
  const int64_t diag = p.kv_len[b] - p.q_len[b];  // bottom-right alignment
  const int64_t pre = std::clamp(p.pre_tokens, -kBig, kBig), next = std::clamp(p.next_tokens, -kBig, kBig);
  switch (p.sparse_mode) {
    case 2: return {-kBig, 0};
    case 3: return {-kBig, diag};
    case 4: return {diag - pre, diag + next};
    default: return {-kBig, kBig};
  }
}

struct Item {
  int64_t tile, j0, j1, slot;  // slot >= 0: a partial result to merge; -1: written straight to the output
};

struct RowTile {
  int64_t b, i0, i1, parts = 1, first_slot = -1;
};

template <typename T, typename C>
struct Worker {
  const MlaParams& p;
  const T *q, *qr, *k, *kr, *v;
  T* out;
  float* lse;
  std::vector<C> qt, qrt, pm, vb;
  std::vector<float> st, kb, krb, vf, acc, mrow, lrow, msafe, alpha, tmax;

  std::vector<T> kz, krz, vz;  // NZ caches: the tile's rows assembled from their pieces

  const T* row(const T* base, int64_t block_stride, const MlaRows& r, int64_t b, int64_t j) const {
    if (p.block_size > 0)
      return base + p.blocks[b * p.table_stride + j / p.block_size] * block_stride + (j % p.block_size) * r.ss;
    return base + b * r.sb + (p.kv_off[b] + j) * r.ss;
  }

  // L rows of width D from key j on (inside one block): the cache's own rows and their stride, or for an NZ cache
  // (p.nz_c0 > 0, common/inference/nz_cache.h) the rows assembled from their head-dim pieces into `scratch`.
  struct TileRows {
    const T* ptr;
    int64_t ld;
  };
  TileRows tile_rows(const T* base, int64_t block_stride, const MlaRows& r, int64_t piece, int64_t b, int64_t j,
                     int64_t L, int64_t D, std::vector<T>& scratch) const {
    const T* first = row(base, block_stride, r, b, j);
    if (p.nz_c0 == 0) return {first, r.ss};
    scratch.resize(L * D);
    ::npu_fa::attention::nz_rows_to_nd(first, piece, r.ss, p.nz_c0, L, D, scratch.data());
    return {scratch.data(), D};
  }

  // Qᵀ of the item's rows (row m = position (m / heads) x head (m % heads)): VNNI pairs for bf16, else [D, R].
  void pack_q(const T* base, const MlaRows& r, int64_t D, const RowTile& t, std::vector<C>& dst) {
    const int64_t H = p.heads, R = (t.i1 - t.i0) * H;
    dst.resize(D * R);
    for (int64_t il = 0; il < t.i1 - t.i0; ++il)
      for (int64_t h = 0; h < H; ++h) {
        const int64_t m = il * H + h;
        const T* src = base + t.b * r.sb + (p.q_off[t.b] + t.i0 + il) * r.ss + h * r.sh;
        brgemm::store_transposed_row(src, D, m, R, dst.data());
      }
  }

  // L rows of width D starting at key j as fp32 (for inputs the compute type cannot read in place).
  const float* to_float(TileRows src, int64_t L, int64_t D, std::vector<float>& buf) {
    buf.resize(L * D);
    for (int64_t x = 0; x < L; ++x)
      for (int64_t d = 0; d < D; ++d) buf[x * D + d] = static_cast<float>(src.ptr[x * src.ld + d]);
    return buf.data();
  }

  void key_tile(const RowTile& t, const Band& band, int64_t j, int64_t L) {
    const int64_t H = p.heads, R = (t.i1 - t.i0) * H, D = p.dim, Dr = p.rope_dim, Dv = p.v_dim, b = t.b;
    st.resize(L * R);
    // Scores Sᵀ = K·Qᵀ (+ K_rope·Q_ropeᵀ).
    const TileRows kt = tile_rows(k, p.k_block, p.k, p.k_piece, b, j, L, D, kz);
    const TileRows krt = Dr > 0 ? tile_rows(kr, p.kr_block, p.kr, p.kr_piece, b, j, L, Dr, krz) : TileRows{kr, 0};
    if constexpr (std::is_same_v<T, C>) {
      mm(L, R, D, kt.ptr, kt.ld, qt.data(), R, st.data(), R, false);
      if (Dr > 0) mm(L, R, Dr, krt.ptr, krt.ld, qrt.data(), R, st.data(), R, true);
    } else {
      mm(L, R, D, to_float(kt, L, D, kb), D, qt.data(), R, st.data(), R, false);
      if (Dr > 0) mm(L, R, Dr, to_float(krt, L, Dr, krb), Dr, qrt.data(), R, st.data(), R, true);
    }
    // Scale, mask (tiles crossing the band's edge only) and the column maxima.
    const float sc = static_cast<float>(p.scale);
    const bool full = j >= (t.i1 - 1) + band.lo && j + L - 1 <= t.i0 + band.hi;
    tmax.assign(R, kNegInf);
    constexpr int64_t W = Vec::size();
    for (int64_t x = 0; x < L; ++x) {
      float* s = st.data() + x * R;
      if (full) {
        int64_t m = 0;
        for (; m + W <= R; m += W) {
          const Vec y = Vec::loadu(s + m) * Vec(sc);
          y.store(s + m);
          at::vec::maximum(Vec::loadu(tmax.data() + m), y).store(tmax.data() + m);
        }
        for (; m < R; ++m) tmax[m] = nan_max(tmax[m], s[m] *= sc);
      } else {
        const int64_t jg = j + x;
        for (int64_t m = 0; m < R; ++m) {
          const int64_t i = t.i0 + m / H;
          s[m] = (jg >= i + band.lo && jg <= i + band.hi) ? s[m] * sc : kNegInf;
          tmax[m] = nan_max(tmax[m], s[m]);
        }
      }
    }
    // New running maxima; alpha rescales what was accumulated before (0 when nothing was: m = -inf).
    msafe.resize(R);
    alpha.resize(R);
    for (int64_t m = 0; m < R; ++m) {
      const float nm = nan_max(mrow[m], tmax[m]);
      msafe[m] = nm == kNegInf ? 0.f : nm;
      alpha[m] = std::exp(mrow[m] - msafe[m]);
      mrow[m] = nm;
    }
    // P = exp(S - m) in place, column sums into tmax (reused).
    std::fill(tmax.begin(), tmax.end(), 0.f);
    for (int64_t x = 0; x < L; ++x) {
      float* s = st.data() + x * R;
      int64_t m = 0;
      for (; m + W <= R; m += W) {
        const Vec e = softmax_exp::exp<float>(Vec::loadu(s + m) - Vec::loadu(msafe.data() + m));
        e.store(s + m);
        (Vec::loadu(tmax.data() + m) + e).store(tmax.data() + m);
      }
      for (; m < R; ++m) tmax[m] += s[m] = std::exp(s[m] - msafe[m]);
    }
    for (int64_t m = 0; m < R; ++m) lrow[m] = lrow[m] * alpha[m] + tmax[m];
    // P [R, Lp] in the compute type (bf16 products need an even k: a zero column pads it).
    const int64_t Lp = std::is_same_v<C, BFloat16> ? (L + 1) / 2 * 2 : L;
    pm.resize(R * Lp);
    for (int64_t m = 0; m < R; ++m) {
      C* dst = pm.data() + m * Lp;
      for (int64_t x = 0; x < L; ++x) dst[x] = static_cast<C>(st[x * R + m]);
      if (Lp > L) dst[L] = C(0.f);
    }
    for (int64_t m = 0; m < R; ++m) {
      if (alpha[m] == 1.f) continue;
      float* a = acc.data() + m * Dv;
      const Vec va(alpha[m]);
      int64_t d = 0;
      for (; d + W <= Dv; d += W) (Vec::loadu(a + d) * va).store(a + d);
      for (; d < Dv; ++d) a[d] *= alpha[m];
    }
    // acc += P·V.
    // Value rows: the key's when value is key (an NZ tile is then assembled once), else the value cache's.
    const TileRows vt_rows = p.v_is_k && Dv == D ? kt : tile_rows(v, p.v_block, p.v, p.v_piece, b, j, L, Dv, vz);
    if constexpr (std::is_same_v<C, BFloat16>) {
      vb.resize(Lp * Dv);
      brgemm::pack_rows_vnni(vt_rows.ptr, vt_rows.ld, L, Dv, Dv, vb.data());
      mm(R, Dv, Lp, pm.data(), Lp, vb.data(), Dv, acc.data(), Dv, true);
    } else if constexpr (std::is_same_v<T, float>) {
      mm(R, Dv, L, pm.data(), L, vt_rows.ptr, vt_rows.ld, acc.data(), Dv, true);
    } else {
      const float* vt = (p.v_is_k && Dv == D) ? kb.data() : to_float(vt_rows, L, Dv, vf);
      mm(R, Dv, L, pm.data(), L, vt, Dv, acc.data(), Dv, true);
    }
  }

  // Output row m of tile t from its unnormalised accumulator, maximum and sum (the sink joins the latter two here).
  void write_row(const RowTile& t, int64_t m, const float* a, float mx, float l) {
    const int64_t H = p.heads, i = t.i0 + m / H, h = m % H, b = t.b;
    T* o = out + b * p.out.sb + (p.q_off[b] + i) * p.out.ss + h * p.out.sh;
    const float acc_scale = p.sink ? online_softmax::add_sink(p.sink[h], mx, l) : 1.f;
    const float inv = l > 0.f ? acc_scale / l : (l == 0.f ? 0.f : l);  // no visible key: zeros; NaN stays NaN
    for (int64_t d = 0; d < p.v_dim; ++d) o[d] = static_cast<T>(a[d] * inv);
    if (lse) {
      float& e = lse[b * p.lse_sb + (p.q_off[b] + i) * p.lse_si + h * p.lse_sh];
      e = l > 0.f ? mx + std::log(l) : (l == 0.f && mx == mx ? kNegInf : std::numeric_limits<float>::quiet_NaN());
    }
  }

  void run(const RowTile& t, const Item& it, float* part_acc, float* part_m, float* part_l) {
    const int64_t R = (t.i1 - t.i0) * p.heads, Dv = p.v_dim;
    acc.assign(R * Dv, 0.f);
    mrow.assign(R, kNegInf);
    lrow.assign(R, 0.f);
    if (it.j1 > it.j0) {
      pack_q(q, p.q, p.dim, t, qt);
      if (p.rope_dim > 0) pack_q(qr, p.qr, p.rope_dim, t, qrt);
      const Band band = band_of(p, t.b);
      for (int64_t j = it.j0; j < it.j1;) {
        int64_t L = std::min(kKeyTile, it.j1 - j);
        if (p.block_size > 0) L = std::min(L, p.block_size - j % p.block_size);
        key_tile(t, band, j, L);
        j += L;
      }
    }
    if (it.slot >= 0) {
      std::memcpy(part_acc, acc.data(), R * Dv * sizeof(float));
      std::memcpy(part_m, mrow.data(), R * sizeof(float));
      std::memcpy(part_l, lrow.data(), R * sizeof(float));
      return;
    }
    for (int64_t m = 0; m < R; ++m) write_row(t, m, acc.data() + m * Dv, mrow[m], lrow[m]);
  }
};

template <typename T, typename C>
void run_all(const MlaParams& p, const T* q, const T* qr, const T* k, const T* kr, const T* v, T* out, float* lse) {
  const int64_t H = p.heads, Dv = p.v_dim;
  const int64_t rows_per_tile = std::max<int64_t>(1, kMaxRows / std::max<int64_t>(H, 1));
  std::vector<RowTile> tiles;
  std::vector<std::pair<int64_t, int64_t>> ranges;
  for (int64_t b = 0; b < p.batch; ++b) {
    const Band band = band_of(p, b);
    for (int64_t i0 = 0; i0 < p.q_len[b]; i0 += rows_per_tile) {
      const int64_t i1 = std::min(p.q_len[b], i0 + rows_per_tile);
      const int64_t lo = std::max<int64_t>(0, i0 + band.lo);
      const int64_t hi = std::min<int64_t>(p.kv_len[b], i1 - 1 + band.hi + 1);
      tiles.push_back({b, i0, i1});
      ranges.emplace_back(lo, std::max(lo, hi));
    }
  }
  const int64_t n_tiles = static_cast<int64_t>(tiles.size());
  if (n_tiles == 0) return;
  const int64_t want = n_tiles < kTargetItems ? ceil_div(kTargetItems, n_tiles) : 1;
  std::vector<Item> items;
  std::vector<int64_t> slot_off;  // float offset of each partial slot's accumulator
  int64_t slot_floats = 0, n_slots = 0;
  for (int64_t t = 0; t < n_tiles; ++t) {
    const auto [lo, hi] = ranges[t];
    const int64_t R = (tiles[t].i1 - tiles[t].i0) * H;
    int64_t parts = std::clamp<int64_t>(std::min(want, (hi - lo) / kMinChunk), 1, want);
    if (parts == 1) {
      items.push_back({t, lo, hi, -1});
      continue;
    }
    const int64_t chunk = ceil_div(ceil_div(hi - lo, parts), kKeyTile) * kKeyTile;
    parts = ceil_div(hi - lo, chunk);
    tiles[t].parts = parts;
    tiles[t].first_slot = n_slots;
    for (int64_t c = 0; c < parts; ++c) {
      items.push_back({t, lo + c * chunk, std::min(hi, lo + (c + 1) * chunk), n_slots++});
      slot_off.push_back(slot_floats);
      slot_floats += R * (Dv + 2);
    }
  }
  std::vector<float> partial(slot_floats);
  at::parallel_for(0, static_cast<int64_t>(items.size()), 1, [&](int64_t i0, int64_t i1) {
    Worker<T, C> w{p, q, qr, k, kr, v, out, lse};
    for (int64_t x = i0; x < i1; ++x) {
      const Item& it = items[x];
      const RowTile& t = tiles[it.tile];
      const int64_t R = (t.i1 - t.i0) * H;
      float* base = it.slot >= 0 ? partial.data() + slot_off[it.slot] : nullptr;
      w.run(t, it, base, base ? base + R * Dv : nullptr, base ? base + R * (Dv + 1) : nullptr);
    }
    brgemm::release(brgemm::kVnni<C>);
  });
  // Merge the key chunks of split tiles in chunk order.
  std::vector<int64_t> split;
  for (int64_t t = 0; t < n_tiles; ++t)
    if (tiles[t].parts > 1) split.push_back(t);
  at::parallel_for(0, static_cast<int64_t>(split.size()), 1, [&](int64_t s0, int64_t s1) {
    Worker<T, C> w{p, q, qr, k, kr, v, out, lse};
    std::vector<float> a(Dv);
    for (int64_t s = s0; s < s1; ++s) {
      const RowTile& t = tiles[split[s]];
      const int64_t R = (t.i1 - t.i0) * H;
      for (int64_t m = 0; m < R; ++m) {
        float mx = kNegInf;
        for (int64_t c = 0; c < t.parts; ++c) mx = nan_max(mx, partial[slot_off[t.first_slot + c] + R * Dv + m]);
        const float safe = mx == kNegInf ? 0.f : mx;
        float l = 0.f;
        std::fill(a.begin(), a.end(), 0.f);
        for (int64_t c = 0; c < t.parts; ++c) {
          const float* base = partial.data() + slot_off[t.first_slot + c];
          const float wgt = std::exp(base[R * Dv + m] - safe);
          if (wgt == 0.f) continue;  // an empty chunk (exactly zero weight)
          l += base[R * (Dv + 1) + m] * wgt;
          const float* src = base + m * Dv;
          for (int64_t d = 0; d < Dv; ++d) a[d] += src[d] * wgt;
        }
        w.write_row(t, m, a.data(), mx, l);
      }
    }
  });
}

}  // namespace

void mla_attention(const MlaParams& p, const at::Tensor& q, const at::Tensor& q_rope, const at::Tensor& key,
                   const at::Tensor& key_rope, const at::Tensor& value, at::Tensor& out, float* lse) {
  switch (q.scalar_type()) {
    case at::kFloat:
      return run_all<float, float>(p, q.const_data_ptr<float>(), q_rope.const_data_ptr<float>(),
                                   key.const_data_ptr<float>(), key_rope.const_data_ptr<float>(),
                                   value.const_data_ptr<float>(), out.data_ptr<float>(), lse);
    case at::kBFloat16: {
      using T = BFloat16;
      const T *a = q.const_data_ptr<T>(), *b = q_rope.const_data_ptr<T>(), *c = key.const_data_ptr<T>(),
              *d = key_rope.const_data_ptr<T>(), *e = value.const_data_ptr<T>();
      if (brgemm_usable(at::kBFloat16) && p.dim % 2 == 0 && p.rope_dim % 2 == 0)
        return run_all<T, T>(p, a, b, c, d, e, out.data_ptr<T>(), lse);
      return run_all<T, float>(p, a, b, c, d, e, out.data_ptr<T>(), lse);
    }
    case at::kHalf: {
      using T = at::Half;
      return run_all<T, float>(p, q.const_data_ptr<T>(), q_rope.const_data_ptr<T>(), key.const_data_ptr<T>(),
                               key_rope.const_data_ptr<T>(), value.const_data_ptr<T>(), out.data_ptr<T>(), lse);
    }
    default:
      TORCH_CHECK(false, "fused_infer_attention_score: MLA kernel: unsupported dtype ", q.scalar_type());
  }
}

NPU_FA_REGISTER_ISA_KERNEL(mla_attention_stub, mla_attention);

}  // namespace npu_fa::cpu::CPU_CAPABILITY
