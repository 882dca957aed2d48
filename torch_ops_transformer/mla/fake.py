"""Fake (meta) kernel of mla_prolog: result shapes and dtypes as the C++ kernel, plus the checks that need no data
(modes, ranks, the shapes that tie the weights together), so a bad call fails at trace time as it does eagerly."""
import torch

_CACHE_MODES = ("PA_BSND", "PA_NZ", "PA_BLK_BSND", "PA_BLK_NZ", "BSND", "TND")


def mla_prolog(a):
    op = "mla_prolog"
    torch._check(a.cache_mode in _CACHE_MODES,
                 lambda: f"{op}: argument 'cache_mode' must be one of {', '.join(_CACHE_MODES)}; got {a.cache_mode!r}")
    if not 0 <= a.weight_quant_mode <= 2:
        raise NotImplementedError(f"{op}: argument 'weight_quant_mode' = {a.weight_quant_mode} is not implemented")
    if not 0 <= a.kv_cache_quant_mode <= 2:
        raise NotImplementedError(f"{op}: argument 'kv_cache_quant_mode' = {a.kv_cache_quant_mode} is not "
                                  f"implemented")
    torch._check(a.query_quant_mode in (0, 1),
                 lambda: f"{op}: argument 'query_quant_mode' must be 0 or 1; got {a.query_quant_mode}")
    x, uk, sin = a.token_x, a.weight_uk, a.rope_sin
    torch._check(x.dim() in (2, 3), lambda: f"{op}: argument 'token_x' must be [T, He] or [B, S, He]; got shape "
                                            f"{tuple(x.shape)}")
    torch._check(uk.dim() == 3, lambda: f"{op}: argument 'weight_uk' must be [N, D, Hckv]; got shape "
                                        f"{tuple(uk.shape)}")
    torch._check(sin.dim() == x.dim(), lambda: f"{op}: argument 'rope_sin' must have token_x's rank; got shape "
                                               f"{tuple(sin.shape)}")
    n, d, hckv = uk.shape
    dr = sin.shape[-1]
    hcq = a.weight_dq.shape[-1]
    torch._check(a.weight_uq_qr.dim() == 2 and a.weight_uq_qr.shape[1] == n * (d + dr),
                 lambda: f"{op}: argument 'weight_uq_qr' must be [Hcq, N*(D+Dr) = {n * (d + dr)}]; got shape "
                         f"{tuple(a.weight_uq_qr.shape)}")
    torch._check(a.weight_dkv_kr.dim() == 2 and a.weight_dkv_kr.shape[1] == hckv + dr,
                 lambda: f"{op}: argument 'weight_dkv_kr' must be [He, Hckv+Dr = {hckv + dr}]; got shape "
                         f"{tuple(a.weight_dkv_kr.shape)}")
    lead = tuple(x.shape[:-1])
    t = lead[0] if len(lead) == 1 else lead[0] * lead[1]
    dt = sin.dtype
    int8_query = a.query_quant_mode == 1
    query = x.new_empty((*lead, n, hckv), dtype=torch.int8 if int8_query else dt)
    query_rope = x.new_empty((*lead, n, dr), dtype=dt)
    dequant_scale_q_nope = x.new_empty((t, n, 1) if int8_query else (0,), dtype=torch.float32)
    norm_dtype = dt if a.weight_quant_mode == 0 else torch.int8
    query_norm = x.new_empty((*lead, hcq) if a.query_norm_flag else (0,), dtype=norm_dtype)
    with_scale = a.query_norm_flag and a.weight_quant_mode > 0
    dequant_scale_q_norm = x.new_empty((t, 1) if with_scale else (0,), dtype=torch.float32)
    return query, query_rope, dequant_scale_q_nope, query_norm, dequant_scale_q_norm
