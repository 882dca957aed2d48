// Row functions of the MLA latent path, shared by kv_rms_norm_rope_cache and mla_prolog:
//   rms_norm_row         RMSNorm of one row (accumulation in A = float, or double for double rows), from
//                        cpu/norm/rms_norm_row.h
//   interleave_rope_row  npu_interleave_rope of one row: de-interleave the pairs, then rotate-half with cos/sin
//   write_cache_row      one row into a cache slot: dtype conversion, or int8 quantisation with scale/offset,
//                        contiguous (ND) or cut into chunks (the FRACTAL_NZ index layout)
// Everything is in A-typed buffers between the steps, so a row is rounded once, when it is written.
//
// The functions are templates in an inline namespace named after the including file's CPU_CAPABILITY (as at::vec):
// a per-ISA file (*_isa.cpp) gets SIMD of its ISA width, any other file the portable at::vec code, and copies built
// with different flags never share a symbol.
#pragma once

#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "cpu/norm/rms_norm_row.h"

namespace npu_fa::mla {
inline namespace CPU_CAPABILITY {

// The row routines of RMSNorm (and the accumulation type and row conversion) are the norm family's
// (cpu/norm/rms_norm_row.h), shared with every RMSNorm of the CPU kernels.
using norm::acc_of;
using norm::load_row;
using norm::rms_norm_row;

namespace detail {

// W values of p as a vector of A (converted through tmp when C is another type).
template <typename C, typename A>
inline at::vec::Vectorized<A> load_vec(const C* p, A* tmp) {
  if constexpr (std::is_same_v<C, A>) {
    return at::vec::Vectorized<A>::loadu(p);
  } else {
    load_row(p, at::vec::Vectorized<A>::size(), tmp);
    return at::vec::Vectorized<A>::loadu(tmp);
  }
}

}  // namespace detail

// npu_interleave_rope of one row of d (even) values:
//   q = [x0, x2, ..., x_{d-2}, x1, x3, ..., x_{d-1}]  (reshape [d/2, 2], transpose, flatten)
//   out = q * cos + rotate_half(q) * sin,  rotate_half(q) = [-q_{d/2..d-1}, q_{0..d/2-1}]
// cos/sin are the row's d values (any floating type C). out must not alias x.
template <typename T, typename C, typename A>
inline void interleave_rope_row(const T* x, const C* cos, const C* sin, int64_t d, A* out) {
  using Vec = at::vec::Vectorized<A>;
  constexpr int64_t W = Vec::size();
  const int64_t h = d / 2;
  int64_t i = 0;
  A xa[2 * W], tmp[W];
  for (; i + W <= h; i += W) {  // q[i..i+W) = x[2i], x[2i+2], ...; q[h+i..h+i+W) = x[2i+1], x[2i+3], ...
    load_row(x + 2 * i, 2 * W, xa);
    const auto eo = at::vec::deinterleave2(Vec::loadu(xa), Vec::loadu(xa + W));
    const Vec& a = eo.first;
    const Vec& b = eo.second;
    (a * detail::load_vec(cos + i, tmp) - b * detail::load_vec(sin + i, tmp)).store(out + i);
    (b * detail::load_vec(cos + h + i, tmp) + a * detail::load_vec(sin + h + i, tmp)).store(out + h + i);
  }
  for (; i < h; ++i) {
    const A a = static_cast<A>(x[2 * i]), b = static_cast<A>(x[2 * i + 1]);  // q[i], q[h + i]
    out[i] = a * static_cast<A>(cos[i]) - b * static_cast<A>(sin[i]);
    out[h + i] = b * static_cast<A>(cos[h + i]) + a * static_cast<A>(sin[h + i]);
  }
}

// Where the n values of a cache row live, relative to the row's first element: value j at
// (j / chunk) * chunk_stride + j % chunk. A contiguous row is chunk == chunk_stride == n.
struct RowLayout {
  int64_t chunk;
  int64_t chunk_stride;
};

inline RowLayout contiguous_row(int64_t n) { return {n, n}; }

struct RowAddr {
  int64_t offset;  // element offset of value 0 in the cache
  RowLayout layout;
};

// Slot `slot` (= block * block_size + position) of a paged cache of rows of n values:
//   ND  [num_blocks, block_size, n]: the row is contiguous at slot * n;
//   NZ  [num_blocks, n / d0, block_size, d0]: chunk c of the row sits at [block, c, position, :].
inline RowAddr paged_row_nd(int64_t slot, int64_t n) { return {slot * n, contiguous_row(n)}; }

inline RowAddr paged_row_nz(int64_t slot, int64_t block_size, int64_t n, int64_t d0) {
  const int64_t block = slot / block_size, pos = slot % block_size;
  return {block * block_size * n + pos * d0, {d0, block_size * d0}};
}

// The NZ chunk of a cache dtype: 32 bytes (16 fp16/bf16 values, 32 int8 values, 8 fp32 values).
inline int64_t nz_chunk(int64_t itemsize) { return 32 / itemsize; }

// int8 quantisation of a row: q[j] = clamp(round_half_even(v[j] * scale[j * scale_stride]
//                                          + offset[j * offset_stride]), -128, 127);
// stride 0 broadcasts one value (per-tensor), 1 is per channel; offset nullptr = symmetric.
struct QuantParams {
  const float* scale = nullptr;
  int64_t scale_stride = 0;
  const float* offset = nullptr;
  int64_t offset_stride = 0;
};

namespace detail {

template <typename A>
inline void quantize_run(const A* v, int64_t n, const QuantParams& q, int64_t j0, int8_t* dst) {
  // j0: index of v[0] in the row, for the per-channel scale/offset.
  for (int64_t j = 0; j < n; ++j) {
    A s = static_cast<A>(q.scale[(j0 + j) * q.scale_stride]);
    A y = v[j] * s;
    if (q.offset != nullptr) y += static_cast<A>(q.offset[(j0 + j) * q.offset_stride]);
    y = std::nearbyint(y);  // round half to even under the default rounding mode, as torch.round
    y = std::min<A>(std::max<A>(y, A(-128)), A(127));
    dst[j] = static_cast<int8_t>(y);
  }
}

// Vectorised form for float rows (per-channel or per-tensor scale and offset).
inline void quantize_run(const float* v, int64_t n, const QuantParams& q, int64_t j0, int8_t* dst) {
  using Vec = at::vec::Vectorized<float>;
  constexpr int64_t W = Vec::size();
  const auto load = [](const float* p, int64_t stride, int64_t j) { return stride == 0 ? Vec(p[0]) : Vec::loadu(p + j); };
  const Vec lo(-128.f), hi(127.f);
  alignas(64) float buf[W];
  int64_t j = 0;
  for (; j + W <= n; j += W) {
    Vec y = Vec::loadu(v + j) * load(q.scale, q.scale_stride, j0 + j);
    if (q.offset != nullptr) y = y + load(q.offset, q.offset_stride, j0 + j);
    at::vec::clamp(y.round(), lo, hi).store(buf);
    for (int64_t k = 0; k < W; ++k) dst[j + k] = static_cast<int8_t>(buf[k]);
  }
  quantize_run<float>(v + j, n - j, q, j0 + j, dst + j);
}

}  // namespace detail

// Writes the n values v (A) of one row at cache + addr.offset in addr.layout. Out is the cache dtype: int8_t caches
// quantise with *quant (required for them, ignored otherwise); float/double/Half/BFloat16 caches convert
// (round to nearest even for the 16-bit types).
template <typename A, typename Out>
inline void write_cache_row(const A* v, int64_t n, Out* cache, const RowAddr& addr,
                            const QuantParams* quant = nullptr) {
  Out* dst = cache + addr.offset;
  const int64_t chunk = addr.layout.chunk > 0 ? addr.layout.chunk : n;
  for (int64_t j0 = 0; j0 < n; j0 += chunk) {
    const int64_t len = std::min(chunk, n - j0);
    Out* d = dst + (j0 / chunk) * addr.layout.chunk_stride;
    if constexpr (std::is_same_v<Out, int8_t>) {
      detail::quantize_run(v + j0, len, *quant, j0, d);
    } else {
      load_row(v + j0, len, d);
    }
  }
}

}  // namespace CPU_CAPABILITY
}  // namespace npu_fa::mla
