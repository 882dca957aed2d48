// The row loop of kv_rms_norm_rope_cache for one instruction set (see rms_norm_rope_cache_kernels.h): per token,
// RMSNorm and interleaved rope into fp32 (fp64) buffers, then the rows written to the outputs and the caches.
#include "cpu/kv_cache/rms_norm_rope_cache_kernels.h"

#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <vector>

#include "cpu/mla/latent_rows.h"

namespace npu_fa::cpu::CPU_CAPABILITY {
namespace {

mla::QuantParams quant_params(const KvRmsNormRopeParams& p, int scale, int offset, int64_t n) {
  mla::QuantParams q;
  if (p.quant[scale] != nullptr) {
    q.scale = p.quant[scale] + (p.quant_rows[scale] > 1 ? n * p.quant_cols[scale] : 0);
    q.scale_stride = p.quant_cols[scale] > 1 ? 1 : 0;
  }
  if (p.quant[offset] != nullptr) {
    q.offset = p.quant[offset] + (p.quant_rows[offset] > 1 ? n * p.quant_cols[offset] : 0);
    q.offset_stride = p.quant_cols[offset] > 1 ? 1 : 0;
  }
  return q;
}

template <typename T, typename KC, typename VC>
void run(const KvRmsNormRopeParams& p) {
  using A = mla::acc_of<T>;
  const A* gp = static_cast<const A*>(p.gamma);
  const T* kvp = static_cast<const T*>(p.kv);
  const T* cp = static_cast<const T*>(p.cos);
  const T* sp = static_cast<const T*>(p.sin);
  const T* vp = static_cast<const T*>(p.v);
  T* krp = static_cast<T*>(p.k_rope);
  T* ckp = static_cast<T*>(p.c_kv);
  KC* kcache = static_cast<KC*>(p.k_cache);
  VC* vcache = static_cast<VC*>(p.ckv_cache);
  const int64_t tokens = p.B * p.N * p.S;
  at::parallel_for(0, tokens, std::max<int64_t>(1, 16384 / std::max<int64_t>(p.D, 1)), [&](int64_t t0, int64_t t1) {
    std::vector<A> y(p.Dn), k(p.Dk), vb(p.has_v ? p.Dv : 0);
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t s = t % p.S, n = (t / p.S) % p.N, b = t / (p.S * p.N);
      const T* row = kvp + t * p.D;
      const int64_t ct = (((p.cB > 1 ? b : 0) * p.cN + (p.cN > 1 ? n : 0)) * p.cS + (p.cS > 1 ? s : 0)) * p.Dr;
      mla::rms_norm_row(row, p.Dn, gp, p.eps, y.data());
      const A* ckv_row = y.data();
      if (!p.has_v) {
        mla::interleave_rope_row(row + p.Dn, cp + ct, sp + ct, p.Dr, k.data());
      } else {
        mla::interleave_rope_row(y.data(), cp + ct, sp + ct, p.Dr, k.data());
        std::copy(y.begin() + p.Dr, y.end(), k.begin() + p.Dr);
        mla::load_row(vp + t * p.Dv, p.Dv, vb.data());
        ckv_row = vb.data();
      }
      mla::write_cache_row(k.data(), p.Dk, krp + t * p.Dk, {0, mla::contiguous_row(p.Dk)});
      mla::write_cache_row(ckv_row, p.Dv, ckp + t * p.Dv, {0, mla::contiguous_row(p.Dv)});
      const int64_t slot = p.slots[b * p.S + s];
      if (slot < 0) continue;
      mla::RowAddr ka, va;
      switch (p.addr) {
        case LatentCacheAddr::kNorm: {
          const int64_t r = (b * p.N + n) * p.cache_len + slot;
          ka = {r * p.Dk, mla::contiguous_row(p.Dk)};
          va = {r * p.Dv, mla::contiguous_row(p.Dv)};
          break;
        }
        case LatentCacheAddr::kPagedNz:  // N == 1
          ka = mla::paged_row_nz(slot, p.block_size, p.Dk, p.kd0);
          va = mla::paged_row_nz(slot, p.block_size, p.Dv, p.vd0);
          break;
        default:
          ka = mla::paged_row_nd(slot * p.N + n, p.Dk);
          va = mla::paged_row_nd(slot * p.N + n, p.Dv);
      }
      const mla::QuantParams kq = quant_params(p, 0, 2, n), vq = quant_params(p, 1, 3, n);
      mla::write_cache_row(k.data(), p.Dk, kcache, ka, &kq);
      mla::write_cache_row(ckv_row, p.Dv, vcache, va, &vq);
    }
  });
}

template <typename T>
void run_caches(const KvRmsNormRopeParams& p) {
  if (p.k_int8 && p.v_int8) {
    run<T, int8_t, int8_t>(p);
  } else if (p.k_int8) {
    run<T, int8_t, T>(p);
  } else if (p.v_int8) {
    run<T, T, int8_t>(p);
  } else {
    run<T, T, T>(p);
  }
}

void kv_rms_norm_rope_cache_rows(const KvRmsNormRopeParams& p) {
  switch (p.dtype) {
    case c10::ScalarType::Float: return run_caches<float>(p);
    case c10::ScalarType::Double: return run_caches<double>(p);
    case c10::ScalarType::Half: return run_caches<c10::Half>(p);
    case c10::ScalarType::BFloat16: return run_caches<c10::BFloat16>(p);
    default: TORCH_CHECK(false, "kv_rms_norm_rope_cache: unsupported dtype ", p.dtype);
  }
}

}  // namespace

NPU_FA_REGISTER_ISA_KERNEL(kv_rms_norm_rope_cache_stub, kv_rms_norm_rope_cache_rows);

}  // namespace npu_fa::cpu::CPU_CAPABILITY
