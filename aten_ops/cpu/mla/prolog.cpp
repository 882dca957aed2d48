// CPU kernel of mla_prolog (native_functions.yaml): the query and latent-KV preparation of DeepSeek's MLA.
//
//   c^Q   = qc_qr_scale * RmsNorm(x W_dq)                    [T, Hcq]
//   q     = c^Q W_uq_qr -> [T, N, D + Dr] = (q_nope | q_pe)
//   query = per head n: q_nope[:, n] W_uk[n]                  [T, N, Hckv]   (one batched GEMM over the heads)
//   query_rope = rope(q_pe)                                   [T, N, Dr]
//   x W_dkv_kr -> (c_kv | k_pe): kc_scale * RmsNorm(c_kv) -> kv_cache, rope(k_pe) -> kr_cache (in place)
//
// GEMMs run through ATen in the inputs' dtype (fp32 accumulation inside); RMSNorm and rope are computed in fp32
// (fp64 for fp64) and rounded to the output dtype once. The quantised variants follow upstream's int8 formulas:
// int8 GEMMs are exact in int32 (at::_int_mm) and dequantised per token x per channel in fp32.
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <unordered_map>
#include <vector>

#include "cpu/mla/latent_rows.h"
#include "generated/kernels.h"

namespace npu_fa {
namespace {

constexpr const char* kOp = "mla_prolog";

enum class CacheMode { PA_BSND, PA_NZ, PA_BLK_BSND, PA_BLK_NZ, BSND, TND };

CacheMode parse_cache_mode(c10::string_view m) {
  if (m == "PA_BSND") return CacheMode::PA_BSND;
  if (m == "PA_NZ") return CacheMode::PA_NZ;
  if (m == "PA_BLK_BSND") return CacheMode::PA_BLK_BSND;
  if (m == "PA_BLK_NZ") return CacheMode::PA_BLK_NZ;
  if (m == "BSND") return CacheMode::BSND;
  if (m == "TND") return CacheMode::TND;
  TORCH_CHECK_VALUE(false, kOp, ": argument 'cache_mode' must be one of 'PA_BSND', 'PA_NZ', 'PA_BLK_BSND', 'PA_BLK_NZ', ",
                    "'BSND', 'TND'; got '", std::string(m.data(), m.size()), "'");
  return CacheMode::PA_BSND;
}

bool paged(CacheMode m) { return m != CacheMode::BSND && m != CacheMode::TND; }
bool nz(CacheMode m) { return m == CacheMode::PA_NZ || m == CacheMode::PA_BLK_NZ; }
bool per_block(CacheMode m) { return m == CacheMode::PA_BLK_BSND || m == CacheMode::PA_BLK_NZ; }

bool is_float(at::ScalarType t) {
  return t == at::kFloat || t == at::kBFloat16 || t == at::kHalf || t == at::kDouble;
}

void check_float(const char* name, const at::Tensor& t) {
  TORCH_CHECK_TYPE(is_float(t.scalar_type()), kOp, ": argument '", name,
                   "' must be a floating-point tensor (float32, bfloat16, float16); got ", t.scalar_type());
}

void check_int8(const char* name, const at::Tensor& t, const char* why) {
  TORCH_CHECK_TYPE(t.scalar_type() == at::kChar, kOp, ": argument '", name, "' must be int8 ", why, "; got ",
                   t.scalar_type());
}

void check_shape(const char* name, const at::Tensor& t, at::IntArrayRef want, const char* what) {
  TORCH_CHECK_VALUE(t.sizes() == want, kOp, ": argument '", name, "' must have shape ", want, " (", what, "); got ",
                    t.sizes());
}

const at::Tensor& required(const char* name, const std::optional<at::Tensor>& t, const char* when) {
  TORCH_CHECK_VALUE(t.has_value() && t->defined(), kOp, ": argument '", name, "' is required ", when, "; got None");
  return *t;
}

// The rows below go through the shared row functions of latent_rows.h (RMSNorm, interleaved rope, cache-slot
// write); A is the accumulation type of the source rows (float, or double for double).

// RMSNorm of each row of x [T, n] (unit last stride, any row stride) into a new [T, n] tensor of A, with
// gamma * scale as the weight (the correction factor folded into gamma once).
at::Tensor rms_norm_rows(const at::Tensor& x, const at::Tensor& gamma, double eps, double scale) {
  TORCH_INTERNAL_ASSERT(x.dim() == 2 && x.stride(1) == 1);
  const int64_t T = x.size(0), n = x.size(1);
  at::Tensor out;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "mla_prolog_rms_norm", [&] {
    using A = mla::acc_of<scalar_t>;
    out = at::empty({T, n}, x.options().dtype(c10::CppTypeToScalarType<A>::value));
    const at::Tensor g = (gamma.to(out.scalar_type()) * scale).contiguous();
    const scalar_t* xp = x.const_data_ptr<scalar_t>();
    const A* gp = g.const_data_ptr<A>();
    A* op = out.mutable_data_ptr<A>();
    const int64_t stride = x.stride(0);
    at::parallel_for(0, T, 16, [&](int64_t t0, int64_t t1) {
      for (int64_t t = t0; t < t1; ++t) mla::rms_norm_row(xp + t * stride, n, gp, eps, op + t * n);
    });
  });
  return out;
}

// Interleaved rope of x [T, H, Dr] (unit last stride) with the token's cos/sin (given in x's accumulation type,
// [T, Dr]), into a new [T, H, Dr] tensor of A.
at::Tensor interleave_rope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  TORCH_INTERNAL_ASSERT(x.dim() == 3 && x.stride(2) == 1);
  const int64_t T = x.size(0), H = x.size(1), d = x.size(2);
  at::Tensor out;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "mla_prolog_rope", [&] {
    using A = mla::acc_of<scalar_t>;
    const auto adt = c10::CppTypeToScalarType<A>::value;
    out = at::empty({T, H, d}, x.options().dtype(adt));
    const at::Tensor c = cos.to(adt).contiguous(), s = sin.to(adt).contiguous();
    const scalar_t* xp = x.const_data_ptr<scalar_t>();
    const A *cp = c.const_data_ptr<A>(), *sp = s.const_data_ptr<A>();
    A* op = out.mutable_data_ptr<A>();
    const int64_t s0 = x.stride(0), s1 = x.stride(1);
    at::parallel_for(0, T, 16, [&](int64_t t0, int64_t t1) {
      for (int64_t t = t0; t < t1; ++t)
        for (int64_t h = 0; h < H; ++h)
          mla::interleave_rope_row(xp + t * s0 + h * s1, cp + t * d, sp + t * d, d, op + (t * H + h) * d);
    });
  });
  return out;
}

