// Argument validation and parameter building for FlashAttentionScore, shared by every backend.
#include "common/attention/params.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>

#include "common/checked_math.h"
#include "generated/kernels.h"

namespace npu_fa::attention {
namespace {

std::string shape_str(at::IntArrayRef s) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < s.size(); ++i) os << (i ? ", " : "") << s[i];
  os << "]";
  return os.str();
}

Layout parse_layout(const char* op, c10::string_view s) {
  if (s == "BSH") return Layout::BSH;
  if (s == "SBH") return Layout::SBH;
  if (s == "BSND") return Layout::BSND;
  if (s == "BNSD") return Layout::BNSD;
  if (s == "TND") return Layout::TND;
  TORCH_CHECK_VALUE(false, op, ": argument 'input_layout' must be one of BSH, SBH, BSND, BNSD, TND; got '",
                    std::string(s.data(), s.size()), "'");
}

int64_t expected_rank(Layout l) {
  switch (l) {
    case Layout::BSH: case Layout::SBH: case Layout::TND: return 3;
    default: return 4;
  }
}

const char* layout_name(Layout l) {
  switch (l) {
    case Layout::BSH: return "BSH";
    case Layout::SBH: return "SBH";
    case Layout::BSND: return "BSND";
    case Layout::BNSD: return "BNSD";
    default: return "TND";
  }
}

struct Dims { int64_t batch, seq, heads, dim; };

// Reads (B, S, N, D) of one of q/k/v; for the H layouts the head count is given (q) or derived from D (k, v).
Dims read_dims(const char* op, const char* arg, const at::Tensor& t, Layout l, int64_t heads_hint, int64_t dim_hint) {
  TORCH_CHECK_VALUE(t.dim() == expected_rank(l), op, ": argument '", arg, "' must be a ", expected_rank(l),
                    "-D tensor for input_layout ", layout_name(l), "; got shape ", shape_str(t.sizes()));
  const auto s = t.sizes();
  switch (l) {
    case Layout::BSND: return {s[0], s[1], s[2], s[3]};
    case Layout::BNSD: return {s[0], s[2], s[1], s[3]};
    case Layout::TND: return {1, s[0], s[1], s[2]};
    default: {
      const int64_t b = l == Layout::BSH ? s[0] : s[1], seq = l == Layout::BSH ? s[1] : s[0], h = s[2];
      if (heads_hint > 0) {
        TORCH_CHECK_VALUE(h % heads_hint == 0, op, ": argument '", arg, "' hidden size ", h,
                          " must be divisible by head_num=", heads_hint, " for input_layout ", layout_name(l));
        return {b, seq, heads_hint, h / heads_hint};
      }
      TORCH_CHECK_VALUE(dim_hint > 0 && h % dim_hint == 0, op, ": argument '", arg, "' hidden size ", h,
                        " must be a multiple of the head dim ", dim_hint, " for input_layout ", layout_name(l));
      return {b, seq, h / dim_hint, dim_hint};
    }
  }
}

// Element strides (batch, head, seq) of a tensor in layout l whose head dim is contiguous.
void layout_strides(const at::Tensor& t, Layout l, int64_t dim, int64_t& sb, int64_t& sn, int64_t& ss) {
  const auto st = t.strides();
  switch (l) {
    case Layout::BSND: sb = st[0]; ss = st[1]; sn = st[2]; break;
    case Layout::BNSD: sb = st[0]; sn = st[1]; ss = st[2]; break;
    case Layout::TND: sb = 0; ss = st[0]; sn = st[1]; break;
    case Layout::BSH: sb = st[0]; ss = st[1]; sn = dim; break;
    case Layout::SBH: ss = st[0]; sb = st[1]; sn = dim; break;
  }
}

at::Tensor dim_contiguous(const at::Tensor& t) { return t.stride(-1) == 1 ? t : t.contiguous(); }

