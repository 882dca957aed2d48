"""Plain-PyTorch references of mla_prolog (independent of the kernel): the float path in any dtype (float64 for the
reference, the inputs' dtype for the "same-dtype PyTorch" error bound of the tolerance rule), the int8 formulas of
upstream's golden functions, and the cache writes of every cache mode written as a sequential Python loop."""
import math

import torch


def rms_norm(x, gamma, eps):
    return x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps) * gamma


def rope_interleaved(x, cos, sin):
    """HF DeepseekV3's apply_rotary_pos_emb_interleave: de-interleave the pairs, then rotate by half."""
    *lead, d = x.shape
    y = x.reshape(*lead, d // 2, 2).transpose(-1, -2).reshape(*lead, d)
    rotated = torch.cat((-y[..., d // 2:], y[..., :d // 2]), -1)
    return y * cos + rotated * sin


def nz_flat_index(slot, j, block_size, row, elem_bytes):
    """Flat element index of value j of the token row in slot `slot` of an NZ block: [row / c, block_size, c]."""
    c = 32 // elem_bytes
    blk, off = divmod(slot, block_size)
    return blk * block_size * row + (j // c) * block_size * c + off * c + j % c


def token_rows(cache_mode, T, B, S, cache_index, actual_seq_len, block_size):
    """Cache row (slot) of each token, or -1 to skip."""
    if cache_mode in ("BSND", "TND"):
        return list(range(T))
    idx = cache_index.reshape(-1).tolist()
    if cache_mode in ("PA_BSND", "PA_NZ"):
        return idx
    rows = []
    if actual_seq_len is None:  # [B, ceil(S / BlockSize)]
        nb = math.ceil(S / block_size)
        for b in range(B):
            for s in range(S):
                blk = idx[b * nb + s // block_size]
                rows.append(-1 if blk < 0 else blk * block_size + s % block_size)
        return rows
    start, first = 0, 0
    for end in actual_seq_len.tolist():
        for s in range(end - start):
            blk = idx[first + s // block_size]
            rows.append(-1 if blk < 0 else blk * block_size + s % block_size)
        first += math.ceil((end - start) / block_size)
        start = end
    return rows


def write_cache(cache, values, rows, cache_mode):
    """values [T, W] written to every head of each token's row (sequentially: a repeated row keeps the last)."""
    out = cache.clone()
    nz = cache_mode in ("PA_NZ", "PA_BLK_NZ")
    if cache_mode in ("BSND", "TND") or not nz:
        nkv = cache.shape[-2]
        flat = out.view(-1, nkv, cache.shape[-1])
        for t, r in enumerate(rows):
            if r >= 0:
                flat[r] = values[t].to(cache.dtype)
        return out
    block_size, nkv, w = cache.shape[1], cache.shape[2], cache.shape[3]
    flat = out.view(-1)
    for t, r in enumerate(rows):
        if r < 0:
            continue
        row = values[t].to(cache.dtype).repeat(nkv)
        for j in range(nkv * w):
            flat[nz_flat_index(r, j, block_size, nkv * w, cache.element_size())] = row[j]
    return out


def mla_prolog(token_x, w_dq, w_uq_qr, w_uk, w_dkv_kr, gamma_cq, gamma_ckv, sin, cos, kv_cache, kr_cache,
               cache_index=None, actual_seq_len=None, eps_cq=1e-5, eps_ckv=1e-5, cache_mode="PA_BSND",
               qc_qr_scale=1.0, kc_scale=1.0, dtype=torch.float64):
    """Float path in `dtype`. Returns (query, query_rope, query_norm, kv_cache', kr_cache') (caches in their own
    dtypes: the `dtype` results rounded once)."""
    lead = token_x.shape[:-1]
    T = math.prod(lead)
    B, S = (1, lead[0]) if len(lead) == 1 else lead
    N, D, Hckv = w_uk.shape
    Dr = sin.shape[-1]
    f = lambda t: t.to(dtype)  # noqa: E731
    x = f(token_x).reshape(T, -1)
    c, s = f(cos).reshape(T, 1, Dr), f(sin).reshape(T, 1, Dr)
    cq = rms_norm(x @ f(w_dq), f(gamma_cq), eps_cq) * qc_qr_scale
    q = (cq @ f(w_uq_qr)).reshape(T, N, D + Dr)
    query = torch.einsum("tnd,ndh->tnh", q[..., :D], f(w_uk))
    query_rope = rope_interleaved(q[..., D:], c, s)
    kvr = x @ f(w_dkv_kr)
    ckv = rms_norm(kvr[:, :Hckv], f(gamma_ckv), eps_ckv) * kc_scale
    kpe = rope_interleaved(kvr[:, Hckv:].reshape(T, 1, Dr), c, s).reshape(T, Dr)
    rows = token_rows(cache_mode, T, B, S, cache_index, actual_seq_len,
                      kv_cache.shape[1] if cache_mode.startswith("PA") else 1)
    kv = write_cache(kv_cache, ckv, rows, cache_mode)
    kr = write_cache(kr_cache, kpe, rows, cache_mode)
    return (query.reshape(*lead, N, Hckv), query_rope.reshape(*lead, N, Dr), cq.reshape(*lead, -1), kv, kr)


# ---- upstream's int8 formulas, in float64 --------------------------------------------------------------------

def int8(x):
    return torch.round(x).clamp(-128, 127)


def dynamic_quant(x):
    scale = x.abs().amax(-1, keepdim=True) / 127
    return int8(x / torch.where(scale > 0, scale, torch.ones_like(scale))), scale


def mla_prolog_quant(token_x, w_dq, w_uq_qr, w_uk, w_dkv_kr, gamma_cq, gamma_ckv, sin, cos, kv_cache, kr_cache,
                     cache_index, weight_quant_mode, kv_cache_quant_mode, dequant_scale_x=None,
                     dequant_scale_w_dq=None, dequant_scale_w_uq_qr=None, dequant_scale_w_dkv_kr=None,
                     quant_scale_ckv=None, quant_scale_ckr=None, smooth_scales_cq=None, eps_cq=1e-5, eps_ckv=1e-5,
                     cache_mode="PA_BSND", qc_qr_scale=1.0, kc_scale=1.0):
    """Returns (query, query_rope, dequant_scale_q_nope or None, query_norm (int8 values), dequant_scale_q_norm,
    kv_cache', kr_cache') in float64 (int8 values as floats), following upstream's golden functions."""
    d = torch.float64
    lead = token_x.shape[:-1]
    T = math.prod(lead)
    N, D, Hckv = w_uk.shape
    Dr = sin.shape[-1]
    x = token_x.to(d).reshape(T, -1)
    c, s = cos.to(d).reshape(T, 1, Dr), sin.to(d).reshape(T, 1, Dr)
    # Where upstream's golden function rounds to bf16 (float GEMM results, q_nope before and the query after the
    # absorption), so do we: an int8 step flips when its input moves by half a step.
    bf16 = w_uk.dtype

    def rnd(t):
        return t.to(bf16).to(d)

    if weight_quant_mode == 2:
        cq_raw = (x @ w_dq.to(d)) * dequant_scale_x.to(d) * dequant_scale_w_dq.to(d)
        kvr = (x @ w_dkv_kr.to(d)) * dequant_scale_x.to(d) * dequant_scale_w_dkv_kr.to(d)
    else:
        cq_raw, kvr = rnd(x @ w_dq.to(d)), rnd(x @ w_dkv_kr.to(d))
    cq = rms_norm(cq_raw, gamma_cq.to(d), eps_cq) * qc_qr_scale
    smooth = smooth_scales_cq.to(d) if smooth_scales_cq is not None else 1.0
    cq_q, cq_scale = dynamic_quant(cq * smooth)
    q = ((cq_q @ w_uq_qr.to(d)) * cq_scale * dequant_scale_w_uq_qr.to(d)).reshape(T, N, D + Dr)
    query = rnd(torch.einsum("tnd,ndh->tnh", rnd(q[..., :D]), w_uk.to(d)))
    query_rope = rope_interleaved(q[..., D:], c, s)
    scale_q = None
    if kv_cache_quant_mode == 1:
        query, scale_q = dynamic_quant(query)
        query_rope = query_rope * quant_scale_ckv.to(d).reshape(()) / scale_q
    ckv = rms_norm(kvr[:, :Hckv], gamma_ckv.to(d), eps_ckv) * kc_scale
    kpe = rope_interleaved(kvr[:, Hckv:].reshape(T, 1, Dr), c, s).reshape(T, Dr)
    if kv_cache_quant_mode == 1:
        ckv = int8(ckv * quant_scale_ckv.to(d).reshape(()))
    elif kv_cache_quant_mode == 2:
        ckv = int8(ckv * quant_scale_ckv.to(d))
        kpe = int8(kpe * quant_scale_ckr.to(d))
    rows = token_rows(cache_mode, T, *((1, lead[0]) if len(lead) == 1 else lead), cache_index, None,
                      kv_cache.shape[1])
    kv = write_cache(kv_cache, ckv, rows, cache_mode).to(d)
    kr = write_cache(kr_cache, kpe, rows, cache_mode).to(d)
    return (query.reshape(*lead, N, Hckv), query_rope.reshape(*lead, N, Dr), scale_q, cq_q.reshape(*lead, -1),
            cq_scale, kv, kr)
