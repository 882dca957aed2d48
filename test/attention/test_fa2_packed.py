"""FlashAttention-2's packed functions (flash_attn_qkvpacked_func, flash_attn_kvpacked_func and their varlen forms):
forward and the packed tensor's gradient against the float64 reference of fa2_reference, gradcheck, signatures, and
torch.compile(fullgraph=True)."""
import inspect
import math

import pytest
import torch

import torch_ops_transformer as tot
from test.attention.fa2_reference import attend
from test.common.reference import DTYPES, check_tolerance

# ALiBi comes with the same kernel change as softcap.


def _dense_ref(q, k, v, scale, causal, window, softcap=0.0, alibi=None):
    """Batched attend(): q [B, Sq, N, D], k/v [B, Skv, N2, D]."""
    outs, lses = [], []
    for b in range(q.shape[0]):
        slopes = None if alibi is None else (alibi[b] if alibi.dim() == 2 else alibi)
        o, lse = attend(q[b], k[b], v[b], scale, causal, window, softcap, slopes)
        outs.append(o)
        lses.append(lse)
    return torch.stack(outs), torch.stack(lses)


def _varlen_ref(q, k, v, cu_q, cu_k, scale, causal, window, softcap=0.0, alibi=None):
    outs, lses = [], []
    for b in range(len(cu_q) - 1):
        slopes = None if alibi is None else (alibi[b] if alibi.dim() == 2 else alibi)
        o, lse = attend(q[cu_q[b]:cu_q[b + 1]], k[cu_k[b]:cu_k[b + 1]], v[cu_k[b]:cu_k[b + 1]], scale, causal,
                        window, softcap, slopes)
        outs.append(o)
        lses.append(lse)
    return torch.cat(outs), torch.cat(lses, dim=1)


def _check_fwd_bwd(name, ours_fn, ref_fn, leaves, dtype):
    """Forward and gradients of ours (in dtype) against ref_fn in float64 and in dtype."""
    gen = torch.Generator().manual_seed(1)
    ours_leaves = [x.to(dtype).requires_grad_() for x in leaves]
    out = ours_fn(*ours_leaves)
    dy = torch.randn(out.shape, generator=gen, dtype=torch.float64)
    ours_g = torch.autograd.grad(out, ours_leaves, dy.to(dtype))
    ref_leaves = [x.double().requires_grad_() for x in leaves]
    ref = ref_fn(*ref_leaves)
    ref_g = torch.autograd.grad(ref, ref_leaves, dy)
    same_leaves = [x.to(dtype).requires_grad_() for x in leaves]
    same = ref_fn(*same_leaves)
    same_g = torch.autograd.grad(same, same_leaves, dy.to(dtype))
    check_tolerance(f"{name} out", out, ref, same)
    for i, (a, r, s) in enumerate(zip(ours_g, ref_g, same_g)):
        check_tolerance(f"{name} grad[{i}]", a, r, s)


CASES = [  # (batch, seqlen_q, seqlen_k, heads, kv heads, D, causal, window)
    (2, 5, 5, 4, 4, 16, False, (-1, -1)),
    (2, 7, 7, 2, 2, 8, True, (-1, -1)),
    (1, 9, 9, 2, 2, 16, False, (3, 1)),
    (2, 6, 6, 4, 4, 32, True, (2, 0)),
]


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("case", CASES, ids=str)
def test_qkvpacked(dtype, case):
    b, s, _, n, _, d, causal, window = case
    gen = torch.Generator().manual_seed(0)
    qkv = torch.randn(b, s, 3, n, d, generator=gen, dtype=torch.float64)
    scale = 0.7 / math.sqrt(d)

    def ours(x):
        return tot.flash_attn_qkvpacked_func(x, 0.0, scale, causal, window)

    def ref(x):
        return _dense_ref(x[:, :, 0], x[:, :, 1], x[:, :, 2], scale, causal, window)[0]

    _check_fwd_bwd("qkvpacked", ours, ref, [qkv], DTYPES[dtype])


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("sq,skv,n,n2,causal,window", [(5, 9, 4, 2, True, (-1, -1)), (9, 5, 4, 1, True, (-1, -1)),
                                                       (6, 6, 6, 3, False, (2, 2)), (4, 8, 2, 2, False, (-1, -1))])
