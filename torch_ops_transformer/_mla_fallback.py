"""TEMPORARY plain-PyTorch stand-ins for the MLA ops still being written (same signatures as the torch_npu
wrappers, only the arguments MLAAttention passes). mla.py uses them only while the real wrapper is missing."""
import torch


def _rms(x, gamma, eps):
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * gamma


def _irope(x, cos, sin):
    d = x.shape[-1]
    q = x.reshape(*x.shape[:-1], d // 2, 2).transpose(-1, -2).reshape(x.shape)
    rot = torch.cat([-q[..., d // 2:], q[..., :d // 2]], -1)
    return q * cos + rot * sin


def npu_interleave_rope(x, cos, sin):
    return _irope(x, cos, sin)


def npu_kv_rmsnorm_rope_cache(kv, gamma, cos, sin, index, k_cache, ckv_cache, *, epsilon=1e-5, cache_mode="Norm",
                              **_):
    r = gamma.shape[0]
    kv = kv.reshape(-1, kv.shape[-1])
    c = _rms(kv[:, :r], gamma, epsilon)
    kr = _irope(kv[:, r:], cos.reshape(-1, kv.shape[-1] - r), sin.reshape(-1, kv.shape[-1] - r))
    ckv_cache.view(-1, r)[index.reshape(-1)] = c.to(ckv_cache.dtype)
    k_cache.view(-1, kr.shape[-1])[index.reshape(-1)] = kr.to(k_cache.dtype)
    return k_cache, ckv_cache, None, None


def npu_mla_prolog_v3(token_x, weight_dq, weight_uq_qr, weight_uk, weight_dkv_kr, rmsnorm_gamma_cq,
                      rmsnorm_gamma_ckv, rope_sin, rope_cos, kv_cache, kr_cache, *, cache_index=None,
                      rmsnorm_epsilon_cq=1e-5, rmsnorm_epsilon_ckv=1e-5, cache_mode="PA_BSND", **_):
    lead = token_x.shape[:-1]
    x = token_x.reshape(-1, token_x.shape[-1])
    n, d, r = weight_uk.shape
    dr = rope_cos.shape[-1]
    cq = _rms(x @ weight_dq, rmsnorm_gamma_cq, rmsnorm_epsilon_cq)
    qc = (cq @ weight_uq_qr).reshape(-1, n, d + dr)
    q = torch.bmm(qc[..., :d].transpose(0, 1), weight_uk).transpose(0, 1)
    cos, sin = rope_cos.reshape(-1, 1, dr), rope_sin.reshape(-1, 1, dr)
    q_rope = _irope(qc[..., d:], cos, sin)
    npu_kv_rmsnorm_rope_cache(x @ weight_dkv_kr, rmsnorm_gamma_ckv, cos, sin, cache_index, kr_cache, kv_cache,
                              epsilon=rmsnorm_epsilon_ckv)
    return q.reshape(*lead, n, r), q_rope.reshape(*lead, n, dr), None, None, None


def npu_fused_infer_attention_score(query, key, value, *, query_rope, key_rope, block_table, actual_seq_lengths,
                                    actual_seq_lengths_kv, num_heads, scale, input_layout, block_size,
                                    sparse_mode=0, **_):
    r, dr = key.shape[-1], key_rope.shape[-1]
    ckv_all, kr_all = key.reshape(-1, r), key_rope.reshape(-1, dr)
    if input_layout == "TND":
        ends = list(actual_seq_lengths)
        starts = [0] + ends[:-1]
        qs = [(query[s:e], query_rope[s:e]) for s, e in zip(starts, ends)]
    else:
        qs = [(query[b], query_rope[b]) for b in range(query.shape[0])]
    outs = []
    for b, (q, qr) in enumerate(qs):
        L, S = int(actual_seq_lengths_kv[b]), q.shape[0]
        p = torch.arange(L)
        slots = block_table[b, p // block_size].long() * block_size + p % block_size
        ckv, kr = ckv_all[slots].float(), kr_all[slots].float()
        s = (torch.einsum("snr,lr->nsl", q.float(), ckv) + torch.einsum("snr,lr->nsl", qr.float(), kr)) * scale
        if sparse_mode == 3:
            i = torch.arange(S)[:, None]
            s = s.masked_fill(p[None, :] > L - S + i, float("-inf"))
        outs.append(torch.einsum("nsl,lr->snr", s.softmax(-1), ckv).to(query.dtype))
    out = torch.cat(outs) if input_layout == "TND" else torch.stack(outs)
    return out, None
