"""npu_fusion_attention's prefix modes: sparse_mode 5 (a full [B, N|1, Sq, Skv] mask plus `prefix`) and 6 (the
compressed 3072 x 2048 prefix mask plus `prefix`). Key j is visible to query row i of batch b when
j <= i + Skv - Sq (bottom-right causal) or j < prefix[b]; mode 5 also applies the caller's mask. Forward and
gradients against a float64 reference of that pattern (plain PyTorch), under the tolerance rule; bad inputs raise
errors naming the argument.
"""
import pytest
import torch

import torch_ops_transformer as tot
from test.common.reference import attention_reference, check_tolerance


def prefix_pattern(B, Sq, Skv, prefix):
    """[B, 1, Sq, Skv] bool, True = masked out: the documented prefix pattern, element by element."""
    m = torch.ones(B, 1, Sq, Skv, dtype=torch.bool)
    for b in range(B):
        for i in range(Sq):
            for j in range(Skv):
                if j <= i + Skv - Sq or j < prefix[b]:
                    m[b, 0, i, j] = False
    return m


def compressed_prefix_mask():
    m = torch.zeros(3072, 2048, dtype=torch.bool)
    m[:2048] = torch.ones(2048, 2048, dtype=torch.bool).triu(1)
    m[2048:, 1024:] = True
    return m


def _inputs(dtype, B=2, N=4, Sq=24, Skv=40, D=32, seed=0):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, N, s, D, generator=g).to(dtype).requires_grad_() for s in (Sq, Skv, Skv))
    return q, k, v


@pytest.mark.parametrize("mode", [5, 6])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_prefix_modes_forward_and_backward(mode, dtype):
    B, N, Sq, Skv, D = 2, 4, 24, 40, 32
    prefix = [5, 31]
    q, k, v = _inputs(dtype, B, N, Sq, Skv, D)
    user = torch.zeros(B, 1, Sq, Skv, dtype=torch.bool)
    user[1, 0, :, 3] = True  # mode 5 applies the caller's mask on top of the pattern
    mask = user if mode == 5 else compressed_prefix_mask()
    out = tot.npu_fusion_attention(q, k, v, N, "BNSD", atten_mask=mask, scale=D ** -0.5, sparse_mode=mode,
                                   prefix=prefix, pre_tockens=3, next_tockens=0)[0]  # pre/next ignored
    want_mask = prefix_pattern(B, Sq, Skv, prefix) | (user if mode == 5 else False)
    dy = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), dy)
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    ref, _ = attention_reference(q64, k64, v64, N, "BNSD", atten_mask=want_mask, scale=D ** -0.5, sparse_mode=1)
    ref_grads = torch.autograd.grad(ref, (q64, k64, v64), dy.double())
    qs, ks, vs = (t.detach().requires_grad_() for t in (q, k, v))
    same, _ = attention_reference(qs, ks, vs, N, "BNSD", atten_mask=want_mask, scale=D ** -0.5, sparse_mode=1,
                                  compute_dtype=None)
    same_grads = torch.autograd.grad(same, (qs, ks, vs), dy)
    check_tolerance(f"mode {mode} out", out.detach(), ref.detach(), same.detach())
    for name, a, r, s in zip("qkv", grads, ref_grads, same_grads):
        check_tolerance(f"mode {mode} d{name}", a, r, s)


def test_prefix_without_a_mask_is_the_pattern():
    q, k, v = (t.detach() for t in _inputs(torch.float32))
    prefix = [7, 2]
    pattern = prefix_pattern(2, 24, 40, prefix)
    want = tot.npu_fusion_attention(q, k, v, 4, "BNSD", atten_mask=pattern, sparse_mode=1)[0]
    for mode in (5, 6):
        got = tot.npu_fusion_attention(q, k, v, 4, "BNSD", sparse_mode=mode, prefix=prefix)[0]
        assert torch.equal(got, want), mode


def test_prefix_mode_equals_mode_1_with_the_pattern():
    q, k, v = (t.detach() for t in _inputs(torch.float32))
    prefix = [0, 40]  # no prefix (plain bottom-right causal) / every key visible
    pattern = prefix_pattern(2, 24, 40, prefix)
    a = tot.npu_fusion_attention(q, k, v, 4, "BNSD", atten_mask=torch.zeros_like(pattern), sparse_mode=5,
                                 prefix=prefix)[0]
    b = tot.npu_fusion_attention(q, k, v, 4, "BNSD", atten_mask=pattern, sparse_mode=1)[0]
    assert torch.equal(a, b)


def _call(**kw):
    q, k, v = (t.detach() for t in _inputs(torch.float32))
    args = dict(atten_mask=torch.zeros(2, 1, 24, 40, dtype=torch.bool), sparse_mode=5, prefix=[1, 2])
    args.update(kw)
    return tot.npu_fusion_attention(q, k, v, 4, "BNSD", **args)


def test_prefix_required():
    with pytest.raises(ValueError, match=r"sparse_mode 5 needs argument 'prefix', a list of B=2 ints"):
        _call(prefix=None)
    with pytest.raises(ValueError, match=r"sparse_mode 5 needs argument 'prefix', a list of B=2 ints"):
        _call(prefix=[1])


def test_prefix_range():
    with pytest.raises(ValueError, match=r"argument 'prefix' entries must be in \[0, Skv=40\]; got \[1, 41\]"):
        _call(prefix=[1, 41])


def test_prefix_mode_5_mask_shape():
    with pytest.raises(ValueError, match=r"sparse_mode 5 needs 'atten_mask' of shape \[B=2, N=4 or 1, Sq=24, "
                                         r"Skv=40\]; got \[24, 40\]"):
        _call(atten_mask=torch.zeros(24, 40, dtype=torch.bool))


def test_prefix_mode_6_needs_the_compressed_mask():
    with pytest.raises(ValueError, match=r"sparse_mode 6 needs the compressed prefix mask \[3072, 2048\]"):
        _call(sparse_mode=6, atten_mask=torch.zeros(2, 1, 24, 40, dtype=torch.bool))
    bad = compressed_prefix_mask()
    bad[2500, 10] = True
    with pytest.raises(ValueError, match=r"sparse_mode 6 needs the compressed prefix mask"):
        _call(sparse_mode=6, atten_mask=bad)


def test_prefix_only_with_prefix_modes():
    with pytest.raises(ValueError, match=r"argument 'prefix' is only used by sparse_mode 5 and 6"):
        _call(sparse_mode=0, atten_mask=None)


def test_prefix_tnd_not_implemented():
    t = torch.randn(6, 2, 16)
    with pytest.raises(NotImplementedError, match=r"argument 'sparse_mode' = 6 \(prefix\) with input_layout TND"):
        tot.npu_fusion_attention(t, t, t, 2, "TND", atten_mask=compressed_prefix_mask(), sparse_mode=6,
                                 prefix=[1, 1], actual_seq_qlen=[3, 6], actual_seq_kvlen=[3, 6])
