// Host program (CANN CPU-debug style: GmAlloc, SetKernelMode(AIV_MODE), ICPU_RUN_KF) for the sparse flash attention
// kernel, checked against a float64 reference computed here from the same (rounded) inputs: fp16 / bf16 / fp32,
// contiguous and paged caches (shuffled blocks), sparse blocks of 1 / 4 / 16 tokens, -1 slots anywhere, entries
// beyond the visible limit, duplicated entries, rows without keys and padding rows, rope parts, value = key (MLA)
// and a separate value of another head dim, GQA groups with heads processed in chunks, several tiles per item,
// sinks, and softmax_max / softmax_sum in both layouts. Prints one line per case; reports through test_main.h.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "tikicpulib.h"
#include "sparse_attention/sparse_flash_attention_tiling.h"
#include "test_main.h"
#include "sparse_attention/sparse_flash_attention_kernel.h"

using namespace tot_ascendc;

namespace {

struct Case {
  const char* name;
  SparseDtype dtype;
  uint32_t B, S1, N1, N2, dn, dr, dv, K, sbs;
  bool paged, value_is_key, sinks, stats, tnd;
  uint32_t block_size;               // paged
  uint32_t S2;                       // contiguous S2, or paged max_blocks * block_size
  std::vector<int32_t> kv_len;       // per sequence
  std::vector<int32_t> q_len;        // per sequence (rows past it are padding)
  bool causal = true;
  uint32_t max_tile_rows = 128;
};

template <typename T>
bool RunTyped(const Case& c) {
  std::mt19937 rng(99 + c.B * 13 + c.dn + c.K);
  std::normal_distribution<float> nd(0.f, 1.f);
  const uint32_t G = c.N1 / c.N2, T1 = c.B * c.S1;
  const uint32_t max_blocks = c.paged ? c.S2 / c.block_size : 0;
  const uint32_t blocks = c.paged ? c.B * max_blocks + 2 : 0;
  const uint64_t kv_rows = c.paged ? uint64_t(blocks) * c.block_size : uint64_t(c.B) * c.S2;
  const uint32_t dv = c.value_is_key ? c.dn : c.dv;
  auto alloc = [](uint64_t n, size_t sz) { return AscendC::GmAlloc(std::max<uint64_t>(n * sz, 32)); };
  T* q = (T*)alloc(uint64_t(T1) * c.N1 * c.dn, sizeof(T));
  T* qr = (T*)alloc(uint64_t(T1) * c.N1 * c.dr, sizeof(T));
  T* k = (T*)alloc(kv_rows * c.N2 * c.dn, sizeof(T));
  T* kr = (T*)alloc(kv_rows * c.N2 * c.dr, sizeof(T));
  T* v = c.value_is_key ? k : (T*)alloc(kv_rows * c.N2 * dv, sizeof(T));
  int32_t* idx = (int32_t*)alloc(uint64_t(T1) * c.N2 * c.K, 4);
  int32_t* table = (int32_t*)alloc(uint64_t(c.B) * max_blocks, 4);
  int32_t* rows = (int32_t*)alloc(uint64_t(T1) * 4, 4);
  float* sinks = (float*)alloc(c.N1, 4);
  T* out = (T*)alloc(uint64_t(T1) * c.N1 * dv, sizeof(T));
  float* smax = (float*)alloc(uint64_t(T1) * c.N1, 4);
  float* ssum = (float*)alloc(uint64_t(T1) * c.N1, 4);
  for (uint64_t i = 0; i < uint64_t(T1) * c.N1 * c.dn; ++i) q[i] = T(nd(rng));
  for (uint64_t i = 0; i < uint64_t(T1) * c.N1 * c.dr; ++i) qr[i] = T(nd(rng));
  for (uint64_t i = 0; i < kv_rows * c.N2 * c.dn; ++i) k[i] = T(nd(rng));
  for (uint64_t i = 0; i < kv_rows * c.N2 * c.dr; ++i) kr[i] = T(nd(rng));
  if (!c.value_is_key)
    for (uint64_t i = 0; i < kv_rows * c.N2 * dv; ++i) v[i] = T(nd(rng));
  for (uint32_t h = 0; h < c.N1; ++h) sinks[h] = nd(rng);
  std::vector<int32_t> perm(blocks);
  for (uint32_t i = 0; i < blocks; ++i) perm[i] = int32_t(i);
  std::shuffle(perm.begin(), perm.end(), rng);
  for (uint64_t i = 0; i < uint64_t(c.B) * max_blocks; ++i) table[i] = perm[i];
  // Entries: mostly valid blocks of the sequence, some -1 (anywhere), some past the visible limit, duplicates.
  const uint32_t blocks_per_seq = (c.S2 + c.sbs - 1) / c.sbs;
  std::uniform_int_distribution<int32_t> pick(-1, int32_t(blocks_per_seq) - 1);
  for (uint64_t i = 0; i < uint64_t(T1) * c.N2 * c.K; ++i) idx[i] = pick(rng);
  for (uint32_t b = 0; b < c.B; ++b)
    for (uint32_t i = 0; i < c.S1; ++i) {
      int32_t* r = rows + (uint64_t(b) * c.S1 + i) * 4;
      const bool pad = int32_t(i) >= c.q_len[b];
      int32_t limit = c.kv_len[b];
      if (c.causal) limit = std::min(limit, c.kv_len[b] - c.q_len[b] + int32_t(i) + 1);
      r[0] = pad ? -1 : int32_t(b);
      r[1] = std::max(limit, 0);
      r[2] = int32_t(uint64_t(b) * c.S2);
      r[3] = 0;
    }
  SparseShape s;
  s.rows = T1; s.q_heads = c.N1; s.kv_heads = c.N2; s.slots = c.K; s.sparse_block_size = c.sbs;
  s.dn = c.dn; s.dr = c.dr; s.dv = dv; s.dtype = c.dtype; s.value_is_key = c.value_is_key; s.paged = c.paged;
  s.batch = c.B; s.block_size = c.block_size; s.max_blocks = max_blocks; s.kv_rows = kv_rows; s.q_tnd = c.tnd;
  s.s1 = c.S1; s.has_sinks = c.sinks; s.return_stats = c.stats; s.scale = 1.f / std::sqrt(float(c.dn + c.dr));
  s.max_tile_rows = c.max_tile_rows;
  SparseFlashAttentionTiling t;
  const std::string err = SparseFlashAttentionTilingFn(s, Ascend910B(), t);
  if (!err.empty()) { std::printf("FAIL %s: tiling: %s\n", c.name, err.c_str()); return false; }
  uint8_t* tiling = (uint8_t*)AscendC::GmAlloc(sizeof(t));
  std::memcpy(tiling, &t, sizeof(t));
  uint8_t* ws = (uint8_t*)AscendC::GmAlloc(32);
  AscendC::SetKernelMode(AscendC::KernelMode::AIV_MODE);
  try {
    ICPU_RUN_KF(sparse_flash_attention, t.block_dim, (uint8_t*)q, (uint8_t*)qr, (uint8_t*)k, (uint8_t*)kr,
                (uint8_t*)v, (uint8_t*)idx, (uint8_t*)table, (uint8_t*)rows, (uint8_t*)sinks, (uint8_t*)out,
                (uint8_t*)smax, (uint8_t*)ssum, ws, tiling);
  } catch (const std::exception& e) {
    std::printf("FAIL %s: kernel: %s\n", c.name, e.what());
    return false;
  }
  // float64 reference on the rounded inputs.
  double worst = 0, worst_stat = 0, ref_max = 0;
  for (uint32_t tq = 0; tq < T1; ++tq)
    for (uint32_t n2 = 0; n2 < c.N2; ++n2) {
      const int32_t* r = rows + uint64_t(tq) * 4;
      std::vector<uint64_t> sel;  // physical rows
      if (r[0] >= 0)
        for (uint32_t sl = 0; sl < c.K; ++sl) {
          const int32_t e = idx[(uint64_t(tq) * c.N2 + n2) * c.K + sl];
          if (e < 0) continue;
          for (int64_t j = int64_t(e) * c.sbs; j < std::min<int64_t>(int64_t(e + 1) * c.sbs, r[1]); ++j)
            sel.push_back(c.paged ? uint64_t(table[r[0] * max_blocks + j / c.block_size]) * c.block_size +
                                        j % c.block_size
                                  : uint64_t(r[2]) + j);
        }
      for (uint32_t h = 0; h < G; ++h) {
        const uint32_t n1 = n2 * G + h;
        const uint64_t qrow = uint64_t(tq) * c.N1 + n1;
        const bool sink_on = c.sinks && r[0] >= 0;
        double m = sink_on ? sinks[n1] : -INFINITY, sum = 0;
        std::vector<double> sc(sel.size()), o(dv, 0.0);
        for (size_t j = 0; j < sel.size(); ++j) {
          const uint64_t krow = sel[j] * c.N2 + n2;
          double d = 0;
          for (uint32_t x = 0; x < c.dn; ++x) d += double(float(q[qrow * c.dn + x])) * double(float(k[krow * c.dn + x]));
          for (uint32_t x = 0; x < c.dr; ++x) d += double(float(qr[qrow * c.dr + x])) * double(float(kr[krow * c.dr + x]));
          sc[j] = d * s.scale;
          m = std::max(m, sc[j]);
        }
        for (size_t j = 0; j < sel.size(); ++j) { sc[j] = std::exp(sc[j] - m); sum += sc[j]; }
        if (sink_on) sum += std::exp(double(sinks[n1]) - m);
        for (size_t j = 0; j < sel.size(); ++j)
          for (uint32_t x = 0; x < dv; ++x) o[x] += sc[j] / sum * double(float(v[(sel[j] * c.N2 + n2) * dv + x]));
        for (uint32_t x = 0; x < dv; ++x) {
          const double got = double(float(out[qrow * dv + x]));
          worst = std::max(worst, std::fabs(got - o[x]));
          ref_max = std::max(ref_max, std::fabs(o[x]));
          if (std::isnan(got) || (sel.empty() && got != 0.0)) worst = INFINITY;
        }
        if (c.stats) {
          const uint32_t b = tq / c.S1, pos = tq % c.S1;
          const uint64_t at = c.tnd ? (uint64_t(n2) * T1 + tq) * G + h : ((uint64_t(b) * c.N2 + n2) * c.S1 + pos) * G + h;
          const double gm = smax[at], gs = ssum[at];
          if (std::isinf(m)) {
            if (!(std::isinf(gm) && gm < 0 && gs == 0.0)) worst_stat = INFINITY;
          } else {
            worst_stat = std::max(worst_stat, std::fabs(gm - m) / std::max(1.0, std::fabs(m)));
            worst_stat = std::max(worst_stat, std::fabs(gs - sum) / std::max(1.0, sum));
          }
        }
      }
    }
  const double eps = c.dtype == SparseDtype::FP32 ? 1.2e-7 : c.dtype == SparseDtype::FP16 ? 9.8e-4 : 7.8e-3;
  const double tol = 2 * eps * std::max(1.0, ref_max) + 1e-5;
  const bool ok = worst <= tol && worst_stat <= 1e-5;
  std::printf("%s %s: max|err| %.3g (tol %.3g) stats %.3g chunk=%u tile=%u cores=%u\n", ok ? "ok" : "FAIL", c.name,
              worst, tol, worst_stat, t.group_chunk, t.tile_rows, t.block_dim);
  for (void* p : {(void*)q, (void*)qr, (void*)k, (void*)kr, (void*)idx, (void*)table, (void*)rows, (void*)sinks,
                  (void*)out, (void*)smax, (void*)ssum, (void*)tiling, (void*)ws})
    AscendC::GmFree(p);
  if (!c.value_is_key) AscendC::GmFree(v);
  return ok;
}

bool Run(const Case& c) {
  if (c.dtype == SparseDtype::FP16) return RunTyped<half>(c);
  if (c.dtype == SparseDtype::BF16) return RunTyped<bfloat16_t>(c);
  return RunTyped<float>(c);
}

}  // namespace

