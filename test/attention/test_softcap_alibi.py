"""softcap (FlashAttention-2's logit soft-capping) and in-kernel ALiBi (pse_type 2/3, FlashAttention-2's
alibi_slopes) in flash_attention_score(_grad): forward and gradients against the float64 reference under the
tolerance rule, gradcheck, flash_attn_func / flash_attn_varlen_func, torch.compile and the argument checks.

The order the kernels and the reference follow (FlashAttention-2's): x = scale*QKᵀ (scale*(QKᵀ + pse) for
pse_type 1), x = softcap*tanh(x/softcap), + pse (pse_type 0) or the ALiBi bias, then the mask and the softmax."""
import itertools
import math

import pytest
import torch

import torch_ops_transformer as tot
from test.attention.attention_cases import OPS, Case, compare_with_reference, make_inputs
from test.common.reference import attention_reference, check_tolerance

DTYPES = ["fp32", "fp16", "bf16"]
LAYOUTS = ["BSND", "BNSD", "BSH", "SBH", "TND"]
VARLEN = ((5, 0, 1, 70, 9), (7, 3, 1, 65, 0))
MODES = {
    "full": dict(sparse_mode=0),
    "causal_br": dict(sparse_mode=3),
    "causal_tl": dict(sparse_mode=2),
    "window": dict(sparse_mode=4, pre_tokens=4, next_tokens=1),
}
# (softcap, alibi slopes shape, pse_type): off, softcap alone, ALiBi alone (both types, both slope shapes), both.
FEATURES = [(0.0, None, 1), (5.0, None, 1), (0.0, "N", 2), (0.0, "BN", 3), (2.0, "BN", 2), (30.0, "N", 3)]


def _grid():
    # Layout x dtype x feature combination in full; the sparse mode and GQA rotate along, so each mode meets
    # every feature combination.
    for (li, layout), (di, dtype), (fi, feat) in itertools.product(enumerate(LAYOUTS), enumerate(DTYPES),
                                                                  enumerate(FEATURES)):
        mode = list(MODES)[(li + di + fi) % len(MODES)]
        gqa = [(4, 2), (4, 1), (2, 2)][(li + fi) % 3]
        yield pytest.param(layout, dtype, feat, mode, gqa, id=f"{layout}-{dtype}-{feat[0]}-{feat[1]}{feat[2]}-{mode}")


def _case(layout, dtype, feat, mode, gqa, **kw):
    softcap, alibi, pse_type = feat
    extra = dict(seqlens=VARLEN) if layout == "TND" else {}
    return Case(layout=layout, dtype=dtype, q_heads=gqa[0], kv_heads=gqa[1], softcap=softcap, alibi=alibi,
                pse_type=pse_type, alibi_bottom_right=alibi is not None and layout == "TND", scale_mult=3.0,
                **MODES[mode], **extra, **kw)


@pytest.mark.parametrize("layout,dtype,feat,mode,gqa", list(_grid()))
def test_grid(layout, dtype, feat, mode, gqa):
    compare_with_reference(_case(layout, dtype, feat, mode, gqa))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("pse,pse_type", [("BNSS", 1), ("BN1S", 0), ("1NSS", 1)])
def test_softcap_with_explicit_pse(dtype, pse, pse_type):
    """pse_type 1: the pse is inside the capped score; pse_type 0: added after the cap."""
    compare_with_reference(Case(dtype=dtype, pse=pse, pse_type=pse_type, softcap=4.0, scale_mult=3.0,
                                sparse_mode=3))


@pytest.mark.parametrize("start_idx", [((0,), (0,)), ((3,), (1,)), ((0, 5), (2, 0))])
@pytest.mark.parametrize("bottom_right", [False, True])
@pytest.mark.parametrize("pse_type", [2, 3])
def test_alibi_start_indices(start_idx, bottom_right, pse_type):
    compare_with_reference(Case(alibi="BN", pse_type=pse_type, start_idx=start_idx, alibi_bottom_right=bottom_right,
                                mask="B1SS"))


