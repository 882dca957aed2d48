// fused_infer_attention_score with query_rope / key_rope (Multi-head Latent Attention): the scores gain
// q_rope·k_ropeᵀ. One KV head (the absorbed latent cache; upstream's D=512 case) with a band-only sparse mode runs
// the dedicated kernel (mla_kernels_isa.cpp) on the caches in place; everything else (GQA, upstream's D=128
// non-absorbed prefill, explicit masks, pse_shift) appends the rope parts to each head's query and key, which is
// the same sum of products, and runs the ordinary paths.
#include "cpu/inference/mla.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <limits>
#include <string>
#include <vector>

#include "common/inference/decode_params.h"
#include "common/inference/nz_cache.h"
#include "common/inference/prefill_params.h"
#include "cpu/inference/mla_kernels.h"

namespace npu_fa {
namespace {

using cpu::MlaParams;
using cpu::MlaRows;

std::string str(c10::string_view s) { return std::string(s.data(), s.size()); }

// Cumulative ends (TND): B non-decreasing entries in [0, total].
std::vector<int64_t> read_ends(const char* op, const char* arg, const at::Tensor& t, int64_t total) {
  TORCH_CHECK_VALUE(t.dim() == 1 && (t.scalar_type() == at::kInt || t.scalar_type() == at::kLong), op,
                    ": argument '", arg, "' must be a 1-D int32/int64 tensor of cumulative ends for TND; got ",
                    t.scalar_type(), " of shape ", t.sizes());
  const at::Tensor c = t.to(at::kCPU, at::kLong).contiguous();
  std::vector<int64_t> e(c.const_data_ptr<int64_t>(), c.const_data_ptr<int64_t>() + c.numel());
  int64_t prev = 0;
  for (size_t b = 0; b < e.size(); ++b) {
    TORCH_CHECK_VALUE(e[b] >= prev && e[b] <= total, op, ": argument '", arg, "' must hold non-decreasing cumulative "
                      "ends in [0, ", total, "] for TND; entry ", b, " is ", e[b]);
    prev = e[b];
  }
  return e;
}

// The head dim of a tensor whose last dim packs `heads` heads (BSH, a 3-D paged cache) or is the head dim.
int64_t head_dim(const char* op, const char* arg, const at::Tensor& t, bool packed, int64_t heads) {
  TORCH_CHECK_VALUE(t.dim() >= 1 && (!packed || (heads > 0 && t.size(-1) % heads == 0)), op, ": argument '", arg,
                    "' must pack ", heads, " heads in its last dim; got shape ", t.sizes());
  return packed ? t.size(-1) / heads : t.size(-1);
}

// A rope tensor has its base tensor's shape but for the last dim.
void check_rope_shape(const char* op, const char* arg, const at::Tensor& r, const char* base_arg,
                      const at::Tensor& base) {
  TORCH_CHECK_VALUE(r.dim() == base.dim() && r.sizes().slice(0, r.dim() - 1) == base.sizes().slice(0, base.dim() - 1),
                    op, ": argument '", arg, "' must have the shape of '", base_arg, "' but for the last (rope) dim; "
                    "got ", r.sizes(), " with '", base_arg, "' ", base.sizes());
}

// q ++ q_rope per head (the last dim holds `heads` heads when packed).
at::Tensor append_rope(const at::Tensor& t, const at::Tensor& r, bool packed, int64_t heads) {
  if (!packed) return at::cat({t, r.to(t.scalar_type())}, -1);
  std::vector<int64_t> ts(t.sizes().begin(), t.sizes().end() - 1), rs = ts;
  ts.push_back(heads);
  ts.push_back(t.size(-1) / heads);
  rs.push_back(heads);
  rs.push_back(r.size(-1) / heads);
  return at::cat({t.reshape(ts), r.to(t.scalar_type()).reshape(rs)}, -1).flatten(-2);
}

at::Tensor last_dim_contiguous(const at::Tensor& t) { return t.stride(-1) == 1 ? t : t.contiguous(); }

// Whether the dedicated kernel runs the call (one KV head, a band-only sparse mode, no pse_shift, one float dtype, on
// the CPU); otherwise the rope parts are appended to the heads. Modes 2-4 with a mask: the ordinary path checks that
// it is the optimised causal mask (the wrapper passes None for one it has verified).
bool kernel_takes(const FusedInferAttentionScoreArgs& a, int64_t N2) {
  const auto dt = a.query.scalar_type();
  const bool band_only = !a.atten_mask.has_value() && (a.sparse_mode == 0 || a.sparse_mode == 2 ||
                                                       a.sparse_mode == 3 || a.sparse_mode == 4);
  return N2 == 1 && !a.pse_shift.has_value() && band_only && a.key.scalar_type() == dt &&
         a.value.scalar_type() == dt && (dt == at::kFloat || dt == at::kBFloat16 || dt == at::kHalf) &&
         a.query.device().is_cpu();
}

// The piece strides of NZ latent caches the kernel reads in place (common/inference/nz_cache.h).
struct MlaNz {
  int64_t c0, k_piece, kr_piece, v_piece;
};

// The call itself; nz: key/value/key_rope are ND stand-in views of NZ caches (rows = piece 0 of each row) whose
// pieces lie nz->*_piece apart.
std::tuple<at::Tensor, at::Tensor> mla_call(const char* op, const FusedInferAttentionScoreArgs& a, const MlaNz* nz) {
  TORCH_CHECK_VALUE(a.query_rope.has_value() && a.key_rope.has_value(), op, ": arguments 'query_rope' and 'key_rope' "
                    "must be given together (MLA); got only '", a.query_rope.has_value() ? "query_rope" : "key_rope",
                    "'");
  const at::Tensor& qr_in = *a.query_rope;
  const at::Tensor& kr_in = *a.key_rope;
  TORCH_CHECK_NOT_IMPLEMENTED(a.key.scalar_type() != at::kChar && a.value.scalar_type() != at::kChar, op,
                              ": int8 key/value (KV antiquant) with 'query_rope'/'key_rope' (MLA) is not implemented");
  TORCH_CHECK_TYPE(qr_in.scalar_type() == a.query.scalar_type(), op, ": argument 'query_rope' must have the dtype of "
                   "'query' (", a.query.scalar_type(), "); got ", qr_in.scalar_type());
  TORCH_CHECK_TYPE(kr_in.scalar_type() == a.key.scalar_type(), op, ": argument 'key_rope' must have the dtype of "
                   "'key' (", a.key.scalar_type(), "); got ", kr_in.scalar_type());
  const c10::string_view layout = a.input_layout;
  const bool tnd = layout == "TND", paged = a.block_table.has_value();
  TORCH_CHECK_VALUE(tnd || layout == "BSH" || layout == "BSND" || layout == "BNSD" || layout == "BNSD_BSND", op,
                    ": argument 'input_layout' must be one of BSH, BSND, BNSD, BNSD_BSND, TND; got '", str(layout), "'");
  TORCH_CHECK_VALUE(a.num_heads > 0, op, ": argument 'num_heads' must be positive; got ", a.num_heads);
  const int64_t N = a.num_heads, N2 = a.num_key_value_heads > 0 ? a.num_key_value_heads : a.num_heads;
  const at::Tensor& q = a.query;
  TORCH_CHECK_VALUE(q.dim() == (layout == "BSH" || tnd ? 3 : 4), op, ": argument 'query' must be ",
                    layout == "BSH" || tnd ? 3 : 4, "-D for input_layout ", str(layout), "; got shape ", q.sizes());
  const bool q_packed = layout == "BSH";
  // Keys: the last dim packs the KV heads in a BSH cache and in a 3-D paged cache (num_blocks, block_size, N2*D).
  const bool k_packed = paged ? a.key.dim() == 3 : layout == "BSH";
  check_rope_shape(op, "query_rope", qr_in, "query", q);
  check_rope_shape(op, "key_rope", kr_in, "key", a.key);
  const int64_t D = head_dim(op, "query", q, q_packed, N), Dr = head_dim(op, "query_rope", qr_in, q_packed, N);
  const int64_t Dk = head_dim(op, "key", a.key, k_packed, N2), Dkr = head_dim(op, "key_rope", kr_in, k_packed, N2);
  TORCH_CHECK_VALUE(Dr == Dkr && Dr > 0, op, ": arguments 'query_rope' and 'key_rope' must have one rope head dim; "
                    "got ", Dr, " and ", Dkr);
  TORCH_CHECK_VALUE(D == Dk, op, ": the head dims of 'query' (", D, ") and 'key' (", Dk, ") must agree");
  if (D == 512) {  // absorbed MLA (the latent cache): upstream's fixed shape
    TORCH_CHECK_VALUE(N2 == 1, op, ": with 'query_rope' and a head dim of 512 (absorbed MLA) the latent cache has "
                      "one head: num_key_value_heads must be 1; got ", N2);
    TORCH_CHECK_VALUE(Dr == 64, op, ": with a head dim of 512 (absorbed MLA), 'query_rope'/'key_rope' must have a "
                      "rope head dim of 64; got ", Dr);
  }
  if (!kernel_takes(a, N2)) {
    // The rope parts appended to every head: [q, q_rope]·[k, k_rope] is the same score. A paged cache is first cut
    // to the blocks the table uses (a copy of B x max_blocks blocks instead of the whole pool), renumbered in order.
    at::Tensor key = a.key, key_rope = kr_in, value = a.value;
    std::optional<at::Tensor> table = a.block_table;
    if (paged && a.actual_seq_lengths_kv.has_value() && a.block_table->dim() == 2 && a.block_size > 0 &&
        a.key.dim() >= 3 && a.key.size(0) == a.value.size(0) && a.key.size(0) == kr_in.size(0)) {
      const at::Tensor& bt = *a.block_table;
      const int64_t rows = bt.size(0), M = bt.size(1), bs = a.block_size, nb = a.key.size(0);
      std::vector<int64_t> lens;
      attention::read_per_batch_lengths(op, "actual_seq_lengths_kv", *a.actual_seq_lengths_kv, rows, M * bs, lens);
      at::Tensor idx = bt.to(at::kCPU, at::kLong).contiguous().clone();
      int64_t* ip = idx.data_ptr<int64_t>();
      bool in_range = true;
      for (int64_t b = 0; b < rows; ++b)
        for (int64_t i = 0; i < M; ++i) {
          int64_t& e = ip[b * M + i];
          if (i * bs >= lens[b]) e = 0;  // never read: any valid block
          in_range = in_range && e >= 0 && e < nb;
        }
      if (in_range && rows * M > 0) {  // (out-of-range entries: the ordinary path names them)
        const at::Tensor flat = idx.flatten().to(a.key.device());
        const bool same = a.value.is_same(a.key);
        key = a.key.index_select(0, flat);
        value = same ? key : a.value.index_select(0, flat);
        key_rope = kr_in.index_select(0, flat);
        table = at::arange(rows * M, bt.options().dtype(at::kInt)).view({rows, M});
      }
    }
    FusedInferAttentionScoreValues g(a);  // the same call without rope parts: they are in the heads now
    g.query = append_rope(q, qr_in, q_packed, N);
    g.key = append_rope(key, key_rope, k_packed, N2);
    g.value = value;
    g.block_table = table;
    g.query_rope.reset();
    g.key_rope.reset();
    return fused_infer_attention_score_cpu(g.args());
  }
  // (inner_precise, the antiquant arguments and learnable_sink were checked with the route: common/inference/fia_route.cpp)
  MlaParams p;
  p.heads = N;
  p.dim = D;
  p.rope_dim = Dr;
  p.scale = a.scale;
  p.sparse_mode = a.sparse_mode;
  p.pre_tokens = a.pre_tokens;
  p.next_tokens = a.next_tokens;
  const at::Tensor sink = a.learnable_sink.has_value() ? a.learnable_sink->contiguous() : at::Tensor();
  if (sink.defined()) p.sink = sink.const_data_ptr<float>();
  const at::Tensor qc = last_dim_contiguous(q), qrc = last_dim_contiguous(qr_in);
  const bool bnsd = layout == "BNSD" || layout == "BNSD_BSND";
  // Query rows (b, i, h).
  auto q_rows = [&](const at::Tensor& t, int64_t d) -> MlaRows {
    if (tnd) return {0, t.stride(0), t.stride(1)};
    if (q_packed) return {t.stride(0), t.stride(1), d};
    if (bnsd) return {t.stride(0), t.stride(2), t.stride(1)};
    return {t.stride(0), t.stride(1), t.stride(2)};
  };
  p.q = q_rows(qc, D);
  p.qr = q_rows(qrc, Dr);
  const int64_t Sq = tnd ? q.size(0) : (bnsd ? q.size(2) : q.size(1));
  int64_t B = 0;
  bool padded = false;
  if (tnd) {
    TORCH_CHECK_VALUE(a.actual_seq_lengths.has_value(), op, ": argument 'actual_seq_lengths' (cumulative query ends) "
                      "is required for TND");
    const std::vector<int64_t> ends = read_ends(op, "actual_seq_lengths", *a.actual_seq_lengths, Sq);
    B = static_cast<int64_t>(ends.size());
    for (int64_t b = 0; b < B; ++b) {
      p.q_off.push_back(b ? ends[b - 1] : 0);
      p.q_len.push_back(ends[b] - p.q_off.back());
    }
    padded = B == 0 || ends.back() < Sq;
  } else {
    B = q.size(0);
    if (a.actual_seq_lengths.has_value())
      attention::read_per_batch_lengths(op, "actual_seq_lengths", *a.actual_seq_lengths, B, Sq, p.q_len);
    else
      p.q_len.assign(B, Sq);
    p.q_off.assign(B, 0);
    for (int64_t b = 0; b < B; ++b) padded = padded || p.q_len[b] < Sq;
  }
  p.batch = B;

  // Keys: one head, so every cache form is rows of D (D_rope, Dv) elements with a row stride.
  const at::Tensor kc = last_dim_contiguous(a.key), krc = last_dim_contiguous(kr_in);
  const bool v_is_k = a.value.is_same(a.key) ||
                      (a.value.data_ptr() == a.key.data_ptr() && a.value.sizes() == a.key.sizes() &&
                       a.value.strides() == a.key.strides() && a.value.scalar_type() == a.key.scalar_type());
  const at::Tensor vc = v_is_k ? kc : last_dim_contiguous(a.value);
  TORCH_CHECK_VALUE(vc.dim() == kc.dim() && vc.sizes().slice(0, vc.dim() - 1) == kc.sizes().slice(0, kc.dim() - 1),
                    op, ": arguments 'key' ", a.key.sizes(), " and 'value' ", a.value.sizes(), " must agree but for "
                    "the last dim");
  p.v_dim = vc.size(-1);
  p.v_is_k = v_is_k;
  if (paged) {
    const int64_t bs = a.block_size;
    TORCH_CHECK_VALUE(bs > 0, op, ": argument 'block_size' must be positive with block_table; got ", bs);
    TORCH_CHECK_VALUE(a.actual_seq_lengths_kv.has_value(), op, ": argument 'actual_seq_lengths_kv' is required with "
                      "block_table");
    const at::Tensor& bt = *a.block_table;
    TORCH_CHECK_TYPE(bt.scalar_type() == at::kInt || bt.scalar_type() == at::kLong, op,
                     ": argument 'block_table' must be int32 or int64; got ", bt.scalar_type());
    TORCH_CHECK_VALUE(bt.dim() == 2 && bt.size(0) == B, op, ": argument 'block_table' must be [B=", B,
                      ", max_blocks_per_seq]; got ", bt.sizes());
    // (num_blocks, block_size, D), (num_blocks, block_size, 1, D) or (num_blocks, 1, block_size, D).
    const bool ok = kc.dim() == 3 ? kc.size(1) == bs
                                  : kc.dim() == 4 && ((kc.size(1) == bs && kc.size(2) == 1) ||
                                                      (kc.size(1) == 1 && kc.size(2) == bs));
    TORCH_CHECK_VALUE(ok, op, ": a paged 'key' cache must be (num_blocks, block_size, D), (num_blocks, block_size, "
                      "1, D) or (num_blocks, 1, block_size, D) with block_size=", bs, "; got shape ", kc.sizes());
    const int64_t row_dim = kc.dim() == 4 && kc.size(2) == bs ? 2 : 1;
    p.block_size = bs;
    p.k = {0, kc.stride(row_dim), 0};
    p.kr = {0, krc.stride(row_dim), 0};
    p.v = {0, vc.stride(row_dim), 0};
    p.k_block = kc.stride(0);
    p.kr_block = krc.stride(0);
    p.v_block = vc.stride(0);
    if (nz) {
      p.nz_c0 = nz->c0;
      p.k_piece = nz->k_piece;
      p.kr_piece = nz->kr_piece;
      p.v_piece = nz->v_piece;
    }
    const int64_t M = bt.size(1), num_blocks = kc.size(0);
    attention::read_per_batch_lengths(op, "actual_seq_lengths_kv", *a.actual_seq_lengths_kv, B, M * bs, p.kv_len);
    const at::Tensor btc = bt.to(at::kCPU, at::kLong).contiguous();
    const int64_t* btp = btc.const_data_ptr<int64_t>();
    p.table_stride = std::max<int64_t>(M, 1);
    p.blocks.assign(B * p.table_stride, 0);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t i = 0; i * bs < p.kv_len[b]; ++i) {
        const int64_t blk = btp[b * M + i];
        TORCH_CHECK_VALUE(blk >= 0 && blk < num_blocks, op, ": argument 'block_table'[", b, "][", i, "] = ", blk,
                          " is out of range [0, ", num_blocks, ")");
        p.blocks[b * p.table_stride + i] = blk;
      }
    p.kv_off.assign(B, 0);
  } else {
    TORCH_CHECK_VALUE(a.block_size == 0, op, ": argument 'block_size' is only used with block_table (paged KV); got ",
                      a.block_size);
    TORCH_CHECK_VALUE(kc.dim() == q.dim(), op, ": argument 'key' must be ", q.dim(), "-D like 'query' for input_layout ",
                      str(layout), "; got shape ", kc.sizes());
    auto k_rows = [&](const at::Tensor& t) -> MlaRows {
      if (tnd) return {0, t.stride(0), 0};
      return {t.stride(0), t.stride(bnsd ? 2 : 1), 0};
    };
    p.k = k_rows(kc);
    p.kr = k_rows(krc);
    p.v = k_rows(vc);
    if (tnd) {
      TORCH_CHECK_VALUE(kc.size(1) == 1, op, ": 'key' must be [T, 1, D] (one KV head); got ", kc.sizes());
      TORCH_CHECK_VALUE(a.actual_seq_lengths_kv.has_value(), op, ": argument 'actual_seq_lengths_kv' (cumulative key "
                        "ends) is required for TND");
      const std::vector<int64_t> ends = read_ends(op, "actual_seq_lengths_kv", *a.actual_seq_lengths_kv, kc.size(0));
      TORCH_CHECK_VALUE(static_cast<int64_t>(ends.size()) == B, op, ": arguments 'actual_seq_lengths' and "
                        "'actual_seq_lengths_kv' must have one entry per sequence; got ", B, " and ", ends.size());
      for (int64_t b = 0; b < B; ++b) {
        p.kv_off.push_back(b ? ends[b - 1] : 0);
        p.kv_len.push_back(ends[b] - p.kv_off.back());
      }
    } else {
      TORCH_CHECK_VALUE(kc.size(0) == B && (bnsd ? kc.size(1) : (q_packed ? 1 : kc.size(2))) == 1, op,
                        ": 'key' must hold B=", B, " sequences of one KV head; got shape ", kc.sizes());
      const int64_t Skv = kc.size(bnsd ? 2 : 1);
      if (a.actual_seq_lengths_kv.has_value())
        attention::read_per_batch_lengths(op, "actual_seq_lengths_kv", *a.actual_seq_lengths_kv, B, Skv, p.kv_len);
      else
        p.kv_len.assign(B, Skv);
      p.kv_off.assign(B, 0);
    }
  }

