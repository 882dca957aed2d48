// Host tiling of the grouped matmul kernel (see grouped_matmul_tiling.h).
#include "moe/grouped_matmul_tiling.h"

namespace tot_ascendc {
namespace {

constexpr uint32_t kBm = 128;      // rows per item: the cube's base M
constexpr uint32_t kMaxBn = 256;   // columns per item
constexpr uint64_t kU32 = 0xffffffffull;

uint32_t DtypeBytes(GmmDtype d) { return d == GmmDtype::kFloat32 ? 4 : 2; }

}  // namespace

uint32_t GroupedMatmulUbBytes(uint32_t chunk_rows, uint32_t bn, uint32_t dtype_bytes, bool act) {
  const uint64_t f32 = uint64_t(chunk_rows) * bn * 4;
  uint64_t bytes = f32;                                  // the product rows (fp32), then the activation in place
  if (act) bytes += f32;                                 // activation scratch
  bytes += uint64_t(chunk_rows) * bn * dtype_bytes;      // output staging in the output dtype
  bytes += uint64_t(bn) * 4;                             // the bias row (fp32)
  return bytes > kU32 ? uint32_t(kU32) : uint32_t(bytes);
}

std::string GroupedMatmulTilingFn(const GroupedMatmulShape& s, const PlatformInfo& platform, GroupedMatmulTiling& t) {
  if (s.m == 0 || s.k == 0 || s.n == 0 || s.groups == 0) return "an empty x, weight or group_list";
  if (s.m > kU32 || s.k > 65535 || s.n > kU32 || s.groups > 65535) return "sizes beyond the kernel's 32-bit fields";
  t = GroupedMatmulTiling{};
  t.dtype = uint32_t(s.dtype);
  t.act = uint32_t(s.act);
  t.has_bias = s.has_bias;
  t.counts = s.counts;
  t.groups = uint32_t(s.groups);
  t.m = uint32_t(s.m);
  t.k = uint32_t(s.k);
  t.n = uint32_t(s.n);
  t.bm = kBm;
  t.bn = AlignUp(s.n < kMaxBn ? s.n : kMaxBn, 16);
  t.n_blocks = uint32_t((s.n + t.bn - 1) / t.bn);
  const bool act = s.act != GmmAct::kNone;
  const uint32_t db = DtypeBytes(s.dtype);
  t.chunk_rows = t.bm;
  while (t.chunk_rows > 8 && GroupedMatmulUbBytes(t.chunk_rows, t.bn, db, act) > platform.UsableUb()) t.chunk_rows -= 8;
  t.ub_bytes = GroupedMatmulUbBytes(t.chunk_rows, t.bn, db, act);
  if (t.ub_bytes > platform.UsableUb()) return "an epilogue chunk that does not fit UB";
  // Items: every group has at least ceil(rows / bm) row blocks; without a count, assume enough for every group.
  const uint64_t items = s.items_hint ? s.items_hint : uint64_t(platform.aiv_cores);
  const uint64_t groups_needed = (items + 1) / 2;
  t.block_dim = uint32_t(groups_needed < platform.aic_cores ? (groups_needed ? groups_needed : 1) : platform.aic_cores);
  t.aiv_num = 2 * t.block_dim;
  t.ws_slice = uint64_t(t.bm) * t.bn;
  t.ws_per_aiv = 2 * AlignUp(t.ws_slice * 4, 512);
  t.workspace_bytes = t.ws_per_aiv * t.aiv_num;
  return "";
}

}  // namespace tot_ascendc
