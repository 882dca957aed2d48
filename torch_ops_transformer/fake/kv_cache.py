"""Fake (meta) kernels of the paged KV cache helpers."""
import torch


def scatter_pa_kv_cache(key, value, key_cache, value_cache, slot_mapping, cache_layout="BSND"):
    op = "scatter_pa_kv_cache"
    torch._check(key.dtype == key_cache.dtype and value.dtype == value_cache.dtype,
                 lambda: f"{op}: key/value and their caches must have the same dtype")
    torch._check(key_cache.dim() in (3, 4) and value_cache.dim() in (3, 4),
                 lambda: f"{op}: caches must be (num_blocks, block_size, N2, D) or (num_blocks, block_size, N2*D)")
    return None


def gather_pa_kv_cache(key_cache, value_cache, block_table, seq_lens, cache_layout="BSND"):
    # The packed length is sum(seq_lens): data-dependent, so an unbacked size.
    total = torch.library.get_ctx().new_dynamic_size()
    row = (lambda c: (c.shape[1], c.shape[3])) if cache_layout == "BNSD" else (lambda c: tuple(c.shape[2:]))
    k = key_cache.new_empty((total, *row(key_cache)))
    v = value_cache.new_empty((total, *row(value_cache)))
    return k, v
