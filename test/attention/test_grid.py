"""flash_attention_score forward (output, softmax stats) and backward (dq, dk, dv, dpse) against the float64
reference, under the tolerance rule max|ours - ref64| <= 2*max|torch_same_dtype - ref64| + 1e-5.

The grid is a union of focused sub-grids rather than one full product (which would take hours):
layouts x sparse modes x dtypes, masks, pse, GQA/MQA, varlen TND, vD < D, and shapes that cross tiles."""
import pytest
import torch

from test.attention.attention_cases import Case, compare_with_reference, make_inputs, run_ours
from test.common.tiers import pairwise
from torch_ops_transformer import attention_tiles_override

LAYOUTS = ["BSH", "SBH", "BSND", "BNSD", "TND"]
DTYPES = ["fp32", "fp16", "bf16"]
# TND batch: lengths not multiples of 64, with an empty query, an empty key sequence and length-1 sequences.
VARLEN = ((5, 0, 1, 70, 9), (7, 3, 1, 65, 0))
VARLEN_EQUAL = ((1, 33, 0, 100), (1, 33, 0, 100))

MODES = {
    "mode0": dict(sparse_mode=0),
    "mode0_window": dict(sparse_mode=0, pre_tokens=3, next_tokens=2),
    "mode1_mask": dict(sparse_mode=1, mask="SS"),
    "mode2": dict(sparse_mode=2),
    "mode3": dict(sparse_mode=3),
    "mode4": dict(sparse_mode=4, pre_tokens=4, next_tokens=1),
}


def _case(layout: str, **kw) -> Case:
    if layout == "TND":
        kw.setdefault("seqlens", VARLEN)
    return Case(layout=layout, **kw)


@pytest.mark.parametrize("layout,mode,dtype", pairwise(layout=LAYOUTS, mode=list(MODES), dtype=DTYPES))
def test_layouts_by_sparse_modes(layout, mode, dtype):
    compare_with_reference(_case(layout, dtype=dtype, **MODES[mode]))


@pytest.mark.asan
@pytest.mark.parametrize("mask_dtype", ["bool", "uint8"])
@pytest.mark.parametrize("mode", ["mode0_window", "mode1_mask"])
@pytest.mark.parametrize("mask", ["BNSS", "B1SS", "11SS", "SS"])
@pytest.mark.parametrize("layout", ["BNSD", "SBH"])
def test_mask_shapes(layout, mask, mode, mask_dtype):
    kw = dict(MODES[mode], mask=mask, mask_dtype=mask_dtype)
    compare_with_reference(_case(layout, **kw))


@pytest.mark.asan
@pytest.mark.parametrize("mask_dtype", ["bool", "uint8"])
@pytest.mark.parametrize("mode", ["mode0", "mode0_window", "mode1_mask"])
def test_mask_tnd(mode, mask_dtype):
    kw = dict(MODES[mode], mask="SS", mask_dtype=mask_dtype)
    compare_with_reference(_case("TND", **kw))


@pytest.mark.asan
@pytest.mark.parametrize("mode", ["mode2", "mode3", "mode4"])
@pytest.mark.parametrize("layout", ["BSND", "TND"])
def test_compressed_mask_is_accepted(layout, mode):
    compare_with_reference(_case(layout, **MODES[mode], mask="compressed"))


@pytest.mark.asan
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("pse_type", [0, 1])
@pytest.mark.parametrize("pse", ["BNSS", "BN1S", "1NSS"])
@pytest.mark.parametrize("layout", ["BSH", "BNSD"])
def test_pse(layout, pse, pse_type, dtype):
    compare_with_reference(_case(layout, pse=pse, pse_type=pse_type, dtype=dtype))


@pytest.mark.parametrize("pse_type", [0, 1])
@pytest.mark.parametrize("mode", ["mode0_window", "mode3", "mode1_mask"])
def test_pse_with_masking(mode, pse_type):
    compare_with_reference(_case("BSND", pse="BNSS", pse_type=pse_type, **MODES[mode]))


@pytest.mark.asan
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("kv_heads", [4, 2, 1], ids=["MHA", "GQA", "MQA"])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_gqa_mqa(layout, kv_heads, dtype):
    compare_with_reference(_case(layout, q_heads=4, kv_heads=kv_heads, dtype=dtype, sparse_mode=3))


@pytest.mark.asan
@pytest.mark.parametrize("dtype", ["fp32", "fp16"])
@pytest.mark.parametrize("mode", ["mode0", "mode0_window", "mode1_mask", "mode2", "mode3", "mode4"])
@pytest.mark.parametrize("seqlens", [VARLEN, VARLEN_EQUAL], ids=["ragged", "equal"])
def test_varlen_tnd(seqlens, mode, dtype):
    compare_with_reference(_case("TND", seqlens=seqlens, dtype=dtype, **MODES[mode]))