def test_long_rows_cross_tiles():
    """Several KV tiles and query blocks (forward's online softmax and the backward's tiles) with both features."""
    compare_with_reference(Case(batch=1, q_heads=2, kv_heads=1, q_len=150, kv_len=600, head_dim=32, softcap=10.0,
                                alibi="N", pse_type=2, alibi_bottom_right=True, sparse_mode=3, scale_mult=2.0))


def test_dropout_with_softcap_alibi():
    compare_with_reference(Case(keep_prob=0.8, softcap=3.0, alibi="N", pse_type=2, scale_mult=3.0))


def test_softcap_bounds_the_logits():
    """With a tiny softcap every logit is within +-softcap: the softmax is close to uniform however large QKᵀ."""
    args = make_inputs(Case(batch=1, q_heads=1, kv_heads=1, q_len=4, kv_len=6, scale_mult=100.0, softcap=1e-3))
    out = OPS.flash_attention_score(**args)[0]
    uniform = args["value"].double().mean(dim=1, keepdim=True).expand_as(out)
    assert (out.double() - uniform).abs().max() < 1e-2


GRADCHECK = dict(eps=1e-3, atol=2e-3, rtol=2e-2)
GRADCHECK_CASES = {
    "softcap": Case(batch=1, q_heads=2, kv_heads=1, q_len=3, kv_len=4, head_dim=4, softcap=0.7, scale_mult=3.0),
    "softcap_pse1": Case(batch=1, q_heads=2, kv_heads=2, q_len=3, kv_len=4, head_dim=4, softcap=0.5, pse="BNSS",
                         pse_type=1, scale_mult=2.0),
    "softcap_pse0_causal": Case(batch=1, q_heads=2, kv_heads=1, q_len=4, kv_len=3, head_dim=4, softcap=0.5,
                                pse="BN1S", pse_type=0, sparse_mode=3, scale_mult=2.0),
    "alibi2_softcap_TND": Case(layout="TND", q_heads=2, kv_heads=1, head_dim=4, seqlens=((2, 3), (3, 2)),
                               softcap=1.0, alibi="N", pse_type=2, alibi_bottom_right=True, scale_mult=2.0),
    "alibi3_BN": Case(batch=2, q_heads=2, kv_heads=1, q_len=3, kv_len=4, head_dim=4, alibi="BN", pse_type=3),
}


@pytest.mark.parametrize("name", list(GRADCHECK_CASES))
def test_gradcheck(name):
    """float64 leaves; the op runs in float32 (it takes no float64), so eps/tolerances are sized for fp32."""
    args = make_inputs(GRADCHECK_CASES[name])
    diff = [n for n in ("query", "key", "value") if args.get(n) is not None]
    if args.get("pse") is not None and GRADCHECK_CASES[name].pse_type < 2:
        diff.append("pse")
    leaves = [args[n].double().requires_grad_() for n in diff]

    def fn(*xs):
        kw = dict(args, **{n: x.float() for n, x in zip(diff, xs)})
        return OPS.flash_attention_score(**kw)[0].double()

    assert torch.autograd.gradcheck(fn, leaves, **GRADCHECK)


def test_slopes_get_zero_gradient_and_plain_grad_op():
    """dpse of pse_type 2/3 is zeros of the slopes' shape (FlashAttention-2 gives the slopes no gradient)."""
    args = make_inputs(Case(alibi="BN", pse_type=2, softcap=2.0))
    out, smax, ssum, _, seed, offset = OPS.flash_attention_score(**args)
    kw = {k: v for k, v in args.items() if k not in ("query", "key", "value", "head_num", "input_layout")}
    grads = OPS.flash_attention_score_grad(args["query"], args["key"], args["value"], torch.ones_like(out),
                                           args["head_num"], args["input_layout"], softmax_max=smax,
                                           softmax_sum=ssum, attention_in=out, **kw)
    assert grads[3].shape == args["pse"].shape and grads[3].dtype == torch.float32 and not grads[3].any()


