// The rotary row loops for one instruction set (see rope_kernels.h). Every mode reduces to one rotation of two runs
// of n values, oa = a * ca - b * sa, ob = b * cb + a * sb: the halves (half), the quarters of each half (quarter), or
// the even and odd elements (interleave, interleave-half), which at::vec's deinterleave2 separates in registers.
// Rows are converted to the accumulation type once, rotated, and converted back.
#include "cpu/rope/rope_kernels.h"

#ifndef CPU_CAPABILITY
#error "this *_isa.cpp must be compiled with -DCPU_CAPABILITY=DEFAULT|AVX2|AVX512 (setup.py does this)"
#endif

#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/cpu/vec/vec.h>

#include <algorithm>
#include <type_traits>
#include <utility>
#include <vector>

namespace npu_fa::cpu::CPU_CAPABILITY {

namespace {

template <typename T>
using acc_of = std::conditional_t<std::is_same_v<T, double>, double, float>;

// Rows (or tokens) per task of at::parallel_for: about 16K values.
int64_t grain(int64_t values_per_item) {
  return std::max<int64_t>(1, (int64_t{1} << 14) / std::max<int64_t>(values_per_item, 1));
}

// oa = a * ca - b * sa, ob = b * cb + a * sb over n values (outputs may not alias inputs).
template <typename A>
void rotate(const A* a, const A* b, const A* ca, const A* sa, const A* cb, const A* sb, A* oa, A* ob, int64_t n) {
  using Vec = at::vec::Vectorized<A>;
  int64_t k = 0;
  for (; k + Vec::size() <= n; k += Vec::size()) {
    const Vec va = Vec::loadu(a + k), vb = Vec::loadu(b + k);
    (va * Vec::loadu(ca + k) - vb * Vec::loadu(sa + k)).store(oa + k);
    (vb * Vec::loadu(cb + k) + va * Vec::loadu(sb + k)).store(ob + k);
  }
  for (; k < n; ++k) {
    oa[k] = a[k] * ca[k] - b[k] * sa[k];
    ob[k] = b[k] * cb[k] + a[k] * sb[k];
  }
}

// even[i] = v[2i], odd[i] = v[2i + 1] for i < n.
template <typename A>
void deinterleave(const A* v, A* even, A* odd, int64_t n) {
  using Vec = at::vec::Vectorized<A>;
  int64_t i = 0;
  for (; i + Vec::size() <= n; i += Vec::size()) {
    const auto eo = at::vec::deinterleave2(Vec::loadu(v + 2 * i), Vec::loadu(v + 2 * i + Vec::size()));
    eo.first.store(even + i);
    eo.second.store(odd + i);
  }
  for (; i < n; ++i) {
    even[i] = v[2 * i];
    odd[i] = v[2 * i + 1];
  }
}

// v[2i] = even[i], v[2i + 1] = odd[i] for i < n.
template <typename A>
void interleave(const A* even, const A* odd, A* v, int64_t n) {
  using Vec = at::vec::Vectorized<A>;
  int64_t i = 0;
  for (; i + Vec::size() <= n; i += Vec::size()) {
    const auto pair = at::vec::interleave2(Vec::loadu(even + i), Vec::loadu(odd + i));
    pair.first.store(v + 2 * i);
    pair.second.store(v + 2 * i + Vec::size());
  }
  for (; i < n; ++i) {
    v[2 * i] = even[i];
    v[2 * i + 1] = odd[i];
  }
}

// One row of D values in A: x (input), out (result) and 6 * D / 2 values of scratch.
template <typename A>
void rotate_row(const A* x, const A* c, const A* s, int64_t D, int64_t mode, A* out, A* scratch) {
  const int64_t h = D / 2;
  switch (mode) {
    case 0:  // halves
      rotate(x, x + h, c, s, c + h, s + h, out, out + h, h);
      break;
    case 2:  // the quarters of each half
      for (const int64_t base : {int64_t{0}, h}) {
        const int64_t q = h / 2;
        rotate(x + base, x + base + q, c + base, s + base, c + base + q, s + base + q, out + base, out + base + q, q);
      }
      break;
    case 1: {  // pairs (2i, 2i + 1), cos/sin per element
      A *a = scratch, *b = a + h, *ce = b + h, *co = ce + h, *se = co + h, *so = se + h;
      deinterleave(x, a, b, h);
      deinterleave(c, ce, co, h);
      deinterleave(s, se, so, h);
      rotate(a, b, ce, se, co, so, ce, co, h);  // ce/co now hold the even/odd results
      interleave(ce, co, out, h);
      break;
    }
    default: {  // 3: y = cat(x[0::2], x[1::2]) rotated by halves, output in y's order
      A *a = scratch, *b = a + h;
      deinterleave(x, a, b, h);
      rotate(a, b, c, s, c + h, s + h, out, out + h, h);
      break;
    }
  }
}

template <typename T>
void rows_kernel(const RopeRowsParams& p) {
  using A = acc_of<T>;
  const int64_t D = p.D;
  const T* src = static_cast<const T*>(p.src);
  T* dst = static_cast<T*>(p.dst);
  const A* cp = static_cast<const A*>(p.cos);
  const A* sp = static_cast<const A*>(p.sin);
  at::parallel_for(0, p.rows, grain(D), [&](int64_t r0, int64_t r1) {
    std::vector<A> buf(5 * D);  // x, out, and 3 * D of scratch
    A *x = buf.data(), *out = x + D, *scratch = out + D;
    for (int64_t r = r0; r < r1; ++r) {
      at::vec::convert(src + r * D, x, D);
      rotate_row(x, cp + p.cos_off[r], sp + p.sin_off[r], D, p.mode, out, scratch);
      at::vec::convert(out, dst + r * D, D);
    }
  });
}

// C: the table's element type (T or A). The table can be large (vLLM keeps every position of the context), so only
// the rows of the batch's positions are converted, per token.
template <typename T, typename C>
void cache_kernel(const RopeCacheParams& p) {
  using A = acc_of<T>;
  const int64_t T_ = p.tokens, rot = p.rot, half = rot / 2, heads = p.heads, hs = p.head_size;
  T* xp = static_cast<T*>(p.x);
  const C* tab = static_cast<const C*>(p.table);
  at::parallel_for(0, T_, std::max<int64_t>(1, grain(hs) / std::max<int64_t>(heads, 1)), [&](int64_t t0, int64_t t1) {
    std::vector<A> buf(8 * half);  // cos, sin (multimodal sections: half each), x, out, pair (rot each)
    A *cg = buf.data(), *sg = cg + half, *x = sg + half, *out = x + rot, *pair = out + rot;
    for (int64_t t = t0; t < t1; ++t) {
      const A *c = cg, *s = sg;
      if (p.one_row) {  // all columns from the token's position row
        const C* row = tab + p.pos[t] * rot;
        if constexpr (std::is_same_v<C, A>) {  // read in place
          c = row;
          s = row + half;
        } else {
          at::vec::convert(row, cg, half);
          at::vec::convert(row + half, sg, half);
        }
      } else {  // multimodal sections: column j from its section's position row
        for (int64_t j = 0; j < half; ++j) {
          const C* row = tab + p.pos[p.row_of[j] * T_ + t] * rot;
          cg[j] = static_cast<A>(row[j]);
          sg[j] = static_cast<A>(row[half + j]);
        }
      }
      for (int64_t h = 0; h < heads; ++h) {
        T* v = xp + (t * heads + h) * hs;
        at::vec::convert(v, x, rot);
        const A* result = out;
        if (p.neox) {
          rotate(x, x + half, c, s, c, s, out, out + half, half);
        } else {  // GPT-J pairs (2k, 2k + 1) share column k's cos/sin
          deinterleave(x, pair, pair + half, half);
          rotate(pair, pair + half, c, s, c, s, out, out + half, half);
          interleave(out, out + half, x, half);
          result = x;
        }
        at::vec::convert(result, v, rot);
      }
    }
  });
}

void rope_rows(const RopeRowsParams& p) {
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, p.dtype, "rope_rows", [&] { rows_kernel<scalar_t>(p); });
}

void rope_cache(const RopeCacheParams& p) {
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, p.dtype, "rope_cache", [&] {
    if (p.table_dtype == p.dtype) {
      cache_kernel<scalar_t, scalar_t>(p);
    } else {
      TORCH_INTERNAL_ASSERT(p.table_dtype == c10::CppTypeToScalarType<acc_of<scalar_t>>::value);
      cache_kernel<scalar_t, acc_of<scalar_t>>(p);
    }
  });
}

}  // namespace

NPU_FA_REGISTER_ISA_KERNEL(rope_rows_stub, rope_rows);
NPU_FA_REGISTER_ISA_KERNEL(rope_cache_stub, rope_cache);

}  // namespace npu_fa::cpu::CPU_CAPABILITY
