// The NZ form of a paged KV cache, as CANN's attention kernels and vLLM-Ascend's int8 caches hold it:
//   (num_blocks, N2, D / c0, block_size, c0),  c0 = 32 bytes of elements (32 int8, 16 fp16/bf16, 8 fp32),
// so value d of key row (block, n2, offset) lies at [block, n2, d / c0, offset, d % c0] (docs/kv_cache.md "NZ
// layout"). A block's keys of one head are D / c0 contiguous runs of block_size * c0 values, one per piece of the
// head dim. The kernels read such caches in place: the rows of a tile are assembled from the pieces in L1.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>

#include <cstdint>
#include <cstring>

namespace npu_fa::attention {

constexpr int64_t kNzBytes = 32;  // bytes per piece of the head dim

inline bool is_nz_cache(const at::Tensor& cache) { return cache.dim() == 5; }

// Element strides of a validated NZ cache: block, head, piece (c0 values of the head dim), row within the block.
struct NzStrides {
  int64_t c0, blk, head, piece, seq;
};

// Checks that `cache` is the NZ form of N2 heads of head dim D in blocks of block_size keys; errors name `name`.
inline NzStrides nz_strides(const char* op, const char* name, const at::Tensor& cache, int64_t n2, int64_t D,
                            int64_t block_size) {
  const int64_t es = static_cast<int64_t>(cache.element_size());
  const int64_t c0 = kNzBytes / es;
  TORCH_CHECK_VALUE(D % c0 == 0, op, ": argument '", name, "' is an NZ cache (5-D) of ", cache.scalar_type(),
                    ", whose head dim is stored in pieces of ", c0, " values (32 bytes); the head dim D = ", D,
                    " is not a multiple of ", c0);
  TORCH_CHECK_VALUE(cache.size(1) == n2 && cache.size(2) == D / c0 && cache.size(3) == block_size &&
                        cache.size(4) == c0,
                    op, ": argument '", name, "' is an NZ cache (5-D) and must have shape (num_blocks, N2=", n2,
                    ", D/", c0, "=", D / c0, ", block_size=", block_size, ", ", c0, ") for ", cache.scalar_type(),
                    " values (32 bytes per piece); got ", cache.sizes());
  TORCH_CHECK_VALUE(cache.stride(4) == 1 && cache.stride(3) == c0, op, ": argument '", name,
                    "' (an NZ cache) needs its last two dims contiguous; got strides ", cache.strides());
  return {c0, cache.stride(0), cache.stride(1), cache.stride(2), cache.stride(3)};
}

// Rows [0, n) of D values assembled from NZ pieces into dst (row x at dst + x * D): piece c of row x (c0 values) is
// at first + c * piece + x * row_stride (c0 for consecutive rows of one block). The copy through which the decode,
// prefill and MLA kernels read a tile of an NZ cache as rows; each piece is one 32-byte move.
template <typename T>
inline void nz_rows_to_nd(const T* first, int64_t piece, int64_t row_stride, int64_t c0, int64_t n, int64_t D,
                          T* dst) {
  for (int64_t c = 0; c < D / c0; ++c) {
    const T* run = first + c * piece;
    for (int64_t x = 0; x < n; ++x) std::memcpy(dst + x * D + c * c0, run + x * row_stride, c0 * sizeof(T));
  }
}

}  // namespace npu_fa::attention