// Cumulative sequence ends of TND -> per-sequence lengths and start tokens.
void read_cumulative(const char* op, const char* arg, const std::optional<at::Tensor>& t, int64_t total,
                     std::vector<int64_t>& len, std::vector<int64_t>& start) {
  TORCH_CHECK_VALUE(t.has_value(), op, ": argument '", arg, "' is required for input_layout TND (cumulative "
                    "sequence ends, e.g. lengths 3,5,2 -> [3, 8, 10])");
  const at::Tensor& c = *t;
  TORCH_CHECK_VALUE(c.dim() == 1 && c.numel() > 0, op, ": argument '", arg,
                    "' must be a non-empty 1-D tensor of cumulative ends; got shape ", shape_str(c.sizes()));
  TORCH_CHECK_TYPE(c.scalar_type() == at::kLong || c.scalar_type() == at::kInt, op, ": argument '", arg,
                   "' must be int64 or int32; got ", c.scalar_type());
  const at::Tensor cl = c.to(at::kCPU, at::kLong).contiguous();
  const int64_t* e = cl.data_ptr<int64_t>();
  int64_t prev = 0;
  for (int64_t b = 0; b < cl.numel(); ++b) {
    TORCH_CHECK_VALUE(e[b] >= prev, op, ": argument '", arg, "' must be cumulative (non-decreasing, starting at >= 0); "
                      "got ", e[b], " after ", prev, " at index ", b, ". Pass cumulative ends, not per-sequence lengths");
    start.push_back(prev);
    len.push_back(e[b] - prev);
    prev = e[b];
  }
  TORCH_CHECK_VALUE(prev == total, op, ": argument '", arg, "' must end at the token count T=", total,
                    " of the packed tensor; got last value ", prev);
}

MaskView mask_view(const char* op, const at::Tensor& m, const AttentionParams& p) {
  MaskView v;
  v.data = m.const_data_ptr<uint8_t>();
  if (m.dim() == 2) {
    const bool ok = p.layout == Layout::TND ? (m.size(0) >= p.max_q_len && m.size(1) >= p.max_kv_len)
                                            : (m.size(0) == p.max_q_len && m.size(1) == p.max_kv_len);
    TORCH_CHECK_VALUE(ok, op, ": argument 'atten_mask' of shape ", shape_str(m.sizes()), " must be [Sq, Skv] = [",
                      p.max_q_len, ", ", p.max_kv_len, "]", p.layout == Layout::TND ? " (or larger, indexed by position in each sequence)" : "");
    v.si = m.stride(0); v.sj = m.stride(1);
    return v;
  }
  TORCH_CHECK_VALUE(p.layout != Layout::TND && m.dim() == 4 && (m.size(0) == 1 || m.size(0) == p.batch) &&
                        (m.size(1) == 1 || m.size(1) == p.q_heads) && m.size(2) == p.max_q_len && m.size(3) == p.max_kv_len,
                    op, ": argument 'atten_mask' must have shape [B,N,Sq,Skv], [B,1,Sq,Skv], [1,1,Sq,Skv] or [Sq,Skv] with B=",
                    p.batch, ", N=", p.q_heads, ", Sq=", p.max_q_len, ", Skv=", p.max_kv_len,
                    p.layout == Layout::TND ? " (TND takes a 2-D mask)" : "", "; got ", shape_str(m.sizes()));
  v.sb = m.size(0) == 1 ? 0 : m.stride(0);
  v.sn = m.size(1) == 1 ? 0 : m.stride(1);
  v.si = m.stride(2); v.sj = m.stride(3);
  return v;
}

// Modes 2-4 build their pattern internally; CANN passes a compressed 2048x2048 upper-triangular mask (1 above the
// diagonal), which torch_npu's inference docs also show as [1,2048,2048] or [1,1,2048,2048]. Accept exactly that
// content, so a real mask is never silently ignored.
void check_compressed_mask(const char* op, const at::Tensor& m, int64_t mode) {
  bool leading_ones = m.dim() >= 2 && m.dim() <= 4;
  for (int64_t d = 0; leading_ones && d + 2 < m.dim(); ++d) leading_ones = m.size(d) == 1;
  const bool shape_ok = leading_ones && m.size(-2) == 2048 && m.size(-1) == 2048;
  bool content_ok = false;
  if (shape_ok) {
    const at::Tensor expect = at::ones({2048, 2048}, m.options().dtype(at::kBool)).triu(1);
    content_ok = at::equal(m.reshape({2048, 2048}).to(at::kBool), expect);
  }
  TORCH_CHECK_VALUE(shape_ok && content_ok, op, ": sparse_mode ", mode, " generates its mask internally; argument "
                    "'atten_mask' must be None or the compressed 2048x2048 mask ([2048,2048], [1,2048,2048] or [1,1,2048,2048]) "
                    "with 1 strictly above the diagonal "
                    "(CANN convention); got ", shape_ok ? "a 2048x2048 mask with other content" : "shape " + shape_str(m.sizes()),
                    ". Use sparse_mode 0 or 1 for an arbitrary mask");
}

