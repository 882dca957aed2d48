"""MC2: collective communication fused with matmul, and the training APIs built on it (docs/mc2.md).

- `ops` — `npu_all_gather_base_mm`, `npu_all_gather_quant_mm`, `npu_mm_reduce_scatter_base`,
  `npu_mm_all_reduce_base`, `npu_mm_all_reduce_add_rms_norm` with torch_npu's (MindSpeed's) signatures, on any
  `torch.distributed` group (int8 forms: `quant`).
- `hccl_names` — torch_npu's `get_hccl_comm_name` on groups without HCCL (installed by the torch_npu shim).
- `tensor_parallel` — column/row-parallel Linear layers (sequence-parallel style) on those ops.
- `MC2Optimizer` — gradient all-reduce fused with the parameter update, bucket by bucket: the all-reduce of
  bucket i+1 is in flight while bucket i is updated by a standard torch optimizer (AdamW, SGD, ...).
- `MC2DistributedDataParallel` — `torch.nn.parallel.DistributedDataParallel` whose comm hook runs the
  `MC2Optimizer` update of each bucket as soon as that bucket's all-reduce completes, i.e. during backward.

Both training APIs produce the same parameters as plain DDP + the torch optimizer.
"""
from . import tensor_parallel
from .ddp import MC2DistributedDataParallel
from .ops import (
    mc2_validation,
    npu_all_gather_base_mm,
    npu_all_gather_quant_mm,
    npu_mm_all_reduce_add_rms_norm,
    npu_mm_all_reduce_base,
    npu_mm_reduce_scatter_base,
)
from .optimizer import COMM_POLICIES, MC2Optimizer

__all__ = ["MC2Optimizer", "MC2DistributedDataParallel", "COMM_POLICIES", "tensor_parallel", "mc2_validation",
           "npu_all_gather_base_mm", "npu_all_gather_quant_mm", "npu_mm_all_reduce_add_rms_norm", "npu_mm_all_reduce_base",
           "npu_mm_reduce_scatter_base"]
