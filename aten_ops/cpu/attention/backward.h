// FlashAttention-2 backward (FlashAttentionScoreGrad) for CPU. Included once per ISA by kernels_isa.cpp.
//
// Work split: items (batches, kv head, kv slice). Slice c of a head owns key tiles c, c + slices, ... (interleaved so
// causal work spreads evenly). An item keeps dK/dV of one key tile in fp32 while it loops over the group's query heads
// and all query tiles, then writes them; its dQ contributions go to the fp32 partial buffer of its slice, and the
// partials are summed in slice order at the end. Every float sum therefore has a fixed order (bit-identical results
// for a given thread count) and both cores stay busy even with one head. Extra memory: `slices` fp32 copies of dQ
// plus per-thread tiles; dpse is accumulated in a pse-sized fp32 buffer.
//
// GEMMs use at::native::cpublas::brgemm (row-major C (+)= A.B), which libtorch exports; the cpublas::gemm overloads
// are not exported. bf16/fp16 stay in their dtype inside the GEMMs (fp32 accumulation, P and dS rounded to the input
// dtype as FlashAttention-2 does) when the oneDNN micro-kernel accepts VNNI-packed B on this CPU (probed once);
// otherwise their tiles are widened to fp32.
#pragma once

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <type_traits>
#include <vector>

#include "cpu/attention/kernels.h"
#include "cpu/attention/logits.h"
#include "cpu/attention/tiles.h"
#include "cpu/brgemm.h"
#include "cpu/softmax_exp.h"
#include "cpu/stage_timing.h"

