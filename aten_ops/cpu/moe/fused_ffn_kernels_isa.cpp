// moe_ffn's passes, compiled three times by setup.py (-DCPU_CAPABILITY=DEFAULT|AVX2|AVX512) so the epilogues'
// at::vec::Vectorized<float> has that ISA's width; the products are oneDNN brgemm micro-kernels (JIT, ISA-chosen
// by oneDNN itself, AMX included).
//
// Passes (each one parallel region; rows are the (token, choice) pairs sorted by expert):
//   0. gather    xs[p] = x[token of p]                                  (dtype, zero-padded to Hp columns)
//   1. gate/up   h[p, block] = act(xs[p] · w13[e, block] + b13)         (fp32 tile -> epilogue -> dtype; SwiGLU takes
//                                                                        its gate and up halves from one tile)
//   2. down      y[p, block] = w(p) · (h[p] · w2[e, block] + b2)         (fp32)
//   3. combine   out[t] = sum_j y[pos(t, j)]                            (fixed j order)
// Work items of passes 1 and 2 are (expert, column block, row chunk of kFfnRows), the row chunk varying fastest so a
// thread keeps one B block in L2 across an expert's rows; each thread takes one contiguous run of items of about
// equal cost. An item's result does not depend on which thread runs it, so results are thread-count independent.
#include "cpu/moe/fused_ffn_kernels.h"
#include "cpu/brgemm.h"
#include "cpu/moe/activations.h"

#ifndef CPU_CAPABILITY
#error "this *_isa.cpp must be compiled with -DCPU_CAPABILITY=DEFAULT|AVX2|AVX512 (setup.py does this)"
#endif

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>
#include <c10/util/BFloat16.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <vector>

