// Unit tests of the FlashAttention forward tiling (pure host C++): UB / L1 budgets across head dims and dtypes,
// tails, the core split (every task exactly once, balanced), forced blocks 64/128/256, and errors for impossible
// input. Reports through test_main.h.
#include <cstdio>
#include <string>
#include <vector>

#include "attention/flash_attention_score_tiling.h"
#include "test_main.h"

using namespace tot_ascendc;

static FlashAttentionTilingInput Input(uint32_t B, uint32_t N, uint32_t G, uint32_t S1, uint32_t S2, uint32_t D,
                                       FaDtype dt) {
  FlashAttentionTilingInput in;
  in.batch = B; in.q_heads = N; in.group = G; in.s1 = S1; in.s2 = S2; in.head_dim = D; in.dtype = dt;
  in.scale = 0.125f;
  return in;
}

// Invariants every successful tiling must satisfy.
static void CheckInvariants(const FlashAttentionTilingInput& in, const FlashAttentionScoreTilingData& t,
                            const char* what) {
  const PlatformInfo pf = Ascend910B();
  CHECK(t.ub_bytes <= pf.UsableUb(), "%s: UB %u > %u", what, t.ub_bytes, pf.UsableUb());
  CHECK(t.ub_bytes == FaPlanUb(t.s1_block, t.s2_block, t.vec_rows, t.v_dim_pad, t.elem_bytes,
                                in.mask_kind == FA_MASK_EXPLICIT).Total(), "%s: UB plan mismatch", what);
  CHECK(t.l1_bytes <= pf.l1_bytes, "%s: L1 %u > %u", what, t.l1_bytes, pf.l1_bytes);
  CHECK(t.s1_block % 8 == 0 && t.s2_block % 64 == 0, "%s: blocks %u x %u", what, t.s1_block, t.s2_block);
  CHECK(t.vec_rows % 8 == 0 && t.vec_rows >= 8 && t.vec_rows <= 128 && t.s1_block % t.vec_rows == 0,
         "%s: vec_rows %u", what, t.vec_rows);
  CHECK(t.v_dim_pad % 16 == 0 && t.v_dim_pad >= t.v_head_dim, "%s: v_dim_pad", what);
  // tails
  CHECK((t.s1_blocks - 1) * t.s1_block + t.s1_tail == in.s1 && t.s1_tail >= 1 && t.s1_tail <= t.s1_block,
         "%s: s1 tail %u of %u blocks", what, t.s1_tail, t.s1_blocks);
  CHECK((t.s2_blocks - 1) * t.s2_block + t.s2_tail == in.s2 && t.s2_tail >= 1 && t.s2_tail <= t.s2_block,
         "%s: s2 tail %u of %u blocks", what, t.s2_tail, t.s2_blocks);
  // core split: block_dim groups, 2 AIVs each; contiguous ranges covering [0, total) once.
  CHECK(t.block_dim >= 1 && t.block_dim <= pf.aic_cores && t.aiv_num == 2 * t.block_dim, "%s: block_dim %u",
         what, t.block_dim);
  CHECK(t.total_tasks == in.batch * in.q_heads * t.s1_blocks, "%s: total tasks", what);
  CHECK(t.task_begin[0] == 0 && t.task_begin[t.aiv_num] == t.total_tasks, "%s: range ends", what);
  std::vector<int> seen(t.total_tasks, 0);
  for (uint32_t a = 0; a < t.aiv_num; ++a) {
    CHECK(t.task_begin[a] <= t.task_begin[a + 1], "%s: range %u reversed", what, a);
    for (uint32_t k = t.task_begin[a]; k < t.task_begin[a + 1] && k < t.total_tasks; ++k) ++seen[k];
  }
  for (uint32_t k = 0; k < t.total_tasks; ++k) CHECK(seen[k] == 1, "%s: task %u seen %d times", what, k, seen[k]);
  // workspace: three slices per AIV, inside the total
  CHECK(t.ws_p_offset >= 2 * uint64_t(t.s1_block) * t.s2_block * 4 &&
             t.ws_o_offset >= t.ws_p_offset + uint64_t(t.s1_block) * t.s2_block * t.elem_bytes &&
             t.ws_per_aiv >= t.ws_o_offset + uint64_t(t.s1_block) * t.v_dim_pad * 4 &&
             t.workspace_bytes == t.ws_per_aiv * t.aiv_num,
         "%s: workspace layout", what);
}

static void BudgetsAcrossDims() {
  for (uint32_t D : {64u, 128u, 256u})
    for (FaDtype dt : {FA_FLOAT16, FA_BFLOAT16, FA_FLOAT32})
      for (bool mask : {false, true}) {
        FlashAttentionTilingInput in = Input(2, 8, 2, 1000, 999, D, dt);
        in.mask_kind = mask ? FA_MASK_EXPLICIT : FA_MASK_NONE;
        FlashAttentionScoreTilingData t;
        const std::string err = FlashAttentionScoreTiling(in, {}, Ascend910B(), &t);
        char what[64];
        std::snprintf(what, sizeof what, "D=%u dt=%u mask=%d", D, dt, int(mask));
        CHECK(err.empty(), "%s: %s", what, err.c_str());
        if (!err.empty()) continue;
        CheckInvariants(in, t, what);
        CHECK(t.s1_block >= 64 && t.s2_block >= 64, "%s: automatic tile %u x %u is small", what, t.s1_block,
               t.s2_block);
        CHECK(t.block_dim == 24, "%s: %u tasks should use all 24 groups", what, t.total_tasks);
      }
}

