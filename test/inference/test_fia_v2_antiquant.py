"""npu_fused_infer_attention_score_v2 with an int8 KV cache (KV antiquant): dequant_scale_key / dequant_offset_key /
dequant_scale_value / dequant_offset_value and key_quant_mode / value_quant_mode are v1's separate-form
key_/value_antiquant_* arguments. Numerics: float64 attention on the dequantised cache with the project's tolerance
rule (test/inference/int8_cases.py); the v2 call must also equal the v1 call bit for bit. Bad inputs: one per rule."""
import pytest
import torch

import torch_ops_transformer as tot
from test.common.reference import check_tolerance
from test.inference.int8_cases import DTYPES, Case, build, reference, run
from test.inference.test_int8_kv import _prefill_reference

V2_NAMES = {"key_antiquant_scale": "dequant_scale_key", "key_antiquant_offset": "dequant_offset_key",
            "value_antiquant_scale": "dequant_scale_value", "value_antiquant_offset": "dequant_offset_value",
            "key_antiquant_mode": "key_quant_mode", "value_antiquant_mode": "value_quant_mode"}


def _v2_kwargs(inp):
    return {V2_NAMES[k]: v for k, v in inp.kwargs.items()}


def _v2(inp, q=None, **extra):
    a = inp.args
    kw = dict(block_table=a[6], num_query_heads=a[8], softmax_scale=a[9], input_layout=a[10],
              num_key_value_heads=a[11], block_size=a[12], actual_seq_kvlen=a[5].tolist(), **_v2_kwargs(inp))
    kw.update(extra)
    return tot.npu_fused_infer_attention_score_v2(a[0] if q is None else q, a[1], a[2], **kw)


def _id(c: Case) -> str:
    return f"{c.layout}-{c.dtype}-block{c.block}-m{c.k_mode}{c.v_mode}-{'off' if c.offset else 'sym'}"


DECODE = [
    # paged (num_blocks, N2, block, D) cache, per-channel (upstream's decode example)
    Case(layout="BNSD", dtype="bf16", kv_len=256, block=128, lens=(256, 100, 1), paged_4d=True, offset=False),
    # paged (num_blocks, block, H), per-token (B, S) with offsets
    Case(layout="BSH", dtype="fp16", kv_len=96, block=32, lens=(90, 33, 64), k_mode=1, v_mode=1),
    # contiguous, per-channel key with per-token value (the one allowed mixed pair)
    Case(layout="BSND", dtype="bf16", lens=(80, 33, 5), k_mode=0, v_mode=1),
    # contiguous, per-tensor per-head and per-token per-head
    Case(layout="BNSD", dtype="fp16", q_heads=6, kv_heads=2, head_dim=32, k_mode=2, v_mode=2),
    Case(layout="BNSD", dtype="bf16", q_heads=4, kv_heads=2, head_dim=128, kv_len=300, lens=(300, 257, 5),
         k_mode=3, v_mode=3),
]


@pytest.mark.parametrize("case", DECODE, ids=_id)
def test_v2_decode(case):
    inp = build(case)
    out, lse = _v2(inp)
    assert lse.numel() == 0 and out.dtype == DTYPES[case.dtype]
    torch.testing.assert_close(out, run(inp), atol=0, rtol=0)  # v1's decode op on the cache in place
    ours = out.reshape(case.batch, case.q_heads, case.head_dim)
    check_tolerance(_id(case), ours, reference(inp, case), reference(inp, case, DTYPES[case.dtype]))


def test_v2_per_channel_upstream_shape():
    # upstream's per-channel examples pass (KV_N, 1, D) in the query's dtype
    c = Case(layout="BNSD", dtype="bf16", kv_len=256, block=128, lens=(256, 100, 1), paged_4d=True, offset=False)
    inp = build(c)
    kw = _v2_kwargs(inp)
    kw = {k: (v.reshape(c.kv_heads, 1, c.head_dim).to(torch.bfloat16) if isinstance(v, torch.Tensor) else v)
          for k, v in kw.items()}
    out, _ = _v2(inp, **kw)
    # the reference has the fp32 factors: compare with the v1 call on them, with the bf16 rounding slack
    torch.testing.assert_close(out.float(), run(inp).float(), atol=2e-2, rtol=2e-2)
    a = inp.args
    v1, _ = tot.npu_fused_infer_attention_score(a[0], a[1], a[2], block_table=a[6], num_heads=a[8], scale=a[9],
                                                input_layout=a[10], num_key_value_heads=a[11], block_size=a[12],
                                                actual_seq_lengths_kv=a[5].tolist(),
                                                **{k: kw[V2_NAMES[k]] for k in inp.kwargs})
    torch.testing.assert_close(out, v1, atol=0, rtol=0)