namespace npu_fa::cpu::CPU_CAPABILITY {
namespace {

using Vec = at::vec::Vectorized<float>;
using at::BFloat16;

using moe_act::activate;
using moe_act::sigmoid;

// c[m, kFfnBlock] = a[m, k] · b, b one packed block [k, kFfnBlock] (VNNI pairs of rows for bf16; cpu/brgemm.h).
template <typename T>
inline void mm_block(int64_t m, int64_t k, const T* a, int64_t lda, const T* b, float* c) {
  brgemm::mm(m, kFfnBlock, k, a, lda, b, kFfnBlock, c, kFfnBlock, false);
}

struct Item {
  int64_t e, block, r0, r1;
};

// Items (expert, block, row chunk), row chunks fastest.
std::vector<Item> make_items(const int64_t* off, int64_t experts, int64_t blocks) {
  std::vector<Item> items;
  for (int64_t e = 0; e < experts; ++e)
    for (int64_t b = 0; b < blocks; ++b)
      for (int64_t r = off[e]; r < off[e + 1]; r += kFfnRows) items.push_back({e, b, r, std::min(off[e + 1], r + kFfnRows)});
  return items;
}

// Runs fn(item) over the items: each thread one contiguous run of about equal rows (the cost of an item), then
// releases the brgemm hardware context it configured (AMX tiles) on that thread.
// A pass below kSerialMacs multiply-adds runs on the calling thread: waking the pool costs more than it saves.
constexpr int64_t kSerialMacs = int64_t(1) << 22;

template <typename Fn>
void run_items(const std::vector<Item>& items, int64_t k, bool vnni, const Fn& fn) {
  const int64_t n = int64_t(items.size());
  if (n == 0) return;
  int64_t rows = 0;
  for (const auto& it : items) rows += it.r1 - it.r0;
  if (rows * kFfnBlock * k < kSerialMacs) {
    for (const auto& it : items) fn(it);
    brgemm::release(vnni);
    return;
  }
  const int64_t threads = std::min<int64_t>(at::get_num_threads(), n);
  std::vector<int64_t> first(threads + 1, n);
  first[0] = 0;
  const int64_t total = rows;
  int64_t before = 0, owner = 0;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t cost = items[i].r1 - items[i].r0;
    const int64_t o = std::min(threads - 1, (2 * before + cost) * threads / (2 * total));
    while (owner < o) first[++owner] = i;
    before += cost;
  }
  at::parallel_for(0, threads, 1, [&](int64_t b, int64_t e) {
    for (int64_t th = b; th < e; ++th)
      for (int64_t i = first[th]; i < first[th + 1]; ++i) fn(items[i]);
    brgemm::release(vnni);
  });
}

// dst[0, n) = src as T (fp32 -> fp32 is a copy).
template <typename T>
inline void store(const float* src, T* dst, int64_t n) {
  at::vec::convert(src, dst, n);
}

// A bf16 block packed for VNNI products ([k/2][kFfnBlock][2]: rows 2q and 2q+1 interleaved) as the fp32 row-major
// [k, kFfnBlock] block of the fp32 product: the low half of each pair is row 2q, the high half row 2q+1; a bf16
// widens exactly by a 16-bit shift. k is even (moe_ffn_prepack pads K to an even count with a zero row).
inline void widen_vnni_block(const BFloat16* packed, int64_t k, float* dst) {
  const uint16_t* src = reinterpret_cast<const uint16_t*>(packed);
  for (int64_t q = 0; q < k / 2; ++q) {
    const uint16_t* pair = src + q * 2 * kFfnBlock;
    float* even = dst + 2 * q * kFfnBlock;
    float* odd = even + kFfnBlock;
    for (int64_t j = 0; j < kFfnBlock; ++j) {
      even[j] = c10::detail::f32_from_bits(pair[2 * j]);
      odd[j] = c10::detail::f32_from_bits(pair[2 * j + 1]);
    }
  }
}

// The B block of an item in the product's dtype C: the packed weights themselves, or (bf16 weights, fp32 products
// on CPUs without a bf16 micro-kernel) this thread's fp32 copy, widened once per block and pass (an expert's row
// chunks are consecutive items, so a thread keeps the copy across them). `pass` identifies the pass of this call:
// a block at the same address in another call may hold other weights.
template <typename T, typename C>
struct BlockOperand {
  std::vector<float> wide;
  const void* source = nullptr;
  uint64_t pass = 0;
  const C* get(const T* block, int64_t k, uint64_t this_pass) {
    if constexpr (std::is_same_v<T, C>) {
      return block;
    } else {
      // 64-byte aligned, as the packed weights are: brgemm's row loads would otherwise split cache lines. k is the
      // same for every block of a pass, so only a new pass can grow (and move) the storage, and a new pass widens.
      const int64_t pad = 64 / int64_t(sizeof(float));
      wide.resize(k * kFfnBlock + pad);
      float* aligned = wide.data() + (pad - (reinterpret_cast<uintptr_t>(wide.data()) % 64) / sizeof(float)) % pad;
      if (block != source || this_pass != pass) {
        widen_vnni_block(block, k, aligned);
        source = block;
        pass = this_pass;
      }
      return aligned;
    }
  }
};

// A fresh id per pass of every call (BlockOperand's cache key).
inline uint64_t next_pass() {
  static std::atomic<uint64_t> counter{0};
  return ++counter;
}

// Scratch of the calling thread, kept between calls up to kKeptScratch bytes: fresh pages of a new ~100 MB buffer
// per call (page faults and the kernel zeroing them) measured ~6% of a 4096-token call.
constexpr int64_t kKeptScratch = int64_t(512) << 20;
at::Tensor scratch(int64_t n) {
  if (n > kKeptScratch) return at::empty({n}, at::kByte);
  thread_local at::Tensor kept;
  if (!kept.defined() || kept.numel() < n) {
    kept = at::Tensor();  // free the smaller one first
    kept = at::empty({n}, at::kByte);
  }
  return kept;
}

// T: the dtype of x, the weights and the output; C: the dtype of the products (T, or fp32 for bf16 on CPUs
// without a bf16 micro-kernel: rows are widened while gathered, weight blocks per item, the intermediate stays fp32).
template <typename T, typename C = T>
void run(const FusedFfnParams& p) {
  constexpr bool kVnni = brgemm::kVnni<C>;
  const int64_t R = p.offsets[p.experts];
  const int64_t H = p.H, Hp = p.Hp, F = p.F, Fp = p.Fp;
  // Row strides off multiples of 4 KiB: brgemm reads several A rows at once, which would share cache sets.
  const int64_t ldx = Hp + 64 / int64_t(sizeof(C)), ldh = Fp + 64 / int64_t(sizeof(C));
  auto bytes = [](int64_t n) { return (n + 63) / 64 * 64; };
  const int64_t xs_bytes = bytes(R * ldx * int64_t(sizeof(C))), h_bytes = bytes(R * ldh * int64_t(sizeof(C)));
  const at::Tensor buf = scratch(xs_bytes + h_bytes + bytes(R * H * 4));
  char* base = static_cast<char*>(buf.data_ptr());
  C* xs = reinterpret_cast<C*>(base);
  C* hbuf = reinterpret_cast<C*>(base + xs_bytes);
  float* y = reinterpret_cast<float*>(base + xs_bytes + h_bytes);
  const T* x = static_cast<const T*>(p.x);
  const T* w13 = static_cast<const T*>(p.w13);
  const T* w2 = static_cast<const T*>(p.w2);

  // 0. gather (and the zero columns of the padding, which the products read).
  // Row copies: chunks of >= 256 KiB, so small calls stay on the calling thread.
  at::parallel_for(0, R, std::max<int64_t>(1, (int64_t(1) << 18) / std::max<int64_t>(H * int64_t(sizeof(T)), 1)),
                   [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const T* src = x + (p.order[r] / p.k) * H;
      if constexpr (std::is_same_v<T, C>) std::memcpy(xs + r * ldx, src, H * sizeof(T));
      else at::vec::convert(src, xs + r * ldx, H);
      std::fill(xs + r * ldx + H, xs + r * ldx + Hp, C(0));
      std::fill(hbuf + r * ldh + F, hbuf + r * ldh + Fp, C(0));
    }
  });

