// Tiling of the grouped matmul kernel (grouped_matmul_kernel.cpp): a POD struct shared by the host glue and the
// kernel, and the pure host function that fills it.
//
// Work: x [M, K] split along M into E row groups (group_list, read by the kernel on the scalar unit), weight
// [E, K, N]. A work item is (group, block of up to bm rows, block of up to bn columns); items are numbered group by
// group and dealt round-robin to the AIVs. Per item the AIV asks its AIC for the fp32 product x_rows · w[e][:, cols]
// (Matmul, into one of two GM workspace slices, issued one item ahead so the cube works while the vector unit runs
// the previous item's epilogue), then the epilogue in UB chunks of `chunk_rows` rows: + bias, the pre-activation
// out (act_input), the activation, the cast, the output rows.
#pragma once

#include <cstdint>

#ifndef __CCE_AICORE__  // host side only: the device compiler sees just the POD struct
#include <string>

#include "common/platform.h"
#endif

namespace tot_ascendc {

enum class GmmDtype : uint32_t { kFloat32 = 0, kFloat16 = 1, kBFloat16 = 2 };
enum class GmmAct : uint32_t { kNone = 0, kRelu = 1, kFastGelu = 4, kSilu = 5 };  // grouped_matmul's act_type

struct GroupedMatmulTiling {
  uint32_t dtype = 0;          // GmmDtype of x, weight, out
  uint32_t act = 0;            // GmmAct
  uint32_t has_bias = 0;       // bias [E, N] in fp32 (the glue converts)
  uint32_t counts = 0;         // group_list holds counts (1) or cumulative ends (0); int64 either way
  uint32_t groups = 0;         // E
  uint32_t m = 0, k = 0, n = 0;
  uint32_t bm = 0, bn = 0;     // item block: rows, columns (bn a multiple of 16: whole DataBlocks in every dtype)
  uint32_t n_blocks = 0;       // ceil(n / bn)
  uint32_t chunk_rows = 0;     // epilogue rows per UB chunk (multiple of 8, <= bm)
  uint32_t block_dim = 0;      // AI Core groups launched (MIX 1:2)
  uint32_t aiv_num = 0;        // 2 * block_dim
  uint64_t ws_slice = 0;       // fp32 elements of one workspace slice: bm * bn
  uint64_t ws_per_aiv = 0;     // bytes: two slices
  uint64_t workspace_bytes = 0;
  uint32_t ub_bytes = 0;       // what the epilogue carves out of UB
};

#ifndef __CCE_AICORE__
struct GroupedMatmulShape {
  uint64_t m = 0, k = 0, n = 0, groups = 0;
  GmmDtype dtype = GmmDtype::kFloat32;
  GmmAct act = GmmAct::kNone;
  bool has_bias = false, counts = false;
  uint64_t items_hint = 0;  // work items if known (0: assume many); fewer groups are launched for fewer items
};

// UB bytes of the epilogue for `chunk_rows` rows of `bn` columns.
uint32_t GroupedMatmulUbBytes(uint32_t chunk_rows, uint32_t bn, uint32_t dtype_bytes, bool act);

// Fills `t`; returns "" or why the kernel cannot run this shape.
std::string GroupedMatmulTilingFn(const GroupedMatmulShape& s, const PlatformInfo& platform, GroupedMatmulTiling& t);
#endif

}  // namespace tot_ascendc