def test_kvpacked(dtype, sq, skv, n, n2, causal, window):
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(2, sq, n, 16, generator=gen, dtype=torch.float64)
    kv = torch.randn(2, skv, 2, n2, 16, generator=gen, dtype=torch.float64)

    def ours(q, kv):
        return tot.flash_attn_kvpacked_func(q, kv, causal=causal, window_size=window)

    def ref(q, kv):
        return _dense_ref(q, kv[:, :, 0], kv[:, :, 1], 0.25, causal, window)[0]

    _check_fwd_bwd("kvpacked", ours, ref, [q, kv], DTYPES[dtype])


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("causal,window", [(False, (-1, -1)), (True, (-1, -1)), (False, (2, 1))])
def test_varlen_qkvpacked(dtype, causal, window):
    lens = [3, 0, 6, 4]
    cu = torch.tensor([0] + lens).cumsum(0).to(torch.int32)
    gen = torch.Generator().manual_seed(0)
    qkv = torch.randn(int(cu[-1]), 3, 4, 8, generator=gen, dtype=torch.float64)
    cu_l = cu.tolist()

    def ours(x):
        return tot.flash_attn_varlen_qkvpacked_func(x, cu, max(lens), causal=causal, window_size=window)

    def ref(x):
        return _varlen_ref(x[:, 0], x[:, 1], x[:, 2], cu_l, cu_l, 8 ** -0.5, causal, window)[0]

    _check_fwd_bwd("varlen_qkvpacked", ours, ref, [qkv], DTYPES[dtype])


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("causal", [False, True])
def test_varlen_kvpacked(dtype, causal):
    qlens, klens = [2, 5, 1], [4, 3, 6]
    cu_q = torch.tensor([0] + qlens).cumsum(0).to(torch.int32)
    cu_k = torch.tensor([0] + klens).cumsum(0).to(torch.int32)
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(int(cu_q[-1]), 4, 8, generator=gen, dtype=torch.float64)
    kv = torch.randn(int(cu_k[-1]), 2, 2, 8, generator=gen, dtype=torch.float64)

    def ours(q, kv):
        return tot.flash_attn_varlen_kvpacked_func(q, kv, cu_q, cu_k, max(qlens), max(klens), causal=causal)

    def ref(q, kv):
        return _varlen_ref(q, kv[:, 0], kv[:, 1], cu_q.tolist(), cu_k.tolist(), 8 ** -0.5, causal, (-1, -1))[0]

    _check_fwd_bwd("varlen_kvpacked", ours, ref, [q, kv], DTYPES[dtype])


def test_dropout_matches_flash_attn_func():
    """dropout_p and deterministic reach flash_attn_func: the same mask under the same seed, and a backward."""
    gen = torch.Generator().manual_seed(0)
    qkv = torch.randn(2, 6, 3, 2, 8, generator=gen, requires_grad=True)
    torch.manual_seed(7)
    out = tot.flash_attn_qkvpacked_func(qkv, 0.3, causal=True, deterministic=True)
    torch.manual_seed(7)
    want = tot.flash_attn_func(qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2], 0.3, causal=True)
    assert torch.equal(out, want)
    assert not torch.equal(out, tot.flash_attn_qkvpacked_func(qkv, causal=True))
    (g,) = torch.autograd.grad(out.sum(), qkv)
    assert torch.isfinite(g).all() and g.abs().sum() > 0