// Symmetric int8 of upstream's golden functions: round half to even, then saturate.
at::Tensor to_int8(const at::Tensor& x) { return at::round(x).clamp(-128, 127).to(at::kChar); }

// Dynamic per-row int8 quantisation: scale = max|x| / 127 per row (of the last dim), q = round(x / scale).
std::pair<at::Tensor, at::Tensor> dynamic_quant_rows(const at::Tensor& x) {
  const at::Tensor scale = x.abs().amax(-1, /*keepdim=*/true) / 127.0;
  // An all-zero row quantises to zeros (scale 0 would give 0/0).
  const at::Tensor safe = at::where(scale > 0, scale, at::ones_like(scale));
  return {to_int8(x / safe), scale};
}

// int8 x int8 -> int32 GEMM, dequantised per row and column in fp32: (A B)[i, j] * row_scale[i] * col_scale[j].
at::Tensor int8_mm_dequant(const at::Tensor& a, const at::Tensor& b, const at::Tensor& row_scale,
                           const at::Tensor& col_scale) {
  at::Tensor acc;
  if (a.size(0) == 0 || b.size(1) == 0 || a.size(1) == 0) {
    acc = at::zeros({a.size(0), b.size(1)}, a.options().dtype(at::kInt));
  } else {
    acc = at::_int_mm(a.contiguous(), b.contiguous());
  }
  return acc.to(at::kFloat) * row_scale.reshape({-1, 1}).to(at::kFloat) * col_scale.reshape({1, -1}).to(at::kFloat);
}

// Destination of each token in a cache viewed as rows: row index (token slot / position), or -1 to skip.
struct Destinations {
  std::vector<int64_t> token, row;  // written tokens and their cache rows (repeated rows: the last token kept)
};