  // 1. gate/up with the activation epilogue.
  const uint64_t pass1 = next_pass(), pass2 = next_pass();
  const bool gated = p.act == kFfnSwiglu;
  const int64_t step = gated ? kFfnHalf : kFfnBlock;  // intermediate features per block
  run_items(make_items(p.offsets, p.experts, p.nb1), Hp, kVnni, [&](const Item& it) {
    alignas(64) float c[kFfnRows * kFfnBlock];
    alignas(64) float tmp[kFfnBlock];
    thread_local BlockOperand<T, C> w;
    const int64_t m = it.r1 - it.r0, f0 = it.block * step, n = std::min(step, F - f0);
    mm_block(m, Hp, xs + it.r0 * ldx, ldx, w.get(w13 + (it.e * p.nb1 + it.block) * Hp * kFfnBlock, Hp, pass1), c);
    const float* bias = p.b13 ? p.b13 + it.e * (gated ? 2 * F : F) : nullptr;
    for (int64_t r = 0; r < m; ++r) {
      const float* cr = c + r * kFfnBlock;
      for (int64_t i = 0; i < n; i += Vec::size()) {
        const int64_t w = std::min<int64_t>(Vec::size(), n - i);
        Vec v = Vec::loadu(cr + i, w);
        if (gated) {
          Vec u = Vec::loadu(cr + kFfnHalf + i, w);
          if (bias) {
            v = v + Vec::loadu(bias + f0 + i, w);
            u = u + Vec::loadu(bias + F + f0 + i, w);
          }
          v = v * sigmoid(v) * u;
        } else {
          if (bias) v = v + Vec::loadu(bias + f0 + i, w);
          v = activate(v, p.act);
        }
        v.store(tmp + i, w);
      }
      store(tmp, hbuf + (it.r0 + r) * ldh + f0, n);
    }
  });

  // 2. down projection, bias and the pair's combine weight.
  run_items(make_items(p.offsets, p.experts, p.nb2), Fp, kVnni, [&](const Item& it) {
    alignas(64) float c[kFfnRows * kFfnBlock];
    thread_local BlockOperand<T, C> w;
    const int64_t m = it.r1 - it.r0, h0 = it.block * kFfnBlock, n = std::min(kFfnBlock, H - h0);
    mm_block(m, Fp, hbuf + it.r0 * ldh, ldh, w.get(w2 + (it.e * p.nb2 + it.block) * Fp * kFfnBlock, Fp, pass2), c);
    const float* bias = p.b2 ? p.b2 + it.e * H + h0 : nullptr;
    for (int64_t r = 0; r < m; ++r) {
      const float* cr = c + r * kFfnBlock;
      float* yr = y + (it.r0 + r) * H + h0;
      const Vec s(p.pair_weight[p.order[it.r0 + r]]);
      for (int64_t i = 0; i < n; i += Vec::size()) {
        const int64_t w = std::min<int64_t>(Vec::size(), n - i);
        Vec v = Vec::loadu(cr + i, w);
        if (bias) v = v + Vec::loadu(bias + i, w);
        (v * s).store(yr + i, w);
      }
    }
  });

  // 3. combine: each token sums its k rows in choice order.
  T* out = static_cast<T*>(p.out);
  at::parallel_for(0, p.tokens, std::max<int64_t>(1, (int64_t(1) << 16) / std::max<int64_t>(H * p.k, 1)),
                   [&](int64_t t0, int64_t t1) {
    std::vector<float> acc(H);
    for (int64_t t = t0; t < t1; ++t) {
      const float* first = y + p.pos[t * p.k] * H;
      std::copy(first, first + H, acc.begin());
      for (int64_t j = 1; j < p.k; ++j) {
        const float* yr = y + p.pos[t * p.k + j] * H;
        at::vec::map2([](Vec a, Vec b) { return a + b; }, acc.data(), acc.data(), yr, H);
      }
      store(acc.data(), out + t * H, H);
    }
  });
}

}  // namespace

void fused_ffn(const FusedFfnParams& p) {
  switch (p.dtype) {
    case c10::ScalarType::Float: return run<float>(p);
    case c10::ScalarType::BFloat16:
      if (brgemm_usable(c10::ScalarType::BFloat16)) return run<BFloat16>(p);
      return run<BFloat16, float>(p);  // no bf16 micro-kernel here: fp32 products on widened operands
    default: TORCH_CHECK(false, "moe_ffn: no brgemm kernel for dtype ", p.dtype);
  }
}

NPU_FA_REGISTER_ISA_KERNEL(fused_ffn_stub, fused_ffn);

}  // namespace npu_fa::cpu::CPU_CAPABILITY
