"""The Python API: torch_npu-compatible npu_fusion_attention(_grad), FlashAttention-2's flash_attn_func /
flash_attn_varlen_func, and the FlashAttention module."""
import math

import pytest
import torch

from torch_ops_transformer._internal.args import ArgumentError
from test.attention.attention_cases import OPS
from test.common.reference import attention_reference, check_tolerance
from torch_ops_transformer import (FlashAttention, flash_attn_func, flash_attn_varlen_func, npu_fusion_attention,
                                   npu_fusion_attention_grad)


def _randn(*shape, dtype=torch.float32, seed=0):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64).to(dtype)


def _qkv(b=2, sq=9, skv=14, n1=4, n2=2, d=16, dtype=torch.float32, seed=0):
    return (_randn(b, sq, n1, d, dtype=dtype, seed=seed), _randn(b, skv, n2, d, dtype=dtype, seed=seed + 1),
            _randn(b, skv, n2, d, dtype=dtype, seed=seed + 2))


def _check_against_reference(out, q, k, v, layout="BSND", head_num=4, **ref_kw):
    """Tolerance rule for a wrapper's output (no gradients)."""
    ref, _ = attention_reference(q, k, v, head_num, layout, **ref_kw)
    same, _ = attention_reference(q, k, v, head_num, layout, compute_dtype=None, **ref_kw)
    check_tolerance("wrapper output", out, ref, same)


# ---------------------------------------------------------------- npu_fusion_attention(_grad)
def test_npu_fusion_attention_returns_torch_npu_tuple():
    q, k, v = _qkv()
    res = npu_fusion_attention(q, k, v, 4, "BSND", scale=0.25)
    assert len(res) == 7
    out, smax, ssum, sout, seed, offset, numels = res
    assert out.shape == q.shape and smax.shape == ssum.shape == (2, 4, 9, 8) and sout.numel() == 0
    # numels: the dropout mask's element count, computed by torch_npu whether or not dropout is on
    assert all(type(x) is int for x in (seed, offset, numels)) and numels == 2 * 4 * 9 * 14
    _check_against_reference(out, q, k, v, scale=0.25)
    *_, numels = npu_fusion_attention(q, k, v, 4, "BSND", keep_prob=0.9)
    assert numels == 2 * 4 * 9 * 14
    *_, numels = npu_fusion_attention(q[0], k[0], v[0], 4, "TND", actual_seq_qlen=[4, 9], actual_seq_kvlen=[5, 14])
    assert numels == 4 * (4 * 5 + 5 * 9)


@pytest.mark.asan
def test_npu_fusion_attention_accepts_sequence_lengths_as_lists():
    q, k, v = _randn(12, 4, 8), _randn(10, 2, 8, seed=1), _randn(10, 2, 8, seed=2)
    as_list = npu_fusion_attention(q, k, v, 4, "TND", scale=0.3, actual_seq_qlen=[5, 12], actual_seq_kvlen=[3, 10],
                                   sparse_mode=3)[0]
    as_tensor = npu_fusion_attention(q, k, v, 4, "TND", scale=0.3, actual_seq_qlen=torch.tensor([5, 12]),
                                     actual_seq_kvlen=torch.tensor([3, 10]), sparse_mode=3)[0]
    assert torch.equal(as_list, as_tensor)
    _check_against_reference(as_list, q, k, v, "TND", scale=0.3, actual_seq_qlen=[5, 12], actual_seq_kvlen=[3, 10],
                             sparse_mode=3)
    with pytest.raises(TypeError, match="actual_seq_qlen"):
        npu_fusion_attention(q, k, v, 4, "TND", actual_seq_qlen=[5.0, 12.0], actual_seq_kvlen=[3, 10])


