// CPU entry point of kv_rms_norm_rope_cache (CANN KvRmsNormRopeCache / KvRmsNormRopeCacheV2; torch_npu's
// npu_kv_rmsnorm_rope_cache*): per token row of kv, RMSNorm + interleaved rope, written in place into two caches.
//
// kv [B, N, S, D]; Dr = cos.size(-1) is the rope width.
//   without v (MLA's latent row, D = Dn + Dr):  c_kv = RMSNorm(kv[:Dn]) -> ckv_cache,  k_rope = rope(kv[Dn:]) -> k_cache
//   with v [B, N, S, Dv] (separate K and V):    y = RMSNorm(kv),  k_rope = cat(rope(y[:Dr]), y[Dr:]) -> k_cache,
//                                               c_kv = v -> ckv_cache
// The rows stay in fp32 (fp64 for fp64 kv) from the norm to the cache write, so each value is rounded once.
//
// Where token (b, s) of head n goes:
//   Norm         caches [B, N, Sc, *]; index [B, S] holds positions in [0, Sc)
//   PA, PA_BNSD  caches [blocks, block_size, N, *] (a BSND layout whatever the name; PA_BSND is accepted as an
//                alias); index [B*S] holds slots block*block_size + offset
//   PA_BLK_BNSD  as PA, index [B*ceil(S/block_size)]: the start slot of each block of the sequence; token s goes to
//                block index[b*nb + s/block_size] / block_size at offset s % block_size
//   PA_NZ, PA_BLK_NZ  as PA / PA_BLK_BNSD, caches stored as [blocks, D/d0, block_size, d0] (d0 = 32 bytes of the
//                cache dtype); upstream defines this for N = 1 only, so N > 1 is not implemented
// A negative index entry skips its tokens (upstream's padding value is -1). Entries that would write one cache row
// twice are rejected (upstream leaves the result undefined; here two threads would race).
// This file validates and resolves the index; the row loop runs per instruction set (rms_norm_rope_cache_kernels.h).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "cpu/kv_cache/rms_norm_rope_cache_kernels.h"
#include "cpu/mla/latent_rows.h"
#include "generated/kernels.h"

