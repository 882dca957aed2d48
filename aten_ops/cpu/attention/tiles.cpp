// The CPU FlashAttention tile policy of tiles.h (sizes from the L2 cache and the ISA, the attention_tile_config
// override) and the ops attention_default_tiles / attention_tile_config.
#include "cpu/attention/tiles.h"

#include <ATen/cpu/Utils.h>
#include <c10/util/Exception.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <string>
#include <vector>

#include "cpu/attention/tuning.h"
#include "generated/kernels.h"

namespace npu_fa::attention {
namespace {
std::atomic<int64_t> g_block_q{0}, g_block_kv{0};

int64_t l2_bytes() {
  static const int64_t l2 = [] {
    const long v = sysconf(_SC_LEVEL2_CACHE_SIZE);
    return v > 0 ? int64_t(v) : int64_t(1) << 20;
  }();
  return l2;
}

// Non-AMX (AVX-512 / AVX2 FMA or AVX512-BF16 dot products): block_q = 64 query rows (a full brgemm M block; finer
// causal/band granularity than 128). block_kv: keys whose working set per step (K and V tiles, the fp32 score tile
// and its low-precision copy) fills about 3/4 of L2; the rest holds Q and the accumulator. Measured on a 1 MiB-L2
// Zen 4: 512 (fp32, D=128) to 1024 keys are within 2-3% of each other, 256-320 are slower.
//
// AMX (bf16 products, elem_size 2): the products run on 16-row x 64-byte tile registers (16 rows x 32 bf16 keys of
// the reduction), brgemm blocks its output in 32 x 32 fp32 (2 x 2 tiles), and every kernel switch reloads the tile
// configuration. So: block_q = 128 (a multiple of 32 rows: no partial row tiles, and 4 row blocks per K tile load
// amortise the configuration and the K/V reads 2x better than 64), block_kv a multiple of 32 keys (whole VNNI tile
// columns, no masked tail tile) of 512..1024 sized by the same L2 rule: the products are ~4x faster than with
// AVX512-BF16, so the per-tile fixed costs (configuration, the online-softmax rescale of the accumulator) must be
// spread over more keys, and the exp pass stays vectorised in fp32.
TileConfig tiles_for(int64_t head_dim, int64_t elem_size, bool amx) {
  const int64_t block_q = amx ? 128 : 64;
  const int64_t per_key = 2 * head_dim * elem_size + block_q * (4 + elem_size);
  const int64_t kv = l2_bytes() * 3 / 4 / std::max<int64_t>(per_key, 1);
  if (amx) return {block_q, std::clamp<int64_t>(kv / 32 * 32, 512, 1024)};
  return {block_q, std::clamp<int64_t>(kv / 64 * 64, 64, 1024)};
}

// Whether this CPU has AMX-BF16 tiles (oneDNN's brgemm then runs bf16 products on them).
bool amx_bf16_available() {
  static const bool v = [] {
    const auto caps = at::cpu::get_cpu_capabilities();
    const auto tile = caps.find("amx_tile"), bf16 = caps.find("amx_bf16");
    return tile != caps.end() && bf16 != caps.end() && tile->second.isBool() && tile->second.toBool() &&
           bf16->second.isBool() && bf16->second.toBool();
  }();
  return v;
}

TileConfig default_tiles(int64_t head_dim, int64_t elem_size) {
  return tiles_for(head_dim, elem_size, elem_size == 2 && amx_bf16_available());
}
}  // namespace

// AMX only drives bf16 products (elem_size 2); fp32 and fp16 inputs compute in fp32 on the AVX-512 FMA units.
TileConfig default_tiles(int64_t head_dim, int64_t elem_size, c10::string_view isa) {
  TORCH_CHECK_VALUE(isa == "auto" || isa == "amx" || isa == "avx512" || isa == "avx2" || isa == "default",
                    "attention_default_tiles: argument 'isa' must be 'auto', 'amx', 'avx512', 'avx2' or 'default'; got '",
                    std::string(isa.data(), isa.size()), "'");
  TORCH_CHECK_VALUE(head_dim > 0 && (elem_size == 2 || elem_size == 4), "attention_default_tiles: arguments "
                    "'head_dim' must be positive and 'elem_size' 2 (bf16 products) or 4 (fp32); got ", head_dim, " and ",
                    elem_size);
  const bool amx_isa = isa == "amx" || (isa == "auto" && amx_bf16_available());
  return tiles_for(head_dim, elem_size, amx_isa && elem_size == 2);
}

TileConfig tile_config(int64_t head_dim, int64_t elem_size) {
  TileConfig t = default_tiles(head_dim, elem_size);
  const TileConfig over = tile_config_override();
  if (over.block_q > 0) t.block_q = over.block_q;
  if (over.block_kv > 0) t.block_kv = over.block_kv;
  return t;
}

TileConfig tile_config() { return tile_config(128, 4); }

// The explicit sizes of attention_tile_config when any is set; else the tiles the op entry point chose for this
// thread's call (tuning.h: tuned, cached or forced by TORCH_OPS_TRANSFORMER_TUNE); else none (0: kernel default).
TileConfig tile_config_override() {
  const TileConfig explicit_tiles{g_block_q.load(), g_block_kv.load()};
  if (explicit_tiles.block_q > 0 || explicit_tiles.block_kv > 0) return explicit_tiles;
  return tuning::thread_tiles().value_or(TileConfig{0, 0});
}

}  // namespace npu_fa::attention

namespace npu_fa {
std::vector<int64_t> attention_default_tiles(int64_t head_dim, int64_t elem_size, c10::string_view isa) {
  const auto t = attention::default_tiles(head_dim, elem_size, isa);
  return {t.block_q, t.block_kv};
}

// Overrides are process-wide: > 0 sets, 0 keeps, -1 returns to the automatic (cache-derived) choice.
std::vector<int64_t> attention_tile_config(int64_t block_q, int64_t block_kv) {
  TORCH_CHECK_VALUE(block_q >= -1 && block_q <= 4096, "attention_tile_config: argument 'block_q' must be in [-1, 4096] "
                    "(0 keeps the current value, -1 restores the automatic choice); got ", block_q);
  TORCH_CHECK_VALUE(block_kv >= -1 && block_kv <= 8192, "attention_tile_config: argument 'block_kv' must be in [-1, 8192] "
                    "(0 keeps the current value, -1 restores the automatic choice); got ", block_kv);
  if (block_q != 0) attention::g_block_q.store(std::max<int64_t>(block_q, 0));
  if (block_kv != 0) attention::g_block_kv.store(std::max<int64_t>(block_kv, 0));
  return {attention::g_block_q.load(), attention::g_block_kv.load()};
}
}  // namespace npu_fa
