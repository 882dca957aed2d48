"""The seed article's data-parallel training APIs (§2.3 and scenario 2), on `torch.distributed`.

- `MC2Optimizer` — gradient all-reduce fused with the parameter update, bucket by bucket: the all-reduce of
  bucket i+1 is in flight while bucket i is updated by a standard torch optimizer (AdamW, SGD, ...).
- `MC2DistributedDataParallel` — `torch.nn.parallel.DistributedDataParallel` whose comm hook runs the
  `MC2Optimizer` update of each bucket as soon as that bucket's all-reduce completes, i.e. during backward.

Both produce the same parameters as plain DDP + the torch optimizer. See docs/mc2.md.
"""
from .ddp import MC2DistributedDataParallel
from .optimizer import COMM_POLICIES, MC2Optimizer

__all__ = ["MC2Optimizer", "MC2DistributedDataParallel", "COMM_POLICIES"]
