// Tiling of the recurrent gated delta rule kernel (recurrent_gated_delta_rule on the npu device, Gated DeltaNet
// decode): per sequence b and value head h the state S [Dv, Dk] starts from the sequence's first slot and, per token,
// becomes a S diag(ak) + beta (v - a S diag(ak) k) kᵀ; the output is scale S q and S is written to the token's slot.
//
// The rows of S never mix (row i evolves from its own past, the token's k, q, gates and v[i]), so the work splits
// into units (sequence b, value head h, block of `rows` state rows): unit u = item * row_blocks + block with item =
// b * Nv + h. A unit keeps its rows in UB in fp32 for the whole sequence. `rows` is the largest multiple of 8 whose
// buffers fit UB (a whole state when it fits), made smaller when there are fewer units than vector cores so that
// the idle cores take rows too. Core c runs the units [GdrUnitBegin(c), GdrUnitBegin(c + 1)).
#pragma once

#include <cstdint>
#include <string>

#include "common/platform.h"

namespace tot_ascendc {

// Dtype codes of the token tensors (query, key, value, out) and of the state.
enum class GdrDtype : uint32_t { FP16 = 0, BF16 = 1, FP32 = 2 };

// POD: copied to GM and read by every core.
struct RecurrentGdrTiling {
  uint32_t block_dim = 1;
  uint32_t dtype = 0;        // GdrDtype of query, key, value, out
  uint32_t state_dtype = 0;  // GdrDtype of the state cache (dtype or FP32)
  uint32_t tokens = 0, batch = 0;  // T and B (sequences)
  uint32_t k_heads = 0, v_heads = 0, group = 1;  // Nk, Nv, Nv / Nk (value head h reads key head h / group)
  uint32_t dk = 0, dv = 0;
  uint32_t dk_pad = 0;       // Dk rounded up to 16 (32 bytes of a 16-bit row; the fp32 rows share the pitch)
  uint32_t has_beta = 0, has_g = 0, has_gk = 0;
  float scale = 1.f;
  uint64_t slots = 0;        // state.size(0)
  uint32_t rows = 0;         // state rows per unit (a multiple of 8, at most 248)
  uint32_t row_blocks = 0;   // ceil(Dv / rows)
  uint32_t items = 0;        // batch * v_heads
  uint32_t units = 0;        // items * row_blocks
  uint32_t units_base = 0, units_extra = 0;  // core c gets units_base units, +1 if c < units_extra
  uint32_t ub_bytes = 0;     // UB the kernel allocates (planned, per core)
};

inline uint32_t GdrUnitBegin(const RecurrentGdrTiling& t, uint32_t c) {
  return c * t.units_base + (c < t.units_extra ? c : t.units_extra);
}

// Shapes and options of one call, as the host glue sees them after validation.
struct GdrShape {
  uint32_t tokens = 0, batch = 0, k_heads = 0, v_heads = 0, dk = 0, dv = 0;
  uint64_t slots = 0;
  GdrDtype dtype = GdrDtype::FP16, state_dtype = GdrDtype::FP32;
  bool has_beta = false, has_g = false, has_gk = false;
  float scale = 1.f;
  uint32_t max_rows = 248;  // tests: smaller row blocks
};

// UB bytes the kernel allocates for `rows` state rows (see the kernel's InitBuffers).
uint32_t GdrUbBytes(uint32_t rows, uint32_t dk_pad, uint32_t dtype_bytes, uint32_t state_bytes, bool has_gk);

// Fills `out`; returns "" or why the shape cannot be tiled (the glue then runs the CPU kernel).
std::string RecurrentGdrTilingFn(const GdrShape& shape, const PlatformInfo& platform, RecurrentGdrTiling& out);

}  // namespace tot_ascendc
