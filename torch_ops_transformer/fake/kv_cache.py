"""Fake (meta) kernels of the paged KV cache helpers."""
import torch


def scatter_pa_kv_cache(a):
    op = "scatter_pa_kv_cache"
    torch._check(a.key.dtype == a.key_cache.dtype and a.value.dtype == a.value_cache.dtype,
                 lambda: f"{op}: key/value and their caches must have the same dtype")
    torch._check(a.key_cache.dim() in (3, 4) and a.value_cache.dim() in (3, 4),
                 lambda: f"{op}: caches must be (num_blocks, block_size, N2, D) or (num_blocks, block_size, N2*D)")
    return None


def gather_pa_kv_cache(a):
    total = torch.library.get_ctx().new_dynamic_size()
    row = (lambda c: (c.shape[1], c.shape[3])) if a.cache_layout == "BNSD" else (lambda c: tuple(c.shape[2:]))
    k = a.key_cache.new_empty((total, *row(a.key_cache)))
    v = a.value_cache.new_empty((total, *row(a.value_cache)))
    return k, v
