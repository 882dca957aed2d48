// Counters of the FlashAttention forward kernel (ascendc/kernels/flash_attention) for the performance model's
// cross-check (test/npu/test_perf_model.py): one count-only launch of an fp16 BNSD problem without mask, forced
// square blocks. Usage: npu_model_fa_counts B N S D block. Prints `tiling <s1_block> <s2_block> <vec_rows>
// <block_dim> <tasks>` and one `core ...` line per core (same format as npu_model_counts).
#include <cstdio>
#include <cstdlib>
#include <string>

#include "attention/flash_attention_score_tiling.h"
#include "tikicpulib.h"
#include "attention/flash_attention_score_kernel.h"


int main(int argc, char** argv) {
  if (argc != 6) {
    std::fprintf(stderr, "usage: %s B N S D block\n", argv[0]);
    return 2;
  }
  using namespace tot_ascendc;
  const uint32_t B = std::atoi(argv[1]), N = std::atoi(argv[2]), S = std::atoi(argv[3]), D = std::atoi(argv[4]);
  const uint32_t block = std::atoi(argv[5]);
  FlashAttentionTilingInput in;
  in.batch = B; in.q_heads = N; in.s1 = S; in.s2 = S; in.head_dim = D; in.v_head_dim = D;
  in.dtype = FA_FLOAT16; in.scale = 0.125f;
  FlashAttentionTilingOptions opt{block, block};
  FlashAttentionScoreTilingData t;
  const std::string err = FlashAttentionScoreTiling(in, opt, Ascend910B(), &t);
  if (!err.empty()) {
    std::printf("tiling failed: %s\n", err.c_str());
    return 1;
  }
  const size_t n = size_t(B) * N * S * D, rows = size_t(B) * N * S;
  auto gm = [](size_t bytes) { return static_cast<uint8_t*>(AscendC::GmAlloc(bytes)); };
  uint8_t *q = gm(n * 2), *k = gm(n * 2), *v = gm(n * 2), *out = gm(n * 2), *smax = gm(rows * 32),
          *ssum = gm(rows * 32), *ws = gm(t.workspace_bytes), *tiling = gm(sizeof(t));
  *reinterpret_cast<FlashAttentionScoreTilingData*>(tiling) = t;
  AscendC::cpu::SetCountOnly(true);
  AscendC::SetKernelMode(AscendC::KernelMode::MIX_MODE);
  ICPU_RUN_KF(flash_attention_score, t.block_dim, q, k, v, static_cast<uint8_t*>(nullptr), out, smax, ssum, ws,
              tiling);
  std::printf("tiling %u %u %u %u %u\n", t.s1_block, t.s2_block, t.vec_rows, t.block_dim, t.total_tasks);
  for (const auto& c : AscendC::cpu::LastLaunchStats().cores) {
    const auto& x = c.counters;
    std::printf("core %s %d %llu %llu %llu %llu %llu %llu %llu %llu %llu %llu\n", c.type == AscendC::cpu::CoreType::AIC ? "AIC" : "AIV",
                c.block_idx, (unsigned long long)x.gm_read_bytes, (unsigned long long)x.gm_write_bytes,
                (unsigned long long)x.cube_macs, (unsigned long long)x.vector_elements,
                (unsigned long long)x.vector_repeats, (unsigned long long)x.copies,
                (unsigned long long)x.vector_instrs, (unsigned long long)x.cube_jobs,
                (unsigned long long)x.scalar_gm, (unsigned long long)x.scalar_ub);
  }
  for (uint8_t* p : {q, k, v, out, smax, ssum, ws, tiling}) AscendC::GmFree(p);
  return 0;
}
