// Process-wide knobs of the Ascend C path, read by the PrivateUse1 glue (set through the op
// npu_attention_tile_config; the performance model's counters through ctypes).
#pragma once

#include <cstdint>

namespace npu_fa::ascendc {

// FlashAttention forward tile sizes forced by npu_attention_tile_config (0 = automatic).
void FlashAttentionBlocks(uint32_t* s1_block, uint32_t* s2_block);

}  // namespace npu_fa::ascendc
