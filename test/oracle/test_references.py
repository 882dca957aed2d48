"""The oracle's float64 chains (torch_ops_transformer/oracle/references.py) against the test suite's independent
float64 reference of flash_attention_score (test/common/reference.py), forward and gradients, over layouts, sparse
modes, masks, pse types, GQA, softcap and TND; and the forms the chains do not model are declined."""
import itertools

import pytest
import torch

from test.common.reference import reference_with_grads
from torch_ops_transformer.oracle import references as R

B, N1, N2, SQ, SKV, D, VD = 2, 4, 2, 5, 7, 8, 6


def _dense(layout, n, s, d, gen):
    shape = {"BNSD": (B, n, s, d), "BSND": (B, s, n, d), "BSH": (B, s, n * d), "SBH": (s, B, n * d)}[layout]
    return torch.randn(shape, generator=gen, dtype=torch.float64)


def _check(args):
    kw = {k: v for k, v in args.items() if k not in ("query", "key", "value", "pse", "head_num", "input_layout")}
    fwd = R.flash_attention_score(args)
    dy = torch.randn(fwd[0].shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    grads = R.flash_attention_score_grad(dict(args, dy=dy))
    inputs = {n: args.get(n) for n in ("query", "key", "value", "pse")}
    out, lse, ref_grads = reference_with_grads(inputs, dy, torch.float64, head_num=args["head_num"],
                                               input_layout=args["input_layout"], **kw)
    lse_chain = fwd[1][..., 0] + torch.log(fwd[2][..., 0])
    if args["input_layout"] == "TND":  # default statistics: NTD row order inside [T, N]
        lse_chain = lse_chain.reshape(lse_chain.shape[1], lse_chain.shape[0]).transpose(0, 1)
    torch.testing.assert_close(fwd[0], out, atol=1e-12, rtol=0)
    torch.testing.assert_close(lse_chain.nan_to_num(0, 0, 0), lse.nan_to_num(0, 0, 0), atol=1e-12, rtol=0)
    for i, name in enumerate(("query", "key", "value", "pse")):
        if inputs[name] is not None:
            torch.testing.assert_close(grads[i], ref_grads[name], atol=1e-11, rtol=0)


@pytest.mark.parametrize("layout,mode,pse_type,softcap,mask", list(itertools.product(
    ["BNSD", "BSND", "BSH", "SBH"], [0, 1, 2, 3, 4], [0, 1], [0.0, 5.0], ["4d", "2d"]))[::3])
def test_dense_chain_matches_the_test_reference(layout, mode, pse_type, softcap, mask):
    gen = torch.Generator().manual_seed(hash((layout, mode, pse_type, softcap, mask)) % 2**31)
    m = (torch.rand(B, 1, SQ, SKV, generator=gen) < 0.3) if mask == "4d" else (torch.rand(SQ, SKV, generator=gen) < 0.3)
    if mode in (2, 3):
        m = torch.ones(2048, 2048, dtype=torch.bool).triu(1)
    args = dict(query=_dense(layout, N1, SQ, D, gen), key=_dense(layout, N2, SKV, D, gen),
                value=_dense(layout, N2, SKV, VD, gen), head_num=N1, input_layout=layout,
                pse=torch.randn(B, N1, SQ, SKV, generator=gen, dtype=torch.float64), atten_mask=m, scale=0.3,
                sparse_mode=mode, pre_tokens=2, next_tokens=1, pse_type=pse_type, softcap=softcap)
    _check(args)


@pytest.mark.parametrize("mode", [0, 1, 2, 3, 4])
def test_tnd_chain_matches_the_test_reference(mode):
    gen = torch.Generator().manual_seed(mode)
    args = dict(query=torch.randn(9, 4, 8, generator=gen, dtype=torch.float64),
                key=torch.randn(11, 2, 8, generator=gen, dtype=torch.float64),
                value=torch.randn(11, 2, 8, generator=gen, dtype=torch.float64), head_num=4, input_layout="TND",
                actual_seq_qlen=[3, 3, 9], actual_seq_kvlen=[4, 6, 11], scale=0.3, sparse_mode=mode, pre_tokens=2,
                next_tokens=1, atten_mask=(torch.rand(16, 16, generator=gen) < 0.3) if mode < 2 else None)
    _check(args)


@pytest.mark.parametrize("extra", [dict(keep_prob=0.9), dict(sink=torch.zeros(4)), dict(sparse_mode=6),
                                   dict(pse_type=2), dict(softmax_layout="BSND")])
def test_forms_the_chain_does_not_model_are_declined(extra):
    q = torch.randn(1, 4, 3, 8)
    args = dict(query=q, key=q, value=q, head_num=4, input_layout="BNSD", dy=q, **extra)
    assert R.flash_attention_score(args) is None and R.flash_attention_score_grad(args) is None
