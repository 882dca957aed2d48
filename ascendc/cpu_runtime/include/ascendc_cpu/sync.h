// Core identity and synchronisation (docs: 基础API/系统变量访问/GetBlockIdx.md, GetBlockNum.md, GetSubBlockIdx.md,
// GetTaskRatio.md; 基础API/同步控制/SetFlag-WaitFlag.md, PipeBarrier.md, SyncAll.md, CrossCoreSetFlag.md).
// Instructions run in program order inside a core here, so pipe flags only need bookkeeping: a WaitFlag with no
// earlier SetFlag would hang the hardware and is an error. SyncAll and cross-core flags really block.
#pragma once

#include "core.h"

namespace AscendC {

__aicore__ inline int64_t GetBlockIdx() { return cpu::Core().BlockIdx(); }
__aicore__ inline int64_t GetBlockNum() { return cpu::Core().block_num; }
__aicore__ inline int64_t GetSubBlockIdx() { return cpu::Core().sub_idx; }
__aicore__ inline int64_t GetSubBlockNum() { return cpu::Core().sub_num; }
__aicore__ inline int64_t GetTaskRatio() { return cpu::Core().type == cpu::CoreType::AIV ? cpu::Core().sub_num : 1; }

template <HardEvent event>
__aicore__ inline void SetFlag(int32_t eventID) {
  ASCENDC_CPU_CHECK(eventID >= 0 && eventID < 8, "SetFlag", "eventID ", eventID, " must be in [0, 8)");
  ++cpu::Core().flags[int(event)][eventID];
}
template <HardEvent event>
__aicore__ inline void WaitFlag(int32_t eventID) {
  ASCENDC_CPU_CHECK(eventID >= 0 && eventID < 8, "WaitFlag", "eventID ", eventID, " must be in [0, 8)");
  int& pending = cpu::Core().flags[int(event)][eventID];
  ASCENDC_CPU_CHECK(pending > 0, "WaitFlag", "event ", int(event), " id ", eventID,
                    " was never set (SetFlag must come first; the hardware would wait forever)");
  --pending;
}
template <pipe_t pipe>
__aicore__ inline void PipeBarrier() {}

namespace cpu {
void SyncAllCores(bool aiv_only);
void CrossCoreSet(uint16_t flag_id);
void CrossCoreWait(uint16_t flag_id);
}  // namespace cpu

// All AIV cores of the launch (or all cores) meet here.
template <bool isAIVOnly = true>
__aicore__ inline void SyncAll() { cpu::SyncAllCores(isAIVOnly); }

// Cross-core flags between the AIC and the AIVs of one group (mode 2 of CrossCoreSetFlag: inside a group).
template <uint8_t modeId, pipe_t pipe>
__aicore__ inline void CrossCoreSetFlag(uint16_t flagId) {
  static_assert(modeId == 2, "CrossCoreSetFlag: only mode 2 (AIC <-> AIV inside a group) is in this runtime");
  cpu::CrossCoreSet(flagId);
}
template <uint8_t modeId = 0, pipe_t pipe = PIPE_S>
__aicore__ inline void CrossCoreWaitFlag(uint16_t flagId) { cpu::CrossCoreWait(flagId); }

// Docs: 基础API/工作空间/GetUserWorkspace.md, GetSysWorkSpacePtr.md. The host glue allocates no system workspace
// here (the Matmul server talks through memory, not GM messages), so the user workspace starts at the argument.
__aicore__ inline GM_ADDR GetUserWorkspace(GM_ADDR workspace) { return workspace; }
GM_ADDR GetSysWorkSpacePtr();

}  // namespace AscendC

// Which half of a MIX kernel this thread runs (docs: 编程指南/语言扩展层/SIMD-BuiltIn关键字.md).
#define ASCEND_IS_AIV (::AscendC::cpu::Core().type == ::AscendC::cpu::CoreType::AIV)
#define ASCEND_IS_AIC (::AscendC::cpu::Core().type == ::AscendC::cpu::CoreType::AIC)
#define ASCEND_IS_NOT_AIV (!ASCEND_IS_AIV)
#define ASCEND_IS_NOT_AIC (!ASCEND_IS_AIC)

// Docs: kernel_utils_macros KERNEL_TASK_TYPE_DEFAULT — the kernel's core mix; the host picks it with SetKernelMode.
enum KernelMetaType { KERNEL_TYPE_AIV_ONLY, KERNEL_TYPE_AIC_ONLY, KERNEL_TYPE_MIX_AIV_1_0, KERNEL_TYPE_MIX_AIC_1_1,
                      KERNEL_TYPE_MIX_AIC_1_2 };
#define KERNEL_TASK_TYPE_DEFAULT(type) ((void)(type))