@pytest.mark.parametrize("keep_prob", [1.0, 0.8])
def test_npu_fusion_attention_grad_matches_autograd(keep_prob):
    q, k, v = (t.requires_grad_() for t in _qkv())
    pse = _randn(2, 4, 9, 14, seed=5).requires_grad_()
    mask = _randn(9, 14, seed=6) > 1.0
    kw = dict(pse=pse, atten_mask=mask, scale=0.25, keep_prob=keep_prob, pre_tockens=5, next_tockens=2)
    out, smax, ssum, _, seed, offset, numels = npu_fusion_attention(q, k, v, 4, "BSND", **kw)
    dy = _randn(*out.shape, seed=7)
    want = torch.autograd.grad(out, (q, k, v, pse), dy)
    got = npu_fusion_attention_grad(q.detach(), k.detach(), v.detach(), dy, 4, "BSND", pse=pse.detach(),
                                    atten_mask=mask, softmax_max=smax, softmax_sum=ssum, attention_in=out.detach(),
                                    scale_value=0.25, keep_prob=keep_prob, pre_tockens=5, next_tockens=2, seed=seed,
                                    offset=offset, numels=numels)
    for name, g, w in zip(("dq", "dk", "dv", "dpse"), got, want):
        torch.testing.assert_close(g, w, rtol=0, atol=0, msg=lambda m: f"{name}: {m}")


def test_npu_fusion_attention_grad_requires_forward_outputs():
    q, k, v = _qkv()
    with pytest.raises(ValueError, match="softmax_max"):
        npu_fusion_attention_grad(q, k, v, torch.zeros_like(q), 4, "BSND")


@pytest.mark.parametrize("layout, mode, exc", [
    ("BSND", 7, ValueError), ("BSND", -1, ValueError), ("TND", 5, ValueError), ("TND", 9, ValueError),
    ("BSND", 5, ValueError), ("BSND", 6, ValueError), ("TND", 6, NotImplementedError),
    ("TND", 8, NotImplementedError),
])
def test_npu_fusion_attention_sparse_mode_ranges_as_torch_npu(layout, mode, exc):
    """torch_npu's ranges ([0, 6], TND [0, 5) or (5, 8]): outside them a ValueError (torch_npu raises too); inside
    them the prefix modes 5/6 need 'prefix' (dense layouts), TND prefix and modes 7-8 are not implemented here; the
    messages name the argument."""
    q, k, v = _qkv()
    kw = {} if layout == "BSND" else dict(actual_seq_qlen=[9], actual_seq_kvlen=[14])
    args = (q, k, v) if layout == "BSND" else (q[0], k[0], v[0])
    for fn in (lambda: npu_fusion_attention(*args, 4, layout, sparse_mode=mode, **kw),
               lambda: npu_fusion_attention_grad(*args, args[0], 4, layout, softmax_max=q, softmax_sum=q,
                                                 attention_in=q, sparse_mode=mode, **kw)):
        with pytest.raises(exc, match="'sparse_mode'|'prefix'"):
            fn()


def test_npu_fusion_attention_layout_is_case_insensitive_and_pse_dtype_must_match():
    q, k, v = _qkv()
    assert torch.equal(npu_fusion_attention(q, k, v, 4, "bsnd", scale=0.25)[0],
                       npu_fusion_attention(q, k, v, 4, "BSND", scale=0.25)[0])
    with pytest.raises(TypeError, match="'pse'"):
        npu_fusion_attention(q, k, v, 4, "BSND", pse=torch.zeros(2, 4, 9, 14, dtype=torch.float64))