PseView pse_view(const char* op, const char* arg, const at::Tensor& t, const AttentionParams& p) {
  TORCH_CHECK_VALUE(p.layout != Layout::TND, op, ": argument '", arg, "' is not supported with input_layout TND");
  const int64_t B = p.batch, N = p.q_heads, Sq = p.max_q_len, Skv = p.max_kv_len;
  const auto s = t.sizes();
  const bool ok = t.dim() == 4 && s[1] == N && s[3] == Skv &&
                  ((s[0] == B && (s[2] == Sq || s[2] == 1)) || (s[0] == 1 && s[2] == Sq));
  TORCH_CHECK_VALUE(ok, op, ": argument '", arg, "' must have shape [B,N,Sq,Skv], [B,N,1,Skv] or [1,N,Sq,Skv] with B=", B,
                    ", N=", N, ", Sq=", Sq, ", Skv=", Skv, "; got ", shape_str(s));
  PseView v;
  v.data = t.const_data_ptr<float>();
  v.sb = s[0] == 1 ? 0 : t.stride(0);
  v.sn = t.stride(1);
  v.si = s[2] == 1 ? 0 : t.stride(2);
  v.sj = t.stride(3);
  return v;
}

uint64_t read_scalar(const char* op, const char* arg, const at::Tensor& t) {
  TORCH_CHECK_VALUE(t.numel() == 1 && !at::isFloatingType(t.scalar_type()) && t.scalar_type() != at::kBool, op,
                    ": argument '", arg, "' must be a one-element integer tensor; got ", t.scalar_type(), " of shape ",
                    shape_str(t.sizes()));
  return static_cast<uint64_t>(t.item<int64_t>());
}

// softmax_layout: "" (torch_npu's default: TND statistics in NTD order) or "TND" (TND order), the latter only with
// input_layout TND. Returns whether TND statistics are in NTD order.
bool softmax_layout_ntd(const char* op, c10::string_view s, Layout layout) {
  TORCH_CHECK_VALUE(s.empty() || s == "TND", op, ": argument 'softmax_layout' must be \"\" (the default) or \"TND\"; got '",
                    std::string(s.data(), s.size()), "'");
  TORCH_CHECK_VALUE(s.empty() || layout == Layout::TND, op, ": argument 'softmax_layout'=\"TND\" is only supported with "
                    "input_layout TND; got input_layout ", layout_name(layout));
  return s.empty();
}

// The flattened dropout mask (see AttentionParams::dropout_base), the seed/offset of the stream, or the explicit
// bit-packed mask that replaces it.
template <class Args>
void set_dropout(const char* op, const Args& args, AttentionParams& p, AttentionInputs& in) {
  // The seed/offset given are read (and returned by the forward) even without dropout, as torch_npu echoes them.
  if (args.seed.has_value()) p.seed = read_scalar(op, "seed", *args.seed);
  if (args.offset.has_value()) p.offset = read_scalar(op, "offset", *args.offset);
  p.dropout_base.resize(p.batch);
  int64_t total = 0;
  for (int64_t b = 0; b < p.batch; ++b) {
    p.dropout_base[b] = total;
    const int64_t per_head = checked_mul(op, "the dropout mask size Sq * Skv", p.q_len[b], p.kv_len[b]);
    total = checked_add(op, "the dropout mask size", total, checked_mul(op, "the dropout mask size", per_head, p.q_heads));
  }
  p.dropout_numel = total;
  if (args.dropout_mask.has_value()) {
    const at::Tensor& m = *args.dropout_mask;
    TORCH_CHECK_TYPE(m.scalar_type() == at::kByte, op, ": argument 'dropout_mask' must be uint8 (a bit-packed keep "
                     "mask as made by _npu_dropout_gen_mask); got ", m.scalar_type());
    TORCH_CHECK_VALUE(m.device() == args.query.device(), op, ": argument 'dropout_mask' must be on ", args.query.device(),
                      "; got ", m.device());
    const int64_t bytes = (total + 7) / 8;
    TORCH_CHECK_VALUE(m.numel() >= bytes, op, ": argument 'dropout_mask' must hold at least ", total, " bits (", bytes,
                      " bytes: one bit per element of the [B, N1, Sq, Skv] attention, N1 * sum(Sq_b * Skv_b) for TND); "
                      "got ", m.numel(), " bytes");
    if (p.has_dropout()) {
      in.dropout_mask = m.contiguous();
      p.dropout_bits = in.dropout_mask.const_data_ptr<uint8_t>();
    }
  } else if (p.has_dropout() && !args.seed.has_value()) {
    p.seed = static_cast<uint64_t>(at::randint(std::numeric_limits<int64_t>::max(), {}, at::kLong).item<int64_t>());
  }
}