def test_return_attn_probs_lse():
    gen = torch.Generator().manual_seed(0)
    qkv = torch.randn(2, 5, 3, 2, 8, generator=gen)
    out, lse, probs = tot.flash_attn_qkvpacked_func(qkv, causal=True, return_attn_probs=True)
    ref_out, ref_lse = _dense_ref(qkv[:, :, 0].double(), qkv[:, :, 1].double(), qkv[:, :, 2].double(), 8 ** -0.5,
                                  True, (-1, -1))
    assert lse.dtype == torch.float32 and lse.shape == (2, 2, 5)
    torch.testing.assert_close(out.double(), ref_out, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(lse.double(), ref_lse, atol=1e-5, rtol=1e-5)
    cu = torch.tensor([0, 2, 5], dtype=torch.int32)
    packed = qkv[0]
    out, lse, _ = tot.flash_attn_varlen_qkvpacked_func(packed, cu, 3, return_attn_probs=True)
    assert lse.shape == (2, 5)


# gradcheck: float64 leaves, the op runs in float32 (its dtypes are fp32/fp16/bf16), so the step and tolerances are
# sized for float32 (as test_gradcheck.py).
GRADCHECK = dict(eps=1e-3, atol=2e-3, rtol=2e-2)


@pytest.mark.parametrize("fn", ["qkvpacked", "kvpacked", "varlen_qkvpacked", "varlen_kvpacked"])
def test_gradcheck_packed(fn):
    gen = torch.Generator().manual_seed(3)
    cu = torch.tensor([0, 2, 5], dtype=torch.int32)
    if fn == "qkvpacked":
        leaves = [torch.randn(1, 4, 3, 2, 4, generator=gen, dtype=torch.float64)]
        call = lambda x: tot.flash_attn_qkvpacked_func(x.float(), causal=True)  # noqa: E731
    elif fn == "kvpacked":
        leaves = [torch.randn(1, 3, 2, 4, generator=gen, dtype=torch.float64),
                  torch.randn(1, 5, 2, 1, 4, generator=gen, dtype=torch.float64)]
        call = lambda q, kv: tot.flash_attn_kvpacked_func(q.float(), kv.float(), causal=True)  # noqa: E731
    elif fn == "varlen_qkvpacked":
        leaves = [torch.randn(5, 3, 2, 4, generator=gen, dtype=torch.float64)]
        call = lambda x: tot.flash_attn_varlen_qkvpacked_func(x.float(), cu, 3, causal=True)  # noqa: E731
    else:
        leaves = [torch.randn(5, 2, 4, generator=gen, dtype=torch.float64),
                  torch.randn(5, 2, 1, 4, generator=gen, dtype=torch.float64)]
        call = lambda q, kv: tot.flash_attn_varlen_kvpacked_func(q.float(), kv.float(), cu, cu, 3, 3)  # noqa: E731
    leaves = [x.requires_grad_() for x in leaves]
    assert torch.autograd.gradcheck(lambda *xs: call(*xs).double(), leaves, **GRADCHECK)


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_qkvpacked_softcap(dtype):
    gen = torch.Generator().manual_seed(0)
    qkv = torch.randn(2, 6, 3, 2, 16, generator=gen, dtype=torch.float64) * 3

    def ours(x):
        return tot.flash_attn_qkvpacked_func(x, causal=True, softcap=5.0)

    def ref(x):
        return _dense_ref(x[:, :, 0], x[:, :, 1], x[:, :, 2], 0.25, True, (-1, -1), softcap=5.0)[0]

    _check_fwd_bwd("qkvpacked softcap", ours, ref, [qkv], DTYPES[dtype])


@pytest.mark.parametrize("slopes_shape", [(2,), (2, 2)])
def test_kvpacked_alibi(slopes_shape):
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(2, 4, 2, 8, generator=gen, dtype=torch.float64)
    kv = torch.randn(2, 7, 2, 1, 8, generator=gen, dtype=torch.float64)
    slopes = torch.rand(slopes_shape, generator=gen) * 0.5

    def ours(q, kv):
        return tot.flash_attn_kvpacked_func(q, kv, causal=True, alibi_slopes=slopes)

    def ref(q, kv):
        return _dense_ref(q, kv[:, :, 0], kv[:, :, 1], 8 ** -0.5, True, (-1, -1), alibi=slopes.double())[0]

    _check_fwd_bwd("kvpacked alibi", ours, ref, [q, kv], torch.float32)


def test_signatures_match_flash_attention_2():
    common = ["dropout_p", "softmax_scale", "causal", "window_size", "softcap", "alibi_slopes", "deterministic",
              "return_attn_probs"]
    want = {
        "flash_attn_qkvpacked_func": ["qkv"] + common,
        "flash_attn_kvpacked_func": ["q", "kv"] + common,
        "flash_attn_varlen_qkvpacked_func": ["qkv", "cu_seqlens", "max_seqlen"] + common,
        "flash_attn_varlen_kvpacked_func": ["q", "kv", "cu_seqlens_q", "cu_seqlens_k", "max_seqlen_q",
                                            "max_seqlen_k"] + common,
        "flash_attn_with_kvcache": ["q", "k_cache", "v_cache", "k", "v", "rotary_cos", "rotary_sin", "cache_seqlens",
                                    "cache_batch_idx", "cache_leftpad", "block_table", "softmax_scale", "causal",
                                    "window_size", "softcap", "rotary_interleaved", "alibi_slopes", "num_splits",
                                    "return_softmax_lse"],
    }
    defaults = {"dropout_p": 0.0, "softmax_scale": None, "causal": False, "window_size": (-1, -1), "softcap": 0.0,
                "alibi_slopes": None, "deterministic": False, "return_attn_probs": False, "k": None, "v": None,
                "rotary_interleaved": True, "num_splits": 0, "return_softmax_lse": False, "block_table": None}
    for name, params in want.items():
        sig = inspect.signature(getattr(tot, name)).parameters
        assert list(sig) == params, name
        for p, d in defaults.items():
            if p in sig:
                assert sig[p].default == d, (name, p)
    varlen = list(inspect.signature(tot.flash_attn_varlen_func).parameters)
    assert varlen[-1] == "block_table" and varlen[-2] == "return_attn_probs"


@pytest.mark.parametrize("name,args", [("qkv", lambda: (torch.randn(2, 5, 2, 4, 8),)),
                                       ("kv", lambda: (torch.randn(2, 5, 4, 8), torch.randn(2, 5, 3, 4, 8)))])
def test_bad_packed_shape(name, args):
    fn = tot.flash_attn_qkvpacked_func if name == "qkv" else tot.flash_attn_kvpacked_func
    with pytest.raises(ValueError, match=rf"argument '{name}' must be a tensor of shape .* got \["):
        fn(*args())


def test_compile_fullgraph_qkvpacked():
    gen = torch.Generator().manual_seed(0)
    qkv = torch.randn(2, 6, 3, 2, 8, generator=gen, requires_grad=True)

    def step(x):
        return tot.flash_attn_qkvpacked_func(x, causal=True).square().sum()

    torch._dynamo.reset()
    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    loss = compiled(qkv)
    (g,) = torch.autograd.grad(loss, qkv)
    loss_e = step(qkv)
    (g_e,) = torch.autograd.grad(loss_e, qkv)
    torch.testing.assert_close(loss, loss_e)
    torch.testing.assert_close(g, g_e)


def test_reference_itself():
    """fa2_reference against PyTorch's SDPA (bottom-right causal as an explicit mask, GQA) and rotary against complex
    multiplication: the reference must not share a mistake with the code under test."""
    import torch.nn.functional as F

    from test.attention.fa2_reference import rotary
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(5, 4, 8, generator=gen, dtype=torch.float64)
    k = torch.randn(9, 2, 8, generator=gen, dtype=torch.float64)
    v = torch.randn(9, 2, 8, generator=gen, dtype=torch.float64)
    out, _ = attend(q, k, v, 0.3, causal=True)
    keep = torch.ones(5, 9, dtype=torch.bool).tril(9 - 5)
    want = F.scaled_dot_product_attention(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), attn_mask=keep,
                                          scale=0.3, enable_gqa=True).transpose(0, 1)
    torch.testing.assert_close(out, want)
    x = torch.randn(3, 2, 8, generator=gen, dtype=torch.float64)
    angle = torch.rand(10, 2, generator=gen, dtype=torch.float64)
    pos = torch.tensor([4, 0, 9])
    got = rotary(x, angle.cos(), angle.sin(), pos, interleaved=True)
    z = torch.view_as_complex(x[..., :4].reshape(3, 2, 2, 2).contiguous()) * torch.polar(
        torch.ones_like(angle[pos]), angle[pos]).unsqueeze(1)
    torch.testing.assert_close(got[..., :4], torch.view_as_real(z).flatten(-2))
    torch.testing.assert_close(got[..., 4:], x[..., 4:])
    half = rotary(x, angle.cos(), angle.sin(), pos, interleaved=False)
    z = torch.complex(x[..., :2], x[..., 2:4]) * torch.polar(torch.ones_like(angle[pos]), angle[pos]).unsqueeze(1)
    torch.testing.assert_close(half[..., :4], torch.cat([z.real, z.imag], dim=-1))