# ---- flash_attn_func / flash_attn_varlen_func ----

def _fa2_reference(q, k, v, causal, window, softcap, slopes, scale, dtype):
    """FlashAttention-2's math on BSND: bottom-right alignment, -slope * |i + Skv - Sq - j|."""
    sq, skv = q.shape[1], k.shape[1]
    mode = 3 if causal else 4 if window != (-1, -1) else 0
    pre = window[0] if window[0] >= 0 else 2147483647
    nxt = 0 if causal else window[1] if window[1] >= 0 else 2147483647
    return attention_reference(q, k, v, q.shape[2], "BSND", scale=scale, sparse_mode=mode, pre_tokens=pre,
                               next_tokens=nxt, pse=slopes, pse_type=2 if slopes is not None else 1,
                               softcap=softcap, alibi_bottom_right=True, compute_dtype=dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("causal,window", [(False, (-1, -1)), (True, (-1, -1)), (False, (3, 1))])
@pytest.mark.parametrize("softcap,slopes_shape", [(0.0, (4,)), (8.0, None), (8.0, (2, 4))])
def test_flash_attn_func(dtype, causal, window, softcap, slopes_shape):
    dt = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[dtype]
    g = torch.Generator().manual_seed(5)
    q = (torch.randn(2, 6, 4, 16, generator=g) * 2).to(dt)
    k, v = torch.randn(2, 9, 2, 16, generator=g).to(dt), torch.randn(2, 9, 2, 16, generator=g).to(dt)
    slopes = None if slopes_shape is None else torch.rand(slopes_shape, generator=g) * 0.5
    out, lse, _ = tot.flash_attn_func(q, k, v, 0.0, None, causal, window, softcap, slopes, False, True)
    scale = 16 ** -0.5
    ref, ref_lse = _fa2_reference(q, k, v, causal, window, softcap, slopes, scale, torch.float64)
    same, same_lse = _fa2_reference(q, k, v, causal, window, softcap, slopes, scale, None)
    check_tolerance("flash_attn_func out", out, ref, same)
    if slopes is not None and causal:  # FlashAttention-2's causal lse carries slope * (i + Skv - Sq)
        row = torch.arange(6, dtype=torch.float64) + 3
        add = slopes.double().unsqueeze(-1) * row
        ref_lse, same_lse = ref_lse + add, same_lse + add.to(same_lse.dtype)
    check_tolerance("flash_attn_func lse", lse, ref_lse, same_lse)


def test_flash_attn_func_wide_left_window_is_causal_for_lse():
    """FlashAttention-2 resets a left window >= seqlen_k to -1: (9, 0) on 9 keys is its causal kernel, whose lse
    carries slope * (i + Skv - Sq)."""
    g = torch.Generator().manual_seed(9)
    q, k, v = torch.randn(1, 6, 2, 8, generator=g), torch.randn(1, 9, 2, 8, generator=g), torch.randn(1, 9, 2, 8,
                                                                                                        generator=g)
    slopes = torch.tensor([0.3, 0.6])
    _, lse_c, _ = tot.flash_attn_func(q, k, v, causal=True, alibi_slopes=slopes, return_attn_probs=True)
    _, lse_w, _ = tot.flash_attn_func(q, k, v, window_size=(9, 0), alibi_slopes=slopes, return_attn_probs=True)
    torch.testing.assert_close(lse_w, lse_c)


def test_flash_attn_func_gradients_softcap_alibi():
    g = torch.Generator().manual_seed(6)
    q = torch.randn(1, 5, 2, 8, generator=g, dtype=torch.float64).requires_grad_()
    k = torch.randn(1, 7, 1, 8, generator=g, dtype=torch.float64).requires_grad_()
    v = torch.randn(1, 7, 1, 8, generator=g, dtype=torch.float64).requires_grad_()
    slopes = torch.tensor([0.5, 0.25])

    def fn(q, k, v):
        return tot.flash_attn_func(q.float(), k.float(), v.float(), causal=True, softcap=1.5,
                                   alibi_slopes=slopes, softmax_scale=1.0).double()

    assert torch.autograd.gradcheck(fn, (q, k, v), **GRADCHECK)


def test_flash_attn_varlen_func_alibi_per_sequence():
    """Bottom-right alignment per sequence (Skv_b - Sq_b differs), slopes [batch, N1], softcap; lse layout [N1, T]."""
    g = torch.Generator().manual_seed(7)
    ql, kl = [3, 1, 4], [5, 6, 4]
    cu_q = torch.tensor([0] + list(itertools.accumulate(ql)), dtype=torch.int32)
    cu_k = torch.tensor([0] + list(itertools.accumulate(kl)), dtype=torch.int32)
    q = torch.randn(sum(ql), 2, 8, generator=g)
    k, v = torch.randn(sum(kl), 1, 8, generator=g), torch.randn(sum(kl), 1, 8, generator=g)
    slopes = torch.rand(3, 2, generator=g)
    for causal in (False, True):
        out, lse, _ = tot.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 4, 6, causal=causal, softcap=3.0,
                                                 alibi_slopes=slopes, return_attn_probs=True)
        for b in range(3):
            qs, ks = slice(cu_q[b], cu_q[b + 1]), slice(cu_k[b], cu_k[b + 1])
            ref, ref_lse = _fa2_reference(q[qs][None], k[ks][None], v[ks][None], causal, (-1, -1), 3.0,
                                          slopes[b:b + 1], 8 ** -0.5, torch.float64)
            same, same_lse = _fa2_reference(q[qs][None], k[ks][None], v[ks][None], causal, (-1, -1), 3.0,
                                            slopes[b:b + 1], 8 ** -0.5, None)
            if causal:
                add = slopes[b].double().unsqueeze(-1) * (torch.arange(ql[b], dtype=torch.float64) + kl[b] - ql[b])
                ref_lse, same_lse = ref_lse + add, same_lse + add.float()
            check_tolerance(f"varlen out seq {b}", out[qs], ref[0], same[0])
            check_tolerance(f"varlen lse seq {b}", lse[:, qs], ref_lse[0], same_lse[0])