# ---------------------------------------------------------------- flash_attn_func
@pytest.mark.parametrize("sq,skv", [(9, 14), (14, 9)])
@pytest.mark.parametrize("causal,window,mode,pre,nxt", [
    (False, (-1, -1), 0, None, None),
    (True, (-1, -1), 3, None, None),
    (False, (3, 2), 4, 3, 2),
    (False, (-1, 0), 3, None, None),
    (False, (4, -1), 4, 4, None),
    (True, (2, 5), 4, 2, 0),  # causal overrides the right window
], ids=["full", "causal", "window_3_2", "window_inf_0", "window_4_inf", "causal_window_2"])
def test_flash_attn_func_causal_and_window_are_bottom_right(sq, skv, causal, window, mode, pre, nxt):
    q, k, v = _qkv(sq=sq, skv=skv)
    out = flash_attn_func(q, k, v, causal=causal, window_size=window)
    ref_kw = dict(scale=1 / math.sqrt(16), sparse_mode=mode)
    if pre is not None:
        ref_kw["pre_tokens"] = pre
    if nxt is not None:
        ref_kw["next_tokens"] = nxt
    _check_against_reference(out, q, k, v, **ref_kw)
    if causal and window == (-1, -1):  # the same as an explicit bottom-right tril mask in mode 1
        explicit = ~torch.ones(sq, skv, dtype=torch.bool).tril(skv - sq)
        _check_against_reference(out, q, k, v, scale=0.25, sparse_mode=1, atten_mask=explicit)


def test_flash_attn_func_return_attn_probs_gives_lse():
    q, k, v = _qkv(n2=1)
    out, lse, probs = flash_attn_func(q, k, v, softmax_scale=0.3, causal=True, return_attn_probs=True)
    assert probs is None and lse.shape == (2, 4, 9) and lse.dtype == torch.float32
    ref_out, ref_lse = attention_reference(q, k, v, 4, "BSND", scale=0.3, sparse_mode=3)
    same_out, same_lse = attention_reference(q, k, v, 4, "BSND", scale=0.3, sparse_mode=3, compute_dtype=None)
    check_tolerance("out", out, ref_out, same_out)
    check_tolerance("lse", lse, ref_lse, same_lse)


def test_flash_attn_func_rejects_bad_arguments():
    q, k, v = _qkv()
    with pytest.raises(ValueError, match="dropout_p"):
        flash_attn_func(q, k, v, dropout_p=1.0)
    with pytest.raises(ValueError, match="window_size"):
        flash_attn_func(q, k, v, window_size=(-2, 0))
    with pytest.raises(TypeError, match="alibi_slopes"):  # FlashAttention-2 takes float32 slopes only
        flash_attn_func(q, k, v, alibi_slopes=torch.ones(4, dtype=torch.float64))


# ---------------------------------------------------------------- flash_attn_varlen_func
@pytest.mark.asan
@pytest.mark.parametrize("causal", [False, True])
def test_flash_attn_varlen_equals_per_sequence_flash_attn_func(causal):
    qlens, kvlens = [5, 1, 0, 67], [3, 4, 2, 70]
    cu_q = torch.tensor([0] + qlens, dtype=torch.int32).cumsum(0, dtype=torch.int32)
    cu_k = torch.tensor([0] + kvlens, dtype=torch.int32).cumsum(0, dtype=torch.int32)
    q, k, v = _randn(sum(qlens), 4, 16), _randn(sum(kvlens), 2, 16, seed=1), _randn(sum(kvlens), 2, 16, seed=2)
    out, lse, _ = flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(qlens), max(kvlens), causal=causal,
                                         return_attn_probs=True)
    assert out.shape == q.shape and lse.shape == (4, sum(qlens))
    for b in range(len(qlens)):
        qs, ks = slice(int(cu_q[b]), int(cu_q[b + 1])), slice(int(cu_k[b]), int(cu_k[b + 1]))
        if qlens[b] == 0:
            continue
        want, want_lse, _ = flash_attn_func(q[qs][None], k[ks][None], v[ks][None], causal=causal,
                                            return_attn_probs=True)
        torch.testing.assert_close(out[qs], want[0], msg=lambda m: f"sequence {b}: {m}")
        finite = torch.isfinite(want_lse[0])
        torch.testing.assert_close(lse[:, qs][finite], want_lse[0][finite])


