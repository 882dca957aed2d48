// Host program (CANN CPU-debug style: GmAlloc, SetKernelMode(AIV_MODE), ICPU_RUN_KF) for the decode-attention
// kernel, checked against a float64 reference computed here from the same (rounded) inputs. Covers fp16/bf16/fp32,
// contiguous caches with row stride N2*D (BSH/BSND) and D (BNSD), paged caches in both layouts with block sizes 16
// and 128, ragged lengths (0, 1, tails of tiles and blocks), kv padding, GQA groups 1/2/4 and chunked groups, D not
// a multiple of 32 bytes, and split-KV (automatic and forced). Prints one line per case; reports through test_main.h.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "tikicpulib.h"
#include "inference/incre_flash_attention_tiling.h"
#include "test_main.h"
#include "inference/incre_flash_attention_kernel.h"

using namespace tot_ascendc;

namespace {

struct Case {
  const char* name;
  DecodeDtype dtype;
  uint32_t B, N1, N2, D;
  bool paged;
  bool head_major;          // BNSD cache: rows of one head contiguous
  uint32_t block_size;      // paged
  uint32_t capacity;        // contiguous S, or paged max_blocks*block_size
  std::vector<uint32_t> lens;
  uint32_t pad = 0;         // kv_padding_size (contiguous)
  uint32_t force_splits = 0;
};

template <typename T>
bool RunTyped(const Case& c) {
  std::mt19937 rng(1234 + c.B * 7 + c.D);
  std::normal_distribution<float> nd(0.f, 1.f);
  const uint32_t G = c.N1 / c.N2, bs = c.block_size;
  const uint32_t max_blocks = c.paged ? c.capacity / bs : 1;
  const uint32_t num_blocks = c.paged ? c.B * max_blocks + 3 : 0;
  const uint64_t kv_elems = c.paged ? uint64_t(num_blocks) * bs * c.N2 * c.D : uint64_t(c.B) * c.capacity * c.N2 * c.D;
  const uint64_t q_elems = uint64_t(c.B) * c.N1 * c.D;
  T* q = (T*)AscendC::GmAlloc(q_elems * sizeof(T));
  T* k = (T*)AscendC::GmAlloc(kv_elems * sizeof(T));
  T* v = (T*)AscendC::GmAlloc(kv_elems * sizeof(T));
  T* out = (T*)AscendC::GmAlloc(q_elems * sizeof(T));
  int32_t* table = (int32_t*)AscendC::GmAlloc(std::max<uint64_t>(1, uint64_t(c.B) * max_blocks) * 4);
  int32_t* seq = (int32_t*)AscendC::GmAlloc(uint64_t(c.B) * 2 * 4);
  for (uint64_t i = 0; i < q_elems; ++i) q[i] = T(nd(rng));
  for (uint64_t i = 0; i < kv_elems; ++i) { k[i] = T(nd(rng)); v[i] = T(nd(rng)); }
  // Paged: a shuffled permutation of physical blocks.
  std::vector<int32_t> perm(num_blocks);
  for (uint32_t i = 0; i < num_blocks; ++i) perm[i] = int32_t(i);
  std::shuffle(perm.begin(), perm.end(), rng);
  for (uint64_t i = 0; i < uint64_t(c.B) * max_blocks; ++i) table[i] = c.paged ? perm[i] : 0;
  for (uint32_t b = 0; b < c.B; ++b) {
    seq[2 * b] = int32_t(c.paged ? 0 : c.capacity - c.pad - c.lens[b]);
    seq[2 * b + 1] = int32_t(c.lens[b]);
  }
  DecodeShape s;
  s.batch = c.B; s.q_heads = c.N1; s.kv_heads = c.N2; s.head_dim = c.D; s.dtype = c.dtype; s.paged = c.paged;
  s.block_size = bs; s.max_blocks = max_blocks; s.seq_capacity = c.capacity; s.kv_elems = kv_elems;
  s.scale = 1.f / std::sqrt(float(c.D)); s.force_splits = c.force_splits;
  const uint32_t rows_per_blk = c.paged ? bs : c.capacity;
  if (c.head_major) { s.k_seq = c.D; s.k_head = uint64_t(rows_per_blk) * c.D; s.k_blk = s.k_head * c.N2; }
  else { s.k_seq = uint64_t(c.N2) * c.D; s.k_head = c.D; s.k_blk = uint64_t(rows_per_blk) * c.N2 * c.D; }
  IncreFlashAttentionTiling t;
  const std::string err = IncreFlashAttentionTilingFn(s, Ascend910B(), t);
  if (!err.empty()) { std::printf("FAIL %s: tiling: %s\n", c.name, err.c_str()); return false; }
  uint8_t* tiling = (uint8_t*)AscendC::GmAlloc(sizeof(t));
  std::memcpy(tiling, &t, sizeof(t));
  uint8_t* ws = (uint8_t*)AscendC::GmAlloc(std::max<uint64_t>(32, t.workspace_bytes));
  AscendC::SetKernelMode(AscendC::KernelMode::AIV_MODE);
  try {
    ICPU_RUN_KF(incre_flash_attention, t.block_dim, (uint8_t*)q, (uint8_t*)k, (uint8_t*)v, (uint8_t*)table,
                (uint8_t*)seq, (uint8_t*)out, ws, tiling);
  } catch (const std::exception& e) {
    std::printf("FAIL %s: kernel: %s\n", c.name, e.what());
    return false;
  }
  // float64 reference on the rounded inputs.
  double worst = 0, ref_max = 0;
  for (uint32_t b = 0; b < c.B; ++b)
    for (uint32_t n1 = 0; n1 < c.N1; ++n1) {
      const uint32_t n2 = n1 / G, len = c.lens[b];
      std::vector<double> sc(len), o(c.D, 0.0);
      double mx = -INFINITY, sum = 0;
      auto row = [&](uint32_t j) {
        uint64_t blk, r;
        if (c.paged) { blk = uint64_t(table[b * max_blocks + j / bs]); r = j % bs; }
        else { blk = b; r = seq[2 * b] + j; }
        return blk * s.k_blk + n2 * s.k_head + r * s.k_seq;
      };
      for (uint32_t j = 0; j < len; ++j) {
        double d = 0;
        for (uint32_t x = 0; x < c.D; ++x) d += double(float(q[(uint64_t(b) * c.N1 + n1) * c.D + x])) * double(float(k[row(j) + x]));
        sc[j] = d * s.scale;
        mx = std::max(mx, sc[j]);
      }
      for (uint32_t j = 0; j < len; ++j) { sc[j] = std::exp(sc[j] - mx); sum += sc[j]; }
      for (uint32_t j = 0; j < len; ++j)
        for (uint32_t x = 0; x < c.D; ++x) o[x] += sc[j] / sum * double(float(v[row(j) + x]));
      for (uint32_t x = 0; x < c.D; ++x) {
        const double got = double(float(out[(uint64_t(b) * c.N1 + n1) * c.D + x]));
        worst = std::max(worst, std::fabs(got - o[x]));
        ref_max = std::max(ref_max, std::fabs(o[x]));
        if (len == 0 && got != 0.0) worst = INFINITY;
        if (std::isnan(got)) worst = INFINITY;
      }
    }
  // Tolerance: a few roundings of the output dtype on values of size ref_max, plus fp32 accumulation.
  const double eps = c.dtype == DecodeDtype::FP32 ? 1.2e-7 : c.dtype == DecodeDtype::FP16 ? 9.8e-4 : 7.8e-3;
  const double tol = 2 * eps * std::max(1.0, ref_max) + 1e-5;
  const bool ok = worst <= tol;
  std::printf("%s %s: max|err| %.3g (tol %.3g) splits=%u chunk=%u tile=%u cores=%u\n", ok ? "ok" : "FAIL", c.name,
              worst, tol, t.splits, t.group_chunk, t.tile_rows, t.block_dim);
  for (void* p : {(void*)q, (void*)k, (void*)v, (void*)out, (void*)table, (void*)seq, (void*)tiling, (void*)ws})
    AscendC::GmFree(p);
  return ok;
}

bool Run(const Case& c) {
  if (c.dtype == DecodeDtype::FP16) return RunTyped<half>(c);
  if (c.dtype == DecodeDtype::BF16) return RunTyped<bfloat16_t>(c);
  return RunTyped<float>(c);
}

}  // namespace

