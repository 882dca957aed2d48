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


_KV_RMS_NORM_MODES = ("Norm", "PA", "PA_BNSD", "PA_BSND", "PA_NZ", "PA_BLK_BNSD", "PA_BLK_NZ")


def kv_rms_norm_rope_cache(a):
    op = "kv_rms_norm_rope_cache"
    torch._check(a.cache_mode in _KV_RMS_NORM_MODES,
                 lambda: f"{op}: argument 'cache_mode' must be one of {_KV_RMS_NORM_MODES}; got {a.cache_mode!r}")
    torch._check(a.kv.dim() == 4, lambda: f"{op}: argument 'kv' must be 4-D [B, N, S, D]; got {tuple(a.kv.shape)}")
    torch._check(a.cos.dim() == 4, lambda: f"{op}: argument 'cos' must be 4-D; got {tuple(a.cos.shape)}")
    torch._check(a.gamma.dim() == 1, lambda: f"{op}: argument 'gamma' must be 1-D; got {tuple(a.gamma.shape)}")
    b, n, s, d = a.kv.shape
    if a.v is None:
        dk, dv = a.cos.shape[-1], a.gamma.shape[0]
        torch._check(dk + dv == d, lambda: f"{op}: kv's last dim D = {d} must be gamma's rms_size {dv} + cos's "
                                           f"rope_size {dk}")
    else:
        dk, dv = d, a.v.shape[-1]
    return a.kv.new_empty((b, n, s, dk)), a.kv.new_empty((b, n, s, dv))


def gather_pa_kv_cache_into(a):
    op = "gather_pa_kv_cache_into"
    torch._check(a.key.dtype == a.key_cache.dtype and a.value.dtype == a.value_cache.dtype,
                 lambda: f"{op}: key/value and their caches must have the same dtype")
    torch._check(a.key_cache.dim() in (3, 4) and a.value_cache.dim() in (3, 4),
                 lambda: f"{op}: caches must be (num_blocks, block_size, N, D) or (num_blocks, block_size, N*D)")
    torch._check(a.block_tables.dim() == 2, lambda: f"{op}: argument 'block_tables' must be 2-D [batch, max_blocks]")
    return None


def scatter_nd_update(a):
    op = "scatter_nd_update"
    k = a.indices.shape[-1] if a.indices.dim() >= 1 else 0
    torch._check(a.indices.dim() >= 1 and k <= a.var.dim(),
                 lambda: f"{op}: argument 'indices' [..., K] needs K <= var.dim() = {a.var.dim()}")
    torch._check(a.updates.dtype == a.var.dtype, lambda: f"{op}: argument 'updates' must have var's dtype")
    return None