// q_start_idx / kv_start_idx: one value for every sequence, or one per sequence; None = 0.
std::vector<int64_t> start_indices(const char* op, const char* arg, at::OptionalIntArrayRef v, int64_t batch) {
  if (!v.has_value() || v->empty()) return std::vector<int64_t>(batch, 0);
  TORCH_CHECK_VALUE(v->size() == 1 || static_cast<int64_t>(v->size()) == batch, op, ": argument '", arg,
                    "' must hold one start index, or one per sequence (", batch, "); got ", v->size(), " values");
  for (int64_t x : *v)
    TORCH_CHECK_VALUE(std::abs(x) <= Band::kNone, op, ": argument '", arg, "' holds an out-of-range index ", x);
  if (v->size() == 1) return std::vector<int64_t>(batch, (*v)[0]);
  return std::vector<int64_t>(v->begin(), v->end());
}

// pse_type 2/3: pse holds fp32 ALiBi slopes [N1] or [B, N1] (CANN's shapes; B = sequences for TND), and the
// distance of (i, j) is (j + kv_start_idx) - (i + q_start_idx), shifted per sequence to the bottom-right
// diagonal with alibi_bottom_right (FlashAttention-2's alibi_slopes: |i + Skv - Sq - j|).
template <class Args>
void set_alibi(const char* op, const Args& args, AttentionParams& p, AttentionInputs& in, const ArgNames& names) {
  const std::vector<int64_t> qs = start_indices(op, "q_start_idx", args.q_start_idx, p.batch);
  const std::vector<int64_t> ks = start_indices(op, "kv_start_idx", args.kv_start_idx, p.batch);
  if (args.pse_type < 2 || !args.pse.has_value()) return;
  const at::Tensor& t = *args.pse;
  TORCH_CHECK_TYPE(t.scalar_type() == at::kFloat, op, ": argument '", names.pse, "' holds the ALiBi slopes with "
                   "pse_type ", args.pse_type, " and must be float32; got ", t.scalar_type());
  TORCH_CHECK_VALUE(t.device() == args.query.device(), op, ": argument '", names.pse, "' must be on ",
                    args.query.device(), "; got ", t.device());
  const bool per_batch = t.dim() == 2 && t.size(0) == p.batch && t.size(1) == p.q_heads;
  TORCH_CHECK_VALUE(per_batch || (t.dim() == 1 && t.size(0) == p.q_heads), op, ": argument '", names.pse,
                    "' holds the ALiBi slopes with pse_type ", args.pse_type, " and must have shape [N] or [B, N] = [",
                    p.batch, ", ", p.q_heads, "]; got ", shape_str(t.sizes()));
  in.slopes_f32 = t.contiguous();
  p.alibi_slopes = in.slopes_f32.const_data_ptr<float>();
  p.alibi_sb = per_batch ? p.q_heads : 0;
  p.alibi_shift.resize(p.batch);
  for (int64_t b = 0; b < p.batch; ++b)
    p.alibi_shift[b] = ks[b] - qs[b] - (args.alibi_bottom_right ? p.kv_len[b] - p.q_len[b] : 0);
}

}  // namespace

void AttentionParams::dropout_keep(int64_t b, int64_t head, int64_t i, int64_t j0, int64_t n, uint8_t* keep) const {
  const int64_t e0 = dropout_base[b] + (head * q_len[b] + i) * kv_len[b] + j0;
  if (!dropout_bits) return dropout_keep_run(seed, offset, keep_prob, e0, n, keep);
  for (int64_t x = 0; x < n; ++x) {
    const int64_t e = e0 + x;
    keep[x] = (dropout_bits[e >> 3] >> (e & 7)) & 1;
  }
}

Band AttentionParams::band(int64_t b) const {
  const int64_t diag = kv_len[b] - q_len[b];  // bottom-right alignment
  // Windows beyond +-kNone are unbounded; clamping both ends keeps -pre and diag +- window from overflowing.
  const int64_t pre = std::clamp(pre_tokens, -Band::kNone, Band::kNone);
  const int64_t next = std::clamp(next_tokens, -Band::kNone, Band::kNone);
  Band r;
  switch (sparse_mode) {
    case 0: r.lo = -pre; r.hi = next; break;
    case 2: r.hi = 0; break;
    case 3: r.hi = diag; break;
    case 4: r.lo = diag - pre; r.hi = diag + next; break;
    default: break;  // 1: the explicit mask alone
  }
  return r;
}

