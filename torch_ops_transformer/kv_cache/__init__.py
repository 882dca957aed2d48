"""The KV cache family (aten_ops/cpu/kv_cache, docs/kv_cache.md): block-allocated caches and the ops that write them.

- `api` — `PagedKVCache` (and its `BlockAllocator`), `to_nz` / `from_nz` (the NZ layout of paged caches),
  torch_npu's npu_scatter_pa_kv_cache and
  npu_kv_rmsnorm_rope_cache(_v2, _v2_functional),
  npu_gather_pa_kv_cache(_functional) and npu_scatter_nd_update(_);
- `fake` — the fake kernels of the family's ops.
"""
from .api import (
    BlockAllocator,
    PagedKVCache,
    npu_kv_rmsnorm_rope_cache,
    npu_kv_rmsnorm_rope_cache_v2,
    npu_kv_rmsnorm_rope_cache_v2_functional,
    npu_scatter_pa_kv_cache,
    npu_gather_pa_kv_cache,
    npu_gather_pa_kv_cache_functional,
    npu_scatter_nd_update,
    npu_scatter_nd_update_,
    from_nz,
    nz_c0,
    to_nz,
)
