// Device-side building blocks the vector (AIV) kernels share: a pipe barrier and the row-dot GEMV that the decode,
// sparse flash attention and lightning indexer kernels score their key tiles with. Included after
// kernel_operator.h, in the CANN build and on the CPU runtime alike (ascendc/kernels is on both include paths).
#pragma once

#include "kernel_operator.h"

namespace tot_ascendc {

constexpr uint32_t kFp32Lanes = 64;  // fp32 elements per vector repeat (256 bytes)

// Orders two pipes on the hardware (e.g. the scalar unit reading a vector result: V_S) with one set / wait pair of
// event id 0. The CPU runtime executes the pipes in program order, where this only records the dependency.
template <AscendC::HardEvent event>
__aicore__ inline void PipeSync() {
  AscendC::SetFlag<event>(0);
  AscendC::WaitFlag<event>(0);
}

// out[j] = x · tile_j for the first `rows` rows of `tile` (rows of d fp32 values, pitch d, d a multiple of 8 and
// at most 8 * 255): Mul with x broadcast over the rows (src1 repeat stride 0), fold each row's 64-lane chunks onto
// its first chunk, then one WholeReduceSum per row. prod is scratch of rows * d floats; rows <= 255 (one repeat
// count).
__aicore__ inline void RowDots(const AscendC::LocalTensor<float>& out, const AscendC::LocalTensor<float>& tile,
                               const AscendC::LocalTensor<float>& x, const AscendC::LocalTensor<float>& prod,
                               uint32_t d, uint32_t rows) {
  using AscendC::BinaryRepeatParams;
  const uint8_t rowBlocks = uint8_t(d / 8);
  for (uint32_t c = 0; c < d; c += kFp32Lanes) {
    const uint64_t lanes = d - c < kFp32Lanes ? d - c : kFp32Lanes;
    AscendC::Mul(prod[c], tile[c], x[c], lanes, uint8_t(rows), BinaryRepeatParams(1, 1, 1, rowBlocks, rowBlocks, 0));
  }
  for (uint32_t c = kFp32Lanes; c < d; c += kFp32Lanes) {
    const uint64_t lanes = d - c < kFp32Lanes ? d - c : kFp32Lanes;
    AscendC::Add(prod, prod, prod[c], lanes, uint8_t(rows),
                 BinaryRepeatParams(1, 1, 1, rowBlocks, rowBlocks, rowBlocks));
  }
  const int32_t first = int32_t(d < kFp32Lanes ? d : kFp32Lanes);
  AscendC::WholeReduceSum(out, prod, first, int32_t(rows), 1, 1, int32_t(rowBlocks));
}

}  // namespace tot_ascendc