@pytest.mark.parametrize("sq", [1, 4])
def test_v2_prefill_route(sq):
    # Sq = 4 and Sq = 1 with return_softmax_lse: the prefill path on the dequantised keys.
    c = Case(layout="BNSD", dtype="fp16", kv_len=256, block=128, lens=(250, 128, 3), k_mode=1, v_mode=1, q_heads=4)
    inp = build(c)
    g = torch.Generator().manual_seed(5)
    q = torch.randn(c.batch, c.q_heads, sq, c.head_dim, generator=g).half()
    out, lse = _v2(inp, q=q, return_softmax_lse=True)
    ref, ref_lse = _prefill_reference(q, inp.kd, inp.vd, inp.lens, c.scale, torch.float64)
    same, _ = _prefill_reference(q, inp.kd, inp.vd, inp.lens, c.scale, torch.float16)
    check_tolerance(f"v2 prefill Sq={sq}", out, ref, same)
    finite = torch.isfinite(ref_lse)
    torch.testing.assert_close(lse[..., 0][finite].double(), ref_lse[finite], atol=1e-3, rtol=1e-4)


def test_v2_equals_v1_fia():
    c = Case(layout="BSH", dtype="bf16", kv_len=96, block=32, lens=(96, 40, 7))
    inp = build(c)
    a = inp.args
    v1, _ = tot.npu_fused_infer_attention_score(a[0], a[1], a[2], block_table=a[6], num_heads=a[8], scale=a[9],
                                                input_layout="BSH", num_key_value_heads=a[11], block_size=a[12],
                                                actual_seq_lengths_kv=a[5].tolist(), **inp.kwargs)
    v2, _ = _v2(inp)
    torch.testing.assert_close(v2, v1, atol=0, rtol=0)


# ---- bad inputs: one per rule ----

def test_bad_v2_int8_query_full_quant():
    inp = build(Case())
    q8 = torch.zeros_like(inp.args[0], dtype=torch.int8)
    with pytest.raises(NotImplementedError, match=r"int8 'query'.*'dequant_scale_key'"):
        _v2(inp, q=q8)


def test_bad_v2_int4_packed_cache():
    inp = build(Case())
    k32 = inp.args[1].view(torch.int32)
    a = inp.args
    with pytest.raises(NotImplementedError, match=r"int4.*'dequant_scale_value'"):
        tot.npu_fused_infer_attention_score_v2(a[0], k32, k32, num_query_heads=8, num_key_value_heads=2,
                                               input_layout="BSH", **_v2_kwargs(inp))


def test_bad_v2_query_quant_with_a_float_query():
    # dequant_scale_query / query_quant_mode 3 belong to an int8 query (MLA full quantisation,
    # test/inference/test_quant_attention.py): next to this float query they are bad arguments
    inp = build(Case())
    with pytest.raises(ValueError, match="'dequant_scale_query' needs an int8 query"):
        _v2(inp, dequant_scale_query=torch.ones(1))
    with pytest.raises(ValueError, match="'query_quant_mode' needs an int8 query"):
        _v2(inp, query_quant_mode=3)


def test_bad_v2_mode_out_of_range_names_v2_argument():
    with pytest.raises(ValueError, match=r"'key_quant_mode' must be in \[0, 5\]"):
        _v2(build(Case()), key_quant_mode=6)


def test_bad_v2_mode_pair():
    inp = build(Case(k_mode=1, v_mode=1))
    with pytest.raises(ValueError, match="must be equal, or 0 and 1"):
        _v2(inp, value_quant_mode=0)


def test_bad_v2_only_key_scale():
    inp = build(Case(offset=False))
    with pytest.raises(ValueError, match="given together"):
        _v2(inp, dequant_scale_value=None)


def test_bad_v2_scale_shape_names_v2_argument():
    with pytest.raises(ValueError, match=r"'dequant_scale_key'.*per-channel.*N2\*D"):
        _v2(build(Case()), dequant_scale_key=torch.ones(1, 2, 1, 63))


def test_bad_v2_dequant_with_float_cache():
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 1, 16, generator=g).half()
    k = torch.randn(1, 8, 16, generator=g).half()
    with pytest.raises(ValueError, match="int8 key/value cache"):
        tot.npu_fused_infer_attention_score_v2(q, k, k, dequant_scale_key=torch.ones(16),
                                               dequant_scale_value=torch.ones(16))


def test_bad_v2_paged_scale_modes_not_implemented():
    with pytest.raises(NotImplementedError, match="'key_quant_mode'.*4"):
        _v2(build(Case()), key_quant_mode=4, value_quant_mode=4)