TileKind AttentionParams::classify(int64_t b, int64_t i0, int64_t i1, int64_t j0, int64_t j1) const {
  const Band r = band(b);
  if (r.hi < r.lo || j1 - 1 < i0 + r.lo || j0 > i1 - 1 + r.hi) return TileKind::Empty;
  const bool inside = j0 >= i1 - 1 + r.lo && j1 - 1 <= i0 + r.hi;
  return inside && !mask.has_value() ? TileKind::Full : TileKind::Partial;
}

std::pair<int64_t, int64_t> AttentionParams::key_range(int64_t b, int64_t i0, int64_t i1) const {
  const Band r = band(b);
  if (r.hi < r.lo || i1 <= i0) return {0, 0};
  const int64_t lo = std::max<int64_t>(0, i0 + r.lo);
  const int64_t hi = std::min<int64_t>(kv_len[b], i1 - 1 + r.hi + 1);
  return {lo, std::max(lo, hi)};
}

bool AttentionParams::visible(int64_t b, int64_t n, int64_t i, int64_t j) const {
  const Band r = band(b);
  if (j < i + r.lo || j > i + r.hi) return false;
  return !(mask.has_value() && mask->masked(layout == Layout::TND ? 0 : b, n, i, j));
}

template <class Args>
AttentionParams parse_attention_params(const char* op, const Args& args, AttentionInputs& in, const ArgNames& names) {
  AttentionParams p;
  p.op = op;
  p.layout = parse_layout(op, args.input_layout);
  if (!names.int8_kv) check_qkv_dtypes(op, args.query, args.key, args.value);
  const auto dt = args.query.scalar_type();
  TORCH_CHECK_VALUE(args.key.device() == args.query.device() && args.value.device() == args.query.device(), op,
                    ": arguments 'query', 'key', 'value' must be on one device; got ", args.query.device(), ", ",
                    args.key.device(), ", ", args.value.device());
  TORCH_CHECK_VALUE(args.head_num > 0, op, ": argument '", names.head_num, "' must be positive; got ", args.head_num);
  TORCH_CHECK_VALUE(args.sparse_mode >= 0 && args.sparse_mode <= 4, op, ": argument 'sparse_mode' must be 0 (default), "
                    "1 (all-mask), 2 (top-left causal), 3 (bottom-right causal) or 4 (band); got ", args.sparse_mode,
                    args.sparse_mode >= 5 && args.sparse_mode <= 8 ? " (prefix / context-parallel modes 5-8 are not implemented)" : "");
  TORCH_CHECK_VALUE(args.keep_prob > 0.0 && args.keep_prob <= 1.0, op,
                    ": argument 'keep_prob' must be in (0, 1]; got ", args.keep_prob);
  TORCH_CHECK_VALUE(args.pse_type >= 0 && args.pse_type <= 3, op,
                    ": argument 'pse_type' must be 0 (pse added after scaling), 1 (before), 2 (in-kernel ALiBi "
                    "-slope*|distance| from slopes in pse) or 3 (-slope*sqrt(|distance|)); got ", args.pse_type);
  // softcap: FlashAttention-2's logit soft-capping (0 = off); computed in fp32 like the scores.
  TORCH_CHECK_VALUE(std::isfinite(args.softcap) && args.softcap >= 0.0 &&
                        args.softcap <= std::numeric_limits<float>::max(), op,
                    ": argument 'softcap' must be a finite value >= 0 (0 disables soft-capping); got ", args.softcap);
  TORCH_CHECK_VALUE(args.inner_precise >= 0 && args.inner_precise <= 4, op,
                    ": argument 'inner_precise' must be in [0, 4]; got ",
                    args.inner_precise);
  check_scale(op, names.scale, args.scale);

  const Dims qd = read_dims(op, "query", args.query, p.layout, p.layout == Layout::TND ? 0 : args.head_num, 0);
  TORCH_CHECK_VALUE(p.layout == Layout::BSH || p.layout == Layout::SBH || qd.heads == args.head_num, op,
                    ": argument '", names.head_num, "'=", args.head_num, " does not match the ", qd.heads, " heads of 'query' (",
                    layout_name(p.layout), " shape ", shape_str(args.query.sizes()), ")");
  const Dims kd = read_dims(op, "key", args.key, p.layout, 0, qd.dim);
  TORCH_CHECK_VALUE(kd.dim == qd.dim, op, ": arguments 'query' and 'key' must have the same head dim; got ", qd.dim,
                    " and ", kd.dim);
  TORCH_CHECK_VALUE(qd.dim > 0, op, ": argument 'query' must have a non-zero head dim; got shape ",
                    shape_str(args.query.sizes()));
  TORCH_CHECK_VALUE(kd.heads > 0 && args.head_num % kd.heads == 0, op, ": key/value heads N2=", kd.heads,
                    " must divide the query heads N1=", args.head_num, " (GQA/MQA)");
  Dims vd;
  if (p.layout == Layout::BSH || p.layout == Layout::SBH) {
    TORCH_CHECK_VALUE(args.value.dim() == 3 && args.value.size(2) % kd.heads == 0, op,
                      ": argument 'value' must be 3-D with a hidden size ",
                      "divisible by the ", kd.heads, " key/value heads; got shape ", shape_str(args.value.sizes()));
    vd = read_dims(op, "value", args.value, p.layout, kd.heads, 0);
  } else {
    vd = read_dims(op, "value", args.value, p.layout, 0, 0);
  }
  TORCH_CHECK_VALUE(vd.batch == kd.batch && vd.seq == kd.seq && vd.heads == kd.heads, op,
                    ": arguments 'key' and 'value' must agree in batch, sequence and heads; got shapes ",
                    shape_str(args.key.sizes()), " and ", shape_str(args.value.sizes()));
  TORCH_CHECK_VALUE(vd.dim > 0 && vd.dim <= qd.dim, op, ": the value head dim must satisfy 0 < vD <= qD=", qd.dim,
                    "; got ", vd.dim);
  TORCH_CHECK_VALUE(kd.batch == qd.batch, op, ": arguments 'query' and 'key' must have the same batch size; got ",
                    qd.batch, " and ", kd.batch);

  p.q_heads = args.head_num;
  p.kv_heads = kd.heads;
  p.group = args.head_num / kd.heads;
  p.head_dim = qd.dim;
  p.v_head_dim = vd.dim;
  p.scale = static_cast<float>(args.scale);
  p.keep_prob = static_cast<float>(args.keep_prob);
  p.pre_tokens = args.pre_tokens;
  p.next_tokens = args.next_tokens;
  p.sparse_mode = args.sparse_mode;
  p.pse_type = args.pse_type;
  p.softcap = static_cast<float>(args.softcap);

  std::vector<int64_t>& q_start = p.q_start;
  std::vector<int64_t>& kv_start = p.kv_start;
  if (p.layout == Layout::TND) {
    read_cumulative(op, names.q_lens, args.actual_seq_qlen, qd.seq, p.q_len, q_start);
    read_cumulative(op, names.kv_lens, args.actual_seq_kvlen, kd.seq, p.kv_len, kv_start);
    TORCH_CHECK_VALUE(p.q_len.size() == p.kv_len.size(), op, ": arguments '", names.q_lens, "' and '", names.kv_lens, "' must "
                      "describe the same number of sequences; got ", p.q_len.size(), " and ", p.kv_len.size());
    p.batch = static_cast<int64_t>(p.q_len.size());
  } else {
    TORCH_CHECK_VALUE(!args.actual_seq_qlen.has_value() && !args.actual_seq_kvlen.has_value(), op,
                      ": arguments '", names.q_lens, "'/'", names.kv_lens, "' are only used with input_layout TND; got them with ",
                      layout_name(p.layout), ". Pack the batch as TND for variable lengths, or pass an atten_mask");
    p.batch = qd.batch;
    p.q_len.assign(p.batch, qd.seq);
    p.kv_len.assign(p.batch, kd.seq);
    q_start.assign(p.batch, 0);
    kv_start.assign(p.batch, 0);
  }
  // Dense layouts keep the tensor's sequence sizes even for an empty batch (output shapes depend on them).
  const bool tnd = p.layout == Layout::TND;
  p.max_q_len = !tnd ? qd.seq : p.q_len.empty() ? 0 : *std::max_element(p.q_len.begin(), p.q_len.end());
  p.max_kv_len = !tnd ? kd.seq : p.kv_len.empty() ? 0 : *std::max_element(p.kv_len.begin(), p.kv_len.end());

  in.query = dim_contiguous(args.query);
  in.key = dim_contiguous(args.key);
  in.value = dim_contiguous(args.value);
  p.q = row_map(p, in.query, true, p.head_dim);
  p.k = row_map(p, in.key, false, p.head_dim);
  p.v = row_map(p, in.value, false, p.v_head_dim);
  p.out = row_map(p, at::empty(output_shape(p, args.query), at::TensorOptions().dtype(dt).device(at::kMeta)), true,
                  p.v_head_dim);

  // Row ids: ((b*N1 + n)*Sq + i), or t*N1 + n for TND. softmax stats: [B, N1, Sq, 8], or for TND a [T, N1, 8] tensor
  // holding the rows in TND order (softmax_layout "TND") or, as torch_npu's default, in NTD order (row (t, n) at
  // n*T + t: the memory of an [N1, T, 8] tensor).
  const bool stats_ntd = softmax_layout_ntd(op, args.softmax_layout, p.layout) && tnd;
  const int64_t tokens = tnd ? qd.seq : 0;
  p.stats.batch_offset.resize(p.batch);
  p.row_id.batch_offset.resize(p.batch);
  for (int64_t b = 0; b < p.batch; ++b) {
    p.row_id.batch_offset[b] = tnd ? q_start[b] * args.head_num : b * args.head_num * qd.seq;
    p.stats.batch_offset[b] = (stats_ntd ? q_start[b] : p.row_id.batch_offset[b]) * 8;
  }
  p.row_id.head_stride = tnd ? 1 : qd.seq;
  p.row_id.seq_stride = tnd ? args.head_num : 1;
  p.stats.head_stride = (stats_ntd ? tokens : p.row_id.head_stride) * 8;
  p.stats.seq_stride = (stats_ntd ? 1 : p.row_id.seq_stride) * 8;

  if (args.atten_mask.has_value()) {
    const at::Tensor& m = *args.atten_mask;
    TORCH_CHECK_TYPE(m.scalar_type() == at::kBool || m.scalar_type() == at::kByte, op,
                     ": argument 'atten_mask' must be bool or uint8 (True/1 = masked out); got ", m.scalar_type(),
                     ". Convert an additive float mask with `mask < 0` or pass it as pse");
    TORCH_CHECK_VALUE(m.device() == args.query.device(), op, ": argument 'atten_mask' must be on ",
                      args.query.device(), "; got ", m.device());
    if (args.sparse_mode >= 2) {
      check_compressed_mask(op, m, args.sparse_mode);
    } else {
      in.mask_u8 = m.scalar_type() == at::kBool ? m.view(at::kByte) : m;
      p.mask = mask_view(op, in.mask_u8, p);
    }
  }
  set_alibi(op, args, p, in, names);
  if (args.pse.has_value() && args.pse_type < 2) {
    TORCH_CHECK_TYPE(at::isFloatingType(args.pse->scalar_type()), op, ": argument '", names.pse,
                     "' must be a floating tensor; got ",
                     args.pse->scalar_type());
    TORCH_CHECK_VALUE(args.pse->device() == args.query.device(), op, ": argument '", names.pse, "' must be on ",
                      args.query.device(), "; got ", args.pse->device());
    in.pse_f32 = args.pse->to(at::kFloat);
    p.pse = pse_view(op, names.pse, in.pse_f32, p);
  }
  if (args.sink.has_value()) {
    const at::Tensor& sk = *args.sink;
    TORCH_CHECK_TYPE(sk.scalar_type() == at::kFloat, op, ": argument 'sink' must be float32; got ", sk.scalar_type());
    TORCH_CHECK_VALUE(sk.dim() == 1 && sk.size(0) == args.head_num, op, ": argument 'sink' must have shape [head_num] = [",
                      args.head_num, "] (one logit per query head); got ", shape_str(sk.sizes()));
    TORCH_CHECK_VALUE(sk.device() == args.query.device(), op, ": argument 'sink' must be on ", args.query.device(),
                      "; got ", sk.device());
    in.sink_f32 = sk.contiguous();
    p.sink = in.sink_f32.const_data_ptr<float>();
  }
  set_dropout(op, args, p, in);
  return p;
}

