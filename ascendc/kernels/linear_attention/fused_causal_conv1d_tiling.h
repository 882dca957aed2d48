// Tiling of the fused causal conv1d kernel (fused_causal_conv1d and its in-place _v2 form on the npu device;
// torch_npu npu_fused_causal_conv1d, the short depthwise conv of Qwen3-Next's Gated DeltaNet layer): per sequence,
// the cached rows of its conv-state line are prepended to its rows of x, y[t] = sum_k weight[k] * padded[offset+t+k]
// (+ bias, SiLU, + x[t]), and the line keeps the last state_len padded rows.
//
// Channels never mix in a depthwise conv, so the work splits into units (channel block, sequence): unit u = block *
// seqs + seq, block-major so that a core's consecutive units share the block's weights. A unit keeps the window of
// K-1 rows in UB in fp32 while the sequence's rows stream through in tiles of `rows` rows. `channels` (a multiple of
// 16, the UB pitch of every row) is made smaller when there are fewer units than vector cores; `rows` (a multiple of
// 8, one repeat count) is the largest that fits UB, at most the longest sequence. Core c runs the units
// [ConvUnitBegin(c), ConvUnitBegin(c + 1)).
#pragma once

#include <cstdint>
#include <string>

#include "common/platform.h"

namespace tot_ascendc {

// Dtype codes of x, weight, bias, conv_states and y (one dtype for all).
enum class ConvDtype : uint32_t { FP16 = 0, BF16 = 1, FP32 = 2 };

// Columns of the kernel's int32 sequence table, one row per computed sequence.
enum ConvSeqField : uint32_t {
  kConvStart = 0,   // first row of x
  kConvLen,         // rows of x
  kConvReadLine,    // cache line of the cached rows; -1: K-1 zero rows (no initial state)
  kConvOffset,      // first padded row the conv of token 0 reads
  kConvWriteLine,   // cache line receiving the last min(state_len, prefix + len) padded rows
  kConvReset,       // y[t] = 0 (before the residual) for t < reset (conv_mode "pangu")
  kConvSeqFields
};

// POD: copied to GM and read by every core.
struct CausalConvTiling {
  uint32_t block_dim = 1;
  uint32_t dtype = 0;        // ConvDtype
  uint32_t dim = 0;          // channels
  uint32_t width = 0;        // K, the kernel width
  uint32_t state_len = 0;    // C, rows per cache line (>= K - 1)
  uint32_t tokens = 0;       // rows of x (and y)
  uint32_t seqs = 0;         // computed sequences (rows of the sequence table)
  uint32_t has_bias = 0, silu = 0, residual = 0;
  uint64_t slots = 0;        // cache lines
  uint32_t channels = 0;     // channels per block: a multiple of 16, the UB pitch of every row
  uint32_t blocks = 0;       // ceil(dim / channels)
  uint32_t rows = 0;         // x rows per tile (a multiple of 8, at most 248)
  uint32_t stage_rows = 0;   // rows of the input-dtype staging buffer: max(rows, K)
  uint32_t units = 0;        // blocks * seqs
  uint32_t units_base = 0, units_extra = 0;  // core c gets units_base units, +1 if c < units_extra
  uint32_t ub_bytes = 0;     // UB the kernel allocates (planned, per core)
};

inline uint32_t ConvUnitBegin(const CausalConvTiling& t, uint32_t c) {
  return c * t.units_base + (c < t.units_extra ? c : t.units_extra);
}

// Shapes and options of one call, as the host glue sees them after validation.
struct ConvShape {
  uint32_t tokens = 0, seqs = 0, dim = 0, width = 0, state_len = 0;
  uint32_t longest = 0;      // the longest computed sequence (caps the tile rows)
  uint64_t slots = 0;
  ConvDtype dtype = ConvDtype::FP16;
  bool has_bias = false, silu = false, residual = false;
  uint32_t max_channels = 256;  // tests: narrower blocks
  uint32_t max_rows = 248;      // tests: shorter tiles
};

// UB bytes the kernel allocates (see the kernel's InitBuffers).
uint32_t ConvUbBytes(uint32_t channels, uint32_t rows, uint32_t width, uint32_t dtype_bytes, bool has_bias);

// Fills `out`; returns "" or why the shape cannot be tiled (the glue then runs the CPU kernel).
std::string CausalConvTilingFn(const ConvShape& shape, const PlatformInfo& platform, CausalConvTiling& out);

}  // namespace tot_ascendc