namespace npu_fa::cpu::CPU_CAPABILITY {
namespace bwd {

using attention::Band;
using attention::TileKind;
using Vec = at::vec::Vectorized<float>;

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr int64_t kDefaultBlockQ = 64, kDefaultBlockKv = 128;

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
inline int64_t round_even(int64_t a) { return (a + 1) & ~int64_t(1); }

// GEMMs and their operand packing: cpu/brgemm.h. For 16-bit G, B operands are VNNI-packed in panels of `panel`
// columns (brgemm_vnni_panel), each [k/2][w][2] (k even), which is what the oneDNN micro-kernel wants.
using brgemm::mm_panels;
using brgemm::pack_cols_vnni;
using brgemm::pack_rows_vnni;
using St = stage_timing::Stage;

template <typename S, typename D>
inline void convert_row(const S* src, D* dst, int64_t n) {
  if constexpr (std::is_same_v<S, D>) {
    std::memcpy(dst, src, n * sizeof(S));
  } else {
    at::vec::convert(src, dst, n);
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Shared state of one backward call
// ---------------------------------------------------------------------------------------------------------------

struct Item {
  int64_t b0, b1;  // batches [b0, b1): all of them when dpse is summed over the batch, else one
  int64_t n2, slice;
  int64_t cost;
};

// Per-row softmax statistics and Di, indexed by the dense row id p.row_id.at(b, n, i).
struct RowStats {
  const float* max;  // +inf for fully masked rows, so exp(s - max) is 0 there; NaN for NaN rows
  const float* inv;  // 1 / sum, 0 for fully masked rows; NaN for NaN rows (handled apart: nan_row)
  const float* di;   // rowsum(dY * O)
};

template <typename T>
struct Ctx {
  const AttentionParams& p;
  const T *q, *k, *v, *dy;
  T *dk, *dv;
  const RowMap &dk_rows, &dv_rows;
  RowStats rows;
  float* dq_part;            // [slices][row id][D] fp32
  int64_t dq_part_stride;    // rows * D
  float* dpse;               // fp32, pse-shaped, zero strides on summed dims; null without pse
  int64_t dpse_sb, dpse_sn, dpse_si;
  int64_t bq, bkv, slices, panel;
  float* d_part;             // [slices][row count]: sum_j P_j dP_j of the slice's keys (with a sink only, for dsink)
  int64_t row_count;         // row ids: softmax_max.numel() / 8
};

// ---------------------------------------------------------------------------------------------------------------
// Per-thread worker: scratch tiles and the tile loops. G is the GEMM operand type (float, or T itself with VNNI).
// ---------------------------------------------------------------------------------------------------------------

template <typename T, typename G>
class Worker {
 public:
  static constexpr bool kVnni = !std::is_same_v<G, float>;

  explicit Worker(const Ctx<T>& c)
      : c_(c), p_(c.p), D_(c.p.head_dim), vD_(c.p.v_head_dim), bq_(c.bq), bkv_(c.bkv),
        bq2_(kVnni ? round_even(c.bq) : c.bq), bkv2_(kVnni ? round_even(c.bkv) : c.bkv) {
    s_.resize(bq_ * bkv_);
    dp_.resize(bq_ * bkv_);
    row_.resize(bkv_);
    keep_.resize(bkv_);
    if (c.p.has_logit_transform()) {
      cap_.resize(bkv_);
      tmp_.resize(bkv_);
    }
    dk_acc_.resize(bkv_ * D_);
    dv_acc_.resize(bkv_ * vD_);
    kt_.resize(D_ * bkv2_);
    vt_.resize(vD_ * bkv2_);
    kb_.resize(bkv2_ * D_);
    pd_t_.resize(bkv_ * bq2_);
    ds_t_.resize(bkv_ * bq2_);
    qa_.resize(bq2_ * D_);
    dya_.resize(bq2_ * vD_);
    if (kVnni) {
      qb_.resize(bq2_ * D_);
      dyb_.resize(bq2_ * vD_);
      pd_g_.resize(bq2_ * bkv2_);
      ds_g_.resize(bq2_ * bkv2_);
    } else {
      vrows_.resize(bkv_ * vD_);
    }
  }

  // This worker's stage times (bench stages); every lap is one branch when timing is off.
  StageClock clock;

  void run(const Item& it) {
    for (int64_t b = it.b0; b < it.b1; ++b) {
      const int64_t tiles = ceil_div(p_.kv_len[b], bkv_);
      for (int64_t kt = it.slice; kt < tiles; kt += c_.slices) key_tile(b, it.n2, it.slice, kt * bkv_);
    }
  }

 private:
  // dK/dV of keys [j0, j0 + nkv) of kv head n2: sum over the group's query heads and every non-empty query tile.
  void key_tile(int64_t b, int64_t n2, int64_t slice, int64_t j0) {
    const int64_t nkv = std::min(bkv_, p_.kv_len[b] - j0);
    use_query_cache(b, n2);
    load_keys(b, n2, j0, nkv);
    std::fill(dk_acc_.begin(), dk_acc_.end(), 0.f);
    std::fill(dv_acc_.begin(), dv_acc_.end(), 0.f);
    clock.lap(St::kBwdPack);
    const int64_t q_len = p_.q_len[b];
    for (int64_t n = n2 * p_.group; n < (n2 + 1) * p_.group; ++n) {
      for (int64_t i0 = 0; i0 < q_len; i0 += bq_) {
        const int64_t nq = std::min(bq_, q_len - i0);
        const TileKind kind = p_.classify(b, i0, i0 + nq, j0, j0 + nkv);
        if (kind != TileKind::Empty) tile(b, n, slice, i0, nq, j0, nkv, kind);
      }
    }
    for (int64_t r = 0; r < nkv; ++r) {
      convert_row(dk_acc_.data() + r * D_, c_.dk + c_.dk_rows.at(b, n2, j0 + r), D_);
      convert_row(dv_acc_.data() + r * vD_, c_.dv + c_.dv_rows.at(b, n2, j0 + r), vD_);
    }
    clock.lap(St::kBwdFinish);
  }

  // Key-side operands, reused by every query tile: K^T and V^T (B of S and dP) and K (B of dQ).
  void load_keys(int64_t b, int64_t n2, int64_t j0, int64_t nkv) {
    const T* k = c_.k + p_.k.at(b, n2, j0);
    const T* v = c_.v + p_.v.at(b, n2, j0);
    const int64_t lk = p_.k.seq_stride, lv = p_.v.seq_stride;
    if constexpr (kVnni) {
      pack_cols_vnni(k, lk, nkv, D_, c_.panel, kt_.data());
      pack_cols_vnni(v, lv, nkv, vD_, c_.panel, vt_.data());
      pack_rows_vnni(k, lk, nkv, D_, c_.panel, kb_.data());
    } else {
      for (int64_t r = 0; r < nkv; ++r) {
        convert_row(k + r * lk, kb_.data() + r * D_, D_);
        convert_row(v + r * lv, vrows_.data() + r * vD_, vD_);
      }
      at::vec::transpose_mxn<float>(kb_.data(), D_, kt_.data(), bkv_, nkv, D_);
      at::vec::transpose_mxn<float>(vrows_.data(), vD_, vt_.data(), bkv_, nkv, vD_);
    }
  }

  // Rows [i0, i0 + cnt) of head n as a row-major G matrix: the input itself when BLAS can read it, else a copy.
  const G* rows_as(const T* base, const RowMap& m, int64_t b, int64_t n, int64_t i0, int64_t cnt, int64_t dim,
                   G* scratch, int64_t& ld) const {
    const T* src = base + m.at(b, n, i0);
    if constexpr (std::is_same_v<T, G>) {
      if (cnt == 1 || m.seq_stride >= dim) {
        ld = cnt == 1 ? dim : m.seq_stride;
        return src;
      }
    }
    for (int64_t r = 0; r < cnt; ++r) convert_row(src + r * m.seq_stride, scratch + r * dim, dim);
    ld = dim;
    return scratch;
  }

  // The query tile's operands of the products: Q and dY rows in G (A of S and dP; the input itself when it is
  // already G) and, for VNNI products, their VNNI packs (B of dK and dV).
  struct QueryOperands {
    const G *q, *dy, *qb, *dyb;
    int64_t lq, ldy;
  };

  // The operands depend on the query tile only, yet every key tile of the head group needs them: with room for the
  // whole group (kQueryCacheBytes) they are formed once per (b, kv head) and reused, else formed per tile step.
  static constexpr int64_t kQueryCacheBytes = int64_t(16) << 20;

  void use_query_cache(int64_t b, int64_t n2) {
    const int64_t key = b * p_.kv_heads + n2;
    if (key == cache_key_) return;
    cache_key_ = key;
    const bool rows = !std::is_same_v<T, G>;  // else rows_as reads the input in place (or a strided copy)
    qtiles_ = ceil_div(p_.q_len[b], bq_);
    slot_ = (rows || kVnni ? 1 : 0) * bq2_ * (D_ + vD_);
    const int64_t bytes = p_.group * qtiles_ * slot_ * static_cast<int64_t>(sizeof(G)) * (rows && kVnni ? 2 : 1);
    cache_on_ = slot_ > 0 && bytes <= kQueryCacheBytes;
    if (!cache_on_) return;
    const int64_t slots = p_.group * qtiles_;
    if (rows) qcache_.resize(slots * slot_);
    if (kVnni) qbcache_.resize(slots * slot_);
    filled_.assign(slots, 0);
  }

  QueryOperands query_operands(int64_t b, int64_t n, int64_t i0, int64_t nq) {
    const int64_t x = (n % p_.group) * qtiles_ + i0 / bq_;
    const bool cached = cache_on_;
    G* qa = cached && !std::is_same_v<T, G> ? qcache_.data() + x * slot_ : qa_.data();
    G* dya = cached && !std::is_same_v<T, G> ? qcache_.data() + x * slot_ + bq2_ * D_ : dya_.data();
    G* qb = cached && kVnni ? qbcache_.data() + x * slot_ : qb_.data();
    G* dyb = cached && kVnni ? qbcache_.data() + x * slot_ + bq2_ * D_ : dyb_.data();
    QueryOperands o{};
    const bool fill = !cached || !filled_[x];
    // rows_as is cheap when it reads in place; with a cache the copy it makes is already in the slot.
    o.q = fill ? rows_as(c_.q, p_.q, b, n, i0, nq, D_, qa, o.lq) : cached_rows(c_.q, p_.q, b, n, i0, nq, D_, qa, o.lq);
    o.dy = fill ? rows_as(c_.dy, p_.out, b, n, i0, nq, vD_, dya, o.ldy)
                : cached_rows(c_.dy, p_.out, b, n, i0, nq, vD_, dya, o.ldy);
    if constexpr (kVnni) {
      if (fill) {
        pack_rows_vnni(c_.q + p_.q.at(b, n, i0), p_.q.seq_stride, nq, D_, c_.panel, qb);
        pack_rows_vnni(c_.dy + p_.out.at(b, n, i0), p_.out.seq_stride, nq, vD_, c_.panel, dyb);
      }
      o.qb = qb;
      o.dyb = dyb;
    } else {
      o.qb = o.q;
      o.dyb = o.dy;
    }
    if (cached) filled_[x] = 1;
    return o;
  }

  // rows_as's answer for a filled slot without copying again: the input in place, or the slot.
  const G* cached_rows(const T* base, const RowMap& m, int64_t b, int64_t n, int64_t i0, int64_t cnt, int64_t dim,
                       G* slot, int64_t& ld) const {
    if constexpr (std::is_same_v<T, G>) {
      return rows_as(base, m, b, n, i0, cnt, dim, slot, ld);
    } else {
      ld = dim;
      return slot;
    }
  }

  // One (query tile, key tile) step of FlashAttention-2's backward.
  void tile(int64_t b, int64_t n, int64_t slice, int64_t i0, int64_t nq, int64_t j0, int64_t nkv, TileKind kind) {
    const int64_t panel = c_.panel;
    const QueryOperands qo = query_operands(b, n, i0, nq);
    const G *q = qo.q, *dy = qo.dy;
    const int64_t lq = qo.lq, ldy = qo.ldy;
    clock.lap(St::kBwdCast);
    const int64_t kt_ld = kVnni ? 0 : bkv_;
    mm_panels<G>(nq, nkv, D_, q, lq, kt_.data(), kt_ld, s_.data(), bkv_, false, panel);     // S = Q K^T
    mm_panels<G>(nq, nkv, vD_, dy, ldy, vt_.data(), kt_ld, dp_.data(), bkv_, false, panel);  // dP = dY V^T
    clock.lap(St::kBwdSdp);
    if (p_.softcap > 0.f) {  // s_ <- dropout(P), dp_ <- scale * dS
      softmax_grad<true>(b, n, slice, i0, nq, j0, nkv, kind);
    } else {
      softmax_grad<false>(b, n, slice, i0, nq, j0, nkv, kind);
    }
    clock.lap(St::kBwdSoftmax);

    const int64_t nq2 = kVnni ? round_even(nq) : nq, nkv2 = kVnni ? round_even(nkv) : nkv;
    const G *qb = qo.qb, *dyb = qo.dyb, *ds = nullptr;
    const int64_t lqb = lq, ldyb = ldy;  // (ignored for VNNI B operands: panels)
    if constexpr (kVnni) {
      // P and dS rounded to G (zero-padded to even sizes), transposed in G for dV and dK.
      narrow(s_.data(), nq, nkv, pd_g_.data());
      narrow(dp_.data(), nq, nkv, ds_g_.data());
      transpose16(pd_g_.data(), bkv2_, nq2, nkv, pd_t_.data(), bq2_);
      transpose16(ds_g_.data(), bkv2_, nq2, nkv, ds_t_.data(), bq2_);
      ds = ds_g_.data();
    } else {
      at::vec::transpose_mxn<float>(s_.data(), bkv_, pd_t_.data(), bq_, nq, nkv);
      at::vec::transpose_mxn<float>(dp_.data(), bkv_, ds_t_.data(), bq_, nq, nkv);
      ds = dp_.data();
    }
    clock.lap(St::kBwdCast);
    mm_panels<G>(nkv, vD_, nq2, pd_t_.data(), bq2_, dyb, ldyb, dv_acc_.data(), vD_, true, panel);  // dV += P^T dY
    mm_panels<G>(nkv, D_, nq2, ds_t_.data(), bq2_, qb, lqb, dk_acc_.data(), D_, true, panel);      // dK += dS^T Q
    const RowMap& rid = p_.row_id;
    float* dq = c_.dq_part + slice * c_.dq_part_stride + rid.at(b, n, i0) * D_;
    // dQ += dS K
    mm_panels<G>(nq, D_, nkv2, ds, kVnni ? bkv2_ : bkv_, kb_.data(), D_, dq, rid.seq_stride * D_, true, panel);
    clock.lap(St::kBwdGrad);
  }

  // fp32 rows x cols (ld bkv_) -> G (ld bkv2_), with a zero row / column making both sizes even.
  void narrow(const float* src, int64_t rows, int64_t cols, G* dst) {
    const int64_t cols2 = round_even(cols);
    for (int64_t r = 0; r < rows; ++r) {
      convert_row(src + r * bkv_, dst + r * bkv2_, cols);
      if (cols2 > cols) dst[r * bkv2_ + cols] = G(0.f);
    }
    if (rows & 1) std::fill(dst + rows * bkv2_, dst + rows * bkv2_ + cols2, G(0.f));
  }

  // 16-bit transpose in the 32 x 32 blocks the vectorised at::vec kernel handles.
  static void transpose16(const G* src, int64_t ld_src, int64_t rows, int64_t cols, G* dst, int64_t ld_dst) {
    for (int64_t r = 0; r < rows; r += 32)
      for (int64_t c = 0; c < cols; c += 32)
        at::vec::transpose_mxn<G>(src + r * ld_src + c, ld_src, dst + c * ld_dst + r, ld_dst,
                                  std::min<int64_t>(32, rows - r), std::min<int64_t>(32, cols - c));
  }

  // Row-wise: logits (scale, pse, mask) -> P from the saved statistics; dS = P * (dP * M/kp - Di). Leaves
  // P * M/kp in s_ (for dV) and scale * dS in dp_ (for dQ and dK), and accumulates dpse (and, with a sink, the row's
  // sum_j P_j * dP_j * M_j/kp for dsink). kCap (softcap): dS is that of the capped logit; the score and a pse_type 1
  // pse get dS * (1 - tanh²), an additive pse (pse_type 0) dS itself.
  template <bool kCap>
  void softmax_grad(int64_t b, int64_t n, int64_t slice, int64_t i0, int64_t nq, int64_t j0, int64_t nkv,
                    TileKind kind) {
    const float scale = p_.scale;
    const float pse_grad = p_.pse_type == 1 ? scale : 1.f;
    const bool dropout = p_.has_dropout();
    const float inv_keep = 1.f / p_.keep_prob;
    // Raw Q·Kᵀ scores (no pse, softcap or ALiBi; scale > 0, so a masked -inf stays -inf) are scaled inside the
    // loop below instead of in a pass of their own; the same product, so the same P.
    const bool raw = !p_.pse && !p_.has_logit_transform() && scale > 0.f;
    const Vec vraw(raw ? scale : 1.f);
    for (int64_t r = 0; r < nq; ++r) {
      const int64_t i = i0 + r;
      const int64_t id = p_.row_id.at(b, n, i);
      float* s = s_.data() + r * bkv_;
      float* d = dp_.data() + r * bkv_;
      if (p_.has_logit_transform()) {
        fa_logits::transform_logits(p_, b, n, i, j0, nkv, s, kCap ? cap_.data() : nullptr, tmp_.data());
      } else if (!raw) {
        logits(b, n, i, j0, nkv, s);
      }
      if (kind == TileKind::Partial) p_.mask_row(b, n, i, j0, nkv, s);
      if (dropout) {
        p_.dropout_keep(b, n, i, j0, nkv, keep_.data());
        for (int64_t j = 0; j < nkv; ++j) row_[j] = keep_[j] ? inv_keep : 0.f;
      }
      float* g = c_.dpse ? c_.dpse + b * c_.dpse_sb + n * c_.dpse_sn + i * c_.dpse_si + j0 : nullptr;
      float* dsum = c_.d_part ? c_.d_part + slice * c_.row_count + id : nullptr;
      if (std::isnan(c_.rows.max[id])) {  // rare: keeps the loop below free of per-element tests
        nan_row(s, d, g, nkv);
        if (dsum) *dsum = std::numeric_limits<float>::quiet_NaN();
        continue;
      }
      const Vec vmax(c_.rows.max[id]), vinv(c_.rows.inv[id]), vdi(c_.rows.di[id]), vscale(scale), vpg(pse_grad), vone(1.f);
      Vec pdp(0.f);
      for (int64_t j = 0; j < nkv; j += Vec::size()) {
        const int64_t cnt = std::min<int64_t>(Vec::size(), nkv - j);
        // Lanes past cnt load as -inf (P = 0): the exponent takes no argument above the row maximum.
        const Vec sj = vraw * (cnt == Vec::size() ? Vec::loadu(s + j)
                                                  : Vec::set(Vec(-kInf), Vec::loadu(s + j, cnt), cnt));
        const Vec prob = softmax_exp::exp<T>(sj - vmax) * vinv;
        Vec dpv = Vec::loadu(d + j, cnt), pd = prob;
        if (dropout) {
          const Vec w = Vec::loadu(row_.data() + j, cnt);
          dpv = dpv * w;
          pd = prob * w;
        }
        // prob == 1: the row sees this one key alone (every other P underflows), so softmax's Jacobian is exactly 0
        // there; dpv - vdi would instead leave the rounding gap between dP (a GEMM) and Di (rowsum(dY * O)), which a
        // pse summed over the rows accumulates.
        Vec ds = Vec::blendv(prob * (dpv - vdi), Vec(0.f), prob == vone);
        if constexpr (kCap) {
          const Vec ds_in = ds * Vec::loadu(cap_.data() + j, cnt);  // through the tanh
          if (g) (Vec::loadu(g + j, cnt) + (p_.pse_type == 1 ? ds_in * vpg : ds)).store(g + j, cnt);
          ds = ds_in;
        } else {
          if (g) (Vec::loadu(g + j, cnt) + ds * vpg).store(g + j, cnt);
        }
        // Lanes past cnt: P = 0 and dP loads as 0, so prob * dpv adds 0 there.
        if (dsum) pdp = at::vec::fmadd(prob, dpv, pdp);
        pd.store(s + j, cnt);
        (ds * vscale).store(d + j, cnt);
      }
      if (dsum) *dsum += at::vec::vec_reduce_all<float>([](Vec& x, Vec& y) { return x + y; }, pdp);
    }
  }

  // A row whose forward is NaN (NaN softmax statistics): P and dS are NaN for every key the row sees and exactly 0
  // for the keys it does not (masked: -inf logits), so only gradients of what the row depends on become NaN (the
  // vector loop would give exp(-inf - NaN) = NaN for masked keys too).
  static void nan_row(float* s, float* d, float* g, int64_t nkv) {
    const float nan = std::numeric_limits<float>::quiet_NaN();
    for (int64_t j = 0; j < nkv; ++j) {
      const bool seen = s[j] != -kInf;
      s[j] = d[j] = seen ? nan : 0.f;
      if (g && seen) g[j] = nan;
    }
  }

  // s <- scale * (s + pse) (pse_type 1) or scale * s + pse (pse_type 0).
  void logits(int64_t b, int64_t n, int64_t i, int64_t j0, int64_t nkv, float* s) {
    const Vec vscale(p_.scale);
    const float* ps = nullptr;
    if (p_.pse) {
      const attention::PseView& pv = *p_.pse;
      ps = pv.row(b, n, i) + j0 * pv.sj;
      if (pv.sj != 1) {
        for (int64_t j = 0; j < nkv; ++j) row_[j] = ps[j * pv.sj];
        ps = row_.data();
      }
    }
    for (int64_t j = 0; j < nkv; j += Vec::size()) {
      const int64_t cnt = std::min<int64_t>(Vec::size(), nkv - j);
      Vec x = Vec::loadu(s + j, cnt);
      if (!ps) {
        x = x * vscale;
      } else if (p_.pse_type == 1) {
        x = (x + Vec::loadu(ps + j, cnt)) * vscale;
      } else {
        x = x * vscale + Vec::loadu(ps + j, cnt);
      }
      x.store(s + j, cnt);
    }
  }

  const Ctx<T>& c_;
  const AttentionParams& p_;
  const int64_t D_, vD_, bq_, bkv_, bq2_, bkv2_;
  std::vector<float> s_, dp_, row_, dk_acc_, dv_acc_, cap_, tmp_;
  std::vector<uint8_t> keep_;
  std::vector<G> kt_, vt_, kb_, vrows_, pd_t_, ds_t_, qa_, dya_, qb_, dyb_, pd_g_, ds_g_;
  // The query operands of one (b, kv head) (query_operands): slot x = head in group · qtiles_ + query tile holds
  // [Q rows | dY rows] (qcache_, when converted) and [Q VNNI | dY VNNI] (qbcache_), slot_ elements each.
  std::vector<G> qcache_, qbcache_;
  std::vector<uint8_t> filled_;
  int64_t cache_key_ = -1, qtiles_ = 0, slot_ = 0;
  bool cache_on_ = false;
};

// ---------------------------------------------------------------------------------------------------------------
// Row passes and the driver
// ---------------------------------------------------------------------------------------------------------------

// Calls fn(b, n, i0, i1) for blocks of up to 64 query rows of every head, in parallel.
template <typename F>
void for_each_row_block(const AttentionParams& p, const F& fn) {
  constexpr int64_t kRows = 64;
  const int64_t blocks = ceil_div(p.max_q_len, kRows);
  at::parallel_for(0, p.batch * p.q_heads * blocks, 1, [&](int64_t u0, int64_t u1) {
    for (int64_t u = u0; u < u1; ++u) {
      const int64_t bn = u / blocks, b = bn / p.q_heads, n = bn % p.q_heads;
      const int64_t i0 = (u % blocks) * kRows, i1 = std::min(p.q_len[b], i0 + kRows);
      if (i0 < i1) fn(b, n, i0, i1);
    }
  });
}

// max / 1/sum from softmax_max/sum (dead rows -> +inf / 0) and Di = rowsum(dY * O) in fp32.
template <typename T>
void prepare_rows(const AttentionParams& p, const BackwardTensors& t, float* mx, float* inv, float* di) {
  const float* smax = t.softmax_max.const_data_ptr<float>();
  const float* ssum = t.softmax_sum.const_data_ptr<float>();
  const T* dy = t.dy.const_data_ptr<T>();
  const T* o = t.attention_in.const_data_ptr<T>();
  const int64_t vD = p.v_head_dim;
  for_each_row_block(p, [&](int64_t b, int64_t n, int64_t i0, int64_t i1) {
    std::vector<float> a(vD), c(vD);
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t id = p.row_id.at(b, n, i), st = p.stats.at(b, n, i);
      const float m = smax[st], s = ssum[st];
      if (std::isnan(m) || std::isnan(s)) {  // the forward row is NaN: so are its probabilities and gradients
        mx[id] = inv[id] = std::numeric_limits<float>::quiet_NaN();
      } else {
        const bool dead = !(s > 0.f) || m == -kInf;
        mx[id] = dead ? kInf : m;
        inv[id] = dead ? 0.f : 1.f / s;
      }
      convert_row(dy + p.out.at(b, n, i), a.data(), vD);
      convert_row(o + p.out.at(b, n, i), c.data(), vD);
      Vec acc(0.f);
      for (int64_t d = 0; d < vD; d += Vec::size()) {
        const int64_t cnt = std::min<int64_t>(Vec::size(), vD - d);
        acc = at::vec::fmadd(Vec::loadu(a.data() + d, cnt), Vec::loadu(c.data() + d, cnt), acc);
      }
      di[id] = at::vec::vec_reduce_all<float>([](Vec& x, Vec& y) { return x + y; }, acc);
    }
  });
}

// dsink[n] = -sum over the rows of head n of P_sink * D, P_sink = exp(sink - max) / sum (the statistics include the
// sink) and D = sum_j P_j dP_j summed over the slices' partials. That D is the one Di approximates: Di = rowsum(dY * O)
// reads O rounded to the input dtype, an error that the sum over all rows of a head would accumulate. Rows and
// slices are summed in a fixed order (double accumulator): deterministic.
inline void finish_dsink(const AttentionParams& p, const float* mx, const float* inv, const float* d_part,
                         int64_t slices, int64_t rows, at::Tensor& dsink) {
  float* out = dsink.data_ptr<float>();
  at::parallel_for(0, p.q_heads, 1, [&](int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < n1; ++n) {
      double acc = 0.0;
      for (int64_t b = 0; b < p.batch; ++b) {
        for (int64_t i = 0; i < p.q_len[b]; ++i) {
          const int64_t id = p.row_id.at(b, n, i);
          if (inv[id] == 0.f) continue;  // a dead row saw neither a key nor the sink
          double d = 0.0;
          for (int64_t s = 0; s < slices; ++s) d += d_part[s * rows + id];
          acc += std::exp(double(p.sink[n]) - double(mx[id])) * double(inv[id]) * d;  // NaN rows stay NaN
        }
      }
      out[n] = static_cast<float>(-acc);
    }
  });
}

// dq = sum of the slice partials in slice order, converted to the input dtype.
template <typename T>
void finish_dq(const AttentionParams& p, BackwardTensors& t, const float* part, int64_t slices, int64_t stride) {
  const int64_t D = p.head_dim;
  T* dq = t.dq.data_ptr<T>();
  for_each_row_block(p, [&](int64_t b, int64_t n, int64_t i0, int64_t i1) {
    std::vector<float> acc(D);
    for (int64_t i = i0; i < i1; ++i) {
      const float* src = part + p.row_id.at(b, n, i) * D;
      std::copy(src, src + D, acc.begin());
      for (int64_t s = 1; s < slices; ++s)
        for (int64_t d = 0; d < D; ++d) acc[d] += src[s * stride + d];
      convert_row(acc.data(), dq + t.dq_rows.at(b, n, i), D);
    }
  });
}

// Items, most expensive first so the dynamic queue ends with small ones.
inline std::vector<Item> make_items(const AttentionParams& p, bool whole_batch, int64_t slices) {
  std::vector<Item> items;
  const int64_t sets = whole_batch ? 1 : p.batch;
  for (int64_t s = 0; s < sets; ++s) {
    const int64_t b0 = whole_batch ? 0 : s, b1 = whole_batch ? p.batch : s + 1;
    int64_t cost = 0;
    for (int64_t b = b0; b < b1; ++b) cost += p.q_len[b] * p.kv_len[b];
    for (int64_t n2 = 0; n2 < p.kv_heads; ++n2)
      for (int64_t c = 0; c < slices; ++c) items.push_back({b0, b1, n2, c, cost});
  }
  std::stable_sort(items.begin(), items.end(), [](const Item& x, const Item& y) { return x.cost > y.cost; });
  return items;
}

template <typename T, typename G>
void run(const AttentionParams& p, const AttentionInputs& in, BackwardTensors& t, int64_t panel) {
  const auto f32 = at::TensorOptions().dtype(at::kFloat);
  const int64_t D = p.head_dim, rows = t.softmax_max.numel() / 8;
  at::Tensor stats = at::empty({3, rows}, f32);
  float* st = stats.data_ptr<float>();
  {
    StageClock clock;  // Di = rowsum(dY * O) and the saved statistics: part of the softmax gradient
    prepare_rows<T>(p, t, st, st + rows, st + 2 * rows);
    clock.lap(St::kBwdSoftmax);
  }

  const attention::TileConfig over = attention::tile_config_override();
  // Tiles never larger than the sequences, so small problems (or huge overrides) do not over-allocate.
  const int64_t bq = std::min(over.block_q > 0 ? over.block_q : kDefaultBlockQ, std::max<int64_t>(1, p.max_q_len));
  const int64_t bkv = std::min(over.block_kv > 0 ? over.block_kv : kDefaultBlockKv, std::max<int64_t>(1, p.max_kv_len));

  // dpse summed over the batch ([1,N,Sq,Skv]) needs all batches of a head in one item to stay race-free.
  const bool whole_batch = t.dpse.defined() && t.dpse.size(0) == 1 && p.batch > 1;
  const int64_t threads = at::get_num_threads();
  const int64_t base_items = (whole_batch ? 1 : p.batch) * p.kv_heads;
  const int64_t max_tiles = std::max<int64_t>(1, ceil_div(p.max_kv_len, bkv));
  const int64_t slices = threads <= 1 ? 1 : std::clamp<int64_t>(ceil_div(4 * threads, base_items), 1, max_tiles);
  at::Tensor dq_part = at::zeros({slices, rows, D}, f32);
  at::Tensor d_part = p.sink ? at::zeros({slices, rows}, f32) : at::Tensor();

  at::Tensor dpse;
  Ctx<T> c{p, in.query.const_data_ptr<T>(), in.key.const_data_ptr<T>(), in.value.const_data_ptr<T>(),
           t.dy.const_data_ptr<T>(), t.dk.data_ptr<T>(), t.dv.data_ptr<T>(), t.dk_rows, t.dv_rows,
           RowStats{st, st + rows, st + 2 * rows}, dq_part.data_ptr<float>(), rows * D, nullptr, 0, 0, 0,
           bq, bkv, slices, panel, p.sink ? d_part.data_ptr<float>() : nullptr, rows};
  if (t.dpse.defined()) {
    dpse = t.dpse.scalar_type() == at::kFloat ? t.dpse.zero_() : at::zeros(t.dpse.sizes(), f32);
    c.dpse = dpse.data_ptr<float>();
    c.dpse_sb = dpse.size(0) == 1 ? 0 : dpse.stride(0);
    c.dpse_sn = dpse.stride(1);
    c.dpse_si = dpse.size(2) == 1 ? 0 : dpse.stride(2);
  }

  const std::vector<Item> items = make_items(p, whole_batch, slices);
  std::atomic<int64_t> next{0};  // work queue only: which thread runs an item never changes a result
  at::parallel_for(0, threads, 1, [&](int64_t, int64_t) {
    Worker<T, G> w(c);
    for (int64_t i = next++; i < static_cast<int64_t>(items.size()); i = next++) w.run(items[i]);
    if constexpr (!std::is_same_v<G, float>) brgemm::release(true);
    w.clock.lap(St::kBwdFinish);
  });

  StageClock clock;
  finish_dq<T>(p, t, dq_part.const_data_ptr<float>(), slices, rows * D);
  clock.lap(St::kBwdFinish);
  if (p.sink) finish_dsink(p, st, st + rows, d_part.const_data_ptr<float>(), slices, rows, t.dsink);
  if (t.dpse.defined() && t.dpse.scalar_type() != at::kFloat) t.dpse.copy_(dpse);
}

// bf16/fp16 GEMMs in their own dtype need the VNNI micro-kernel and even head dims (the K of S and dP).
template <typename T>
void run_low_precision(const AttentionParams& p, const AttentionInputs& in, BackwardTensors& t) {
  const int64_t panel = brgemm_vnni_panel(c10::CppTypeToScalarType<T>::value);
  if (panel > 0 && p.head_dim % 2 == 0 && p.v_head_dim % 2 == 0) return run<T, T>(p, in, t, panel);
  run<T, float>(p, in, t, 0);
}

}  // namespace bwd

void attention_backward(const AttentionParams& p, const AttentionInputs& in, BackwardTensors& t) {
  switch (in.query.scalar_type()) {
    case at::kFloat: return bwd::run<float, float>(p, in, t, 0);
    case at::kBFloat16: return bwd::run_low_precision<at::BFloat16>(p, in, t);
    case at::kHalf: return bwd::run_low_precision<at::Half>(p, in, t);
    default: TORCH_CHECK(false, p.op, ": unsupported dtype ", in.query.scalar_type());
  }
}

}  // namespace npu_fa::cpu::CPU_CAPABILITY