static void Tails() {
  for (uint32_t S1 : {1u, 7u, 37u, 130u, 257u})
    for (uint32_t S2 : {1u, 33u, 130u, 300u}) {
      FlashAttentionTilingInput in = Input(1, 4, 2, S1, S2, 40, FA_FLOAT16);
      FlashAttentionScoreTilingData t;
      const std::string err = FlashAttentionScoreTiling(in, {}, Ascend910B(), &t);
      char what[64];
      std::snprintf(what, sizeof what, "S1=%u S2=%u", S1, S2);
      CHECK(err.empty(), "%s: %s", what, err.c_str());
      if (err.empty()) CheckInvariants(in, t, what);
      CHECK(t.s1_block <= ((S1 + 15) / 16) * 16 && t.s2_block <= ((S2 + 63) / 64) * 64, "%s: tile larger than needed", what);
    }
}

static void ForcedBlocks() {
  for (uint32_t s1 : {64u, 128u, 256u})
    for (uint32_t s2 : {64u, 128u, 256u}) {
      FlashAttentionTilingInput in = Input(4, 32, 1, 4096, 4096, 128, FA_FLOAT16);
      FlashAttentionScoreTilingData t;
      const std::string err = FlashAttentionScoreTiling(in, {s1, s2}, Ascend910B(), &t);
      char what[64];
      std::snprintf(what, sizeof what, "forced %ux%u", s1, s2);
      CHECK(err.empty(), "%s: %s", what, err.c_str());
      if (!err.empty()) continue;
      CHECK(t.s1_block == s1 && t.s2_block == s2, "%s: got %u x %u", what, t.s1_block, t.s2_block);
      CheckInvariants(in, t, what);
    }
  // D=64 fits the largest forced tile too.
  FlashAttentionTilingInput in = Input(1, 1, 1, 512, 512, 64, FA_FLOAT32);
  FlashAttentionScoreTilingData t;
  CHECK(FlashAttentionScoreTiling(in, {256, 256}, Ascend910B(), &t).empty(), "fp32 D=64 256x256");
}

static void CausalBalance() {
  // Top-left causal: later query blocks see more key blocks; ranges balance the visible-block cost.
  FlashAttentionTilingInput in = Input(1, 2, 1, 2048, 2048, 64, FA_FLOAT16);
  in.band_hi = 0;
  FlashAttentionScoreTilingData t;
  CHECK(FlashAttentionScoreTiling(in, {128, 128}, Ascend910B(), &t).empty(), "causal tiling");
  CheckInvariants(in, t, "causal");
  uint64_t max_cost = 0, total = 0;
  for (uint32_t a = 0; a < t.aiv_num; ++a) {
    uint64_t c = 0;
    for (uint32_t k = t.task_begin[a]; k < t.task_begin[a + 1]; ++k) c += 1 + (k % t.s1_blocks) + 1;
    max_cost = std::max(max_cost, c);
    total += c;
  }
  CHECK(max_cost * t.aiv_num <= total * 2, "causal: busiest AIV has %llu of %llu", (unsigned long long)max_cost,
         (unsigned long long)total);
  // Few tasks: one group, every task still assigned once.
  FlashAttentionTilingInput one = Input(1, 1, 1, 5, 5, 8, FA_FLOAT32);
  CHECK(FlashAttentionScoreTiling(one, {}, Ascend910B(), &t).empty() && t.block_dim == 1 && t.total_tasks == 1,
         "single task");
  CheckInvariants(one, t, "single task");
}

static void Errors() {
  FlashAttentionScoreTilingData t;
  auto err = [&](FlashAttentionTilingInput in, FlashAttentionTilingOptions o) {
    return FlashAttentionScoreTiling(in, o, Ascend910B(), &t);
  };
  CHECK(err(Input(1, 4, 3, 8, 8, 64, FA_FLOAT16), {}).find("group") != std::string::npos, "bad group");
  CHECK(err(Input(0, 4, 1, 8, 8, 64, FA_FLOAT16), {}).find("positive") != std::string::npos, "zero batch");
  CHECK(err(Input(1, 4, 1, 8, 8, 64, FA_FLOAT16), {20, 0}).find("s1_block") != std::string::npos, "s1_block 20");
  CHECK(err(Input(1, 4, 1, 8, 8, 64, FA_FLOAT16), {0, 48}).find("s2_block") != std::string::npos, "s2_block 48");
  CHECK(err(Input(1, 4, 1, 8, 8, 1024, FA_FLOAT16), {}).find("head_dim") != std::string::npos, "D 1024");
  const std::string big = err(Input(1, 1, 1, 4096, 4096, 256, FA_FLOAT32), {256, 256});
  CHECK(big.find("no tile fits") != std::string::npos && big.find("UB") != std::string::npos,
         "256x256 fp32 D=256 must not fit: '%s'", big.c_str());
}

int main() {
  BudgetsAcrossDims();
  Tails();
  ForcedBlocks();
  CausalBalance();
  Errors();
  return tot_test::FinishChecks();
}