int main() {
  const DecodeDtype F16 = DecodeDtype::FP16, BF = DecodeDtype::BF16, F32 = DecodeDtype::FP32;
  std::vector<Case> cases = {
      {"fp32 contiguous BSH GQA2 D40 ragged", F32, 3, 4, 2, 40, false, false, 0, 37, {37, 0, 1}},
      {"fp16 contiguous BNSD GQA4 pad", F16, 2, 8, 2, 64, false, true, 0, 50, {33, 17}, 5},
      {"bf16 contiguous BSH MHA D20", BF, 2, 3, 3, 20, false, false, 0, 29, {29, 9}},
      {"fp16 paged16 BSH GQA2 ragged", F16, 3, 4, 2, 48, true, false, 16, 64, {17, 0, 63}},
      {"bf16 paged16 BNSD GQA4", BF, 2, 4, 1, 32, true, true, 16, 48, {48, 31}},
      {"fp32 paged128 BSH split", F32, 1, 4, 1, 24, true, false, 128, 384, {300}},
      {"fp16 paged128 BNSD split ragged", F16, 2, 4, 2, 64, true, true, 128, 256, {129, 1}},
      {"fp16 contiguous forced 3 splits, empty split", F16, 2, 2, 1, 16, false, false, 0, 40, {10, 40}, 0, 3},
      {"bf16 big group chunked", BF, 1, 64, 1, 256, false, true, 0, 20, {19}},
      {"fp32 all lengths 0", F32, 2, 2, 2, 8, false, false, 0, 16, {0, 0}},
  };
  int failed = 0;
  for (const Case& c : cases) failed += Run(c) ? 0 : 1;
  return tot_test::Finish(failed, int(cases.size()), "cases");
}
