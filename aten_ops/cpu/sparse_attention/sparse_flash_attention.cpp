// CPU kernels of sparse flash attention (DeepSeek-V3.2's DSA): sparse_flash_attention, its backward and
// kv_quant_sparse_flash_attention (docs/sparse_attention.md, "Sparse flash attention").
//
// The forward runs in sparse_flash_attention_kernels_isa.cpp (compiled per instruction set, brgemm products and a
// vectorised softmax); this file validates, allocates and calls it, and holds the backward.
//
// Backward work item = (query row t, KV head n2). The KV tokens row t selects are gathered ONCE per item into an
// fp32 (fp64 for fp64 inputs) tile K̃ [M, Dqk] ([latent, rope] for MLA) and, unless value is key itself, Ṽ [M, Dv];
// the G = N1 / N2 query heads sharing that KV head are one [G, Dqk] block, so the products are small GEMMs (at::mm
// on the gathered tiles).
// The backward recomputes S per item (P from the forward's softmax_max / softmax_sum, or from S itself when the
// forward did not return them), forms dS = P ⊙ (dO Ṽᵀ - rowsum(dO ⊙ out)) and writes dq / dq_rope directly. The
// key / value gradients of the selected rows (dK̃ = scale dSᵀ Q, dṼ = Pᵀ dO) go to a per-chunk buffer; the chunk
// is then added into full-cache accumulators by a parallel loop over cache rows (each thread owns a range of rows
// and scans the chunk in item order), so no two threads write one row and the sums' order depends on the shapes
// and indices only.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "common/sparse_attention/sparse_flash_attention_params.h"
#include "cpu/sparse_attention/sparse_flash_attention_kernels.h"
#include "generated/kernels.h"

