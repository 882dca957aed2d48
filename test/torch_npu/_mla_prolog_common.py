"""Shared pieces of the ports of op-plugin's test_mla_prolog.py, test_mla_prolog_v2.py and test_mla_prolog_v3.py:
upstream's shapes (He 7168, Hcq 1536, Hckv 512, N 32, D 128, Dr 64, BlockSize 128) and the math of their golden
functions, written over whole tensors: float32 with bf16 rounding where upstream's golden rounds (the float path),
or int32 GEMMs with per-token x per-channel dequantisation, per-token dynamic int8 of c^Q (smooth scales),
per-token-head dynamic int8 of the query, query_rope times quant_scale_ckv over that scale, and the int8 cache
round(x * scale) saturated (the int8 path); caches written token after token (a repeated slot keeps the last)."""
import math

import torch

SIZES = dict(He=7168, Hcq=1536, Hckv=512, N=32, D=128, Dr=64, Nkv=1, BlockSize=128)


def _bf16(t):
    return t.to(torch.bfloat16).float()


def _rms(x, gamma, eps):
    return x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps) * gamma.float()


def _rope(x, cos, sin):
    """Pairs de-interleaved (even positions first), then x * cos + rotate_half(x) * sin."""
    d = x.shape[-1]
    y = torch.cat((x[..., 0::2], x[..., 1::2]), -1)
    return y * cos + torch.cat((-y[..., d // 2:], y[..., :d // 2]), -1) * sin


def _scatter(cache, rows, slots):
    out = cache.clone()
    flat = out.view(-1, out.shape[-2], out.shape[-1])
    for t, s in enumerate(slots.reshape(-1).tolist()):
        flat[s] = rows[t].to(out.dtype)
    return out


def _int8(x):
    return x.round().clamp(-256, 255).clamp(-128, 127)  # upstream saturates to 9 bits, then to 8


def golden_float(token_x, w_dq, w_uq_qr, w_uk, w_dkv_kr, gamma_cq, gamma_ckv, sin, cos, cache_index, kv_cache,
                 kr_cache, eps_cq, eps_ckv):
    """test_mla_prolog.py's baseline: (query, query_rope, kv_cache_out, kr_cache_out) in float32."""
    lead = token_x.shape[:-1]
    T, N, D, Hckv, Dr = math.prod(lead), w_uk.shape[0], w_uk.shape[1], w_uk.shape[2], sin.shape[-1]
    x = token_x.reshape(T, -1).float()
    c, s = cos.reshape(T, 1, Dr).float(), sin.reshape(T, 1, Dr).float()
    cq = _bf16(_rms(_bf16(x @ w_dq.float()), gamma_cq, eps_cq))
    q = _bf16(cq @ w_uq_qr.float()).reshape(T, N, D + Dr)
    query = _bf16(torch.einsum("tnd,ndh->tnh", _bf16(q[..., :D]), w_uk.float()))
    query_rope = _bf16(_rope(q[..., D:], c, s))
    kvr = x @ w_dkv_kr.float()
    ckv = _rms(kvr[:, :Hckv], gamma_ckv, eps_ckv)
    kpe = _rope(kvr[:, Hckv:], c[:, 0], s[:, 0])
    return (query.reshape(*lead, N, Hckv), query_rope.reshape(*lead, N, Dr), _scatter(kv_cache, ckv, cache_index),
            _scatter(kr_cache, kpe, cache_index))


def golden_int8(token_x, w_dq, w_uq_qr, w_uk, w_dkv_kr, gamma_cq, gamma_ckv, sin, cos, cache_index, kv_cache,
                kr_cache, eps_cq, eps_ckv, dequant_scale_x, dequant_scale_w_dq, dequant_scale_w_uq_qr,
                dequant_scale_w_dkv_kr, quant_scale_ckv, smooth_scales_cq, qc_qr_scale=1.0, kc_scale=1.0):
    """The int8 baseline of test_mla_prolog_v2.py / _v3.py (int8 token_x and weights, per-tensor int8 kv_cache,
    int8 query): (query, query_rope, kv_cache_out, kr_cache_out, dequant_scale_q_nope [T, N, 1])."""
    lead = token_x.shape[:-1]
    T, N, D, Hckv, Dr = math.prod(lead), w_uk.shape[0], w_uk.shape[1], w_uk.shape[2], sin.shape[-1]
    x = token_x.reshape(T, -1).long()
    c, s = cos.reshape(T, 1, Dr).float(), sin.reshape(T, 1, Dr).float()
    qs = quant_scale_ckv.reshape(-1)[0].float()
    cq_raw = (x @ w_dq.long()).float() * dequant_scale_x.float() * dequant_scale_w_dq.float()
    cq = _rms(cq_raw, gamma_cq, eps_cq) * qc_qr_scale * smooth_scales_cq.float()
    cq_scale = cq.abs().amax(-1, keepdim=True) / 127
    cq_q = torch.round(cq / cq_scale).long()
    q = ((cq_q @ w_uq_qr.long()).float() * cq_scale * dequant_scale_w_uq_qr.float()).reshape(T, N, D + Dr)
    query = _bf16(torch.einsum("tnd,ndh->tnh", _bf16(q[..., :D]), w_uk.float()))
    q_scale = query.abs().amax(-1, keepdim=True) / 127
    query = _int8(query / q_scale).to(torch.int8)
    query_rope = _bf16(_rope(q[..., D:], c, s)) * qs / q_scale
    kvr = (x @ w_dkv_kr.long()).float() * dequant_scale_x.float() * dequant_scale_w_dkv_kr.float()
    ckv = _int8(_rms(kvr[:, :Hckv], gamma_ckv, eps_ckv) * kc_scale * qs)
    kpe = _rope(kvr[:, Hckv:], c[:, 0], s[:, 0])
    return (query.reshape(*lead, N, Hckv), query_rope.reshape(*lead, N, Dr), _scatter(kv_cache, ckv, cache_index),
            _scatter(kr_cache, kpe, cache_index), q_scale)


def int8_inputs(B, S, Skv, seed):
    """test_mla_prolog_v2.py / _v3.py's inputs of the int8 case, from a seeded generator."""
    g = torch.Generator().manual_seed(seed)
    z = SIZES
    He, Hcq, Hckv, N, D, Dr, Nkv, bs = (z[k] for k in ("He", "Hcq", "Hckv", "N", "D", "Dr", "Nkv", "BlockSize"))
    nb = math.ceil(B * Skv / bs)

    def i8(*shape):
        return torch.randint(-100, 100, shape, generator=g, dtype=torch.int8)

    def bf(*shape):
        return torch.rand(*shape, generator=g).to(torch.bfloat16)

    return dict(token_x=i8(B, S, He), weight_dq=i8(He, Hcq), weight_uq_qr=i8(Hcq, N * (D + Dr)),
                weight_uk=bf(N, D, Hckv), weight_dkv_kr=i8(He, Hckv + Dr), rmsnorm_gamma_cq=bf(Hcq),
                rmsnorm_gamma_ckv=bf(Hckv), rope_sin=bf(B, S, Dr), rope_cos=bf(B, S, Dr),
                cache_index=torch.randint(0, B * S, (B, S), generator=g, dtype=torch.int64),
                kv_cache=i8(nb, bs, Nkv, Hckv), kr_cache=bf(nb, bs, Nkv, Dr),
                dequant_scale_x=torch.rand(B * S, 1, generator=g), dequant_scale_w_dq=torch.rand(1, Hcq, generator=g),
                dequant_scale_w_uq_qr=torch.rand(1, N * (D + Dr), generator=g),
                dequant_scale_w_dkv_kr=torch.rand(1, Hckv + Dr, generator=g),
                smooth_scales_cq=torch.ones(1, Hcq))


POSITIONAL = ("token_x", "weight_dq", "weight_uq_qr", "weight_uk", "weight_dkv_kr", "rmsnorm_gamma_cq",
              "rmsnorm_gamma_ckv", "rope_sin", "rope_cos")