def test_empty_rows_give_plus_inf_lse():
    """FlashAttention-2 returns lse = +inf for a row that sees no key (here: Sq > Skv with causal)."""
    q, k, v = torch.randn(1, 5, 2, 8), torch.randn(1, 2, 2, 8), torch.randn(1, 2, 2, 8)
    out, lse, _ = tot.flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
    assert torch.isinf(lse[:, :, :3]).all() and (lse[:, :, :3] > 0).all() and torch.isfinite(lse[:, :, 3:]).all()
    assert not out[:, :3].any()
    cu = torch.tensor([0, 5], dtype=torch.int32)
    cu_k = torch.tensor([0, 2], dtype=torch.int32)
    out, lse, _ = tot.flash_attn_varlen_func(q[0], k[0], v[0], cu, cu_k, 5, 2, causal=True, return_attn_probs=True)
    assert torch.isinf(lse[:, :3]).all() and (lse[:, :3] > 0).all() and torch.isfinite(lse[:, 3:]).all()


def test_compile_fullgraph_softcap_alibi():
    torch._dynamo.reset()
    g = torch.Generator().manual_seed(8)
    q, k, v = torch.randn(2, 5, 4, 8, generator=g), torch.randn(2, 7, 2, 8, generator=g), torch.randn(2, 7, 2, 8,
                                                                                                        generator=g)
    slopes = torch.rand(4, generator=g)

    def fn(q, k, v, slopes):
        return tot.flash_attn_func(q, k, v, causal=True, softcap=5.0, alibi_slopes=slopes)

    eager = fn(q, k, v, slopes)
    compiled = torch.compile(fn, fullgraph=True, backend="aot_eager")(q, k, v, slopes)
    torch.testing.assert_close(compiled, eager, rtol=0, atol=0)


# ---- argument checks ----