namespace npu_fa {

namespace {

using sparse_attention::check_float;
using sparse_attention::check_sfa_tensors;
using sparse_attention::SfaTensors;
using sparse_attention::KvLayout;
using sparse_attention::SfaGeometry;
using cpu::CacheView;
using cpu::CPU_CAPABILITY::load_row;

template <typename T>
using acc_type_t = std::conditional_t<std::is_same_v<T, double>, double, float>;

template <typename acc_t>
constexpr c10::ScalarType acc_scalar() {
  return std::is_same_v<acc_t, double> ? at::kDouble : at::kFloat;
}

// c = alpha * op(a) · op(b) (+ c when add), row-major buffers; op transposes when the flag is set.
template <typename acc_t>
void gemm(int64_t m, int64_t n, int64_t k, const acc_t* a, int64_t lda, bool ta, const acc_t* b, int64_t ldb,
          bool tb, acc_t* c, int64_t ldc, double alpha = 1.0, bool add = false) {
  if (m == 0 || n == 0) return;
  const auto opt = at::TensorOptions().dtype(acc_scalar<acc_t>());
  auto A = at::from_blob(const_cast<acc_t*>(a), {ta ? k : m, ta ? m : k}, {lda, 1}, opt);
  auto Bm = at::from_blob(const_cast<acc_t*>(b), {tb ? n : k, tb ? k : n}, {ldb, 1}, opt);
  auto C = at::from_blob(c, {m, n}, {ldc, 1}, opt);
  if (ta) A = A.t();
  if (tb) Bm = Bm.t();
  if (k == 0) {
    if (!add) C.zero_();
    return;
  }
  if (add)
    C.addmm_(A, Bm, 1.0, alpha);
  else if (alpha == 1.0)
    at::mm_out(C, A, Bm);
  else
    at::mm_out(C, A, Bm).mul_(alpha);
}

// Per-thread buffers of one work item.
template <typename acc_t>
struct Tiles {
  std::vector<int64_t> rows;
  std::vector<acc_t> q, k, v, s;
  acc_t* vptr = nullptr;
  int64_t ldv = 0;
};

// Gathers Q [G, Dqk] of row t, head group n2, and K̃ / Ṽ of the selected rows.
template <typename scalar_t, typename acc_t>
void gather(const SfaGeometry& g, const CacheView& cv, const scalar_t* q, const scalar_t* qr, int64_t Dq,
            int64_t t, int64_t n2, Tiles<acc_t>& w) {
  const int64_t Dqk = cv.Dn + cv.Dr, M = static_cast<int64_t>(w.rows.size());
  w.q.resize(g.G * Dqk);
  for (int64_t h = 0; h < g.G; ++h) {
    const int64_t head = n2 * g.G + h;
    const scalar_t* src = q + (t * g.N1 + head) * Dq;
    for (int64_t d = 0; d < cv.Dn; ++d) w.q[h * Dqk + d] = static_cast<acc_t>(src[d]);
    if (cv.Dr > 0) {
      const scalar_t* srcr = qr != nullptr ? qr + (t * g.N1 + head) * cv.Dr : src + cv.Dn;
      for (int64_t d = 0; d < cv.Dr; ++d) w.q[h * Dqk + cv.Dn + d] = static_cast<acc_t>(srcr[d]);
    }
  }
  w.k.resize(M * Dqk);
  if (!cv.value_is_key) w.v.resize(M * cv.Dv);
  // (inside a parallel region, e.g. one item per thread, this loop runs on the calling thread; outside, a lone
  // decode item's rows are split across the threads)
  at::parallel_for(0, M, 128, [&](int64_t m0, int64_t m1) {
    for (int64_t m = m0; m < m1; ++m)
      load_row<scalar_t, acc_t>(cv, w.rows[m], n2, w.k.data() + m * Dqk,
                                cv.value_is_key ? nullptr : w.v.data() + m * cv.Dv);
  });
  w.vptr = cv.value_is_key ? w.k.data() : w.v.data();
  w.ldv = cv.value_is_key ? Dqk : cv.Dv;
}

struct BwdIo {
  const void* dout;  // [T1, N1, Dv] scalar_t
  const void* out;
  const void* smax;  // acc_t stats or nullptr (recompute)
  const void* ssum;
  const void* sinks;  // [N1] in acc_t or nullptr
  void* dq;   // [T1, N1, Dn] scalar_t
  void* dqr;  // [T1, N1, Dr] or nullptr
};

struct BwdAcc {
  at::Tensor dk, dv;  // dK̃ [kv_rows, N2, Dqk] and dṼ [kv_rows, N2, Dv], acc_t
  at::Tensor dsinks;  // [N1] acc_t, or undefined without sinks
};

// Returns the accumulators of the cache and sink gradients, and writes dq / dq_rope.
template <typename scalar_t>
BwdAcc backward_kernel(const SfaGeometry& g, const CacheView& cv, const scalar_t* q,
                                                  const scalar_t* qr, const BwdIo& io) {
  using acc_t = acc_type_t<scalar_t>;
  const int64_t Dn = cv.Dn, Dr = cv.Dr, Dqk = Dn + Dr, Dv = cv.Dv, items = g.T1 * g.N2;
  const auto opt = at::TensorOptions().dtype(acc_scalar<acc_t>());
  at::Tensor dk_acc = at::zeros({g.kv_rows, g.N2, Dqk}, opt);
  at::Tensor dv_acc = at::zeros({g.kv_rows, g.N2, Dv}, opt);
  acc_t* dk = dk_acc.data_ptr<acc_t>();
  acc_t* dv = dv_acc.data_ptr<acc_t>();
  const scalar_t* dout = static_cast<const scalar_t*>(io.dout);
  const scalar_t* out = static_cast<const scalar_t*>(io.out);
  const acc_t* smax = static_cast<const acc_t*>(io.smax);
  const acc_t* ssum = static_cast<const acc_t*>(io.ssum);
  scalar_t* dq = static_cast<scalar_t*>(io.dq);
  scalar_t* dqr = static_cast<scalar_t*>(io.dqr);
  const acc_t* sinks = static_cast<const acc_t*>(io.sinks);
  // d sink[n] = -sum over the rows of head n of p_sink * rowsum(dO * O): one term per (token, head), summed after
  // the parallel loop in token order, so the result does not depend on the thread count.
  std::vector<acc_t> sink_terms(sinks != nullptr ? g.T1 * g.N1 : 0, acc_t(0));

  // Selection sizes, to cut the items into chunks whose gathered gradients fit a bounded buffer.
  std::vector<int64_t> count(items);
  at::parallel_for(0, items, 64, [&](int64_t i0, int64_t i1) {
    std::vector<int64_t> rows;
    for (int64_t it = i0; it < i1; ++it) {
      g.select(it / g.N2, it % g.N2, rows);
      count[it] = static_cast<int64_t>(rows.size());
    }
  });
  const int64_t budget = std::max<int64_t>(int64_t{1} << 22, Dqk + Dv);  // values per chunk (16 MiB fp32)
  std::vector<int64_t> offset(items + 1, 0);
  for (int64_t it = 0; it < items; ++it) offset[it + 1] = offset[it] + count[it];
  std::vector<int64_t> chunk_rows;
  std::vector<acc_t> chunk_dk, chunk_dv;
  int64_t start = 0;
  while (start < items) {
    int64_t end = start + 1;
    while (end < items && (offset[end + 1] - offset[start]) * (Dqk + Dv) <= budget) ++end;
    const int64_t base = offset[start], total = offset[end] - base;
    chunk_rows.assign(total, 0);
    chunk_dk.assign(total * Dqk, 0);
    chunk_dv.assign(total * Dv, 0);
    at::parallel_for(start, end, 1, [&](int64_t i0, int64_t i1) {
      Tiles<acc_t> w;
      std::vector<acc_t> dO, O, delta, dp, dqc, mx, sm;
      for (int64_t it = i0; it < i1; ++it) {
        const int64_t t = it / g.N2, n2 = it % g.N2;
        g.select(t, n2, w.rows);
        const int64_t M = static_cast<int64_t>(w.rows.size());
        // rows without keys: zero dq (the buffer starts zeroed)
        if (M == 0) continue;
        std::copy(w.rows.begin(), w.rows.end(), chunk_rows.begin() + (offset[it] - base));
        gather<scalar_t, acc_t>(g, cv, q, qr, Dqk - (qr != nullptr ? Dr : 0), t, n2, w);
        dO.resize(g.G * Dv);
        O.resize(g.G * Dv);
        delta.assign(g.G, 0);
        for (int64_t h = 0; h < g.G; ++h) {
          const int64_t src = (t * g.N1 + n2 * g.G + h) * Dv;
          for (int64_t d = 0; d < Dv; ++d) {
            dO[h * Dv + d] = static_cast<acc_t>(dout[src + d]);
            O[h * Dv + d] = static_cast<acc_t>(out[src + d]);
            delta[h] += dO[h * Dv + d] * O[h * Dv + d];
          }
        }
        w.s.resize(g.G * M);
        gemm<acc_t>(g.G, M, Dqk, w.q.data(), Dqk, false, w.k.data(), Dqk, true, w.s.data(), M, g.scale);
        mx.assign(g.G, 0);
        sm.assign(g.G, 0);
        if (smax != nullptr) {
          const int64_t sb = g.stat_offset(t, n2);
          for (int64_t h = 0; h < g.G; ++h) {
            mx[h] = smax[sb + h];
            sm[h] = ssum[sb + h];
          }
        } else {
          for (int64_t h = 0; h < g.G; ++h) {
            const acc_t* srow = w.s.data() + h * M;
            acc_t m = sinks != nullptr ? sinks[n2 * g.G + h] : -std::numeric_limits<acc_t>::infinity();
            for (int64_t j = 0; j < M; ++j) m = std::max(m, srow[j]);
            acc_t sum = sinks != nullptr ? std::exp(sinks[n2 * g.G + h] - m) : acc_t(0);
            for (int64_t j = 0; j < M; ++j) sum += std::exp(srow[j] - m);
            mx[h] = m;
            sm[h] = sum;
          }
        }
        for (int64_t h = 0; h < g.G; ++h) {
          acc_t* srow = w.s.data() + h * M;
          const acc_t inv = sm[h] > 0 ? acc_t(1) / sm[h] : acc_t(0);
          for (int64_t j = 0; j < M; ++j) srow[j] = std::exp(srow[j] - mx[h]) * inv;  // P
          if (sinks != nullptr)  // the sink's probability times rowsum(dO * O), with the sign of dS
            sink_terms[t * g.N1 + n2 * g.G + h] = -std::exp(sinks[n2 * g.G + h] - mx[h]) * inv * delta[h];
        }
        dp.resize(g.G * M);
        gemm<acc_t>(g.G, M, Dv, dO.data(), Dv, false, w.vptr, w.ldv, true, dp.data(), M);  // dO Ṽᵀ
        for (int64_t h = 0; h < g.G; ++h)
          for (int64_t j = 0; j < M; ++j) dp[h * M + j] = w.s[h * M + j] * (dp[h * M + j] - delta[h]);  // dS
        dqc.resize(g.G * Dqk);
        gemm<acc_t>(g.G, Dqk, M, dp.data(), M, false, w.k.data(), Dqk, false, dqc.data(), Dqk, g.scale);
        for (int64_t h = 0; h < g.G; ++h) {
          const int64_t head = t * g.N1 + n2 * g.G + h;
          for (int64_t d = 0; d < Dn; ++d) dq[head * Dn + d] = static_cast<scalar_t>(dqc[h * Dqk + d]);
          if (Dr > 0) {
            scalar_t* dst = dqr != nullptr ? dqr + head * Dr : nullptr;
            if (dst != nullptr)
              for (int64_t d = 0; d < Dr; ++d) dst[d] = static_cast<scalar_t>(dqc[h * Dqk + Dn + d]);
          }
        }
        acc_t* ck = chunk_dk.data() + (offset[it] - base) * Dqk;
        acc_t* cvv = chunk_dv.data() + (offset[it] - base) * Dv;
        gemm<acc_t>(M, Dqk, g.G, dp.data(), M, true, w.q.data(), Dqk, false, ck, Dqk, g.scale);
        gemm<acc_t>(M, Dv, g.G, w.s.data(), M, true, dO.data(), Dv, false, cvv, Dv);
      }
    });
    // Scatter: each thread owns cache rows [r0, r1) and adds the chunk's contributions in item order.
    at::parallel_for(0, g.kv_rows, 256, [&](int64_t r0, int64_t r1) {
      for (int64_t it = start; it < end; ++it) {
        const int64_t n2 = it % g.N2;
        for (int64_t e = offset[it] - base; e < offset[it + 1] - base; ++e) {
          const int64_t r = chunk_rows[e];
          if (r < r0 || r >= r1) continue;
          acc_t* dst = dk + (r * g.N2 + n2) * Dqk;
          const acc_t* src = chunk_dk.data() + e * Dqk;
          for (int64_t d = 0; d < Dqk; ++d) dst[d] += src[d];
          acc_t* dstv = dv + (r * g.N2 + n2) * Dv;
          const acc_t* srcv = chunk_dv.data() + e * Dv;
          for (int64_t d = 0; d < Dv; ++d) dstv[d] += srcv[d];
        }
      }
    });
    start = end;
  }
  at::Tensor dsinks;
  if (sinks != nullptr) {
    dsinks = at::zeros({g.N1}, opt);
    acc_t* ds = dsinks.data_ptr<acc_t>();
    for (int64_t t = 0; t < g.T1; ++t)
      for (int64_t n = 0; n < g.N1; ++n) ds[n] += sink_terms[t * g.N1 + n];
  }
  return {dk_acc, dv_acc, dsinks};
}

// The sinks in the kernels' accumulation type (float64 for a float64 query, else float32), or undefined.
at::Tensor sinks_in_acc(const std::optional<at::Tensor>& sinks, const at::Tensor& query) {
  if (!sinks.has_value()) return at::Tensor();
  return sinks->to(query.scalar_type() == at::kDouble ? at::kDouble : at::kFloat).contiguous();
}

std::vector<int64_t> with_last(const at::Tensor& t, int64_t last) {
  std::vector<int64_t> s(t.sizes().begin(), t.sizes().end());
  s.back() = last;
  return s;
}

std::vector<int64_t> stat_shape(const SfaGeometry& g) {
  if (g.q_tnd) return {g.N2, g.T1, g.G};
  return {g.B, g.N2, g.S1, g.G};
}

sparse_attention::SfaCall sfa_call(const char* op, const at::Tensor& query, const at::Tensor& key,
                                   const at::Tensor& idx, const std::optional<at::Tensor>& bt,
                                   const std::optional<at::Tensor>& lq, const std::optional<at::Tensor>& lkv,
                                   const char* lq_name, const char* lkv_name, double scale, int64_t sbs,
                                   c10::string_view layout_q, c10::string_view layout_kv, int64_t mode, int64_t pre,
                                   int64_t next) {
  return sparse_attention::SfaCall{op, query, key, idx, bt, lq, lkv, lq_name, lkv_name, scale, sbs, layout_q,
                                   layout_kv, mode, pre, next};
}

}  // namespace

std::tuple<at::Tensor, at::Tensor, at::Tensor> sparse_flash_attention_cpu(const SparseFlashAttentionArgs& a) {
  const char* op = "sparse_flash_attention";
  const SfaGeometry g = sparse_attention::parse_sfa(
      sfa_call(op, a.query, a.key, a.sparse_indices, a.block_table, a.actual_seq_lengths_query,
               a.actual_seq_lengths_kv, "actual_seq_lengths_query", "actual_seq_lengths_kv", a.scale_value,
               a.sparse_block_size, a.layout_query, a.layout_kv, a.sparse_mode, a.pre_tokens, a.next_tokens));
  const SfaTensors d = check_sfa_tensors(op, a.query, a.key, a.value, a.query_rope, a.key_rope, a.attention_mode,
                                         a.sinks, g);
  const auto stat_opt = a.query.options().dtype(a.query.scalar_type() == at::kDouble ? at::kDouble : at::kFloat);
  at::Tensor out = at::empty(with_last(a.query, d.Dv), a.query.options());
  at::Tensor smax = a.return_softmax_lse ? at::empty(stat_shape(g), stat_opt) : at::empty({0}, stat_opt);
  at::Tensor ssum = a.return_softmax_lse ? at::empty(stat_shape(g), stat_opt) : at::empty({0}, stat_opt);
  if (out.numel() == 0 && smax.numel() == 0) return {out, smax, ssum};
  const at::Tensor q = a.query.contiguous(), k = a.key.contiguous(), v = a.value.contiguous();
  const at::Tensor qr = a.query_rope.has_value() ? a.query_rope->contiguous() : at::Tensor();
  const at::Tensor kr = a.key_rope.has_value() ? a.key_rope->contiguous() : at::Tensor();
  const at::Tensor sinks = sinks_in_acc(a.sinks, a.query);
  CacheView cv;
  cv.N2 = g.N2;
  cv.Dn = d.Dn;
  cv.Dr = d.Dr;
  cv.Dv = d.Dv;
  cv.key = k.data_ptr();
  cv.key_rope = kr.defined() ? kr.data_ptr() : nullptr;
  cv.value = v.data_ptr();
  cv.value_is_key = v.data_ptr() == k.data_ptr() && v.sizes() == k.sizes();
  cpu::SfaForwardParams p;
  p.geo = &g;
  p.cv = cv;
  p.dtype = q.scalar_type();
  p.q = q.data_ptr();
  p.qr = qr.defined() ? qr.data_ptr() : nullptr;
  p.Dq = d.Dn;
  p.out = out.data_ptr();
  p.smax = a.return_softmax_lse ? smax.data_ptr() : nullptr;
  p.ssum = a.return_softmax_lse ? ssum.data_ptr() : nullptr;
  p.sinks = sinks.defined() ? sinks.data_ptr() : nullptr;
  cpu::sparse_flash_attention_forward_stub(p);
  return {out, smax, ssum};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> sparse_flash_attention_grad_cpu(
    const SparseFlashAttentionGradArgs& a) {
  const char* op = "sparse_flash_attention_grad";
  const SfaGeometry g = sparse_attention::parse_sfa(
      sfa_call(op, a.query, a.key, a.sparse_indices, a.block_table, a.actual_seq_qlen, a.actual_seq_kvlen,
               "actual_seq_qlen", "actual_seq_kvlen", a.scale_value, a.sparse_block_size, a.layout, a.layout_kv,
               a.sparse_mode, a.pre_tokens, a.next_tokens));
  const SfaTensors d = check_sfa_tensors(op, a.query, a.key, a.value, a.query_rope, a.key_rope, a.attention_mode,
                                         a.sinks, g);
  const auto out_shape = with_last(a.query, d.Dv);
  for (const auto& [name, t] : {std::pair<const char*, const at::Tensor*>{"d_out", &a.d_out}, {"out", &a.out}}) {
    TORCH_CHECK_TYPE(t->scalar_type() == a.query.scalar_type(), op, ": argument '", name,
                     "' must have query's dtype (", a.query.scalar_type(), "); got ", t->scalar_type());
    TORCH_CHECK_VALUE(t->sizes() == at::IntArrayRef(out_shape), op, ": argument '", name,
                      "' must have the forward output's shape ", at::IntArrayRef(out_shape), "; got ", t->sizes());
  }
  const auto stat_dtype = a.query.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  const bool have_stats = a.softmax_max.numel() > 0 || a.softmax_sum.numel() > 0;
  if (have_stats) {
    const auto shape = stat_shape(g);
    for (const auto& [name, t] : {std::pair<const char*, const at::Tensor*>{"softmax_max", &a.softmax_max},
                                  {"softmax_sum", &a.softmax_sum}}) {
      TORCH_CHECK_TYPE(t->scalar_type() == stat_dtype, op, ": argument '", name, "' must be ", stat_dtype,
                       " (the forward's statistics); got ", t->scalar_type());
      TORCH_CHECK_VALUE(t->sizes() == at::IntArrayRef(shape), op, ": argument '", name, "' must be ",
                        at::IntArrayRef(shape), " (the forward's statistics) or empty [0]; got ", t->sizes());
    }
  }
  at::Tensor dq = at::zeros_like(a.query, at::MemoryFormat::Contiguous);
  at::Tensor dqr = a.query_rope.has_value() ? at::zeros_like(*a.query_rope, at::MemoryFormat::Contiguous)
                                            : at::empty({0}, a.query.options());
  const at::Tensor q = a.query.contiguous(), k = a.key.contiguous(), v = a.value.contiguous();
  const at::Tensor qr = a.query_rope.has_value() ? a.query_rope->contiguous() : at::Tensor();
  const at::Tensor kr = a.key_rope.has_value() ? a.key_rope->contiguous() : at::Tensor();
  const at::Tensor sinks = sinks_in_acc(a.sinks, a.query);
  const at::Tensor dout = a.d_out.contiguous(), out = a.out.contiguous();
  const at::Tensor smax = have_stats ? a.softmax_max.contiguous() : at::Tensor();
  const at::Tensor ssum = have_stats ? a.softmax_sum.contiguous() : at::Tensor();
  CacheView cv;
  cv.N2 = g.N2;
  cv.Dn = d.Dn;
  cv.Dr = d.Dr;
  cv.Dv = d.Dv;
  cv.key = k.data_ptr();
  cv.key_rope = kr.defined() ? kr.data_ptr() : nullptr;
  cv.value = v.data_ptr();
  cv.value_is_key = v.data_ptr() == k.data_ptr() && v.sizes() == k.sizes();
  BwdAcc acc;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, q.scalar_type(), "sparse_flash_attention_grad", [&] {
    acc = backward_kernel<scalar_t>(
        g, cv, q.data_ptr<scalar_t>(), qr.defined() ? qr.data_ptr<scalar_t>() : nullptr,
        BwdIo{dout.data_ptr(), out.data_ptr(), have_stats ? smax.data_ptr() : nullptr,
              have_stats ? ssum.data_ptr() : nullptr, sinks.defined() ? sinks.data_ptr() : nullptr,
              dq.data_ptr(), qr.defined() ? dqr.data_ptr() : nullptr});
  });
  const at::Tensor& dk_acc = acc.dk;
  at::Tensor dk = dk_acc.narrow(2, 0, d.Dn).reshape(a.key.sizes()).to(a.key.scalar_type());
  at::Tensor dkr = a.key_rope.has_value()
                       ? dk_acc.narrow(2, d.Dn, d.Dr).reshape(a.key_rope->sizes()).to(a.key.scalar_type())
                       : at::empty({0}, a.key.options());
  at::Tensor dv = acc.dv.reshape(a.value.sizes()).to(a.value.scalar_type());
  at::Tensor dsinks = a.sinks.has_value() ? acc.dsinks.to(a.sinks->scalar_type())
                                          : at::empty({0}, a.query.options().dtype(at::kFloat));
  return {dq, dk.contiguous(), dv.contiguous(), dqr, dkr.contiguous(), dsinks};
}

at::Tensor kv_quant_sparse_flash_attention_cpu(const KvQuantSparseFlashAttentionArgs& a) {
  const char* op = "kv_quant_sparse_flash_attention";
  TORCH_CHECK_VALUE(a.key_quant_mode == 2 && a.value_quant_mode == 2, op,
                    ": arguments 'key_quant_mode' and 'value_quant_mode' must be 2 (per-tile); got ",
                    a.key_quant_mode, " and ", a.value_quant_mode, " (other modes are not implemented)");
  TORCH_CHECK_VALUE(a.quant_scale_repo_mode == 1, op,
                    ": argument 'quant_scale_repo_mode' must be 1 (scales stored in the cache rows); got ",
                    a.quant_scale_repo_mode, " (other modes are not implemented)");
  TORCH_CHECK_VALUE(a.attention_mode == 2, op, ": argument 'attention_mode' must be 2 (MLA absorb); got ",
                    a.attention_mode, " (other modes are not implemented)");
  TORCH_CHECK_VALUE(!a.key_dequant_scale.has_value() && !a.value_dequant_scale.has_value(), op,
                    ": arguments 'key_dequant_scale' and 'value_dequant_scale' are reserved and must be None (the "
                    "scales are part of the cache rows)");
  const SfaGeometry g = sparse_attention::parse_sfa(
      sfa_call(op, a.query, a.key, a.sparse_indices, a.block_table, a.actual_seq_lengths_query,
               a.actual_seq_lengths_kv, "actual_seq_lengths_query", "actual_seq_lengths_kv", a.scale_value,
               a.sparse_block_size, a.layout_query, a.layout_kv, a.sparse_mode, a.pre_tokens, a.next_tokens));
  const auto qs = a.query.scalar_type();
  TORCH_CHECK_TYPE(qs == at::kHalf || qs == at::kBFloat16 || qs == at::kFloat, op,
                   ": argument 'query' must be float16, bfloat16 or float32; got ", qs);
  const auto ks = a.key.scalar_type();
  TORCH_CHECK_TYPE(ks == at::kChar || ks == at::kFloat8_e4m3fn, op,
                   ": argument 'key' must be int8 or float8_e4m3fn (quantised cache rows); got ", ks);
  TORCH_CHECK_TYPE(a.value.scalar_type() == ks, op, ": argument 'value' must have key's dtype (", ks, "); got ",
                   a.value.scalar_type());
  for (const auto& [name, v] : {std::pair<const char*, std::optional<int64_t>>{"key_dtype", a.key_dtype},
                                {"value_dtype", a.value_dtype}})
    TORCH_CHECK_VALUE(!v.has_value() || *v == static_cast<int64_t>(ks), op, ": argument '", name,
                      "' must be None or key's dtype code (", static_cast<int64_t>(ks), "); got ", *v,
                      " (other cache formats, e.g. hifloat8, are not implemented)");
  TORCH_CHECK_VALUE(a.tile_size > 0, op, ": argument 'tile_size' must be positive; got ", a.tile_size);
  TORCH_CHECK_VALUE(a.rope_head_dim >= 0 && a.rope_head_dim < a.query.size(-1), op,
                    ": argument 'rope_head_dim' must lie in [0, query's head dim ", a.query.size(-1), "); got ",
                    a.rope_head_dim);
  const int64_t Dr = a.rope_head_dim, Dn = a.query.size(-1) - Dr;
  TORCH_CHECK_VALUE(Dn % a.tile_size == 0, op, ": argument 'tile_size' (", a.tile_size,
                    ") must divide the latent dim (query's head dim - rope_head_dim = ", Dn, ")");
  const int64_t esize = static_cast<int64_t>(a.query.element_size());
  const int64_t kv_d = Dn + Dr * esize + 4 * (Dn / a.tile_size);
  TORCH_CHECK_VALUE(a.key.size(-1) == kv_d, op, ": argument 'key' must have rows of Dn + rope_head_dim * ", esize,
                    " + 4 * Dn / tile_size = ", kv_d, " bytes (latent, rope, scales); got shape ", a.key.sizes());
  const bool value_ok = a.value.dim() == a.key.dim() &&
                        a.value.sizes().slice(0, a.key.dim() - 1) == a.key.sizes().slice(0, a.key.dim() - 1) &&
                        (a.value.size(-1) == Dn || a.value.size(-1) == kv_d);
  TORCH_CHECK_VALUE(value_ok, op, ": argument 'value' must have key's shape ", a.key.sizes(),
                    " with a last size of ", Dn, " or ", kv_d, "; got ", a.value.sizes());
  sparse_attention::check_sinks(op, a.sinks, a.query, g.N1);  // (query is never float64 here: float32 sinks)
  at::Tensor out = at::empty(with_last(a.query, Dn), a.query.options());
  if (out.numel() == 0) return out;
  const at::Tensor q = a.query.contiguous(), k = a.key.contiguous();
  const at::Tensor sinks = sinks_in_acc(a.sinks, a.query);
  CacheView cv;
  cv.N2 = g.N2;
  cv.Dn = Dn;
  cv.Dr = Dr;
  cv.Dv = Dn;
  cv.value_is_key = true;
  cv.qkey = static_cast<const uint8_t*>(k.data_ptr());
  cv.row_bytes = kv_d;
  cv.tile = a.tile_size;
  cv.fp8 = ks == at::kFloat8_e4m3fn;
  cv.input_precision = true;
  cpu::SfaForwardParams p;
  p.geo = &g;
  p.cv = cv;
  p.dtype = q.scalar_type();
  p.q = q.data_ptr();
  p.Dq = Dn + Dr;
  p.out = out.data_ptr();
  p.sinks = sinks.defined() ? sinks.data_ptr() : nullptr;
  cpu::sparse_flash_attention_forward_stub(p);
  return out;
}

}  // namespace npu_fa