@pytest.mark.asan
def test_flash_attn_varlen_requires_leading_zero():
    q, k, v = _randn(6, 2, 8), _randn(6, 2, 8), _randn(6, 2, 8)
    cu = torch.tensor([0, 2, 6])
    with pytest.raises(ValueError, match="cu_seqlens_q"):
        flash_attn_varlen_func(q, k, v, cu[1:], cu, 4, 4)


# ---------------------------------------------------------------- FlashAttention module
@pytest.mark.parametrize("layout", ["BSND", "BSH"])
@pytest.mark.parametrize("causal", [False, True])
def test_module_matches_reference(layout, causal):
    q, k, v = _qkv(sq=11, skv=8)
    module = FlashAttention(head_dim=16, num_heads=4, causal=causal)
    if layout == "BSH":
        q, k, v = (t.flatten(2) for t in (q, k, v))
    out = module(q, k, v)
    assert out.shape == q.shape
    _check_against_reference(out, q, k, v, layout, scale=0.25, sparse_mode=3 if causal else 0)


def test_module_with_mask():
    q, k, v = _qkv(n2=4)
    mask = _randn(2, 1, 9, 14, seed=3) > 0.5
    out = FlashAttention(16, 4)(q, k, v, atten_mask=mask)
    _check_against_reference(out, q, k, v, scale=0.25, atten_mask=mask)
    with pytest.raises(ValueError, match="causal"):
        FlashAttention(16, 4, causal=True)(q, k, v, atten_mask=mask)


def test_module_dropout_only_in_training():
    q, k, v = _qkv()
    module = FlashAttention(16, 4, dropout=0.5)
    no_dropout = FlashAttention(16, 4)(q, k, v)
    module.eval()
    assert torch.equal(module(q, k, v), no_dropout)
    module.train()
    torch.manual_seed(1)
    a = module(q, k, v)
    torch.manual_seed(1)
    b = module(q, k, v)
    assert torch.equal(a, b) and not torch.allclose(a, no_dropout)


def test_module_backward():
    q, k, v = (t.requires_grad_() for t in _qkv())
    out = FlashAttention(16, 4, causal=True)(q, k, v)
    out.sum().backward()
    assert all(t.grad is not None and torch.isfinite(t.grad).all() for t in (q, k, v))
    assert repr(FlashAttention(16, 4, causal=True)).startswith("FlashAttention(head_dim=16, num_heads=4")


def test_attention_tiles_roundtrip():
    from torch_ops_transformer import attention_tiles, attention_tiles_override
    before = attention_tiles()
    with attention_tiles_override(8, 24) as now:
        assert now == (8, 24) == attention_tiles()
    assert attention_tiles() == before
    assert attention_tiles(-1, -1) == (0, 0)  # -1 restores the automatic choice, reported as 0
    with pytest.raises(ValueError, match="block_q"):
        OPS.attention_tile_config(-2, 0)
    with pytest.raises(ValueError, match="block_kv"):
        OPS.attention_tile_config(0, 9000)