def test_compile_fullgraph_varlen_kvpacked():
    gen = torch.Generator().manual_seed(0)
    cu_q = torch.tensor([0, 2, 5], dtype=torch.int32)
    cu_k = torch.tensor([0, 4, 7], dtype=torch.int32)
    q = torch.randn(5, 4, 8, generator=gen, requires_grad=True)
    kv = torch.randn(7, 2, 2, 8, generator=gen, requires_grad=True)

    def step(q, kv):
        return tot.flash_attn_varlen_kvpacked_func(q, kv, cu_q, cu_k, 3, 4, causal=True).square().sum()

    torch._dynamo.reset()
    loss = torch.compile(step, fullgraph=True, backend="aot_eager")(q, kv)
    grads = torch.autograd.grad(loss, (q, kv))
    loss_e = step(q, kv)
    grads_e = torch.autograd.grad(loss_e, (q, kv))
    torch.testing.assert_close(loss, loss_e)
    for a, b in zip(grads, grads_e):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("form", ["list", "tensor", "int32_tensor", "0d_tensors"])
def test_window_size_any_pair_form(form):
    """window_size as any pair FlashAttention-2 takes (its tests pass a 2-element tensor): the tuple's result, for the
    dense, varlen and packed functions alike."""
    gen = torch.Generator().manual_seed(0)
    qkv = torch.randn(2, 9, 3, 2, 16, generator=gen)
    q, k, v = qkv.unbind(2)
    cu = torch.tensor([0, 4, 9], dtype=torch.int32)
    forms = {"list": [3, 1], "tensor": torch.tensor([3, 1]), "int32_tensor": torch.tensor([3, 1], dtype=torch.int32),
             "0d_tensors": (torch.tensor(3), torch.tensor(1))}
    calls = {
        "flash_attn_func": lambda w: tot.flash_attn_func(q, k, v, window_size=w),
        "flash_attn_varlen_func": lambda w: tot.flash_attn_varlen_func(q[0], k[0], v[0], cu, cu, 5, 5, window_size=w),
        "flash_attn_qkvpacked_func": lambda w: tot.flash_attn_qkvpacked_func(qkv, window_size=w),
        "flash_attn_varlen_kvpacked_func": lambda w: tot.flash_attn_varlen_kvpacked_func(
            q[0], qkv[0, :, 1:], cu, cu, 5, 5, window_size=w),
    }
    for name, call in calls.items():
        assert torch.equal(call(forms[form]), call((3, 1))), name
    ref, _ = _dense_ref(q.double(), k.double(), v.double(), 16 ** -0.5, False, (3, 1))
    torch.testing.assert_close(calls["flash_attn_func"](forms[form]).double(), ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("bad,exc", [(torch.tensor([3, 1, 0]), ValueError), (torch.tensor([3.0, 1.0]), TypeError),
                                     ((3, True), TypeError), (3, ValueError)])
def test_window_size_bad_forms(bad, exc):
    q = torch.randn(1, 4, 2, 8)
    with pytest.raises(exc, match=r"flash_attn_func: argument 'window_size' must be a pair \(left, right\) of ints"):
        tot.flash_attn_func(q, q, q, window_size=bad)