  // Output (the query's layout with Dv; BNSD_BSND writes BSND) and the lse.
  std::vector<int64_t> shape;
  const int64_t Dv = p.v_dim;
  if (tnd) shape = {Sq, N, Dv};
  else if (q_packed) shape = {B, Sq, N * Dv};
  else if (layout == "BSND" || layout == "BNSD_BSND") shape = {B, Sq, N, Dv};
  else shape = {B, N, Sq, Dv};
  at::Tensor out = padded ? at::zeros(shape, q.options()) : at::empty(shape, q.options());
  if (tnd) p.out = {0, out.stride(0), out.stride(1)};
  else if (q_packed) p.out = {out.stride(0), out.stride(1), Dv};
  else if (layout == "BNSD") p.out = {out.stride(0), out.stride(2), out.stride(1)};
  else p.out = {out.stride(0), out.stride(1), out.stride(2)};
  at::Tensor lse;
  const auto f32 = q.options().dtype(at::kFloat);
  if (a.softmax_lse_flag) {
    const std::vector<int64_t> ls = tnd ? std::vector<int64_t>{Sq, N, 1} : std::vector<int64_t>{B, N, Sq, 1};
    lse = padded ? at::full(ls, -std::numeric_limits<float>::infinity(), f32) : at::empty(ls, f32);
    if (tnd) {
      p.lse_sb = 0, p.lse_si = N, p.lse_sh = 1;
    } else {
      p.lse_sb = N * Sq, p.lse_si = 1, p.lse_sh = Sq;
    }
  } else {
    lse = at::empty({0}, f32);
  }
  if (out.numel() > 0 && B > 0)
    cpu::mla_attention_stub(p, qc, qrc, kc, krc, vc, out, a.softmax_lse_flag ? lse.data_ptr<float>() : nullptr);
  return {out, lse};
}

}  // namespace