# ---------------------------------------------------------------- one exception policy (torch_ops_transformer._internal.args)
def _policy_cases():
    import torch_ops_transformer as tot

    q, k, v = _qkv()
    one = torch.ones(1)
    x, w = torch.randn(6, 8), torch.randn(2, 8, 4)
    # (exception, words in the message, call): NotImplementedError = an upstream feature not implemented here,
    # ValueError = a bad value (a reserved argument given), TypeError = a wrong type; the same for every family.
    return [
        (NotImplementedError, ("npu_fusion_attention", "'sparse_mode'", "TND"),
         lambda: tot.npu_fusion_attention(q[0], k[0], v[0], 4, "TND", sparse_mode=6, prefix=[1],
                                          actual_seq_qlen=[q.shape[1]], actual_seq_kvlen=[k.shape[1]])),
        # quantised formats not implemented: an fp8 attention_out, a reinterpreted (low-precision) key dtype
        (NotImplementedError, ("npu_fused_infer_attention_score_v2", "'out_dtype'"),
         lambda: tot.npu_fused_infer_attention_score_v2(q, k, v, out_dtype=torch.float8_e5m2, num_query_heads=4,
                                                        input_layout="BSND")),
        (NotImplementedError, ("npu_fused_infer_attention_score_v2", "'key_dtype'"),
         lambda: tot.npu_fused_infer_attention_score_v2(q, k, v, key_dtype=291, num_query_heads=4,
                                                        input_layout="BSND")),
        # the full-quantisation factors next to a float query are a bad argument (they need an int8 query)
        (ValueError, ("npu_prompt_flash_attention", "'deq_scale1'", "int8 query"),
         lambda: tot.npu_prompt_flash_attention(q, k, v, deq_scale1=one, num_heads=4, input_layout="BSND")),
        (NotImplementedError, ("npu_fused_infer_attention_score", "'query_padding_size'"),
         lambda: tot.npu_fused_infer_attention_score(q, k, v, query_padding_size=one, num_heads=4,
                                                     input_layout="BSND")),
        (NotImplementedError, ("npu_fused_infer_attention_score", "'key'", "2 tensors"),
         lambda: tot.npu_fused_infer_attention_score(q, [k, k], v, num_heads=4, input_layout="BSND")),
        # KV antiquant dequantises an int8 cache: factors next to a floating-point cache are a bad argument
        (ValueError, ("incre_flash_attention", "antiquant", "not int8"),
         lambda: tot.npu_incre_flash_attention(q[:, :1], k, v, antiquant_scale=one, num_heads=4,
                                               num_key_value_heads=2, input_layout="BSND")),
        # quantisation arguments next to floating-point x / weight are a wrong type (W8A8 needs int8 ones)
        (TypeError, ("npu_grouped_matmul", "'scale'", "int8"),
         lambda: tot.npu_grouped_matmul([x], [w], scale=[one], group_list=[3, 6])),
        (NotImplementedError, ("npu_grouped_matmul", "'output_dtype'"),
         lambda: tot.npu_grouped_matmul([x], [w], group_list=[3, 6], output_dtype=torch.int8)),
        (ValueError, ("npu_mm_all_reduce_base", "'dequant_scale'"),
         lambda: tot.npu_mm_all_reduce_base(x, w[0], "group", dequant_scale=one)),
        (ValueError, ("npu_fusion_attention", "'padding_mask'", "reserved"),
         lambda: tot.npu_fusion_attention(q, k, v, 4, "BSND", padding_mask=one)),
        (ValueError, ("npu_prompt_flash_attention", "'padding_mask'", "reserved"),
         lambda: tot.npu_prompt_flash_attention(q, k, v, padding_mask=one, num_heads=4, input_layout="BSND")),
        (ValueError, ("npu_incre_flash_attention", "'padding_mask'", "reserved"),
         lambda: tot.npu_incre_flash_attention(q[:, :1], k, v, padding_mask=one, num_heads=4, num_key_value_heads=2,
                                               input_layout="BSND")),
        (ValueError, ("flash_attn_func", "'window_size'", "pair"), lambda: tot.flash_attn_func(q, k, v, window_size=(1,))),
        (TypeError, ("npu_prompt_flash_attention", "'actual_seq_lengths'"),
         lambda: tot.npu_prompt_flash_attention(q, k, v, actual_seq_lengths=[9.0, 9.0], num_heads=4,
                                                input_layout="BSND")),
        (TypeError, ("npu_incre_flash_attention", "'actual_seq_lengths'"),
         lambda: tot.npu_incre_flash_attention(q[:, :1], k, v, actual_seq_lengths=["14"], num_heads=4,
                                               num_key_value_heads=2, input_layout="BSND")),
        (TypeError, ("grouped_matmul", "'group_list'"), lambda: tot.grouped_matmul(x, w, [3.0, 6.0])),
        # Python ints beyond int64 (torch.tensor's own overflow error would not name the argument)
        (ValueError, ("npu_fusion_attention", "'actual_seq_qlen'", "int64"),
         lambda: tot.npu_fusion_attention(q[0], k[0], v[0], 4, "TND", actual_seq_qlen=[2**64],
                                          actual_seq_kvlen=[14])),
        (ValueError, ("grouped_matmul", "'group_list'", "int64"), lambda: tot.grouped_matmul(x, w, [2**63, 6])),
        (ValueError, ("npu_incre_flash_attention", "'kv_padding_size'", "int64"),
         lambda: tot.npu_incre_flash_attention(q[:, :1], k, v, kv_padding_size=2**63, num_heads=4,
                                               num_key_value_heads=2, input_layout="BSND")),
        (TypeError, ("npu_incre_flash_attention", "'kv_padding_size'"),
         lambda: tot.npu_incre_flash_attention(q[:, :1], k, v, kv_padding_size=True, num_heads=4,
                                               num_key_value_heads=2, input_layout="BSND")),
        # cu_seqlens: a float tensor used to be truncated to ints silently; bad ends are reported under the
        # wrapper's argument names
        (TypeError, ("flash_attn_varlen_func", "'cu_seqlens_q'", "int32 or int64"),
         lambda: tot.flash_attn_varlen_func(q[0], k[0], v[0], torch.tensor([0.0, 4.5, 9.0]), torch.tensor([0, 14]),
                                            9, 14)),
        (ValueError, ("flash_attn_varlen_func", "'cu_seqlens_k'", "non-decreasing"),
         lambda: tot.flash_attn_varlen_func(q[0], k[0], v[0], torch.tensor([0, 4, 9]), torch.tensor([0, 15, 14]), 9,
                                            14)),
        (ValueError, ("flash_attn_varlen_func", "'cu_seqlens_q'", "9 tokens"),
         lambda: tot.flash_attn_varlen_func(q[0], k[0], v[0], torch.tensor([0, 4, 8]), torch.tensor([0, 7, 14]), 9,
                                            14)),
        (ValueError, ("flash_attn_varlen_func", "'cu_seqlens_q'", "'cu_seqlens_k'", "same batch"),
         lambda: tot.flash_attn_varlen_func(q[0], k[0], v[0], torch.tensor([0, 9]), torch.tensor([0, 7, 14]), 9, 14)),
    ]