Destinations destinations(CacheMode mode, int64_t T, int64_t B, int64_t S, int64_t rows, int64_t block_size,
                          const std::optional<at::Tensor>& cache_index, const std::optional<at::Tensor>& actual_seq_len,
                          bool bs_merged) {
  std::vector<int64_t> dest(T, -1);
  if (!paged(mode)) {
    for (int64_t t = 0; t < T; ++t) dest[t] = t;
  } else {
    const at::Tensor& ci = required("cache_index", cache_index, "for the paged cache modes (PA_*)");
    TORCH_CHECK_TYPE(ci.scalar_type() == at::kLong || ci.scalar_type() == at::kInt, kOp,
                     ": argument 'cache_index' must be int64 (or int32); got ", ci.scalar_type());
    const at::Tensor idx = ci.to(at::kLong).contiguous();
    const int64_t* ip = idx.data_ptr<int64_t>();
    if (!per_block(mode)) {
      if (bs_merged) {
        TORCH_CHECK_VALUE(ci.dim() == 1 && ci.size(0) == T, kOp, ": argument 'cache_index' must have shape [", T,
                          "] (one slot per token of token_x [T, He]); got ", ci.sizes());
      } else {
        TORCH_CHECK_VALUE(ci.dim() == 2 && ci.size(0) == B && ci.size(1) == S, kOp,
                          ": argument 'cache_index' must have shape [", B, ", ", S,
                          "] (one slot per token of token_x [B, S, He]); got ", ci.sizes());
      }
      for (int64_t t = 0; t < T; ++t) {
        TORCH_CHECK_VALUE(ip[t] >= -1 && ip[t] < rows, kOp, ": cache_index[", t, "] = ", ip[t],
                          " is out of range; slots are -1 (skip) or in [0, BlockNum*BlockSize = ", rows, ")");
        dest[t] = ip[t];
      }
    } else {
      const int64_t num_blocks = rows / std::max<int64_t>(block_size, 1);
      auto block_of = [&](int64_t j) {
        TORCH_CHECK_VALUE(ip[j] >= -1 && ip[j] < num_blocks, kOp, ": cache_index[", j, "] = ", ip[j],
                          " is out of range; blocks are -1 (skip) or in [0, BlockNum = ", num_blocks, ")");
        return ip[j];
      };
      auto place = [&](int64_t t, int64_t blk, int64_t s) {
        dest[t] = blk < 0 ? -1 : blk * block_size + s % block_size;
      };
      if (!bs_merged) {
        const int64_t nb = (S + block_size - 1) / block_size;
        TORCH_CHECK_VALUE(ci.dim() == 2 && ci.size(0) == B && ci.size(1) == nb, kOp,
                          ": argument 'cache_index' must have shape [", B, ", ", nb,
                          "] (B, ceil(S / BlockSize)) for cache_mode PA_BLK_*; got ", ci.sizes());
        for (int64_t b = 0; b < B; ++b)
          for (int64_t s = 0; s < S; ++s) place(b * S + s, block_of(b * nb + s / block_size), s);
      } else {
        const at::Tensor& asl = required("actual_seq_len", actual_seq_len,
                                         "for cache_mode PA_BLK_* with a 2-D token_x [T, He]");
        TORCH_CHECK_TYPE(asl.scalar_type() == at::kInt || asl.scalar_type() == at::kLong, kOp,
                         ": argument 'actual_seq_len' must be int32 (or int64); got ", asl.scalar_type());
        TORCH_CHECK_VALUE(asl.dim() == 1, kOp, ": argument 'actual_seq_len' must be 1-D [B] (cumulative sequence ",
                          "ends); got shape ", asl.sizes());
        const at::Tensor ends = asl.to(at::kCPU).to(at::kLong).contiguous();
        const int64_t* ep = ends.data_ptr<int64_t>();
        const int64_t nbatch = ends.numel();
        TORCH_CHECK_VALUE(nbatch == 0 ? T == 0 : ep[nbatch - 1] == T, kOp,
                          ": argument 'actual_seq_len' holds cumulative sequence ends whose last must equal T = ", T,
                          "; got ", nbatch == 0 ? std::string("an empty tensor") : std::to_string(ep[nbatch - 1]));
        int64_t start = 0, blocks = 0;
        for (int64_t b = 0; b < nbatch; ++b) {
          TORCH_CHECK_VALUE(ep[b] >= start, kOp, ": argument 'actual_seq_len' must be non-decreasing (cumulative ",
                            "ends); entry ", b, " is ", ep[b], " after ", start);
          blocks += (ep[b] - start + block_size - 1) / block_size;
          start = ep[b];
        }
        TORCH_CHECK_VALUE(ci.dim() == 1 && ci.size(0) == blocks, kOp, ": argument 'cache_index' must have shape [",
                          blocks, "] (sum over the sequences of ceil(S_i / BlockSize)) for cache_mode PA_BLK_* ",
                          "with actual_seq_len; got ", ci.sizes());
        start = 0;
        int64_t first_block = 0;
        for (int64_t b = 0; b < nbatch; ++b) {
          for (int64_t t = start; t < ep[b]; ++t) {
            const int64_t s = t - start;
            place(t, block_of(first_block + s / block_size), s);
          }
          first_block += (ep[b] - start + block_size - 1) / block_size;
          start = ep[b];
        }
      }
    }
  }
  // A repeated row keeps the last token that names it (a sequential write order), so the result is
  // deterministic and the row writes below are independent.
  std::unordered_map<int64_t, int64_t> last;
  last.reserve(T);
  for (int64_t t = 0; t < T; ++t)
    if (dest[t] >= 0) last[dest[t]] = t;
  Destinations d;
  for (int64_t t = 0; t < T; ++t)
    if (dest[t] >= 0 && last[dest[t]] == t) {
      d.token.push_back(t);
      d.row.push_back(dest[t]);
    }
  return d;
}

