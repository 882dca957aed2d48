// Host tiling of moe_gating_top_k_softmax: core split over rows, rows per UB tile, buffer count, UB row strides.
#include "moe/moe_gating_top_k_softmax_tiling.h"

#include <algorithm>

namespace tot_ascendc {

namespace {

constexpr uint32_t kBlock = 32;          // bytes of a DataBlock: UB rows start on one
constexpr uint32_t kMaxTileRows = 1024;  // DataCopyPad blockCount is at most 4095; 1024 rows already amortise it
constexpr int64_t kMaxK = 1024;          // as the CPU op
constexpr uint32_t kBatchedMaxE = 64;    // one fp32 repeat per row
constexpr uint32_t kBatchedMaxRows = 248;  // repeat counts are 8-bit; a multiple of 8 (whole Brcb repeats)

// ReduceMax(calIndex) / ReduceSum work space for `count` fp32 elements: one (value, index) pair per 64-element
// repeat, then a second level over those pairs, each rounded up to a DataBlock, plus one DataBlock of slack
// (a conservative reading of the sharedTmpBuffer size rule in the ReduceMax docs page).
uint32_t ReduceTmpBytes(uint32_t count) {
  const uint32_t first = CeilDiv(count, 64) * 2;
  const uint32_t second = CeilDiv(first, 64) * 2;
  return (AlignUp(first, 8) + AlignUp(second, 8) + 8) * 4;
}

}  // namespace

uint32_t GatingDtypeBytes(GatingDtype dtype) { return dtype == GatingDtype::kFloat32 ? 4 : 2; }

uint64_t MoeGatingUbBytes(const MoeGatingTopKSoftmaxTiling& t, uint32_t tile_rows, uint32_t buffer_num) {
  const uint64_t s = GatingDtypeBytes(GatingDtype(t.dtype));
  const uint64_t r = tile_rows, bn = buffer_num;
  uint64_t bytes = bn * r * t.x_row_stride * s;                        // x tiles (VECIN)
  if (t.has_finished) bytes += bn * AlignUp(r, kBlock);                // finished flags (VECIN), 1 byte per row
  if (s != 4) bytes += r * t.x_row_stride * 4;                         // fp32 copy of the logits (selection keys)
  if (t.batched) {
    const uint64_t r8 = AlignUp(r, 8);
    bytes += r * t.x_row_stride * 4;                                   // exp of the tile's rows
    bytes += 3 * r8 * 4;                                               // per-row (value, index) pairs, sums
    bytes += r8 * 8 * 4;                                               // [rows, 8] broadcast row values
    bytes += r8 * 4;                                                   // per-row "only -inf left" flags
  } else {
    bytes += uint64_t(t.x_row_stride) * 4;                             // exp of one row
  }
  bytes += bn * r * t.y_row_stride * s;                                // y tiles (VECOUT)
  if (s != 4) bytes += r * t.y_row_stride * 4;                         // y in fp32 before the cast
  bytes += bn * r * t.idx_row_stride * 4;                              // expert_idx tiles (VECOUT)
  if (t.want_row_idx) bytes += bn * r * t.idx_row_stride * 4;          // row_idx tiles (VECOUT)
  if (t.want_softmax) bytes += bn * r * t.sm_row_stride * 4;           // softmax tiles (VECOUT)
  bytes += t.reduce_tmp_bytes;                                         // ReduceMax / ReduceSum work space
  bytes += 2 * kBlock;                                                 // their results
  return bytes;
}

std::string MoeGatingTopKSoftmaxTilingFor(const MoeGatingTopKSoftmaxShape& shape, const PlatformInfo& platform,
                                          MoeGatingTopKSoftmaxTiling* out) {
  const char* op = "moe_gating_top_k_softmax tiling";
  if (shape.rows < 1 || shape.experts < 1) return std::string(op) + ": rows and experts must be >= 1";
  if (shape.k < 1 || shape.k > shape.experts || shape.k > kMaxK)
    return std::string(op) + ": k must satisfy 1 <= k <= min(E, 1024); got k=" + std::to_string(shape.k);
  if (shape.renorm != 0 && shape.renorm != 1) return std::string(op) + ": renorm must be 0 or 1";
  // row_idx = j * N + i and the expert index E are int32 outputs.
  if (shape.rows * shape.k > INT32_MAX || shape.experts > INT32_MAX - 1)
    return std::string(op) + ": N*k = " + std::to_string(shape.rows * shape.k) + " and E must fit int32";

  MoeGatingTopKSoftmaxTiling t;
  const uint32_t s = GatingDtypeBytes(shape.dtype);
  t.rows = uint32_t(shape.rows);
  t.experts = uint32_t(shape.experts);
  t.k = uint32_t(shape.k);
  t.dtype = uint32_t(shape.dtype);
  t.renorm = uint32_t(shape.renorm);
  t.has_finished = shape.has_finished;
  t.want_softmax = shape.want_softmax && shape.renorm == 0;
  t.want_row_idx = shape.want_row_idx;
  t.x_row_stride = AlignUp(t.experts, kBlock / s);
  t.sm_row_stride = AlignUp(t.experts, 8);
  t.y_row_stride = AlignUp(t.k, kBlock / s);
  t.idx_row_stride = AlignUp(t.k, 8);
  t.reduce_tmp_bytes = ReduceTmpBytes(std::max(t.experts, t.k));
  t.batched = t.experts <= kBatchedMaxE;

  t.block_dim = uint32_t(std::min<int64_t>(platform.aiv_cores, shape.rows));
  t.rows_per_core = t.rows / t.block_dim;
  t.rows_remainder = t.rows % t.block_dim;
  const uint32_t largest_share = t.rows_per_core + (t.rows_remainder ? 1 : 0);
  const uint64_t budget = platform.UsableUb();

  // Double-buffered if at least one row fits that way, else single-buffered; then the most rows that fit.
  for (uint32_t bn : {2u, 1u}) {
    if (MoeGatingUbBytes(t, 1, bn) > budget) continue;
    uint32_t lo = 1, hi = std::min(largest_share, t.batched ? kBatchedMaxRows : kMaxTileRows);
    while (lo < hi) {  // largest r in [lo, hi] that fits
      const uint32_t mid = lo + (hi - lo + 1) / 2;
      if (MoeGatingUbBytes(t, mid, bn) <= budget) lo = mid;
      else hi = mid - 1;
    }
    t.buffer_num = bn;
    t.tile_rows = lo;
    t.ub_bytes_used = uint32_t(MoeGatingUbBytes(t, lo, bn));
    *out = t;
    return "";
  }
  return std::string(op) + ": one row of E=" + std::to_string(shape.experts) + " experts needs " +
         std::to_string(MoeGatingUbBytes(t, 1, 1)) + " bytes of UB even single-buffered, more than the " +
         std::to_string(budget) + " usable bytes of an Ascend 910B AIV (E too large for the one-pass kernel)";
}

}  // namespace tot_ascendc