@pytest.mark.asan
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_value_head_dim_smaller(layout, dtype):
    compare_with_reference(_case(layout, head_dim=24, v_head_dim=7, dtype=dtype, sparse_mode=0, pre_tokens=5,
                                 next_tokens=0))


SHAPES = {
    "q_longer_than_kv_causal": dict(q_len=19, kv_len=6, sparse_mode=3),  # leading rows fully masked -> zeros
    "q_longer_than_kv_band": dict(q_len=19, kv_len=6, sparse_mode=4, pre_tokens=2, next_tokens=0),
    "single_query": dict(q_len=1, kv_len=29, sparse_mode=3),
    "single_key": dict(q_len=9, kv_len=1),
    "empty_band": dict(sparse_mode=0, pre_tokens=-3, next_tokens=-5),  # next < -pre: every row fully masked
    "head_dim_128": dict(head_dim=128, q_len=5, kv_len=9, batch=1),
    "head_dim_72_vd_40": dict(head_dim=72, v_head_dim=40, q_len=6, kv_len=10, batch=1),
    "causal_square": dict(q_len=23, kv_len=23, sparse_mode=2, batch=1),
    "peaky_softmax": dict(scale_mult=30.0, q_len=9, kv_len=70),  # logits of +-100: needs the running max
    "head_dim_256": dict(head_dim=256, q_len=4, kv_len=7, batch=1, q_heads=2, kv_heads=1),
    "zero_scale": dict(scale_mult=0.0),  # uniform attention
}


@pytest.mark.asan
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("shape", list(SHAPES))
def test_shapes(shape, dtype):
    compare_with_reference(Case(dtype=dtype, **SHAPES[shape]))


LONG = {
    "many_kv_tiles": dict(batch=1, q_heads=2, kv_heads=1, q_len=70, kv_len=1100, head_dim=32),
    "many_q_tiles_causal": dict(batch=1, q_heads=2, kv_heads=2, q_len=200, kv_len=150, head_dim=32, sparse_mode=3),
    "band_across_tiles": dict(batch=1, q_heads=2, kv_heads=1, q_len=130, kv_len=600, head_dim=16, sparse_mode=4,
                              pre_tokens=100, next_tokens=40),
    "peaky_across_tiles": dict(batch=1, q_heads=2, kv_heads=1, q_len=20, kv_len=1300, head_dim=16, scale_mult=20.0),
}


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["fp32", "fp16"])
@pytest.mark.parametrize("shape", list(LONG))
def test_long_sequences_default_tiles(shape, dtype):
    compare_with_reference(Case(dtype=dtype, **LONG[shape]))


TILES = [(1, 1), (16, 32), (7, 5), (64, 16)]


@pytest.mark.asan
@pytest.mark.parametrize("tiles", TILES, ids=[f"{q}x{k}" for q, k in TILES])
@pytest.mark.parametrize("case", [
    Case(layout="BSND", q_len=37, kv_len=45, sparse_mode=0, pre_tokens=9, next_tokens=3, mask="B1SS"),
    Case(layout="TND", seqlens=VARLEN, sparse_mode=3, pse=None, dtype="bf16"),
    Case(layout="BNSD", q_len=40, kv_len=33, sparse_mode=2, pse="BN1S", pse_type=0, keep_prob=0.8),
], ids=["band_mask", "varlen_causal", "causal_pse_dropout"])
def test_tile_sizes(case, tiles):
    with attention_tiles_override(*tiles):
        compare_with_reference(case)


@pytest.mark.asan
@pytest.mark.parametrize("layout", LAYOUTS)
def test_non_contiguous_inputs(layout):
    compare_with_reference(_case(layout, strided=True, pse="BNSS" if layout != "TND" else None, sparse_mode=3))


@pytest.mark.parametrize("threads", [1, 2])
def test_backward_is_deterministic(threads):
    """Bit-identical results run to run for a fixed thread count (several tiles, GQA, dropout)."""
    case = Case(batch=2, q_heads=4, kv_heads=1, q_len=90, kv_len=140, head_dim=32, keep_prob=0.9, pse="BN1S")
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        with attention_tiles_override(16, 32):
            first, second = (run_ours(make_inputs(case)) for _ in range(2))
    finally:
        torch.set_num_threads(old)
    assert torch.equal(first.out, second.out)
    for name in first.grads:
        assert torch.equal(first.grads[name], second.grads[name]), f"d{name} differs between two runs"


def test_backward_of_a_call_with_only_required_arguments():
    """Autograd must not depend on which optional arguments the caller spelled out."""
    q, k, v = (torch.randn(1, 5, 2, 8, requires_grad=True) for _ in range(3))
    out = torch.ops.npu_fa.flash_attention_score(q, k, v, 2, "BSND")[0]
    grads = torch.autograd.grad(out.sum(), (q, k, v))
    explicit = torch.ops.npu_fa.flash_attention_score(q, k, v, 2, "BSND", scale=1.0)[0]
    want = torch.autograd.grad(explicit.sum(), (q, k, v))
    for g, w in zip(grads, want):
        assert torch.equal(g, w)