template AttentionParams parse_attention_params(const char*, const FlashAttentionScoreArgs&, AttentionInputs&,
                                                const ArgNames&);
template AttentionParams parse_attention_params(const char*, const FlashAttentionScoreGradArgs&, AttentionInputs&,
                                                const ArgNames&);

RowMap row_map(const AttentionParams& p, const at::Tensor& t, bool is_query, int64_t dim) {
  TORCH_CHECK(t.stride(-1) == 1 || t.size(-1) <= 1, p.op, ": internal error: row_map needs a contiguous head dim");
  int64_t sb, sn, ss;
  layout_strides(t, p.layout, dim, sb, sn, ss);
  const std::vector<int64_t>& starts = is_query ? p.q_start : p.kv_start;
  RowMap m;
  m.head_stride = sn;
  m.seq_stride = ss;
  m.batch_offset.resize(p.batch);
  for (int64_t b = 0; b < p.batch; ++b) m.batch_offset[b] = p.layout == Layout::TND ? starts[b] * ss : b * sb;
  return m;
}

std::vector<int64_t> output_shape(const AttentionParams& p, const at::Tensor& query) {
  std::vector<int64_t> s(query.sizes().begin(), query.sizes().end());
  s.back() = (p.layout == Layout::BSH || p.layout == Layout::SBH) ? p.q_heads * p.v_head_dim : p.v_head_dim;
  return s;
}