// One row of n values (A) into `cache` (its own dtype; int8 quantised with *quant) at addr.
template <typename A>
void write_row(const A* v, int64_t n, const at::Tensor& cache, const mla::RowAddr& addr,
               const mla::QuantParams* quant) {
  switch (cache.scalar_type()) {
    case at::kChar: mla::write_cache_row(v, n, static_cast<int8_t*>(cache.data_ptr()), addr, quant); break;
    case at::kFloat: mla::write_cache_row(v, n, static_cast<float*>(cache.data_ptr()), addr, quant); break;
    case at::kDouble: mla::write_cache_row(v, n, static_cast<double*>(cache.data_ptr()), addr, quant); break;
    case at::kHalf: mla::write_cache_row(v, n, static_cast<c10::Half*>(cache.data_ptr()), addr, quant); break;
    case at::kBFloat16: mla::write_cache_row(v, n, static_cast<c10::BFloat16*>(cache.data_ptr()), addr, quant); break;
    default: TORCH_CHECK_TYPE(false, kOp, ": cache dtype ", cache.scalar_type(), " is not supported");
  }
}

// Where a token row of n values (Nkv heads x width) goes: cache row `row` of a contiguous or ND paged cache, or
// slot `row` of an NZ paged cache ([BlockNum, n / c, BlockSize, c], c = 32 bytes of elements).
mla::RowAddr row_addr(int64_t row, int64_t n, int64_t block_size, bool nz_layout, int64_t itemsize) {
  return nz_layout ? mla::paged_row_nz(row, block_size, n, mla::nz_chunk(itemsize)) : mla::paged_row_nd(row, n);
}

}  // namespace

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> mla_prolog_cpu(const MlaPrologArgs& a) {
  const CacheMode mode = parse_cache_mode(a.cache_mode);
  const int64_t wq = a.weight_quant_mode, kvq = a.kv_cache_quant_mode, qq = a.query_quant_mode;
  TORCH_CHECK_NOT_IMPLEMENTED(wq >= 0 && wq <= 2, kOp, ": argument 'weight_quant_mode' = ", wq,
                              " is not implemented (0 float, 1 int8 weight_uq_qr, 2 int8 token_x and weights; 3 mxfp8, ",
                              "4 fp8 and 5 hifloat8 are NPU formats)");
  TORCH_CHECK_NOT_IMPLEMENTED(kvq >= 0 && kvq <= 2, kOp, ": argument 'kv_cache_quant_mode' = ", kvq,
                              " is not implemented (0 float, 1 int8 per tensor, 2 int8 per channel; 3, the ",
                              "per-token-per-group tiles, is not)");
  TORCH_CHECK_VALUE(qq == 0 || qq == 1, kOp, ": argument 'query_quant_mode' must be 0 or 1; got ", qq);
  TORCH_CHECK_VALUE((kvq == 1) == (qq == 1), kOp, ": kv_cache_quant_mode 1 (per-tensor int8 cache) and ",
                    "query_quant_mode 1 (int8 query) go together; got kv_cache_quant_mode=", kvq,
                    ", query_quant_mode=", qq);
  TORCH_CHECK_VALUE(kvq != 1 || wq == 2, kOp, ": kv_cache_quant_mode 1 needs weight_quant_mode 2 (int8 token_x and ",
                    "weights); got weight_quant_mode=", wq);
  TORCH_CHECK_VALUE(kvq != 2 || wq == 1, kOp, ": kv_cache_quant_mode 2 needs weight_quant_mode 1 (int8 weight_uq_qr); ",
                    "got weight_quant_mode=", wq);

  // ---- shapes -----------------------------------------------------------------------------------------------
  const at::Tensor& x = a.token_x;
  TORCH_CHECK_VALUE(x.dim() == 2 || x.dim() == 3, kOp, ": argument 'token_x' must be [T, He] or [B, S, He]; got shape ",
                    x.sizes());
  const bool merged = x.dim() == 2;
  const int64_t B = merged ? 1 : x.size(0), S = merged ? x.size(0) : x.size(1);
  const int64_t T = merged ? x.size(0) : x.size(0) * x.size(1), He = x.size(-1);
  TORCH_CHECK_VALUE(a.weight_uk.dim() == 3, kOp, ": argument 'weight_uk' must be [N, D, Hckv]; got shape ",
                    a.weight_uk.sizes());
  const int64_t N = a.weight_uk.size(0), D = a.weight_uk.size(1), Hckv = a.weight_uk.size(2);
  TORCH_CHECK_VALUE(a.rope_sin.dim() == x.dim(), kOp, ": argument 'rope_sin' must be ",
                    merged ? "[T, Dr] for a 2-D token_x" : "[B, S, Dr] for a 3-D token_x", "; got shape ",
                    a.rope_sin.sizes());
  const int64_t Dr = a.rope_sin.size(-1);
  std::vector<int64_t> rope_shape(x.sizes().begin(), x.sizes().end() - 1);
  rope_shape.push_back(Dr);
  check_shape("rope_sin", a.rope_sin, rope_shape, "token_x's leading dims, Dr");
  check_shape("rope_cos", a.rope_cos, rope_shape, "rope_sin's shape");
  TORCH_CHECK_VALUE(Dr % 2 == 0 && Dr > 0, kOp, ": the rope dim Dr (rope_sin's last dim) must be even and > 0; got ",
                    Dr);
  TORCH_CHECK_VALUE(N > 0 && D > 0 && Hckv > 0, kOp, ": argument 'weight_uk' [N, D, Hckv] must have no zero dim; got ",
                    a.weight_uk.sizes());
  TORCH_CHECK_VALUE(a.weight_dq.dim() == 2 && a.weight_dq.size(0) == He, kOp,
                    ": argument 'weight_dq' must be [He = ", He, ", Hcq]; got shape ", a.weight_dq.sizes());
  const int64_t Hcq = a.weight_dq.size(1);
  check_shape("weight_uq_qr", a.weight_uq_qr, {Hcq, N * (D + Dr)}, "Hcq, N*(D+Dr)");
  check_shape("weight_dkv_kr", a.weight_dkv_kr, {He, Hckv + Dr}, "He, Hckv+Dr");
  check_shape("rmsnorm_gamma_cq", a.rmsnorm_gamma_cq, {Hcq}, "Hcq");
  check_shape("rmsnorm_gamma_ckv", a.rmsnorm_gamma_ckv, {Hckv}, "Hckv");

  // ---- dtypes -----------------------------------------------------------------------------------------------
  for (auto [name, t] : {std::pair<const char*, const at::Tensor*>{"rope_sin", &a.rope_sin}, {"rope_cos", &a.rope_cos},
                         {"weight_uk", &a.weight_uk}, {"rmsnorm_gamma_cq", &a.rmsnorm_gamma_cq},
                         {"rmsnorm_gamma_ckv", &a.rmsnorm_gamma_ckv}})
    check_float(name, *t);
  const at::ScalarType dt = a.rope_sin.scalar_type();  // dtype of the float results and of the float GEMMs
  const at::ScalarType acc = dt == at::kDouble ? at::kDouble : at::kFloat;
  TORCH_CHECK_TYPE(a.rope_cos.scalar_type() == dt && a.weight_uk.scalar_type() == dt, kOp,
                   ": arguments 'rope_cos' and 'weight_uk' must have rope_sin's dtype ", dt, "; got ",
                   a.rope_cos.scalar_type(), " and ", a.weight_uk.scalar_type());
  if (wq == 2) {
    check_int8("token_x", x, "with weight_quant_mode 2");
    check_int8("weight_dq", a.weight_dq, "with weight_quant_mode 2");
    check_int8("weight_dkv_kr", a.weight_dkv_kr, "with weight_quant_mode 2");
  } else {
    for (auto [name, t] : {std::pair<const char*, const at::Tensor*>{"token_x", &x}, {"weight_dq", &a.weight_dq},
                           {"weight_dkv_kr", &a.weight_dkv_kr}})
      TORCH_CHECK_TYPE(t->scalar_type() == dt, kOp, ": argument '", name, "' must have rope_sin's dtype ", dt,
                       wq == 0 ? "" : " (only weight_uq_qr is int8 with weight_quant_mode 1)", "; got ",
                       t->scalar_type(),
                       t->scalar_type() == at::kChar ? " (int8 token_x needs weight_quant_mode 2)" : "");
  }
  if (wq >= 1)
    check_int8("weight_uq_qr", a.weight_uq_qr, "with weight_quant_mode 1 or 2");
  else
    TORCH_CHECK_TYPE(a.weight_uq_qr.scalar_type() == dt, kOp, ": argument 'weight_uq_qr' must have rope_sin's dtype ",
                     dt, "; got ", a.weight_uq_qr.scalar_type(),
                     a.weight_uq_qr.scalar_type() == at::kChar ? " (int8 needs weight_quant_mode 1 or 2)" : "");
  if (kvq == 0) {
    TORCH_CHECK_TYPE(is_float(a.kv_cache.scalar_type()) && is_float(a.kr_cache.scalar_type()), kOp,
                     ": arguments 'kv_cache' and 'kr_cache' must be floating-point with kv_cache_quant_mode 0; got ",
                     a.kv_cache.scalar_type(), " and ", a.kr_cache.scalar_type());
  } else {
    check_int8("kv_cache", a.kv_cache, "with kv_cache_quant_mode 1 or 2");
    if (kvq == 2)
      check_int8("kr_cache", a.kr_cache, "with kv_cache_quant_mode 2");
    else
      check_float("kr_cache", a.kr_cache);
  }
  // Scales that only a quantised mode reads must not be given silently.
  auto unused = [&](const char* name, const std::optional<at::Tensor>& t, bool used, const char* when) {
    TORCH_CHECK_VALUE(used || !(t.has_value() && t->defined()), kOp, ": argument '", name, "' is only read ", when,
                      "; got a tensor with weight_quant_mode=", wq, ", kv_cache_quant_mode=", kvq);
  };
  unused("dequant_scale_x", a.dequant_scale_x, wq == 2, "with weight_quant_mode 2");
  unused("dequant_scale_w_dq", a.dequant_scale_w_dq, wq == 2, "with weight_quant_mode 2");
  unused("dequant_scale_w_dkv_kr", a.dequant_scale_w_dkv_kr, wq == 2, "with weight_quant_mode 2");
  unused("dequant_scale_w_uq_qr", a.dequant_scale_w_uq_qr, wq >= 1, "with weight_quant_mode 1 or 2");
  unused("smooth_scales_cq", a.smooth_scales_cq, wq >= 1, "with weight_quant_mode 1 or 2");
  unused("quant_scale_ckv", a.quant_scale_ckv, kvq >= 1, "with kv_cache_quant_mode 1 or 2");
  unused("quant_scale_ckr", a.quant_scale_ckr, kvq == 2, "with kv_cache_quant_mode 2");
  auto float_scale = [&](const char* name, const std::optional<at::Tensor>& t, at::IntArrayRef shape,
                         const char* what, const char* when) {
    const at::Tensor& s = required(name, t, when);
    TORCH_CHECK_TYPE(s.scalar_type() == at::kFloat, kOp, ": argument '", name, "' must be float32; got ",
                     s.scalar_type());
    check_shape(name, s, shape, what);
    return s.to(at::kFloat);
  };

  // ---- caches -----------------------------------------------------------------------------------------------
  const at::Tensor &kv = a.kv_cache, &kr = a.kr_cache;
  TORCH_CHECK_VALUE(kv.is_contiguous() && kr.is_contiguous(), kOp,
                    ": arguments 'kv_cache' and 'kr_cache' are written in place and must be contiguous");
  int64_t nkv = 0, rows = 0, block_size = 1;
  if (paged(mode)) {
    TORCH_CHECK_VALUE(kv.dim() == 4 && kv.size(3) == Hckv, kOp, ": argument 'kv_cache' must be [BlockNum, BlockSize, ",
                      "Nkv, Hckv = ", Hckv, "] for cache_mode ", std::string(a.cache_mode), "; got shape ", kv.sizes());
    nkv = kv.size(2);
    block_size = kv.size(1);
    rows = kv.size(0) * kv.size(1);
    check_shape("kr_cache", kr, {kv.size(0), kv.size(1), nkv, Dr}, "BlockNum, BlockSize, Nkv of kv_cache, Dr");
    TORCH_CHECK_VALUE(block_size > 0 || kv.size(0) == 0, kOp, ": argument 'kv_cache' has BlockSize 0; got shape ",
                      kv.sizes());
    block_size = std::max<int64_t>(block_size, 1);
    if (nz(mode)) {
      for (auto [name, t, w] : {std::tuple<const char*, const at::Tensor*, int64_t>{"kv_cache", &kv, Hckv},
                                {"kr_cache", &kr, Dr}}) {
        const int64_t c = 32 / t->element_size();
        TORCH_CHECK_VALUE((nkv * w) % c == 0, kOp, ": cache_mode ", std::string(a.cache_mode), " stores '", name,
                          "' in tiles of 32 bytes (", c, " ", t->scalar_type(), " values); its row of Nkv*", w, " = ",
                          nkv * w, " values is not a multiple");
      }
    }
  } else if (mode == CacheMode::BSND) {
    TORCH_CHECK_VALUE(!merged, kOp, ": cache_mode 'BSND' needs a 3-D token_x [B, S, He]; got shape ", x.sizes());
    TORCH_CHECK_VALUE(kv.dim() == 4 && kv.size(0) == B && kv.size(1) == S && kv.size(3) == Hckv, kOp,
                      ": argument 'kv_cache' must be [B = ", B, ", S = ", S, ", Nkv, Hckv = ", Hckv,
                      "] for cache_mode 'BSND'; got shape ", kv.sizes());
    nkv = kv.size(2);
    check_shape("kr_cache", kr, {B, S, nkv, Dr}, "B, S, Nkv, Dr");
    rows = T;
  } else {
    TORCH_CHECK_VALUE(merged, kOp, ": cache_mode 'TND' needs a 2-D token_x [T, He]; got shape ", x.sizes());
    TORCH_CHECK_VALUE(kv.dim() == 3 && kv.size(0) == T && kv.size(2) == Hckv, kOp, ": argument 'kv_cache' must be [T = ",
                      T, ", Nkv, Hckv = ", Hckv, "] for cache_mode 'TND'; got shape ", kv.sizes());
    nkv = kv.size(1);
    check_shape("kr_cache", kr, {T, nkv, Dr}, "T, Nkv, Dr");
    rows = T;
  }
  TORCH_CHECK_VALUE(nkv > 0, kOp, ": the caches' Nkv must be >= 1; got kv_cache of shape ", kv.sizes());
  if (!paged(mode)) {
    const bool given = a.cache_index.has_value() && a.cache_index->defined() && a.cache_index->numel() > 0;
    TORCH_CHECK_VALUE(!given, kOp, ": argument 'cache_index' must be None for cache_mode ",
                      std::string(a.cache_mode), " (token t goes to cache row t)");
  }
  if (!(per_block(mode) && merged))
    TORCH_CHECK_VALUE(!(a.actual_seq_len.has_value() && a.actual_seq_len->defined()), kOp,
                      ": argument 'actual_seq_len' is only read for cache_mode PA_BLK_* with a 2-D token_x; got a "
                      "tensor with cache_mode ", std::string(a.cache_mode));
  const Destinations dest =
      destinations(mode, T, B, S, rows, block_size, a.cache_index, a.actual_seq_len, merged);

  // ---- query path -------------------------------------------------------------------------------------------
  const at::Tensor x2 = x.reshape({T, He});
  const at::Tensor sin2 = a.rope_sin.reshape({T, Dr}), cos2 = a.rope_cos.reshape({T, Dr});
  at::Tensor cq_raw, ckvkr;  // x W_dq [T, Hcq] and x W_dkv_kr [T, Hckv+Dr]
  if (wq == 2) {
    const at::Tensor dsx = float_scale("dequant_scale_x", a.dequant_scale_x, {T, 1}, "T, 1",
                                       "with weight_quant_mode 2 (token_x's per-token scale)");
    const at::Tensor dsq = float_scale("dequant_scale_w_dq", a.dequant_scale_w_dq, {1, Hcq}, "1, Hcq",
                                       "with weight_quant_mode 2");
    const at::Tensor dskv = float_scale("dequant_scale_w_dkv_kr", a.dequant_scale_w_dkv_kr, {1, Hckv + Dr},
                                        "1, Hckv+Dr", "with weight_quant_mode 2");
    cq_raw = int8_mm_dequant(x2, a.weight_dq, dsx, dsq);
    ckvkr = int8_mm_dequant(x2, a.weight_dkv_kr, dsx, dskv);
  } else {
    cq_raw = at::mm(x2, a.weight_dq);
    ckvkr = at::mm(x2, a.weight_dkv_kr);
  }
  const at::Tensor cq = rms_norm_rows(cq_raw, a.rmsnorm_gamma_cq, a.rmsnorm_epsilon_cq, a.qc_qr_scale);
  at::Tensor qcqr, query_norm, dequant_scale_q_norm;  // qcqr: c^Q W_uq_qr [T, N*(D+Dr)]
  if (wq == 0) {
    const at::Tensor cq_dt = cq.to(dt);
    qcqr = at::mm(cq_dt, a.weight_uq_qr);
    query_norm = a.query_norm_flag ? cq_dt.reshape(merged ? std::vector<int64_t>{T, Hcq} : std::vector<int64_t>{B, S, Hcq})
                                   : at::empty({0}, x.options().dtype(dt));
    dequant_scale_q_norm = at::empty({0}, x.options().dtype(at::kFloat));
  } else {
    const at::Tensor dsuq = float_scale("dequant_scale_w_uq_qr", a.dequant_scale_w_uq_qr, {1, N * (D + Dr)},
                                        "1, N*(D+Dr)", "with weight_quant_mode 1 or 2");
    at::Tensor cq_in = cq.to(at::kFloat);
    if (a.smooth_scales_cq.has_value() && a.smooth_scales_cq->defined())
      cq_in = cq_in * float_scale("smooth_scales_cq", a.smooth_scales_cq, {1, Hcq}, "1, Hcq", "");
    auto [cq_q, cq_scale] = dynamic_quant_rows(cq_in);
    qcqr = int8_mm_dequant(cq_q, a.weight_uq_qr, cq_scale, dsuq);
    query_norm = a.query_norm_flag ? cq_q.reshape(merged ? std::vector<int64_t>{T, Hcq} : std::vector<int64_t>{B, S, Hcq})
                                   : at::empty({0}, x.options().dtype(at::kChar));
    dequant_scale_q_norm = a.query_norm_flag ? cq_scale.reshape({T, 1}) : at::empty({0}, x.options().dtype(at::kFloat));
  }
  const at::Tensor q3 = qcqr.view({T, N, D + Dr});
  // Absorption: per head n, q_nope[:, n, :] [T, D] @ weight_uk[n] [D, Hckv], one batched GEMM in the output dtype.
  const at::Tensor q_nope = q3.slice(2, 0, D).to(dt).transpose(0, 1);  // [N, T, D]
  at::Tensor query = at::bmm(q_nope, a.weight_uk).transpose(0, 1).contiguous();  // [T, N, Hckv]
  at::Tensor query_rope = interleave_rope(q3.slice(2, D), cos2, sin2).to(acc);  // [T, N, Dr]
  at::Tensor dequant_scale_q_nope;
  if (qq == 1) {
    const at::Tensor qs = float_scale("quant_scale_ckv", a.quant_scale_ckv, {1}, "1", "with kv_cache_quant_mode 1");
    auto [q_i8, q_scale] = dynamic_quant_rows(query.to(at::kFloat));  // per token and head
    // The rope part is pre-divided by the query's scale and multiplied by the cache's, so that scores from the
    // int8 query and int8 cache need one rescale (upstream's formula, which rescales the rounded rope values).
    const at::Tensor safe = at::where(q_scale > 0, q_scale, at::ones_like(q_scale));
    query_rope = query_rope.to(dt).to(acc) * qs.to(acc) / safe.to(acc);
    query = q_i8;
    dequant_scale_q_nope = q_scale;  // [T, N, 1]
  } else {
    dequant_scale_q_nope = at::empty({0}, x.options().dtype(at::kFloat));
  }
  query_rope = query_rope.to(dt);
  if (!merged) {
    query = query.view({B, S, N, Hckv});
    query_rope = query_rope.view({B, S, N, Dr});
  }

  // ---- KV path ----------------------------------------------------------------------------------------------
  // Only the tokens that write a row are computed: RMSNorm / rope into a row buffer, repeated for the Nkv heads,
  // then written (converted or quantised) by the shared row writer. Rows are distinct, so tokens run in parallel.
  mla::QuantParams kv_quant, kr_quant;
  std::vector<float> kv_scale, kr_scale;
  if (kvq == 1) {
    kv_scale = {float_scale("quant_scale_ckv", a.quant_scale_ckv, {1}, "1", "with kv_cache_quant_mode 1").item<float>()};
    kv_quant.scale = kv_scale.data();
  } else if (kvq == 2) {
    const at::Tensor qkv = float_scale("quant_scale_ckv", a.quant_scale_ckv, {1, Hckv}, "1, Hckv",
                                       "with kv_cache_quant_mode 2").repeat({1, nkv}).contiguous();
    const at::Tensor qkr = float_scale("quant_scale_ckr", a.quant_scale_ckr, {1, Dr}, "1, Dr",
                                       "with kv_cache_quant_mode 2").repeat({1, nkv}).contiguous();
    kv_scale.assign(qkv.const_data_ptr<float>(), qkv.const_data_ptr<float>() + qkv.numel());
    kr_scale.assign(qkr.const_data_ptr<float>(), qkr.const_data_ptr<float>() + qkr.numel());
    kv_quant = {kv_scale.data(), 1, nullptr, 0};
    kr_quant = {kr_scale.data(), 1, nullptr, 0};
  }
  const mla::QuantParams* kvp = kvq >= 1 ? &kv_quant : nullptr;
  const mla::QuantParams* krp = kvq == 2 ? &kr_quant : nullptr;
  if (!dest.token.empty() && kv.numel() > 0 && kr.numel() > 0) {
    const at::Tensor src = ckvkr.contiguous();
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, src.scalar_type(), "mla_prolog_kv_rows", [&] {
      using A = mla::acc_of<scalar_t>;
      const auto adt = c10::CppTypeToScalarType<A>::value;
      const at::Tensor g = (a.rmsnorm_gamma_ckv.to(adt) * a.kc_scale).contiguous();
      const at::Tensor c = cos2.to(adt).contiguous(), s = sin2.to(adt).contiguous();
      const scalar_t* xp = src.const_data_ptr<scalar_t>();
      const A *gp = g.const_data_ptr<A>(), *cp = c.const_data_ptr<A>(), *sp = s.const_data_ptr<A>();
      const int64_t ld = Hckv + Dr, nv = nkv * Hckv, nr = nkv * Dr;
      const bool nzl = nz(mode);
      at::parallel_for(0, (int64_t)dest.token.size(), 8, [&](int64_t i0, int64_t i1) {
        std::vector<A> vrow(nv), rrow(nr);
        for (int64_t i = i0; i < i1; ++i) {
          const int64_t t = dest.token[i], r = dest.row[i];
          mla::rms_norm_row(xp + t * ld, Hckv, gp, a.rmsnorm_epsilon_ckv, vrow.data());
          mla::interleave_rope_row(xp + t * ld + Hckv, cp + t * Dr, sp + t * Dr, Dr, rrow.data());
          for (int64_t h = 1; h < nkv; ++h) {
            std::copy(vrow.begin(), vrow.begin() + Hckv, vrow.begin() + h * Hckv);
            std::copy(rrow.begin(), rrow.begin() + Dr, rrow.begin() + h * Dr);
          }
          write_row(vrow.data(), nv, kv, row_addr(r, nv, block_size, nzl, kv.element_size()), kvp);
          write_row(rrow.data(), nr, kr, row_addr(r, nr, block_size, nzl, kr.element_size()), krp);
        }
      });
    });
  }
  return {query, query_rope, dequant_scale_q_nope, query_norm, dequant_scale_q_norm};
}

}  // namespace npu_fa