@pytest.mark.parametrize("case", range(len(_policy_cases())))
def test_one_exception_policy_for_unsupported_and_bad_arguments(case):
    exc, words, call = _policy_cases()[case]
    with pytest.raises(exc) as info:
        call()
    # torch_npu-compatible wrappers raise ArgumentError: a ValueError that is also torch_npu's RuntimeError
    assert type(info.value) is exc or (exc is ValueError and type(info.value) is ArgumentError), type(info.value)
    assert all(w in str(info.value) for w in words), (words, str(info.value))


def test_sequence_lengths_accept_lists_ints_and_tensors_alike():
    import torch_ops_transformer as tot

    q, k, v = _qkv(b=1)
    kw = dict(num_heads=4, num_key_value_heads=2, input_layout="BSND", scale_value=0.25)
    step = q[:, :1]
    as_int = tot.npu_incre_flash_attention(step, k, v, actual_seq_lengths=11, **kw)
    as_list = tot.npu_incre_flash_attention(step, k, v, actual_seq_lengths=[11], **kw)
    as_tensor = tot.npu_incre_flash_attention(step, k, v, actual_seq_lengths=torch.tensor([11]), **kw)
    assert torch.equal(as_int, as_list) and torch.equal(as_list, as_tensor)
    x, w = torch.randn(6, 8), torch.randn(2, 8, 4)
    assert torch.equal(tot.grouped_matmul(x, w, [2, 6]), tot.grouped_matmul(x, w, torch.tensor([2, 6])))
