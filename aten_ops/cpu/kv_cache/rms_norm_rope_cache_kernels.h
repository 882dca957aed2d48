// The row loop of kv_rms_norm_rope_cache (cpu/kv_cache/rms_norm_rope_cache.cpp), compiled once per instruction set by
// cpu/kv_cache/rms_norm_rope_cache_kernels_isa.cpp so the row functions of cpu/mla/latent_rows.h run at the CPU's
// vector width. The entry point validates the arguments and resolves the index into one slot per token first.
#pragma once

#include <c10/core/ScalarType.h>

#include <cstdint>

#include "cpu/isa_dispatch.h"

namespace npu_fa::cpu {

enum class LatentCacheAddr : int {
  kNorm = 0,     // caches [B, N, cache_len, D], slot = position in the batch's rows
  kPagedNd = 1,  // caches [blocks, block_size, N, D], slot = block * block_size + offset
  kPagedNz = 2,  // caches stored [blocks, D / d0, block_size, d0] (N = 1)
};

struct KvRmsNormRopeParams {
  c10::ScalarType dtype;  // of kv, cos, sin, v, k_rope, c_kv (gamma is given in its accumulation type)
  bool k_int8 = false, v_int8 = false, has_v = false;
  int64_t B = 0, N = 0, S = 0, D = 0;
  int64_t Dr = 0, Dn = 0, Dk = 0, Dv = 0;  // rope width, RMSNorm width, k_cache row, ckv_cache row
  int64_t cB = 1, cN = 1, cS = 1;         // cos/sin [cB, cN, cS, Dr] (1 = broadcast)
  LatentCacheAddr addr = LatentCacheAddr::kNorm;
  int64_t cache_len = 0, block_size = 0, kd0 = 0, vd0 = 0;
  double eps = 0;
  const void* kv = nullptr;
  const void* gamma = nullptr;  // float (double for double kv), [Dn]
  const void* cos = nullptr;
  const void* sin = nullptr;
  const void* v = nullptr;
  void* k_rope = nullptr;
  void* c_kv = nullptr;
  void* k_cache = nullptr;
  void* ckv_cache = nullptr;
  const int64_t* slots = nullptr;  // [B * S], -1 = not written
  // k_rope_scale, c_kv_scale, k_rope_offset, c_kv_offset: fp32 [rows, cols] (rows 1 or N, cols 1 or the row
  // length), nullptr when not given.
  const float* quant[4] = {nullptr, nullptr, nullptr, nullptr};
  int64_t quant_rows[4] = {1, 1, 1, 1}, quant_cols[4] = {1, 1, 1, 1};
};

NPU_FA_DECLARE_ISA_STUB(kv_rms_norm_rope_cache_stub, void (*)(const KvRmsNormRopeParams&));

}  // namespace npu_fa::cpu