std::vector<int64_t> stats_shape(const AttentionParams& p, const at::Tensor& query) {
  if (p.layout == Layout::TND) return {query.size(0), p.q_heads, 8};
  return {p.batch, p.q_heads, p.max_q_len, 8};
}

void check_qkv_dtypes(const char* op, const at::Tensor& query, const at::Tensor& key, const at::Tensor& value) {
  const auto dt = query.scalar_type();
  TORCH_CHECK_TYPE(dt == at::kFloat || dt == at::kHalf || dt == at::kBFloat16, op,
                   ": argument 'query' must be float32, float16 or bfloat16; got ", dt);
  TORCH_CHECK_TYPE(key.scalar_type() == dt && value.scalar_type() == dt, op,
                   ": arguments 'query', 'key', 'value' must share one dtype; got ", dt, ", ", key.scalar_type(), ", ",
                   value.scalar_type());
}

void check_scale(const char* op, const char* arg, double scale) {
  // The kernels compute in fp32: a double beyond FLT_MAX would become inf there.
  const bool ok = std::isfinite(scale) && std::abs(scale) <= std::numeric_limits<float>::max();
  TORCH_CHECK_VALUE(ok, op, ": argument '", arg, "' must be finite (and within float32 range, |scale| <= ",
                    std::numeric_limits<float>::max(), "); got ", scale);
}

