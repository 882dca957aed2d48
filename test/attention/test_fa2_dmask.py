"""FlashAttention-2's S_dmask (return_attn_probs=True with dropout) from flash_attn_func, flash_attn_varlen_func and
the packed variants: its shape and padding, its sign as the keep mask the kernel applied (out is rebuilt from it in
float64), its magnitude as FlashAttention-2's un-normalised probabilities (normalised back with the running maxima
over key blocks of _get_block_size_n and compared with the float64 softmax), and None without dropout.

The reference is written here in plain PyTorch (float64, and the tested dtype for the tolerance rule)."""
import math

import pytest
import torch

import torch_ops_transformer as tot
from test.common.reference import DTYPES, check_tolerance
from torch_ops_transformer.attention.fa2 import get_block_size_n

P = 0.17  # the dropout probability of FlashAttention-2's tests


def _scores(q, k, scale, causal, window, softcap, slopes):
    """One sequence, in q's dtype: q [Sq, N, D], k [L, N2, D] -> masked scores [N, Sq, L] (-inf where not seen)
    with bottom-right causal / window, soft-capping and ALiBi -slope * |i + L - Sq - j|."""
    sq, n, _ = q.shape
    length, n2 = k.shape[:2]
    s = torch.einsum("qnd,knd->nqk", q, k.repeat_interleave(n // n2, dim=1)) * scale
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    diag = torch.arange(sq).view(-1, 1) + length - sq
    j = torch.arange(length).view(1, -1)
    if slopes is not None:
        s = s - slopes.to(s.dtype).view(n, 1, 1) * (diag - j).abs().to(s.dtype)
    left, right = window
    right = 0 if causal else right
    seen = torch.ones(sq, length, dtype=torch.bool)
    if right >= 0:
        seen &= j <= diag + right
    if left >= 0:
        seen &= j >= diag - left
    return s.masked_fill(~seen, -math.inf), seen


def _softmax(s):
    return torch.softmax(s, dim=-1).nan_to_num(0.0)  # a row without keys gives zeros


def _dropped_out(p, keep, v, n):
    """(softmax with the dropped entries zeroed) / (1 - P) @ v: v [L, N2, Dv] -> [Sq, N, Dv]."""
    vv = v.repeat_interleave(n // v.shape[1], dim=1)
    return torch.einsum("nqk,knd->qnd", p * keep / (1 - P), vv)


def _normalise(magnitude, s64, block):
    """FlashAttention-2's reading of S_dmask's magnitude: entry (i, j) is exp(s - m) with m the row maximum over the
    key block of j and every later block, so exp(s - m) * exp(m - lse) is the probability."""
    lse = torch.logsumexp(s64, dim=-1, keepdim=True)
    parts = []
    for c, part in enumerate(magnitude.split(block, dim=-1)):
        m = s64[..., c * block:].amax(dim=-1, keepdim=True)
        parts.append(part * torch.exp(m - lse).nan_to_num(0.0))
    return torch.cat(parts, dim=-1)


def _check_sequence(name, q, k, v, out, s_block, dtype, scale, causal, window, softcap=0.0, slopes=None):
    """One sequence's output and S_dmask block [N, Sq, L] against the float64 and same-dtype references."""
    n, d = q.shape[1], q.shape[2]
    keep = ~torch.signbit(s_block)  # -0.0 (a dropped entry whose probability underflowed) counts as dropped
    s64, seen = _scores(q.double(), k.double(), scale, causal, window, softcap, slopes)
    same, _ = _scores(q.to(dtype), k.to(dtype), scale, causal, window, softcap, slopes)
    p64 = _softmax(s64)
    check_tolerance(f"{name} out", out, _dropped_out(p64, keep, v.double(), n),
                    _dropped_out(_softmax(same), keep, v.to(dtype), n))
    probs = _normalise(s_block.double().abs(), s64, get_block_size_n(q.device, d, True, causal))
    check_tolerance(f"{name} probabilities", probs, p64, _softmax(same))
    assert not s_block[:, ~seen].abs().any(), f"{name}: masked entries must be 0"
    return keep[:, seen].flatten()


def _check_fraction(kept):
    n = kept.numel()
    frac = 1.0 - kept.double().mean().item()
    assert abs(frac - P) < 5 * math.sqrt(P * (1 - P) / n), f"dropped fraction {frac} for dropout_p {P} ({n} entries)"


DENSE = {  # (batch, Sq, Skv, N, N2, D, causal, window, softcap, alibi)
    "plain_gqa": (2, 37, 150, 4, 2, 64, False, (-1, -1), 0.0, False),
    "causal_sq_lt_skv": (2, 70, 150, 4, 4, 32, True, (-1, -1), 0.0, False),
    "causal_sq_gt_skv": (1, 140, 90, 2, 1, 128, True, (-1, -1), 0.0, False),
    "window": (2, 60, 200, 2, 2, 64, False, (17, 9), 0.0, False),
    "alibi_causal": (2, 33, 130, 4, 2, 64, True, (-1, -1), 0.0, True),
    "alibi_window_softcap": (1, 50, 180, 3, 1, 96, False, (40, 0), 5.0, True),
}


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("name", list(DENSE))
def test_flash_attn_func_s_dmask(name, dtype):
    b, sq, sk, n, n2, d, causal, window, softcap, alibi = DENSE[name]
    dt = DTYPES[dtype]
    gen = torch.Generator().manual_seed(3)
    q = torch.randn(b, sq, n, d, generator=gen).to(dt)
    k, v = (torch.randn(b, sk, n2, d, generator=gen).to(dt) for _ in range(2))
    slopes = torch.rand(b, n, generator=gen) * 0.3 if alibi else None
    torch.manual_seed(11)
    out, lse, s_dmask = tot.flash_attn_func(q, k, v, P, causal=causal, window_size=window, softcap=softcap,
                                            alibi_slopes=slopes, return_attn_probs=True)
    rounded = (b, n, math.ceil(sq / 128) * 128, math.ceil(sk / 128) * 128)
    assert s_dmask.shape == rounded and s_dmask.dtype == dt and s_dmask.device == q.device
    assert not s_dmask[:, :, sq:].any() and not s_dmask[:, :, :, sk:].any(), "padding must be 0"
    scale = d ** -0.5
    kept = [_check_sequence(f"{name}[{i}]", q[i], k[i], v[i], out[i], s_dmask[i, :, :sq, :sk], dt, scale, causal,
                            window, softcap, slopes[i] if alibi else None) for i in range(b)]
    _check_fraction(torch.cat(kept))


VARLEN = {  # (cu_seqlens_q, cu_seqlens_k, N, N2, D, causal, window, alibi)
    "causal_gqa": ([0, 5, 40, 41, 41], [0, 70, 100, 230, 240], 4, 2, 64, True, (-1, -1), False),
    "window_alibi": ([0, 30, 90, 150], [0, 30, 90, 150], 2, 2, 32, False, (11, 4), True),
}


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("name", list(VARLEN))
def test_flash_attn_varlen_func_s_dmask(name, dtype):
    cu_q, cu_k, n, n2, d, causal, window, alibi = VARLEN[name]
    dt = DTYPES[dtype]
    gen = torch.Generator().manual_seed(5)
    batch = len(cu_q) - 1
    q = torch.randn(cu_q[-1], n, d, generator=gen).to(dt)
    k, v = (torch.randn(cu_k[-1], n2, d, generator=gen).to(dt) for _ in range(2))
    slopes = torch.rand(batch, n, generator=gen) * 0.3 if alibi else None
    lens_q = [b - a for a, b in zip(cu_q, cu_q[1:])]
    lens_k = [b - a for a, b in zip(cu_k, cu_k[1:])]
    torch.manual_seed(12)
    out, _, s_dmask = tot.flash_attn_varlen_func(
        q, k, v, torch.tensor(cu_q, dtype=torch.int32), torch.tensor(cu_k, dtype=torch.int32), max(lens_q),
        max(lens_k), P, causal=causal, window_size=window, alibi_slopes=slopes, return_attn_probs=True)
    assert s_dmask.shape == (batch, n, math.ceil(max(lens_q) / 128) * 128, math.ceil(max(lens_k) / 128) * 128)
    assert s_dmask.dtype == dt
    kept = []
    for i, (lq, lk) in enumerate(zip(lens_q, lens_k)):
        assert not s_dmask[i, :, lq:].any() and not s_dmask[i, :, :, lk:].any(), "past the sequence must be 0"
        if lq and lk:
            kq, kk = slice(cu_q[i], cu_q[i + 1]), slice(cu_k[i], cu_k[i + 1])
            kept.append(_check_sequence(f"{name}[{i}]", q[kq], k[kk], v[kk], out[kq], s_dmask[i, :, :lq, :lk], dt,
                                        d ** -0.5, causal, window, 0.0, slopes[i] if alibi else None))
    _check_fraction(torch.cat(kept))


def _packed_calls(dropout_p):
    gen = torch.Generator().manual_seed(0)
    qkv = torch.randn(2, 40, 3, 2, 32, generator=gen, dtype=torch.float16)
    q, k, v = qkv.unbind(2)
    cu = torch.tensor([0, 15, 40], dtype=torch.int32)
    flat = qkv.flatten(0, 1)[:40]
    fq, fk, fv = flat.unbind(1)
    return {  # packed call, the unpacked call it must equal
        "qkvpacked": (lambda: tot.flash_attn_qkvpacked_func(qkv, dropout_p, causal=True, return_attn_probs=True),
                      lambda: tot.flash_attn_func(q, k, v, dropout_p, causal=True, return_attn_probs=True)),
        "kvpacked": (lambda: tot.flash_attn_kvpacked_func(q, qkv[:, :, 1:], dropout_p, return_attn_probs=True),
                     lambda: tot.flash_attn_func(q, k, v, dropout_p, return_attn_probs=True)),
        "varlen_qkvpacked": (
            lambda: tot.flash_attn_varlen_qkvpacked_func(flat, cu, 25, dropout_p, return_attn_probs=True),
            lambda: tot.flash_attn_varlen_func(fq, fk, fv, cu, cu, 25, 25, dropout_p, return_attn_probs=True)),
        "varlen_kvpacked": (
            lambda: tot.flash_attn_varlen_kvpacked_func(fq, flat[:, 1:], cu, cu, 25, 25, dropout_p, causal=True,
                                                        return_attn_probs=True),
            lambda: tot.flash_attn_varlen_func(fq, fk, fv, cu, cu, 25, 25, dropout_p, causal=True,
                                               return_attn_probs=True)),
    }


@pytest.mark.parametrize("fn", ["qkvpacked", "kvpacked", "varlen_qkvpacked", "varlen_kvpacked"])
def test_packed_variants_return_it(fn):
    packed, unpacked = _packed_calls(P)[fn]
    torch.manual_seed(21)
    got = packed()
    torch.manual_seed(21)
    want = unpacked()
    assert got[2] is not None and got[2].shape[-2:] == (128, 128)
    assert torch.equal(got[0], want[0]) and torch.equal(got[2], want[2])
    assert torch.signbit(got[2]).any(), "some entries must be dropped"


@pytest.mark.parametrize("fn", ["qkvpacked", "kvpacked", "varlen_qkvpacked", "varlen_kvpacked"])
def test_none_without_dropout(fn):
    """As FlashAttention-2: S_dmask only with dropout."""
    packed, unpacked = _packed_calls(0.0)[fn]
    assert packed()[2] is None and unpacked()[2] is None


def test_it_does_not_change_the_output_or_the_gradient():
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 30, 2, 16, generator=gen, requires_grad=True) for _ in range(3))
    torch.manual_seed(4)
    out, _, s_dmask = tot.flash_attn_func(q, k, v, P, causal=True, return_attn_probs=True)
    torch.manual_seed(4)
    plain = tot.flash_attn_func(q, k, v, P, causal=True)
    assert torch.equal(out, plain) and not s_dmask.requires_grad
    assert torch.equal(torch.autograd.grad(out.sum(), q)[0], torch.autograd.grad(plain.sum(), q)[0])


@pytest.mark.parametrize("sq,sk", [(0, 5), (3, 0)])
def test_zero_sizes(sq, sk):
    q, k = torch.randn(2, sq, 2, 16), torch.randn(2, sk, 2, 16)
    _, _, s_dmask = tot.flash_attn_func(q, k, k, P, return_attn_probs=True)
    assert s_dmask.shape == (2, 2, math.ceil(sq / 128) * 128, math.ceil(sk / 128) * 128) and not s_dmask.any()