def _base_args(**kw):
    args = make_inputs(Case(batch=1, q_heads=2, kv_heads=1, q_len=3, kv_len=4, head_dim=8))
    args.update(kw)
    return args


@pytest.mark.parametrize("bad", [-1.0, float("nan"), float("inf")])
def test_bad_softcap(bad):
    with pytest.raises(ValueError, match="argument 'softcap' must be a finite value >= 0"):
        OPS.flash_attention_score(**_base_args(softcap=bad))
    q, k, v = torch.randn(1, 3, 2, 8), torch.randn(1, 4, 1, 8), torch.randn(1, 4, 1, 8)
    with pytest.raises(ValueError, match="flash_attn_func: argument 'softcap'"):
        tot.flash_attn_func(q, k, v, softcap=bad)


def test_bad_pse_type():
    with pytest.raises(ValueError, match="argument 'pse_type' must be 0 .* or 3"):
        OPS.flash_attention_score(**_base_args(pse_type=4))


@pytest.mark.parametrize("slopes,match", [
    (torch.rand(3), r"argument 'pse' holds the ALiBi slopes with pse_type 2 and must have shape \[N\] or \[B, N\]"),
    (torch.rand(2, 2), r"must have shape \[N\] or \[B, N\] = \[1, 2\]"),
    (torch.rand(1, 2, 4, 1), r"must have shape \[N\] or \[B, N\]"),
])
def test_bad_slopes_shape(slopes, match):
    with pytest.raises(ValueError, match=match):
        OPS.flash_attention_score(**_base_args(pse=slopes, pse_type=2))


def test_bad_slopes_dtype():
    with pytest.raises(TypeError, match="argument 'pse' holds the ALiBi slopes with pse_type 3 and must be float32"):
        OPS.flash_attention_score(**_base_args(pse=torch.rand(2, dtype=torch.float16), pse_type=3))


@pytest.mark.parametrize("name", ["q_start_idx", "kv_start_idx"])
def test_bad_start_idx(name):
    with pytest.raises(ValueError, match=f"argument '{name}' must hold one start index, or one per sequence"):
        OPS.flash_attention_score(**_base_args(pse=torch.rand(2), pse_type=2, **{name: [0, 1, 2]}))


def test_fa2_bad_alibi_slopes():
    q, k, v = torch.randn(2, 3, 4, 8), torch.randn(2, 4, 2, 8), torch.randn(2, 4, 2, 8)
    with pytest.raises(TypeError, match="flash_attn_func: argument 'alibi_slopes' must be float32"):
        tot.flash_attn_func(q, k, v, alibi_slopes=torch.rand(4, dtype=torch.float64))
    with pytest.raises(ValueError, match=r"argument 'alibi_slopes' must have shape \[nheads\] = \[4\]"):
        tot.flash_attn_func(q, k, v, alibi_slopes=torch.rand(3))
    cu = torch.tensor([0, 3, 6], dtype=torch.int32)
    with pytest.raises(ValueError, match=r"flash_attn_varlen_func: argument 'alibi_slopes' .*\[batch, nheads\] = "
                                         r"\[2, 4\]"):
        tot.flash_attn_varlen_func(q.view(6, 4, 8), k[:, :3].reshape(6, 2, 8), v[:, :3].reshape(6, 2, 8), cu, cu, 3,
                                   3, alibi_slopes=torch.rand(3, 4))


def test_fa2_argument_order():
    import inspect
    names = list(inspect.signature(tot.flash_attn_func).parameters)
    assert names == ["q", "k", "v", "dropout_p", "softmax_scale", "causal", "window_size", "softcap", "alibi_slopes",
                     "deterministic", "return_attn_probs"]
    names = list(inspect.signature(tot.flash_attn_varlen_func).parameters)
    assert names[7:] == ["dropout_p", "softmax_scale", "causal", "window_size", "softcap", "alibi_slopes",
                         "deterministic", "return_attn_probs", "block_table"]
    assert math.isclose(inspect.signature(tot.flash_attn_func).parameters["softcap"].default, 0.0)
