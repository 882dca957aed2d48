// Process-wide knobs of the Ascend C path: the FlashAttention tile override (the op npu_attention_tile_config of
// native_functions.yaml) and, for the performance model, C entry points (ctypes on torch_ops_transformer/_C*.so)
// that switch the CPU runtime to count-only launches and read the per-core counters of the last launch.
#include "npu/ascendc_control.h"

#include <c10/util/Exception.h>

#include <vector>

#include "generated/kernels.h"

#include <atomic>

#ifndef TOT_WITH_CANN
#include "tikicpulib.h"
#endif

#define TOT_EXPORT extern "C" __attribute__((visibility("default")))

namespace {
std::atomic<uint32_t> g_fa_s1_block{0}, g_fa_s2_block{0};
}

namespace npu_fa::ascendc {
void FlashAttentionBlocks(uint32_t* s1_block, uint32_t* s2_block) {
  *s1_block = g_fa_s1_block.load();
  *s2_block = g_fa_s2_block.load();
}
}  // namespace npu_fa::ascendc

namespace npu_fa {
// > 0 sets, 0 keeps, -1 returns to the automatic choice. Invalid sizes surface as the tiling's error at the next
// flash_attention_score call.
std::vector<int64_t> npu_attention_tile_config(int64_t s1_block, int64_t s2_block) {
  constexpr int64_t kMax = 65535;
  TORCH_CHECK_VALUE(s1_block >= -1 && s1_block <= kMax, "npu_attention_tile_config: argument 's1_block' must be in "
                    "[-1, ", kMax, "] (0 keeps the current value, -1 restores the automatic choice); got ", s1_block);
  TORCH_CHECK_VALUE(s2_block >= -1 && s2_block <= kMax, "npu_attention_tile_config: argument 's2_block' must be in "
                    "[-1, ", kMax, "] (0 keeps the current value, -1 restores the automatic choice); got ", s2_block);
  if (s1_block != 0) g_fa_s1_block = s1_block > 0 ? uint32_t(s1_block) : 0u;
  if (s2_block != 0) g_fa_s2_block = s2_block > 0 ? uint32_t(s2_block) : 0u;
  return {int64_t(g_fa_s1_block.load()), int64_t(g_fa_s2_block.load())};
}
}  // namespace npu_fa

#ifndef TOT_WITH_CANN
TOT_EXPORT void tot_ascendc_set_count_only(int on) { AscendC::cpu::SetCountOnly(on != 0); }

// Per core of the last launch, 12 values: type (0 AIC, 1 AIV), block_idx, gm_read_bytes, gm_write_bytes,
// cube_macs, vector_elements, vector_repeats, copies, vector_instrs, cube_jobs, scalar_gm, scalar_ub. Writes at most
// max_cores rows; returns the core count.
TOT_EXPORT int tot_ascendc_last_stats(unsigned long long* out, int max_cores) {
  const AscendC::cpu::LaunchStats stats = AscendC::cpu::LastLaunchStats();
  const int n = int(stats.cores.size());
  for (int i = 0; i < n && i < max_cores && out; ++i) {
    const auto& c = stats.cores[i];
    unsigned long long* row = out + 12 * i;
    row[0] = c.type == AscendC::cpu::CoreType::AIC ? 0 : 1;
    row[1] = static_cast<unsigned long long>(c.block_idx);
    row[2] = c.counters.gm_read_bytes;
    row[3] = c.counters.gm_write_bytes;
    row[4] = c.counters.cube_macs;
    row[5] = c.counters.vector_elements;
    row[6] = c.counters.vector_repeats;
    row[7] = c.counters.copies;
    row[8] = c.counters.vector_instrs;
    row[9] = c.counters.cube_jobs;
    row[10] = c.counters.scalar_gm;
    row[11] = c.counters.scalar_ub;
  }
  return n;
}
#endif