// NZ latent caches (5-D (num_blocks, N2, D / c0, block_size, c0) key, value and key_rope, as vLLM-Ascend's MLA keeps
// them with its NZ cache option): the kernel's calls read them in place; every other call (GQA, masks, pse_shift)
// runs on their ND copies (num_blocks, block_size, N2, D).
std::tuple<at::Tensor, at::Tensor> fused_infer_attention_score_mla(const char* op,
                                                                   const FusedInferAttentionScoreArgs& a) {
  if (!a.block_table.has_value() || !attention::is_nz_cache(a.key)) return mla_call(op, a, nullptr);
  TORCH_CHECK_VALUE(a.key_rope.has_value() && attention::is_nz_cache(*a.key_rope) && attention::is_nz_cache(a.value),
                    op, ": an NZ (5-D) 'key' cache needs 'value' and 'key_rope' in the NZ form too; got 'value' ",
                    a.value.sizes(), " and 'key_rope' ", a.key_rope.has_value() ? a.key_rope->sizes() : at::IntArrayRef{});
  const at::Tensor &k = a.key, &v = a.value, &kr = *a.key_rope;
  const int64_t N2 = a.num_key_value_heads > 0 ? a.num_key_value_heads : a.num_heads, bs = a.block_size;
  const attention::NzStrides ks = attention::nz_strides(op, "key", k, N2, k.size(2) * k.size(4), bs);
  const attention::NzStrides vs = attention::nz_strides(op, "value", v, N2, v.size(2) * v.size(4), bs);
  const attention::NzStrides rs = attention::nz_strides(op, "key_rope", kr, N2, kr.size(2) * kr.size(4), bs);
  const bool kernel = kernel_takes(a, N2);
  FusedInferAttentionScoreValues g(a);
  auto nd = [&](const at::Tensor& t, const attention::NzStrides& st) {
    const int64_t d = t.size(2) * t.size(4);
    if (kernel)  // rows are piece 0 of each NZ row: only the kernel, told the piece strides, reads through them
      return t.as_strided({t.size(0), bs, N2, d}, {st.blk, st.seq, st.head, 1});
    return t.permute({0, 3, 1, 2, 4}).reshape({t.size(0), bs, N2, d});
  };
  g.key = nd(k, ks);
  g.value = v.is_same(k) ? g.key : nd(v, vs);
  g.key_rope = nd(kr, rs);
  if (!kernel) return mla_call(op, g.args(), nullptr);
  const MlaNz nz{ks.c0, ks.piece, rs.piece, vs.piece};
  return mla_call(op, g.args(), &nz);
}

}  // namespace npu_fa
