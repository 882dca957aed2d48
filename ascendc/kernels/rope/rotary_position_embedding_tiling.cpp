// Host tiling of the rotary position embedding kernel: the broadcast pattern of cos/sin, the core split over
// rows, and the rows per UB tile. Pure C++ (no torch); unit-tested by ascendc/tests/rope_tiling_test.cpp.
#include "rope/rotary_position_embedding_tiling.h"

#include <algorithm>

namespace tot_ascendc {

bool RopeBroadcastPattern(const int64_t* x_shape, const int64_t* table_shape, int ndim, uint64_t* table_rows,
                          uint64_t* repeat) {
  // Walk the row dims (all but the last) outermost first: broadcast dims, then table dims, then broadcast dims.
  enum Phase { kOuter, kTable, kInner } phase = kOuter;
  uint64_t tab = 1, inner = 1;
  for (int i = 0; i + 1 < ndim; ++i) {
    const int64_t xs = x_shape[i], ts = table_shape[i];
    if (ts != 1 && ts != xs) return false;
    if (xs == 1) continue;  // size-1 dims fit any phase
    const bool broadcast = ts == 1;
    if (!broadcast) {
      if (phase == kInner) return false;  // table, broadcast, table: not one run of table rows
      phase = kTable;
      tab *= uint64_t(xs);
    } else if (phase != kOuter) {
      phase = kInner;
      inner *= uint64_t(xs);
    }
  }
  *table_rows = tab;
  *repeat = inner;
  return true;
}

namespace {

std::string Str(const char* what, uint64_t v) { return std::string(what) + std::to_string(v); }

// Element pitch that is a whole number of DataBlocks both for `bytes`-sized elements and for fp32.
uint32_t Pitch(uint64_t n, uint32_t bytes) { return AlignUp(n, bytes == 2 ? 16 : 8); }

}  // namespace

std::string RopeTiling(const RopeProblem& p, const PlatformInfo& platform, RotaryPositionEmbeddingTiling* out) {
  if (p.mode != 0 && p.mode != 1)
    return Str("rope tiling: the kernel handles mode 0 (half) and 1 (interleave); got mode ", uint64_t(p.mode));
  if (p.d <= 0 || p.d % 2 != 0) return "rope tiling: D must be even and positive; got D=" + std::to_string(p.d);
  if (p.x_dtype > kRopeBFloat16) return Str("rope tiling: unknown x dtype code ", p.x_dtype);
  if (p.table_dtype != p.x_dtype && p.table_dtype != kRopeFloat32)
    return "rope tiling: cos/sin must have x's dtype or float32";
  if (p.rows == 0) return "rope tiling: x has no rows";
  if (p.table_rows == 0 || p.repeat == 0 || p.rows % (p.table_rows * p.repeat) != 0)
    return Str("rope tiling: rows=", p.rows) + Str(" is not a multiple of table_rows*repeat=", p.table_rows * p.repeat);
  RotaryPositionEmbeddingTiling t{};
  t.mode = uint32_t(p.mode);
  t.is_grad = p.is_grad ? 1 : 0;
  t.x_dtype = p.x_dtype;
  t.table_dtype = p.table_dtype;
  t.d = uint32_t(p.d);
  const uint32_t xb = RopeDtypeBytes(p.x_dtype);
  if (p.mode == 0) {
    t.half_pitch = Pitch(uint64_t(p.d) / 2, xb);
    t.row_pitch = 2 * t.half_pitch;
  } else {
    t.row_pitch = Pitch(uint64_t(p.d), xb);
    t.half_pitch = t.row_pitch / 2;
  }
  t.rows = p.rows;
  t.table_rows = p.table_rows;
  // A single table row serves every x row: one repeat run (tiles then need one table row each).
  t.repeat = p.table_rows == 1 ? p.rows : p.repeat;
  t.block_dim = uint32_t(std::min<uint64_t>(platform.aiv_cores, p.rows));
  t.base_rows = p.rows / t.block_dim;
  t.big_cores = uint32_t(p.rows % t.block_dim);
  // Largest tile that fits UB: at most a core's rows, at most 2047 rows (half mode copies 2 blocks per row and
  // DataCopyPad takes at most 4095 blocks).
  const uint64_t core_rows = t.base_rows + (t.big_cores ? 1 : 0);
  uint64_t n = std::min<uint64_t>(core_rows, 2047);
  while (n > 0 && RopeUbBytes(t, n, RopeTableRowsPerTile(n, t.repeat)) > platform.UsableUb()) --n;
  if (n == 0)
    return Str("rope tiling: D=", uint64_t(p.d)) + Str(" needs ", RopeUbBytes(t, 1, 1)) +
           Str(" bytes of UB for one row; usable UB is ", platform.UsableUb());
  t.tile_rows = uint32_t(n);
  t.tile_table_rows = uint32_t(RopeTableRowsPerTile(n, t.repeat));
  t.ub_bytes = uint32_t(RopeUbBytes(t, t.tile_rows, t.tile_table_rows));
  *out = t;
  return "";
}

}  // namespace tot_ascendc