namespace npu_fa {
namespace {

constexpr const char* kOp = "kv_rms_norm_rope_cache";

enum class Mode { kNorm, kPa, kPaBlk };

struct Plan {
  Mode mode = Mode::kNorm;
  bool nz = false;
  bool has_v = false;
  int64_t B = 0, N = 0, S = 0, D = 0;
  int64_t Dr = 0;  // rope width (cos.size(-1))
  int64_t Dn = 0;  // RMSNorm width (gamma.size(0))
  int64_t Dk = 0;  // k_cache row: Dr without v, D with v
  int64_t Dv = 0;  // ckv_cache row: Dn without v, v.size(-1) with v
  int64_t cache_len = 0;             // Norm: Sc
  int64_t blocks = 0, block_size = 0;  // PA modes
  int64_t kd0 = 0, vd0 = 0;          // NZ chunks
};

void parse_mode(c10::string_view s, Plan& p) {
  const std::string m(s.data(), s.size());
  if (m == "Norm") {
    p.mode = Mode::kNorm;
  } else if (m == "PA" || m == "PA_BNSD" || m == "PA_BSND") {
    p.mode = Mode::kPa;
  } else if (m == "PA_NZ") {
    p.mode = Mode::kPa;
    p.nz = true;
  } else if (m == "PA_BLK_BNSD") {
    p.mode = Mode::kPaBlk;
  } else if (m == "PA_BLK_NZ") {
    p.mode = Mode::kPaBlk;
    p.nz = true;
  } else {
    TORCH_CHECK_VALUE(false, kOp, ": argument 'cache_mode' must be 'Norm', 'PA', 'PA_BNSD', 'PA_NZ', 'PA_BLK_BNSD' or ",
                      "'PA_BLK_NZ' ('PA_BSND' is an alias of 'PA'); got '", m, "'");
  }
}

bool is_float(at::ScalarType s) {
  return s == at::kFloat || s == at::kHalf || s == at::kBFloat16 || s == at::kDouble;
}

void check_like_kv(const char* name, const at::Tensor& t, const at::Tensor& kv) {
  TORCH_CHECK_TYPE(t.scalar_type() == kv.scalar_type(), kOp, ": argument '", name, "' must have kv's dtype (",
                   kv.scalar_type(), "); got ", t.scalar_type());
}

// A quantisation parameter (k_rope_scale, ...) as fp32 rows of [rows, cols]: rows 1 or N, cols 1 or the cache row.
struct QuantArg {
  at::Tensor t;  // fp32, contiguous; undefined when not given
  int64_t rows = 1, cols = 1;
};

QuantArg quant_arg(const char* name, const std::optional<at::Tensor>& opt, int64_t N, int64_t width) {
  QuantArg q;
  if (!opt.has_value() || !opt->defined()) return q;
  const at::Tensor& t = *opt;
  TORCH_CHECK_TYPE(t.scalar_type() == at::kFloat, kOp, ": argument '", name, "' must be float32; got ",
                   t.scalar_type());
  const bool ok1 = t.dim() == 1 && (t.size(0) == width || t.size(0) == 1);
  const bool ok2 = t.dim() == 2 && (t.size(0) == 1 || t.size(0) == N) && t.size(1) == width;
  TORCH_CHECK_VALUE(ok1 || ok2, kOp, ": argument '", name, "' must have shape [", width, "], [1, ", width, "], [", N,
                    ", ", width, "] or [1] (one value per channel of its cache row, optionally per head, or one for "
                    "all); got ", t.sizes());
  q.t = t.contiguous();
  q.rows = t.dim() == 2 ? t.size(0) : 1;
  q.cols = t.size(-1);
  return q;
}

void check_cache(const char* name, const at::Tensor& cache, const at::Tensor& kv, bool quantised,
                 const char* scale_name) {
  TORCH_CHECK_VALUE(cache.dim() == 4, kOp, ": argument '", name, "' must be a 4-D cache; got shape ", cache.sizes());
  TORCH_CHECK_VALUE(cache.is_contiguous(), kOp, ": argument '", name, "' is written in place and must be contiguous");
  if (quantised) {
    TORCH_CHECK_TYPE(cache.scalar_type() == at::kChar, kOp, ": argument '", name, "' must be int8 when '", scale_name,
                     "' is given (quantised cache); got ", cache.scalar_type());
  } else {
    TORCH_CHECK_TYPE(cache.scalar_type() == kv.scalar_type() || cache.scalar_type() == at::kChar, kOp, ": argument '",
                     name, "' must have kv's dtype (", kv.scalar_type(), "), or be int8 with '", scale_name,
                     "' given; got ", cache.scalar_type());
    TORCH_CHECK_VALUE(cache.scalar_type() != at::kChar, kOp, ": argument '", name, "' is int8, which needs the ",
                      "quantisation scale '", scale_name, "'; got None");
  }
}

// The slot (Norm: position) of every token (b, s), -1 = skipped; checks ranges and rows written twice.
std::vector<int64_t> token_slots(const Plan& p, const at::Tensor& index) {
  const at::Tensor idx = index.to(at::kLong).contiguous();
  const int64_t* ip = idx.data_ptr<int64_t>();
  std::vector<int64_t> slots(p.B * p.S, -1);
  const int64_t limit = p.mode == Mode::kNorm ? p.cache_len : p.blocks * p.block_size;
  const char* range = p.mode == Mode::kNorm ? "cache positions [0, Sc = " : "cache slots [0, blocks*block_size = ";
  const int64_t n_idx = idx.numel();
  for (int64_t i = 0; i < n_idx; ++i)
    TORCH_CHECK_VALUE(ip[i] < limit, kOp, ": argument 'index' has index[", i, "] = ", ip[i], " outside the ", range,
                      limit, ") (negative entries skip their tokens)");
  const int64_t nb = p.mode == Mode::kPaBlk ? (p.S + p.block_size - 1) / p.block_size : 0;
  for (int64_t b = 0; b < p.B; ++b) {
    for (int64_t s = 0; s < p.S; ++s) {
      int64_t v = -1;
      if (p.mode == Mode::kPaBlk) {
        const int64_t start = ip[b * nb + s / p.block_size];
        if (start >= 0) v = (start / p.block_size) * p.block_size + s % p.block_size;
      } else {
        v = ip[b * p.S + s];
      }
      slots[b * p.S + s] = v < 0 ? -1 : v;
    }
  }
  std::vector<int64_t> keys;  // the cache row each token writes, for the duplicate check
  keys.reserve(slots.size());
  for (int64_t t = 0; t < p.B * p.S; ++t)
    if (slots[t] >= 0) keys.push_back(p.mode == Mode::kNorm ? (t / p.S) * p.cache_len + slots[t] : slots[t]);
  std::sort(keys.begin(), keys.end());
  const auto dup = std::adjacent_find(keys.begin(), keys.end());
  TORCH_CHECK_VALUE(dup == keys.end(), kOp, ": argument 'index' writes one cache ",
                    p.mode == Mode::kNorm ? "position" : "slot", " twice (",
                    p.mode == Mode::kNorm ? "batch*Sc + position " : "slot ", dup == keys.end() ? 0 : *dup,
                    "); entries must be distinct", p.mode == Mode::kPaBlk ? " after division by block_size" : "");
  return slots;
}

}  // namespace

std::tuple<at::Tensor, at::Tensor> kv_rms_norm_rope_cache_cpu(const KvRmsNormRopeCacheArgs& a) {
  Plan p;
  parse_mode(a.cache_mode, p);
  const at::Tensor& kv = a.kv;
  TORCH_CHECK_TYPE(is_float(kv.scalar_type()), kOp, ": argument 'kv' must be float32, float16, bfloat16 or float64; "
                   "got ", kv.scalar_type());
  TORCH_CHECK_VALUE(kv.dim() == 4, kOp, ": argument 'kv' must be 4-D [B, N, S, D]; got shape ", kv.sizes());
  p.B = kv.size(0), p.N = kv.size(1), p.S = kv.size(2), p.D = kv.size(3);
  check_like_kv("gamma", a.gamma, kv);
  check_like_kv("cos", a.cos, kv);
  check_like_kv("sin", a.sin, kv);
  TORCH_CHECK_VALUE(a.gamma.dim() == 1, kOp, ": argument 'gamma' must be 1-D [rms_size]; got shape ",
                    a.gamma.sizes());
  TORCH_CHECK_VALUE(a.cos.dim() == 4, kOp, ": argument 'cos' must be 4-D [B, N, S, rope_size] (B, N, S may be 1); ",
                    "got shape ", a.cos.sizes());
  TORCH_CHECK_VALUE(a.sin.sizes() == a.cos.sizes(), kOp, ": arguments 'sin' ", a.sin.sizes(), " and 'cos' ",
                    a.cos.sizes(), " must have the same shape");
  for (int64_t d = 0; d < 3; ++d)
    TORCH_CHECK_VALUE(a.cos.size(d) == 1 || a.cos.size(d) == kv.size(d), kOp, ": argument 'cos' of shape ",
                      a.cos.sizes(), " must be [B, N, S, rope_size] with each of B, N, S equal to kv's ", kv.sizes(),
                      " or 1");
  p.Dr = a.cos.size(3);
  TORCH_CHECK_VALUE(p.Dr > 0 && p.Dr % 2 == 0, kOp, ": the rope width cos.size(-1) must be even and positive; got ",
                    p.Dr);
  p.Dn = a.gamma.size(0);
  const bool has_v = a.v.has_value() && a.v->defined();
  p.has_v = has_v;
  at::Tensor v;
  if (has_v) {
    v = *a.v;
    check_like_kv("v", v, kv);
    TORCH_CHECK_VALUE(v.dim() == 4 && v.size(0) == p.B && v.size(1) == p.N && v.size(2) == p.S, kOp,
                      ": argument 'v' must be 4-D [B, N, S, Dv] with kv's [B, N, S] = [", p.B, ", ", p.N, ", ", p.S,
                      "]; got shape ", v.sizes());
    TORCH_CHECK_VALUE(p.Dn == p.D && p.Dr <= p.D, kOp, ": with 'v', gamma [", p.Dn, "] must cover all of kv's D = ",
                      p.D, " and the rope width cos.size(-1) = ", p.Dr, " must be at most D");
    p.Dk = p.D;
    p.Dv = v.size(3);
  } else {
    TORCH_CHECK_VALUE(p.Dn + p.Dr == p.D, kOp, ": kv's last dim D = ", p.D, " must be gamma's rms_size ", p.Dn,
                      " + cos's rope_size ", p.Dr, " (kv = [RMSNorm part, rope part])");
    p.Dk = p.Dr;
    p.Dv = p.Dn;
  }
  TORCH_CHECK_VALUE(std::isfinite(a.epsilon) && a.epsilon >= 0, kOp, ": argument 'epsilon' must be finite and >= 0; "
                    "got ", a.epsilon);

  // Quantisation parameters: k_rope_scale/k_rope_offset for k_cache, c_kv_scale/c_kv_offset for ckv_cache.
  const QuantArg q[4] = {quant_arg("k_rope_scale", a.k_rope_scale, p.N, p.Dk),
                         quant_arg("c_kv_scale", a.c_kv_scale, p.N, p.Dv),
                         quant_arg("k_rope_offset", a.k_rope_offset, p.N, p.Dk),
                         quant_arg("c_kv_offset", a.c_kv_offset, p.N, p.Dv)};
  TORCH_CHECK_VALUE(!q[2].t.defined() || q[0].t.defined(), kOp, ": argument 'k_rope_offset' needs 'k_rope_scale' ",
                    "(an offset without a scale is not a quantisation upstream defines)");
  TORCH_CHECK_VALUE(!q[3].t.defined() || q[1].t.defined(), kOp, ": argument 'c_kv_offset' needs 'c_kv_scale' ",
                    "(an offset without a scale is not a quantisation upstream defines)");
  const bool kq = q[0].t.defined(), vq = q[1].t.defined();
  check_cache("k_cache", a.k_cache, kv, kq, "k_rope_scale");
  check_cache("ckv_cache", a.ckv_cache, kv, vq, "c_kv_scale");

  const at::Tensor& kc = a.k_cache;
  const at::Tensor& vc = a.ckv_cache;
  auto shape_error = [&](const char* name, const at::Tensor& c, const std::string& want) {
    TORCH_CHECK_VALUE(false, kOp, ": argument '", name, "' must be ", want, " for cache_mode '",
                      std::string(a.cache_mode.data(), a.cache_mode.size()), "'; got shape ", c.sizes());
  };
  if (p.mode == Mode::kNorm) {
    p.cache_len = kc.size(2);
    for (auto [name, c, w] : {std::tuple<const char*, const at::Tensor*, int64_t>{"k_cache", &kc, p.Dk},
                              {"ckv_cache", &vc, p.Dv}}) {
      if (c->size(0) != p.B || c->size(1) != p.N || c->size(2) != p.cache_len || c->size(3) != w)
        shape_error(name, *c, "[B, N, Sc, " + std::to_string(w) + "] = [" + std::to_string(p.B) + ", " +
                                  std::to_string(p.N) + ", Sc, " + std::to_string(w) + "] (both caches one Sc)");
    }
    TORCH_CHECK_VALUE(a.index.dim() == 2 && a.index.size(0) == p.B && a.index.size(1) == p.S, kOp,
                      ": argument 'index' must be [B, S] = [", p.B, ", ", p.S, "] for cache_mode 'Norm'; got shape ",
                      a.index.sizes());
  } else {
    p.blocks = kc.size(0);
    p.block_size = kc.size(1);
    for (auto [name, c, w] : {std::tuple<const char*, const at::Tensor*, int64_t>{"k_cache", &kc, p.Dk},
                              {"ckv_cache", &vc, p.Dv}}) {
      if (c->size(0) != p.blocks || c->size(1) != p.block_size || c->size(2) != p.N || c->size(3) != w)
        shape_error(name, *c, "[blocks, block_size, N, " + std::to_string(w) + "] with N = " + std::to_string(p.N) +
                                  " and k_cache's [blocks, block_size] = [" + std::to_string(p.blocks) + ", " +
                                  std::to_string(p.block_size) + "]");
    }
    TORCH_CHECK_VALUE(p.block_size > 0, kOp, ": argument 'k_cache' has block_size 0 (dim 1); expected >= 1");
    if (p.nz) {
      TORCH_CHECK_NOT_IMPLEMENTED(p.N == 1, kOp, ": cache_mode '", std::string(a.cache_mode.data(), a.cache_mode.size()),
                                  "' with N = ", p.N, " heads: upstream defines the NZ layout for N = 1 only");
      p.kd0 = mla::nz_chunk(kc.element_size());
      p.vd0 = mla::nz_chunk(vc.element_size());
      TORCH_CHECK_VALUE(p.Dk % p.kd0 == 0, kOp, ": argument 'k_cache' row of ", p.Dk, " values must be a multiple of ",
                        "the NZ chunk of ", p.kd0, " (32 bytes of ", kc.scalar_type(), ")");
      TORCH_CHECK_VALUE(p.Dv % p.vd0 == 0, kOp, ": argument 'ckv_cache' row of ", p.Dv,
                        " values must be a multiple of the NZ chunk of ", p.vd0, " (32 bytes of ", vc.scalar_type(),
                        ")");
    }
    const int64_t want = p.mode == Mode::kPaBlk ? p.B * ((p.S + p.block_size - 1) / p.block_size) : p.B * p.S;
    TORCH_CHECK_VALUE(a.index.numel() == want, kOp, ": argument 'index' must hold ",
                      p.mode == Mode::kPaBlk ? "B*ceil(S/block_size) = " : "B*S = ", want, " entries (shape [", want,
                      "]) for cache_mode '", std::string(a.cache_mode.data(), a.cache_mode.size()), "'; got shape ",
                      a.index.sizes());
  }
  TORCH_CHECK_TYPE(a.index.scalar_type() == at::kLong || a.index.scalar_type() == at::kInt, kOp,
                   ": argument 'index' must be int64 (or int32); got ", a.index.scalar_type());

  at::Tensor k_rope = at::empty({p.B, p.N, p.S, p.Dk}, kv.options());
  at::Tensor c_kv = at::empty({p.B, p.N, p.S, p.Dv}, kv.options());
  const std::vector<int64_t> slots = token_slots(p, a.index);
  if (p.B * p.N * p.S == 0) return {k_rope, c_kv};
  const at::Tensor kvc = kv.contiguous(), cc = a.cos.contiguous(), sc = a.sin.contiguous();
  const at::Tensor vcont = has_v ? v.contiguous() : at::Tensor();
  const at::Tensor gamma = a.gamma.to(kv.scalar_type() == at::kDouble ? at::kDouble : at::kFloat).contiguous();
  cpu::KvRmsNormRopeParams r;
  r.dtype = kv.scalar_type();
  r.k_int8 = kq;
  r.v_int8 = vq;
  r.has_v = has_v;
  r.B = p.B, r.N = p.N, r.S = p.S, r.D = p.D, r.Dr = p.Dr, r.Dn = p.Dn, r.Dk = p.Dk, r.Dv = p.Dv;
  r.cB = a.cos.size(0), r.cN = a.cos.size(1), r.cS = a.cos.size(2);
  r.addr = p.mode == Mode::kNorm ? cpu::LatentCacheAddr::kNorm
                                 : (p.nz ? cpu::LatentCacheAddr::kPagedNz : cpu::LatentCacheAddr::kPagedNd);
  r.cache_len = p.cache_len, r.block_size = p.block_size, r.kd0 = p.kd0, r.vd0 = p.vd0;
  r.eps = a.epsilon;
  r.kv = kvc.data_ptr();
  r.gamma = gamma.data_ptr();
  r.cos = cc.data_ptr();
  r.sin = sc.data_ptr();
  r.v = has_v ? vcont.data_ptr() : nullptr;
  r.k_rope = k_rope.data_ptr();
  r.c_kv = c_kv.data_ptr();
  r.k_cache = a.k_cache.data_ptr();
  r.ckv_cache = a.ckv_cache.data_ptr();
  r.slots = slots.data();
  for (int i = 0; i < 4; ++i) {
    if (!q[i].t.defined()) continue;
    r.quant[i] = q[i].t.data_ptr<float>();
    r.quant_rows[i] = q[i].rows;
    r.quant_cols[i] = q[i].cols;
  }
  cpu::kv_rms_norm_rope_cache_stub(r);
  return {k_rope, c_kv};
}

}  // namespace npu_fa
