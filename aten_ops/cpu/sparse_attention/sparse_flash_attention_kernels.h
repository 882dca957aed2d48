// The sparse flash attention kernels' shared pieces (cpu/sparse_attention/sparse_flash_attention.cpp): how cache rows
// are read (CacheView, load_row, used by the forward and the backward), and the forward's entry, compiled once per
// instruction set by sparse_flash_attention_kernels_isa.cpp so its softmax and conversions run at the CPU's vector
// width. load_row lives in npu_fa::cpu::CPU_CAPABILITY: inline functions compiled with different instruction sets
// must not be merged by the linker.
#pragma once

#include <c10/core/ScalarType.h>
#include <c10/util/Float8_e4m3fn.h>

#include <cstdint>
#include <cstring>

#include "common/sparse_attention/sparse_flash_attention_params.h"
#include "cpu/isa_dispatch.h"
#include "cpu/vec_convert.h"

namespace npu_fa::cpu {

// How the cache rows of one call are read: the latent part (and rope) of key, and value.
struct CacheView {
  int64_t N2 = 1, Dn = 0, Dr = 0, Dv = 0;  // K̃ = [latent (Dn), rope (Dr)]; Ṽ of Dv
  bool value_is_key = false;               // Ṽ = the latent columns of K̃ (MLA: the same cache)
  // floating caches (contiguous [rows, N2, D])
  const void* key = nullptr;
  const void* key_rope = nullptr;
  const void* value = nullptr;
  // quantised cache rows: [latent int8 / fp8 (Dn bytes), rope (Dr * esize bytes), Dn / tile float32 scales]
  const uint8_t* qkey = nullptr;
  int64_t row_bytes = 0, tile = 1;
  bool fp8 = false;
  // Round the dequantised latent and the probabilities P to the query's dtype before the products, as upstream's
  // golden for the quantised op does (its products take 16-bit operands).
  bool input_precision = false;
};

// The forward (sparse_flash_attention, kv_quant_sparse_flash_attention): per query row t and KV head n2, the G
// query heads of that KV head attend to the rows geo->select(t, n2) picks:
//   out = softmax(scale · Q K̃ᵀ) Ṽ, the softmax's running max and sum (with the sink term when sinks are given).
struct SfaForwardParams {
  const sparse_attention::SfaGeometry* geo = nullptr;
  CacheView cv;
  c10::ScalarType dtype = c10::ScalarType::Float;  // query's (scalar_t; the accumulation type is float, or double)
  const void* q = nullptr;   // [T1, N1, Dq] scalar_t: the latent part of each head (and its rope part when qr is null)
  const void* qr = nullptr;  // [T1, N1, Dr] scalar_t or nullptr
  int64_t Dq = 0;            // q's last size
  void* out = nullptr;       // [T1, N1, Dv] scalar_t
  void* smax = nullptr;      // statistics in the accumulation type, or nullptr (not returned)
  void* ssum = nullptr;
  const void* sinks = nullptr;  // [N1] in the accumulation type, or nullptr
};

NPU_FA_DECLARE_ISA_STUB(sparse_flash_attention_forward_stub, void (*)(const SfaForwardParams&));

}  // namespace npu_fa::cpu

namespace npu_fa::cpu::CPU_CAPABILITY {

// Fills K̃ row (Dn + Dr values) and, when not shared, Ṽ row (Dv values) of cache row r, head n2, in the
// accumulation type acc_t.
template <typename scalar_t, typename acc_t>
inline void load_row(const CacheView& cv, int64_t r, int64_t n2, acc_t* krow, acc_t* vrow) {
  const int64_t e = r * cv.N2 + n2;
  if (cv.qkey != nullptr) {
    const uint8_t* row = cv.qkey + e * cv.row_bytes;
    const uint8_t* sc = row + cv.Dn + cv.Dr * static_cast<int64_t>(sizeof(scalar_t));
    for (int64_t t0 = 0; t0 < cv.Dn; t0 += cv.tile) {
      float s;
      std::memcpy(&s, sc + (t0 / cv.tile) * 4, 4);
      for (int64_t d = t0; d < t0 + cv.tile; ++d) {
        const float x = cv.fp8 ? static_cast<float>(c10::Float8_e4m3fn(row[d], c10::Float8_e4m3fn::from_bits()))
                               : static_cast<float>(static_cast<int8_t>(row[d]));
        const float y = x * s;
        krow[d] = cv.input_precision ? static_cast<acc_t>(static_cast<scalar_t>(y)) : static_cast<acc_t>(y);
      }
    }
    for (int64_t d = 0; d < cv.Dr; ++d) {
      scalar_t x;
      std::memcpy(&x, row + cv.Dn + d * sizeof(scalar_t), sizeof(scalar_t));
      krow[cv.Dn + d] = static_cast<acc_t>(x);
    }
    return;
  }
  to_acc(static_cast<const scalar_t*>(cv.key) + e * cv.Dn, cv.Dn, krow);
  if (cv.Dr > 0) to_acc(static_cast<const scalar_t*>(cv.key_rope) + e * cv.Dr, cv.Dr, krow + cv.Dn);
  if (!cv.value_is_key) to_acc(static_cast<const scalar_t*>(cv.value) + e * cv.Dv, cv.Dv, vrow);
}

}  // namespace npu_fa::cpu::CPU_CAPABILITY
