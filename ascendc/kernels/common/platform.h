// The target the host tiling functions plan for: Ascend 910B (arch 2201). Pure C++, shared by the kernels' tiling
// functions (host) and their unit tests. Figures: asc-devkit docs 硬件实现/架构规格/NPU架构版本2201.md and the
// platform .ini quoted in ../../../docs/ascendc.md; they are the documented limits, not measurements.
#pragma once

#include <cstdint>

namespace tot_ascendc {

struct PlatformInfo {
  uint32_t aic_cores = 24;             // cube cores (= AI Core groups) on 910B1/B2
  uint32_t aiv_cores = 48;             // vector cores, 2 per group
  uint32_t ub_bytes = 192 * 1024;      // per AIV
  uint32_t ub_reserved_bytes = 256;    // kept free: the compiler reserves the top of UB in mixed kernels
  uint32_t l1_bytes = 512 * 1024;      // per AIC
  uint32_t l0a_bytes = 64 * 1024;
  uint32_t l0b_bytes = 64 * 1024;
  uint32_t l0c_bytes = 128 * 1024;
  uint32_t UsableUb() const { return ub_bytes - ub_reserved_bytes; }
};

inline PlatformInfo Ascend910B() { return PlatformInfo{}; }

inline uint32_t CeilDiv(uint64_t a, uint64_t b) { return uint32_t((a + b - 1) / b); }
inline uint32_t AlignUp(uint64_t a, uint64_t to) { return uint32_t((a + to - 1) / to * to); }

}  // namespace tot_ascendc
