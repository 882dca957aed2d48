"""The sampling family (aten_ops/cpu/sampling, docs/sampling.md): the serving loop's logits filters.

- `api` — torch_npu's npu_top_k_top_p;
- `fake` — the fake kernels of the family's ops.
"""
from .api import npu_top_k_top_p
