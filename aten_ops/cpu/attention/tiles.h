// Tile sizes of the CPU FlashAttention kernels (forward.h, backward.h; the prefill ops run the forward): the built-in
// sizes chosen from the L2 cache and the ISA, the process-wide override of the op attention_tile_config, and the
// per-call tiles that block-size tuning (tuning.h) sets for the calling thread. CPU policy only: the Ascend C kernels
// have their own tiling (ascendc/kernels, npu_attention_tile_config).
#pragma once

#include <c10/util/string_view.h>

#include <cstdint>

namespace npu_fa::attention {

struct TileConfig {
  int64_t block_q;
  int64_t block_kv;
};

TileConfig tile_config();
// Tile sizes for a kernel with head dim `head_dim` and `elem_size`-byte inputs, sized from the L2 cache; values
// set through attention_tile_config win.
TileConfig tile_config(int64_t head_dim, int64_t elem_size);
// Only the sizes set explicitly through attention_tile_config, else the tiles tuning set for this thread's call
// (0 = not set), for kernels with their own defaults.
TileConfig tile_config_override();
// Built-in tiles before any override or tuning, for an ISA: "amx" (AMX-BF16 tiles drive the bf16 products),
// "avx512", "avx2", "default", or "auto" (this CPU). See tiles.cpp for the reasoning.
TileConfig default_tiles(int64_t head_dim, int64_t elem_size, c10::string_view isa);

}  // namespace npu_fa::attention
