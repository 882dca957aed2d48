// Unit tests of the FlashAttention backward tiling: UB/L1 budget, tails, core split (every task and row assigned
// exactly once), workspace layout, and the errors for impossible input. Reports through test_main.h.
#include <cstdio>
#include <string>
#include <vector>

#include "attention/flash_attention_score_grad_tiling.h"
#include "test_main.h"

using namespace tot_ascendc;

namespace {

FlashAttentionScoreGradShape Shape(int64_t b, int64_t n1, int64_t n2, int64_t s1, int64_t s2, int64_t d,
                                   FagDtype dt = FagDtype::FP16) {
  FlashAttentionScoreGradShape s;
  s.batch = b; s.q_heads = n1; s.kv_heads = n2; s.s1 = s1; s.s2 = s2; s.d = s.dv = d; s.dtype = dt;
  return s;
}

void CheckInvariants(const FlashAttentionScoreGradShape& s, const FlashAttentionScoreGradTiling& t) {
  const PlatformInfo pf = Ascend910B();
  CHECK(t.ub_bytes <= pf.UsableUb(), "ub %u > %u", t.ub_bytes, pf.UsableUb());
  CHECK(t.l1_bytes <= pf.l1_bytes, "l1 %u", t.l1_bytes);
  CHECK(t.block_dim >= 1 && t.block_dim <= pf.aic_cores && t.aiv_num == 2 * t.block_dim, "block_dim %u", t.block_dim);
  CHECK(t.bkv_pitch % 16 == 0 && t.bkv_pitch >= t.bkv && t.d_pitch % 16 == 0 && t.dv_pitch % 16 == 0, "pitches");
  CHECK(t.mask_pitch % 32 == 0 && t.mask_pitch >= t.bkv, "mask pitch %u", t.mask_pitch);
  CHECK(t.ub_chunk_elems >= t.bkv_pitch && t.ub_chunk_elems >= t.d_pitch && t.ub_chunk_elems >= t.dv_pitch &&
             t.ub_chunk_elems % 16 == 0, "chunk %u", t.ub_chunk_elems);
  CHECK(t.vec_rows >= 1 && t.vec_rows <= t.bq && t.vec_rows * t.bkv_pitch <= t.ub_chunk_elems, "vec_rows %u",
         t.vec_rows);
  // Tails: the blocks cover each sequence exactly.
  CHECK(uint64_t(t.s1_blocks - 1) * t.bq + t.s1_tail == uint64_t(s.s1) && t.s1_tail >= 1 && t.s1_tail <= t.bq,
         "s1 tail %u blocks %u bq %u", t.s1_tail, t.s1_blocks, t.bq);
  CHECK(uint64_t(t.s2_blocks - 1) * t.bkv + t.s2_tail == uint64_t(s.s2) && t.s2_tail >= 1 && t.s2_tail <= t.bkv,
         "s2 tail %u", t.s2_tail);
  // Split: every task and every row goes to exactly one AIV (the kernel's loops, replayed).
  std::vector<int> task_owner(t.task_num, 0), row_owner(t.rows, 0);
  for (uint32_t v = 0; v < t.aiv_num; ++v) {
    for (uint32_t task = v; task < t.task_num; task += t.aiv_num) ++task_owner[task];
    const uint64_t per = (t.rows + t.aiv_num - 1) / t.aiv_num;
    for (uint64_t r = per * v; r < per * (v + 1) && r < t.rows; ++r) ++row_owner[r];
  }
  bool once = true;
  for (int c : task_owner) once = once && c == 1;
  for (int c : row_owner) once = once && c == 1;
  CHECK(once, "tasks/rows not assigned exactly once");
  CHECK(t.task_num == uint32_t(s.batch * s.kv_heads * t.s2_blocks), "task_num %u", t.task_num);
  // Workspace: regions in order, 32-byte aligned, inside the total.
  const uint64_t elem = s.dtype == FagDtype::FP32 ? 4 : 2;
  CHECK(t.ws_dq_offset % 32 == 0 && t.ws_di_offset >= t.ws_dq_offset + t.rows * t.d_pitch * 4, "dq region");
  CHECK(t.ws_aiv_offset >= t.ws_di_offset + t.rows * 32, "di region");
  CHECK(t.ws_dv_offset + uint64_t(t.bkv) * t.dv_pitch * 4 <= t.ws_aiv_bytes && t.ws_aiv_bytes % 32 == 0, "slice");
  CHECK(t.ws_ds_offset >= t.ws_p_offset + uint64_t(t.bq) * t.bkv_pitch * elem, "p region");
  CHECK(t.workspace_bytes == t.ws_aiv_offset + uint64_t(t.aiv_num) * t.ws_aiv_bytes, "workspace total");
}

void TestShapes() {
  const PlatformInfo pf = Ascend910B();
  struct S { int64_t b, n1, n2, s1, s2, d; FagDtype dt; };
  const S shapes[] = {{1, 1, 1, 1, 1, 8, FagDtype::FP16},      {1, 4, 2, 37, 37, 64, FagDtype::FP32},
                      {2, 4, 1, 130, 130, 128, FagDtype::BF16}, {1, 8, 8, 4096, 4096, 128, FagDtype::FP16},
                      {3, 2, 2, 129, 257, 256, FagDtype::FP32}, {1, 2, 1, 1000, 77, 512, FagDtype::FP32},
                      {48, 32, 8, 2048, 2048, 128, FagDtype::BF16}};
  for (const S& x : shapes) {
    FlashAttentionScoreGradShape s = Shape(x.b, x.n1, x.n2, x.s1, x.s2, x.d, x.dt);
    FlashAttentionScoreGradTiling t;
    const std::string err = FlashAttentionScoreGradTilingFunc(s, pf, t);
    CHECK(err.empty(), "error %s", err.c_str());
    if (err.empty()) CheckInvariants(s, t);
  }
  // Big problems use every AI Core group; a 1-task problem one group.
  FlashAttentionScoreGradTiling t;
  FlashAttentionScoreGradTilingFunc(Shape(1, 8, 8, 4096, 4096, 128), pf, t);
  CHECK(t.block_dim == 24 && t.bq == 128 && t.bkv == 128, "block_dim %u bq %u bkv %u", t.block_dim, t.bq, t.bkv);
  FlashAttentionScoreGradTilingFunc(Shape(1, 1, 1, 5, 5, 16), pf, t);
  CHECK(t.block_dim == 1 && t.task_num == 1 && t.bq == 5 && t.bkv == 5 && t.s1_tail == 5, "tiny: %u %u", t.block_dim,
         t.bq);
  // Tails with forced tiles.
  FlashAttentionScoreGradShape s = Shape(1, 2, 2, 37, 130, 64);
  s.block_q = 16;
  s.block_kv = 32;
  FlashAttentionScoreGradTilingFunc(s, pf, t);
  CHECK(t.s1_blocks == 3 && t.s1_tail == 5 && t.s2_blocks == 5 && t.s2_tail == 2, "tails %u %u %u %u", t.s1_blocks,
         t.s1_tail, t.s2_blocks, t.s2_tail);
  CheckInvariants(s, t);
  // max_block_dim caps the launch.
  s.max_block_dim = 2;
  FlashAttentionScoreGradTilingFunc(s, pf, t);
  CHECK(t.block_dim == 2 && t.aiv_num == 4, "capped %u", t.block_dim);
  CheckInvariants(s, t);
  // Mask strides: [B, 1, S1, S2] -> batch stride S1*S2, head stride 0.
  s = Shape(2, 4, 2, 10, 12, 16);
  s.has_mask = true;
  s.mask_batches = 2;
  FlashAttentionScoreGradTilingFunc(s, pf, t);
  CHECK(t.has_mask == 1 && t.mask_batch_stride == 120 && t.mask_head_stride == 0, "mask strides %llu %llu",
         (unsigned long long)t.mask_batch_stride, (unsigned long long)t.mask_head_stride);
}

void TestSmallUbShrinksTiles() {
  PlatformInfo small = Ascend910B();
  small.ub_bytes = 48 * 1024;
  FlashAttentionScoreGradShape s = Shape(1, 2, 2, 512, 512, 128, FagDtype::FP32);
  FlashAttentionScoreGradTiling t;
  const std::string err = FlashAttentionScoreGradTilingFunc(s, small, t);
  CHECK(err.empty(), "%s", err.c_str());
  CHECK(t.ub_bytes <= small.UsableUb(), "ub %u", t.ub_bytes);
  CHECK(t.vec_rows < t.bq, "vec_rows %u should be below bq %u under a small UB", t.vec_rows, t.bq);
}

void TestErrors() {
  const PlatformInfo pf = Ascend910B();
  FlashAttentionScoreGradTiling t;
  auto err = [&](FlashAttentionScoreGradShape s) { return FlashAttentionScoreGradTilingFunc(s, pf, t); };
  auto has = [](const std::string& e, const char* what) { return e.find(what) != std::string::npos; };
  CHECK(has(err(Shape(1, 3, 2, 8, 8, 16)), "multiple of kv_heads"), "gqa");
  CHECK(has(err(Shape(1, 2, 2, 0, 8, 16)), "s1 must be > 0"), "s1");
  CHECK(has(err(Shape(1, 2, 2, 8, 8, 1024)), "head dims must be <= 512"), "d");
  FlashAttentionScoreGradShape s = Shape(2, 2, 2, 8, 8, 16);
  s.has_mask = true;
  s.mask_batches = 3;
  CHECK(has(err(s), "mask leading dims"), "mask");
  PlatformInfo tiny = pf;
  tiny.ub_bytes = 8 * 1024;
  CHECK(has(FlashAttentionScoreGradTilingFunc(Shape(1, 1, 1, 64, 64, 512, FagDtype::FP32), tiny, t), "no tile fits"),
         "tiny ub");
}

}  // namespace

int main() {
  TestShapes();
  TestSmallUbShrinksTiles();
  TestErrors();
  return tot_test::FinishChecks();
}