void check_shape(const char* op, const char* arg, const at::Tensor& t, at::IntArrayRef expected) {
  TORCH_CHECK_VALUE(t.sizes() == expected, op, ": argument '", arg, "' must have shape ", shape_str(expected), "; got ",
                    shape_str(t.sizes()));
}

AttentionParams parse_backward_params(const char* op, const FlashAttentionScoreGradArgs& args, AttentionInputs& inputs) {
  TORCH_CHECK_VALUE(args.keep_prob >= 1.0 || args.seed.has_value() || args.dropout_mask.has_value(), op,
                    ": argument 'seed' is required when keep_prob < 1 and no dropout_mask is given (pass the "
                    "seed_out/offset_out of the forward so the same dropout mask is regenerated)");
  const AttentionParams p = parse_attention_params(op, args, inputs);
  const auto out_shape = output_shape(p, args.query);
  const auto stats = stats_shape(p, args.query);
  check_shape(op, "dy", args.dy, out_shape);
  check_shape(op, "attention_in", args.attention_in, out_shape);
  check_shape(op, "softmax_max", args.softmax_max, stats);
  check_shape(op, "softmax_sum", args.softmax_sum, stats);
  const at::ScalarType q_dtype = args.query.scalar_type();
  TORCH_CHECK_TYPE(args.dy.scalar_type() == q_dtype && args.attention_in.scalar_type() == q_dtype, op,
                   ": arguments 'dy' and 'attention_in' must have query's dtype ", q_dtype, "; got ",
                   args.dy.scalar_type(), " and ", args.attention_in.scalar_type());
  TORCH_CHECK_TYPE(args.softmax_max.scalar_type() == at::kFloat && args.softmax_sum.scalar_type() == at::kFloat, op,
                   ": arguments 'softmax_max' and 'softmax_sum' must be float32; got ", args.softmax_max.scalar_type(),
                   " and ", args.softmax_sum.scalar_type());
  return p;
}

void dropout_keep_run(uint64_t seed, uint64_t offset, float keep_prob, int64_t e0, int64_t n, uint8_t* keep) {
  const uint64_t threshold = static_cast<uint64_t>(static_cast<double>(keep_prob) * 4294967296.0);
  uint32_t words[4];
  int64_t e = e0;
  const int64_t end = e0 + n;
  while (e < end) {
    Philox::generate(seed, offset, static_cast<uint64_t>(e) >> 2, words);
    for (int64_t w = e & 3; w < 4 && e < end; ++w, ++e) keep[e - e0] = static_cast<uint64_t>(words[w]) < threshold;
  }
}

}  // namespace npu_fa::attention
