// Host tiling of the fused causal conv1d kernel: pure C++ (no torch), unit-tested by
// ascendc/tests/fused_causal_conv1d_tiling_test.cpp.
#include "linear_attention/fused_causal_conv1d_tiling.h"

#include <limits>

namespace tot_ascendc {
namespace {

constexpr uint32_t kFloat = 4;
constexpr uint32_t kMaxRows = 248;      // the largest multiple of 8 that is one repeat count
constexpr uint32_t kChannelAlign = 16;  // 32 bytes of a 16-bit row: every UB row starts on a DataBlock
constexpr uint32_t kMaxPitch = 2032;    // a row's pitch is a level-0 repeat stride: at most 255 fp32 DataBlocks

uint32_t DtypeBytes(ConvDtype d) { return d == ConvDtype::FP32 ? 4 : 2; }

}  // namespace

uint32_t ConvUbBytes(uint32_t channels, uint32_t rows, uint32_t width, uint32_t dtype_bytes, bool has_bias) {
  const uint64_t d = channels, r = rows, k = width;
  uint64_t bytes = k * d * kFloat;                           // the block's weights in fp32
  if (has_bias) bytes += d * kFloat;                         // its bias in fp32
  bytes += (k - 1 + r) * d * kFloat;                         // the window: K-1 carried rows + the tile, fp32
  bytes += 2 * r * d * kFloat;                               // the outputs and the products (SiLU's denominator)
  bytes += (r > k ? r : k) * d * dtype_bytes;                // staging of rows as stored (x, cache, weights)
  if (dtype_bytes != kFloat) bytes += r * d * dtype_bytes;   // the outputs in the inputs' dtype
  return bytes > 0xffffffffull ? 0xffffffffu : uint32_t(bytes);
}

std::string CausalConvTilingFn(const ConvShape& s, const PlatformInfo& platform, CausalConvTiling& t) {
  if (s.seqs == 0 || s.dim == 0 || s.width == 0)
    return "empty shape (sequences, channels and the kernel width must be positive)";
  if (s.state_len + 1 < s.width) return "a state_len shorter than K - 1";
  if (s.slots > uint64_t(std::numeric_limits<int32_t>::max())) return "more than 2^31 - 1 cache lines (int32 table)";
  if (s.tokens > uint32_t(std::numeric_limits<int32_t>::max())) return "more than 2^31 - 1 tokens (int32 table)";
  t = CausalConvTiling{};
  t.dtype = uint32_t(s.dtype);
  t.dim = s.dim;
  t.width = s.width;
  t.state_len = s.state_len;
  t.tokens = s.tokens;
  t.seqs = s.seqs;
  t.has_bias = s.has_bias ? 1 : 0;
  t.silu = s.silu ? 1 : 0;
  t.residual = s.residual ? 1 : 0;
  t.slots = s.slots;

  // Channels: the whole (16-padded) dim up to the cap; narrower blocks when the units would not fill the cores.
  const uint32_t cores = platform.aiv_cores;
  uint32_t cap = s.max_channels < kChannelAlign ? kChannelAlign : s.max_channels / kChannelAlign * kChannelAlign;
  if (cap > kMaxPitch) cap = kMaxPitch;
  uint32_t channels = AlignUp(s.dim, kChannelAlign);
  if (channels > cap) channels = cap;
  if (uint64_t(s.seqs) * CeilDiv(s.dim, channels) < cores) {
    const uint32_t want_blocks = CeilDiv(cores, s.seqs);
    const uint32_t split = AlignUp(CeilDiv(s.dim, want_blocks), kChannelAlign);
    if (split < channels) channels = split;
  }
  // Rows: the largest multiple of 8 that fits UB, at most the longest sequence; then narrower blocks if 8 rows do
  // not fit (a wide kernel).
  const uint32_t dbytes = DtypeBytes(s.dtype);
  uint32_t rows = s.max_rows < 8 ? 8 : (s.max_rows > kMaxRows ? kMaxRows : s.max_rows / 8 * 8);
  const uint32_t longest = AlignUp(s.longest < 1 ? 1 : s.longest, 8);
  if (rows > longest) rows = longest;
  while (rows > 8 && ConvUbBytes(channels, rows, s.width, dbytes, s.has_bias) > platform.UsableUb()) rows -= 8;
  while (channels > kChannelAlign && ConvUbBytes(channels, rows, s.width, dbytes, s.has_bias) > platform.UsableUb())
    channels -= kChannelAlign;
  if (ConvUbBytes(channels, rows, s.width, dbytes, s.has_bias) > platform.UsableUb())
    return "a kernel width too large for its weights and window in UB";
  t.channels = channels;
  t.rows = rows;
  t.stage_rows = rows > s.width ? rows : s.width;
  t.blocks = CeilDiv(s.dim, channels);
  if (uint64_t(t.blocks) * s.seqs > std::numeric_limits<uint32_t>::max()) return "more than 2^32 - 1 work units";
  t.units = t.blocks * s.seqs;
  t.block_dim = t.units < cores ? t.units : cores;
  t.units_base = t.units / t.block_dim;
  t.units_extra = t.units % t.block_dim;
  t.ub_bytes = ConvUbBytes(channels, rows, s.width, dbytes, s.has_bias);
  return "";
}

}  // namespace tot_ascendc
