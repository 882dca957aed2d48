// Whether oneDNN's brgemm (at::native::cpublas::brgemm) can run our kernels' products on this machine and build.
// The attention, MLA and fused-MoE kernels call it on fp32 operands and on bf16 ones with B VNNI-packed (element
// (kk, j) at b[((kk / 2) * ldb + j) * 2 + kk % 2]) and any ldb >= n; some builds or CPUs refuse a layout or throw.
// Defined in one ordinary translation unit so that no per-ISA copy of it exists.
#pragma once

#include <c10/core/ScalarType.h>

namespace npu_fa::cpu {

// True when brgemm gives exact small-integer products in that layout for `dtype` (kFloat or kBFloat16; any other
// dtype: false). Probed once per dtype; false whenever the user disabled oneDNN (torch.backends.mkldnn).
bool brgemm_usable(c10::ScalarType dtype);

}  // namespace npu_fa::cpu
