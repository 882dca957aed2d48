// Block-size tuning of the CPU FlashAttention kernels (docs/attention.md, "Block-size tuning").
//
// The op entry points (flash_attention_score(_grad), the prefill ops) run their kernel through run_with_tiles(), which
// picks the tiles of the call's shape class (op family, head dims, dtype, mask kind, power-of-two length buckets,
// threads): an explicit attention_tile_config override wins and nothing is tuned; otherwise the mode of the
// environment variable TORCH_OPS_TRANSFORMER_TUNE decides:
//   unset / ""  the cached winner of the class if the in-process table has one (the Python package loads the
//               per-machine cache file into it at import), else the built-in defaults; never measures;
//   "0"         the built-in defaults, table ignored;
//   "1"         as unset, and a class without an entry is tuned on its first call: the kernel runs on the call's own
//               inputs with a few candidate tile sizes, the fastest is kept in the table and its outputs are returned;
//   "BQxBKV"    these tiles for every call (e.g. "128x512").
// The tiles reach the kernels as a thread-local setting read by tile_config() / tile_config_override() (tiles.h), so
// the kernel bodies do not change. Fake-tensor and compile-time runs never get here (they run the fake kernels).
#pragma once

#include <c10/core/ScalarType.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "common/attention/params.h"
#include "cpu/attention/tiles.h"

namespace npu_fa::attention::tuning {

enum class Family { Forward, Backward, Prefill };

// The tiles set for the calling thread by the innermost live ScopedTiles (nullopt: none; the kernels' defaults).
std::optional<TileConfig> thread_tiles();

class ScopedTiles {
 public:
  explicit ScopedTiles(std::optional<TileConfig> t);
  ~ScopedTiles();
  ScopedTiles(const ScopedTiles&) = delete;
  ScopedTiles& operator=(const ScopedTiles&) = delete;

 private:
  std::optional<TileConfig> prev_;
};

// Runs `run` (the kernel writing the call's outputs) with the tiles of the call's class (see the top of the file).
// When tuning measures, `run` is called several times: `reset` (if given) restores any output the kernel
// accumulates into before each run; the last run is the winner's, so the outputs are the winner's.
void run_with_tiles(Family family, const AttentionParams& p, c10::ScalarType dtype, c10::ScalarType kv_dtype,
                    const std::function<void()>& run, const std::function<void()>& reset = {});

// The class key of a call, e.g. "fwd|d128|bf16|causal|sq2048|skv2048|t2" (attention/tuning.py of the package builds the
// same keys for its lookups).
std::string class_key(Family family, const AttentionParams& p, c10::ScalarType dtype, c10::ScalarType kv_dtype);

}  // namespace npu_fa::attention::tuning
