// Tiling of the rotary position embedding kernel (forward, and dx of the backward), shared by host and kernel.
//
// x is viewed as `rows` rows of D values (rows = every dim but the last). cos/sin are viewed as `table_rows`
// rows of D; x row r uses table row (r / repeat) % table_rows. That "outer broadcast x table rows x inner
// repeat" pattern covers cos/sin of [S, D] / [1,S,1,D] on BSND, [1,1,S,D] on BNSD, [S,1,1,D] on SBND, [T,1,D] on
// TND, per-batch [B,S,1,D], and full-shape tables; other broadcasts are not this kernel's (the glue says which).
//
// UB row layout (all buffers of a tile share one row pitch `row_pitch`, in elements):
//   half mode:       [x1 | pad | x2 | pad], each half padded to `half_pitch` elements (a 32-byte multiple for x's
//                    dtype and for fp32), so the halves can be swapped with whole-DataBlock copies;
//   interleave mode: [x | pad], D padded to `row_pitch`.
#pragma once

#include <cstdint>

namespace tot_ascendc {

enum RopeDtype : uint32_t { kRopeFloat32 = 0, kRopeFloat16 = 1, kRopeBFloat16 = 2 };

inline uint32_t RopeDtypeBytes(uint32_t dtype) { return dtype == kRopeFloat32 ? 4 : 2; }

struct RotaryPositionEmbeddingTiling {
  uint32_t block_dim;        // AIV cores used (<= 48)
  uint32_t mode;             // 0 half (rotate_half), 1 interleave
  uint32_t is_grad;          // 0: out = x*cos + rot(x)*sin; 1: dx = g*cos + rot^T(g*sin), dcos, dsin
  uint32_t x_dtype;          // RopeDtype of x (and out)
  uint32_t table_dtype;      // RopeDtype of cos/sin: x's or float32
  uint32_t d;                // head dimension (even)
  uint32_t half_pitch;       // half mode: UB elements per half row; interleave: row_pitch / 2 (unused)
  uint32_t row_pitch;        // UB elements per row (32-byte multiple for x's dtype and fp32)
  uint64_t rows;             // x rows
  uint64_t table_rows;       // cos/sin rows
  uint64_t repeat;           // consecutive x rows sharing one cos/sin row
  uint64_t base_rows;        // rows per core; the first `big_cores` cores take one more
  uint32_t big_cores;
  uint32_t tile_rows;        // x rows per UB tile (the last tile of a core may be shorter)
  uint32_t tile_table_rows;  // cos/sin rows a tile of tile_rows x rows can touch
  uint32_t ub_bytes;         // UB the kernel allocates with these sizes (<= usable UB)
};

// Shape and options of one launch.
struct RopeProblem {
  uint64_t rows = 0;
  int64_t d = 0;
  int64_t mode = 0;
  bool is_grad = false;
  uint32_t x_dtype = kRopeFloat32;
  uint32_t table_dtype = kRopeFloat32;
  uint64_t table_rows = 1;
  uint64_t repeat = 1;
};

// Cos/sin rows a tile of `tile_rows` consecutive x rows may touch, wherever it starts.
inline uint64_t RopeTableRowsPerTile(uint64_t tile_rows, uint64_t repeat) {
  const uint64_t k = (tile_rows + 2 * repeat - 2) / repeat;  // ceil((tile_rows - 1) / repeat) + 1
  return k < tile_rows ? k : tile_rows;
}

// UB bytes of the kernel's buffers for a tile of `tile_rows` x rows and `table_rows` cos/sin rows (the kernel
// allocates exactly these; see the kernel's Init).
inline uint64_t RopeUbBytes(const RotaryPositionEmbeddingTiling& t, uint64_t tile_rows, uint64_t table_rows) {
  const uint64_t x_elems = tile_rows * t.row_pitch, tab_elems = table_rows * t.row_pitch;
  const uint64_t sx = RopeDtypeBytes(t.x_dtype), sc = RopeDtypeBytes(t.table_dtype);
  uint64_t bytes = 2 * x_elems * sx * 2;                  // x in + out, double buffered
  bytes += 2 * 2 * tab_elems * sc;                        // cos + sin in, double buffered
  bytes += x_elems * 4;                                   // rotated operand (fp32)
  if (sx != 4) bytes += 2 * x_elems * 4;                  // fp32 copy of x and fp32 result
  if (sc != 4) bytes += 2 * tab_elems * 4;                // fp32 cos and sin
  bytes += uint64_t(t.row_pitch) * 4;                     // sign row folded into sin
  if (t.mode == 1) bytes += x_elems * 4;                  // Gather byte offsets
  if (t.is_grad) {
    bytes += 2 * x_elems * sx;                            // x in (the forward input), double buffered
    if (sx != 4) bytes += x_elems * 4;                    // fp32 copy of x
    bytes += x_elems * 4;                                 // per-row products before the row reduction
    bytes += 2 * 2 * tab_elems * 4;                       // dcos + dsin rows out (fp32), double buffered
  }
  return bytes;
}

}  // namespace tot_ascendc

// Host only (the CANN device pass defines __CCE_AICORE__ and has no <string>).
#ifndef __CCE_AICORE__
#include <string>

#include "common/platform.h"

namespace tot_ascendc {

// Which cos/sin row each x row uses, from x's shape and the table's shape right-aligned to it (1s in front), both
// of rank `ndim` with the head dimension last. Returns false when the broadcast is not "outer x table x repeat".
bool RopeBroadcastPattern(const int64_t* x_shape, const int64_t* table_shape, int ndim, uint64_t* table_rows,
                          uint64_t* repeat);

// Fills `out`; returns "" or why the problem cannot be tiled.
std::string RopeTiling(const RopeProblem& p, const PlatformInfo& platform, RotaryPositionEmbeddingTiling* out);

}  // namespace tot_ascendc
#endif