int main() {
  const SparseDtype F16 = SparseDtype::FP16, BF = SparseDtype::BF16, F32 = SparseDtype::FP32;
  // name, dtype, B, S1, N1, N2, dn, dr, dv, K, sbs, paged, value_is_key, sinks, stats, tnd, block_size, S2, kv_len,
  // q_len, causal, max_tile_rows
  std::vector<Case> cases = {
      {"fp32 BSND plain GQA2 dv24 causal, padding row, 8-row tiles", F32, 2, 3, 4, 2, 40, 0, 24, 12, 1, false, false,
       false, true, false, 0, 20, {20, 9}, {3, 2}, true, 8},
      {"fp16 paged16 sbs4 rope MLA sinks stats", F16, 2, 2, 8, 1, 64, 16, 0, 6, 4, true, true, true, true, false, 16,
       64, {64, 37}, {2, 2}},
      {"bf16 TND-stats sbs1 rope, keyless rows, no causal", BF, 3, 2, 4, 2, 32, 8, 0, 5, 1, false, true, false, true,
       true, 0, 16, {16, 0, 7}, {2, 2, 1}, false},
      {"fp32 paged32 sbs16 separate value, sinks, several tiles", F32, 1, 4, 2, 1, 24, 8, 48, 5, 16, true, false, true,
       true, false, 32, 96, {90}, {4}, true, 16},
      {"bf16 DeepSeek-like 64 heads of 512+64, chunked group", BF, 1, 2, 64, 1, 512, 64, 0, 8, 1, true, true, false,
       true, false, 64, 128, {100}, {2}},
      {"fp16 no slots selectable beyond limit, causal first row", F16, 1, 4, 2, 2, 16, 0, 16, 3, 4, false, false, true,
       true, false, 0, 12, {12}, {4}},
  };
  int failed = 0;
  for (const Case& c : cases) failed += Run(c) ? 0 : 1;
  return tot_test::Finish(failed, int(cases.size()), "cases");
}
