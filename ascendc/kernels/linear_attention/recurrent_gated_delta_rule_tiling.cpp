// Host tiling of the recurrent gated delta rule kernel: pure C++ (no torch), unit-tested by
// ascendc/tests/recurrent_gated_delta_rule_tiling_test.cpp.
#include "linear_attention/recurrent_gated_delta_rule_tiling.h"

#include <limits>

namespace tot_ascendc {
namespace {

constexpr uint32_t kFloat = 4;
constexpr uint32_t kBlock = 32;       // bytes of one DataBlock
constexpr uint32_t kMaxRepeat = 255;  // level-0 repeat count and repeat stride limit
constexpr uint32_t kMaxRows = 248;    // the largest multiple of 8 that is one repeat count (RowDots, Brcb rows)

uint32_t DtypeBytes(GdrDtype d) { return d == GdrDtype::FP32 ? 4 : 2; }

}  // namespace

uint32_t GdrUbBytes(uint32_t rows, uint32_t dk_pad, uint32_t dtype_bytes, uint32_t state_bytes, bool has_gk) {
  const uint64_t r = rows, d = dk_pad;
  uint64_t bytes = 2 * r * d * kFloat;                       // the state rows in fp32, the products
  if (state_bytes != kFloat) bytes += r * d * state_bytes;   // the state rows as stored (load / store staging)
  bytes += 2 * d * kFloat;                                   // q and k in fp32
  if (dtype_bytes != kFloat) bytes += 2 * d * dtype_bytes;   // q and k as stored
  bytes += d * kFloat;                                       // the decay row
  if (has_gk) bytes += d * kFloat;                           // gk as loaded
  bytes += 3 * r * kFloat;                                   // v, S k (then beta (v - S k)), the output
  bytes += r * kBlock;                                       // beta (v - S k) broadcast to one DataBlock per row
  if (dtype_bytes != kFloat) bytes += 2 * AlignUp(r * dtype_bytes, kBlock);  // v as stored, the output staging
  return bytes > 0xffffffffull ? 0xffffffffu : uint32_t(bytes);
}

std::string RecurrentGdrTilingFn(const GdrShape& s, const PlatformInfo& platform, RecurrentGdrTiling& t) {
  if (s.tokens == 0 || s.batch == 0 || s.k_heads == 0 || s.v_heads == 0 || s.dk == 0 || s.dv == 0 || s.slots == 0)
    return "empty shape (tokens, sequences, heads, head dims and slots must be positive)";
  if (s.v_heads % s.k_heads != 0) return "v_heads must be a multiple of k_heads";
  if (s.state_dtype != s.dtype && s.state_dtype != GdrDtype::FP32) return "a state dtype other than the inputs' or fp32";
  if (s.slots > uint64_t(std::numeric_limits<int32_t>::max())) return "more than 2^31 - 1 state slots (int32 tables)";
  if (s.tokens > uint32_t(std::numeric_limits<int32_t>::max())) return "more than 2^31 - 1 tokens (int32 tables)";
  t = RecurrentGdrTiling{};
  t.dtype = uint32_t(s.dtype);
  t.state_dtype = uint32_t(s.state_dtype);
  t.tokens = s.tokens;
  t.batch = s.batch;
  t.k_heads = s.k_heads;
  t.v_heads = s.v_heads;
  t.group = s.v_heads / s.k_heads;
  t.dk = s.dk;
  t.dv = s.dv;
  t.dk_pad = AlignUp(s.dk, 16);
  // A state row's pitch is a level-0 repeat stride in fp32 DataBlocks.
  if (t.dk_pad / (kBlock / kFloat) > kMaxRepeat) return "a key head dim too large for one vector repeat stride";
  t.has_beta = s.has_beta ? 1 : 0;
  t.has_g = s.has_g ? 1 : 0;
  t.has_gk = s.has_gk ? 1 : 0;
  t.scale = s.scale;
  t.slots = s.slots;

  // The largest block of rows (multiple of 8) that fits UB, at most the whole (8-padded) state.
  const uint32_t dbytes = DtypeBytes(s.dtype), sbytes = DtypeBytes(s.state_dtype);
  uint32_t rows = AlignUp(s.dv, 8);
  uint32_t cap = s.max_rows < 8 ? 8 : s.max_rows / 8 * 8;
  if (cap > kMaxRows) cap = kMaxRows;
  if (rows > cap) rows = cap;
  while (rows > 8 && GdrUbBytes(rows, t.dk_pad, dbytes, sbytes, s.has_gk) > platform.UsableUb()) rows -= 8;
  if (GdrUbBytes(rows, t.dk_pad, dbytes, sbytes, s.has_gk) > platform.UsableUb())
    return "eight state rows and the token rows do not fit UB";

  const uint64_t items = uint64_t(s.batch) * s.v_heads;
  if (items * CeilDiv(s.dv, 8) > std::numeric_limits<uint32_t>::max()) return "more than 2^32 - 1 work units";
  t.items = uint32_t(items);
  // Fewer units than cores: smaller blocks of rows (still multiples of 8) so that every core runs rows.
  const uint32_t cores = platform.aiv_cores;
  if (uint64_t(t.items) * CeilDiv(s.dv, rows) < cores) {
    const uint32_t want_blocks = CeilDiv(cores, t.items);
    const uint32_t split_rows = AlignUp(CeilDiv(s.dv, want_blocks), 8);
    if (split_rows < rows) rows = split_rows;
  }
  t.rows = rows;
  t.row_blocks = CeilDiv(s.dv, rows);
  t.ub_bytes = GdrUbBytes(rows, t.dk_pad, dbytes, sbytes, s.has_gk);
  t.units = t.items * t.row_blocks;
  t.block_dim = t.units < cores ? t.units : cores;
  t.units_base = t.units / t.block_dim;
  t.units_extra = t.units % t.block_dim;
  return "";
}

}  // namespace tot_ascendc
