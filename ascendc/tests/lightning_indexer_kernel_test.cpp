// Host program (CANN CPU-debug style: GmAlloc, SetKernelMode(AIV_MODE), ICPU_RUN_KF) for the lightning indexer
// kernel, checked against a float64 reference computed here from the same (rounded) inputs: fp16 / bf16 / fp32,
// contiguous and paged keys (shuffled blocks), GQA groups, causal and full visibility, ragged lengths, padding rows,
// rows without keys, sparse_count larger than the visible keys (-1 padding), several tiles per item, exact ties
// (equal keys: the lower position first) and the returned values. The selection is compared through the reference
// scores (scores a rounding apart may swap places). Prints one line per case; reports through test_main.h.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "tikicpulib.h"
#include "sparse_attention/lightning_indexer_tiling.h"
#include "test_main.h"
#include "sparse_attention/lightning_indexer_kernel.h"

using namespace tot_ascendc;

namespace {

struct Case {
  const char* name;
  SparseDtype dtype;
  uint32_t B, S1, N1, N2, D, K;
  bool paged, values;
  uint32_t block_size;           // paged
  uint32_t S2;                   // contiguous S2, or paged max_blocks * block_size
  std::vector<int32_t> kv_len;   // per sequence
  std::vector<int32_t> q_len;    // per sequence (rows past it are padding)
  bool causal = true;
  uint32_t max_tile_rows = 128;
  bool equal_keys = false;       // every key row identical: all scores tie
  uint32_t max_splits = 48;      // 1: each item on one core (no split of its keys, no merge)
};

template <typename T>
bool RunTyped(const Case& c) {
  std::mt19937 rng(7 + c.B * 31 + c.D + c.K);
  std::normal_distribution<float> nd(0.f, 1.f);
  const uint32_t G = c.N1 / c.N2, T1 = c.B * c.S1;
  const uint32_t max_blocks = c.paged ? c.S2 / c.block_size : 0;
  const uint32_t blocks = c.paged ? c.B * max_blocks + 2 : 0;
  const uint64_t kv_rows = c.paged ? uint64_t(blocks) * c.block_size : uint64_t(c.B) * c.S2;
  auto alloc = [](uint64_t n, size_t sz) { return AscendC::GmAlloc(std::max<uint64_t>(n * sz, 32)); };
  T* q = (T*)alloc(uint64_t(T1) * c.N1 * c.D, sizeof(T));
  T* k = (T*)alloc(kv_rows * c.N2 * c.D, sizeof(T));
  float* w = (float*)alloc(uint64_t(T1) * c.N1, 4);
  int32_t* table = (int32_t*)alloc(uint64_t(c.B) * max_blocks, 4);
  int32_t* rows = (int32_t*)alloc(uint64_t(T1) * 4, 4);
  int32_t* idx = (int32_t*)alloc(uint64_t(T1) * c.N2 * c.K, 4);
  T* val = (T*)alloc(uint64_t(T1) * c.N2 * c.K, sizeof(T));
  for (uint64_t i = 0; i < uint64_t(T1) * c.N1 * c.D; ++i) q[i] = T(nd(rng));
  std::vector<float> one_key(c.D);
  for (float& x : one_key) x = nd(rng);
  for (uint64_t i = 0; i < kv_rows * c.N2 * c.D; ++i) k[i] = T(c.equal_keys ? one_key[i % c.D] : nd(rng));
  for (uint64_t i = 0; i < uint64_t(T1) * c.N1; ++i) w[i] = nd(rng) / float(c.N1);
  std::vector<int32_t> perm(blocks);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  for (uint64_t i = 0; i < uint64_t(c.B) * max_blocks; ++i) table[i] = perm[i];
  for (uint32_t b = 0; b < c.B; ++b)
    for (uint32_t i = 0; i < c.S1; ++i) {
      int32_t* r = rows + (uint64_t(b) * c.S1 + i) * 4;
      int32_t limit = c.kv_len[b];
      if (c.causal) limit = std::min(limit, c.kv_len[b] - c.q_len[b] + int32_t(i) + 1);
      r[0] = int32_t(i) >= c.q_len[b] ? -1 : int32_t(b);
      r[1] = std::max(limit, 0);
      r[2] = int32_t(uint64_t(b) * c.S2);
      r[3] = 0;
    }
  IndexerShape s;
  s.rows = T1; s.q_heads = c.N1; s.kv_heads = c.N2; s.d = c.D; s.sparse_count = c.K; s.dtype = c.dtype;
  s.return_value = c.values; s.paged = c.paged; s.batch = c.B; s.block_size = c.block_size;
  s.max_blocks = max_blocks; s.kv_rows = kv_rows; s.max_tile_rows = c.max_tile_rows;
  s.max_splits = c.max_splits;
  for (uint32_t i = 0; i < T1; ++i) s.max_keys = std::max<uint32_t>(s.max_keys, uint32_t(rows[uint64_t(i) * 4 + 1]));
  LightningIndexerTiling t;
  const std::string err = LightningIndexerTilingFn(s, Ascend910B(), t);
  if (!err.empty()) { std::printf("FAIL %s: tiling: %s\n", c.name, err.c_str()); return false; }
  uint8_t* tiling = (uint8_t*)AscendC::GmAlloc(sizeof(t));
  std::memcpy(tiling, &t, sizeof(t));
  uint8_t* ws = (uint8_t*)AscendC::GmAlloc(std::max<uint64_t>(t.workspace_bytes, 32));
  AscendC::SetKernelMode(AscendC::KernelMode::AIV_MODE);
  try {
    ICPU_RUN_KF(lightning_indexer, t.block_dim, (uint8_t*)q, (uint8_t*)k, (uint8_t*)w, (uint8_t*)table,
                (uint8_t*)rows, (uint8_t*)idx, (uint8_t*)val, ws, tiling);
  } catch (const std::exception& e) {
    std::printf("FAIL %s: kernel: %s\n", c.name, e.what());
    return false;
  }
  // float64 reference on the rounded inputs; the selection through the reference scores.
  std::string why;
  double worst_sel = 0, worst_val = 0, tol_sel = 0;
  const double eps = c.dtype == SparseDtype::FP32 ? 1.2e-7 : c.dtype == SparseDtype::FP16 ? 9.8e-4 : 7.8e-3;
  for (uint32_t tq = 0; tq < T1 && why.empty(); ++tq)
    for (uint32_t n2 = 0; n2 < c.N2 && why.empty(); ++n2) {
      const int32_t* r = rows + uint64_t(tq) * 4;
      const int32_t vis = r[0] >= 0 ? r[1] : 0;
      std::vector<double> sc(vis);
      for (int32_t j = 0; j < vis; ++j) {
        const uint64_t krow = c.paged ? uint64_t(table[r[0] * max_blocks + j / c.block_size]) * c.block_size +
                                            j % c.block_size
                                      : uint64_t(r[2]) + j;
        double sum = 0;
        for (uint32_t h = 0; h < G; ++h) {
          const uint64_t qrow = uint64_t(tq) * c.N1 + n2 * G + h;
          double dot = 0;
          for (uint32_t x = 0; x < c.D; ++x)
            dot += double(float(q[qrow * c.D + x])) * double(float(k[(krow * c.N2 + n2) * c.D + x]));
          sum += double(w[qrow]) * std::max(dot, 0.0);
        }
        sc[j] = sum;
      }
      std::vector<double> want(sc);
      std::sort(want.begin(), want.end(), std::greater<double>());
      const uint32_t kk = std::min<uint32_t>(c.K, uint32_t(vis));
      const double top = want.empty() ? 0.0 : std::max(std::fabs(want.front()), std::fabs(want.back()));
      const double tol = 16 * 1.2e-7 * std::max(1.0, top) * std::sqrt(double(c.D * G));
      tol_sel = std::max(tol_sel, tol);
      std::vector<char> used(vis, 0);
      const uint64_t o = (uint64_t(tq) * c.N2 + n2) * c.K;
      for (uint32_t j = 0; j < c.K; ++j) {
        const int32_t got = idx[o + j];
        if (j >= kk) {
          if (got != -1) why = "slot past the visible keys is not -1";
          if (c.values && !(std::isinf(float(val[o + j])) && float(val[o + j]) < 0)) why = "value of a -1 slot";
          continue;
        }
        if (got < 0 || got >= vis || used[got]) { why = "position out of range or repeated"; break; }
        used[got] = 1;
        worst_sel = std::max(worst_sel, std::fabs(sc[got] - want[j]));
        if (c.equal_keys && got != int32_t(j)) why = "equal scores not in position order";
        if (c.values) {
          const double v = double(float(val[o + j]));
          worst_val = std::max(worst_val, std::fabs(v - sc[got]) / (eps * std::max(1.0, top) + tol));
          if (j > 0 && v > double(float(val[o + j - 1]))) why = "values not descending";
        }
      }
    }
  const bool ok = why.empty() && worst_sel <= tol_sel && worst_val <= 2.0;
  std::printf("%s %s: selection |err| %.3g (tol %.3g) values %.3g%s%s tile=%u splits=%u%s cores=%u\n",
              ok ? "ok" : "FAIL", c.name, worst_sel, tol_sel, worst_val, why.empty() ? "" : " ", why.c_str(),
              t.tile_rows, t.splits, t.splits == 1 ? "" : t.split_keys <= t.sparse_count ? " direct" : " selected",
              t.block_dim);
  for (void* p : {(void*)q, (void*)k, (void*)w, (void*)table, (void*)rows, (void*)idx, (void*)val, (void*)tiling,
                  (void*)ws})
    AscendC::GmFree(p);
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
  // name, dtype, B, S1, N1, N2, D, K, paged, values, block_size, S2, kv_len, q_len, causal, max_tile_rows,
  // equal_keys, max_splits (few items: their keys are split over the cores and merged, unless max_splits = 1)
  std::vector<Case> cases = {
      {"fp32 BSND GQA2 causal, padding row, 8-key tiles, values", F32, 2, 3, 4, 2, 40, 12, false, true, 0, 37,
       {37, 9}, {3, 2}, true, 8},
      {"fp16 paged16 decode, K > visible keys", F16, 2, 1, 8, 1, 64, 48, true, false, 16, 64, {64, 21}, {1, 1}},
      {"bf16 BSND full visibility, a sequence without keys, values", BF, 3, 2, 4, 1, 32, 6, false, true, 0, 40,
       {40, 0, 7}, {2, 2, 1}, false},
      {"fp32 paged32 several tiles per range, causal prefill", F32, 1, 5, 6, 1, 24, 16, true, false, 32, 96, {90}, {5},
       true, 16},
      {"bf16 DeepSeek-like 64 heads of 128, K 64 of 300 keys", BF, 1, 2, 64, 1, 128, 64, true, false, 64, 320, {300},
       {2}},
      {"fp16 equal keys: ties in position order, values", F16, 1, 2, 4, 1, 16, 20, false, true, 0, 30, {30}, {2},
       true, 8, true},
      {"fp16 equal keys over split ranges: ties across the merge", F16, 1, 1, 4, 1, 16, 20, false, true, 0, 60,
       {60}, {1}, true, 8, true},
      {"fp32 decode without the split (one core per item)", F32, 2, 1, 4, 1, 32, 10, true, true, 16, 64, {64, 40},
       {1, 1}, false, 16, false, 1},
      {"bf16 48 items: no split, causal prefill", BF, 4, 6, 4, 2, 24, 7, false, false, 0, 24, {24, 13, 6, 20},
       {6, 6, 3, 5}},
  };
  int failed = 0;
  for (const Case& c : cases) failed += Run(c) ? 0 : 1;
  return tot_test::Finish(failed, int(cases.size()), "cases");
}
