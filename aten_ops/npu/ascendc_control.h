// Process-wide knobs of the Ascend C path, set from Python through ctypes (performance model: bench npu-model)
// and read by the PrivateUse1 glue. Torch-free so the exported C functions stay plain.
#pragma once

#include <cstdint>

namespace npu_fa::ascendc {

// FlashAttention forward tile sizes forced by tot_ascendc_set_flash_attention_blocks (0 = automatic).
void FlashAttentionBlocks(uint32_t* s1_block, uint32_t* s2_block);

}  // namespace npu_fa::ascendc
