// What an Ascend C kernel includes. On a machine with CANN this name resolves to the toolkit's header; here, to
// the CPU runtime of the subset our kernels use (ascendc/cpu_runtime/SIGNATURES.md). Anything outside the subset
// does not compile.
#pragma once

#include "ascendc_cpu/types.h"
#include "ascendc_cpu/core.h"
#include "ascendc_cpu/global_tensor.h"
#include "ascendc_cpu/local_tensor.h"
#include "ascendc_cpu/pipe.h"
#include "ascendc_cpu/data_copy.h"
#include "ascendc_cpu/vector.h"
#include "ascendc_cpu/sync.h"
#include "ascendc_cpu/matmul.h"
