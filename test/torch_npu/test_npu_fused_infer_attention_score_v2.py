"""Ported: op-plugin test/test_custom_ops/test_npu_fused_infer_attention_score_v2.py
(torch_npu.npu_fused_infer_attention_score_v2: npu_fused_infer_attention_score with renamed arguments plus
learnable_sink).

Upstream cases (TestFusedInferAttentionV2), and what became of each here:
- test_npu_fused_infer_attention_score_v2 (first definition: BNSD fp16 [1, 32, 2048, 128], scale 1/0.0078125, golden
  computed, nothing asserted; a second method of the same name replaces it in the class, so it never runs upstream)
  -> ported with the assertion (test_bnsd_prefill), S = 256 as in test_npu_fused_infer_attention_score.py.
- _pfa_return_lse / _ifa_return_lse -> ported (out against the softmax golden, lse against upstream's lse golden).
- _ntd_tnd: NTD_TND bf16 ones, golden per head, prec 1e-6 -> ported.
- test_npu_fused_infer_attention_score_v2 (second definition: TND page attention on a 5-D
  [blocks, N, D/16, block_size, 16] cache) -> cannot apply: it builds that cache with a numpy-style five-axis
  Tensor.transpose (a TypeError in PyTorch) and asserts on an undefined name; the 5-D NZ cache is an NPU-only
  format (NZ), not implemented (MLA over plain caches is: test/inference/test_fia_mla.py).
- _sink: TND bf16 ones [128, 8, 128], learnable_sink ones (8,), golden softmax over the keys plus one sink logit per
  head in float64, prec 1e-6 -> ported; test_learnable_sink_random adds the same golden on random data.
- Ascend950 cases: _bnsd_bsnd_d_unequal, _bsnd_d_unequal, _bsh_d_unequal, _tnd_d_unequal (ones: output ones) ->
  ported with the KV length cut from 2048 to 256. _nsd_d_unequal uses names it never defines (softmax_scale,
  return_softmax_lse) -> ported with its siblings' values. _page_attention and _int32_antiquant call
  torch_npu.npu_fused_infer_attention_v2, a name torch_npu does not have -> ported through
  npu_fused_infer_attention_score_v2 (ones over a paged cache; the int4 antiquant call -> NotImplementedError for
  dequant_scale_key). _without_outdtype (BNSD fp16, Q/K D 192, V D 128, quant_scale_out randn(1): int8 output;
  nothing asserted upstream) -> ported against upstream's formula round(y · quant_scale_out) on the float64
  attention; _with_outdtype (the same with out_dtype float8_e5m2, an fp8 output) -> NotImplementedError naming
  out_dtype. _d_unequal (query D 192 against key D 128, misspelt name) and _fp4_antiquant
  (torch_npu.float4_e1m2 / float8_e8m0 dtypes, misspelt name) -> cannot apply: no such head-dim mode in the A2/A3
  documentation, and fp4/e8m0 are torch_npu-only dtypes (quantisation we do not implement).

Not in upstream's file: v2 == v1 under the renaming, the learnable_sink constraints upstream documents (TND /
NTD_TND only, not with pse_shift), the arguments upstream reserves, and query_quant_mode's rules (v2's MLA full
quantisation itself: test/inference/test_quant_attention.py).
"""
import pytest
import torch

from test.common.reference import check_tolerance
from test.torch_npu.common import on_cpu, to_device, torch_npu
from test.torch_npu.test_npu_fused_infer_attention_score import (SCALE, _check_out, _golden_lse, _golden_ntd, _ones,
                                                                 _randn, check_int8_output)
from test.torch_npu.rtol import assert_rtol_equal


def _v2_bnsd(q, k, v, lse):
    return torch_npu.npu_fused_infer_attention_score_v2(*to_device(q, k, v), num_query_heads=32, input_layout="BNSD",
                                                        softmax_scale=SCALE, pre_tokens=65535, next_tokens=65535,
                                                        return_softmax_lse=lse)


def test_bnsd_prefill():
    q, k, v = (_randn(1, 32, 256, 128, seed=s) for s in range(3))
    out, lse = _v2_bnsd(q, k, v, False)
    _check_out(out, q, k, v)
    assert on_cpu(lse).shape == (0,)


@pytest.mark.parametrize("q_len", [256, 1], ids=["pfa", "ifa"])
def test_return_lse(q_len):
    kv_len = 256 if q_len > 1 else 2048
    q = _randn(1, 32, q_len, 128, seed=3)
    k, v = _randn(1, 32, kv_len, 128, seed=4), _randn(1, 32, kv_len, 128, seed=5)
    out, lse = _v2_bnsd(q, k, v, True)
    _check_out(out, q, k, v)
    lse = on_cpu(lse)
    assert lse.shape == (1, 32, q_len, 1)
    assert_rtol_equal(_golden_lse(q, k, dtype=torch.float32), lse)
    s64 = torch.matmul(q.double(), k.double().transpose(2, 3)) * SCALE
    check_tolerance("softmax_lse", lse, torch.logsumexp(s64, -1, keepdim=True), _golden_lse(q, k))


def test_ntd_tnd():
    q, k = _ones(2, 32, 192, dtype=torch.bfloat16), _ones(2, 32, 192, dtype=torch.bfloat16)
    v = _ones(2, 32, 128, dtype=torch.bfloat16)
    out, _ = torch_npu.npu_fused_infer_attention_score_v2(*to_device(q, k, v), num_query_heads=2,
                                                          input_layout="NTD_TND", softmax_scale=SCALE,
                                                          pre_tokens=65535, next_tokens=65535, actual_seq_qlen=[32],
                                                          actual_seq_kvlen=[32])
    assert_rtol_equal(_golden_ntd(q, k, v, torch.bfloat16), on_cpu(out), prec=1e-6, prec16=1e-6)


def _golden_sink(q, k, v, sink, scale):
    """Upstream's sink golden for one TND sequence, in float64: softmax over [scores, sink_n] per head, the sink
    column dropped before the product with V."""
    q, k, v = (t.double().transpose(0, 1) for t in (q, k, v))          # [N, S, D]
    scores = torch.matmul(q, k.transpose(1, 2)) * scale
    sinks = sink.double().view(-1, 1, 1).expand(-1, scores.shape[1], 1)
    probs = torch.softmax(torch.cat([scores, sinks], dim=-1), dim=-1)[..., :-1]
    return torch.matmul(probs, v).transpose(0, 1)                        # [S, N, D]


def test_sink():
    q = k = v = _ones(128, 8, 128, dtype=torch.bfloat16)
    sink = torch.ones(8, dtype=torch.bfloat16)
    out, lse = torch_npu.npu_fused_infer_attention_score_v2(
        *to_device(q, k, v), learnable_sink=to_device(sink), num_query_heads=8, input_layout="TND",
        softmax_scale=SCALE, pre_tokens=65535, next_tokens=65535, actual_seq_qlen=[128], actual_seq_kvlen=[128],
        return_softmax_lse=True)
    assert_rtol_equal(_golden_sink(q, k, v, sink, SCALE), on_cpu(out).double(), prec=1e-6, prec16=1e-6)
    assert on_cpu(lse).shape == (128, 8, 1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_learnable_sink_random(dtype):
    # Two sequences (TND) and sinks of both signs: each sequence is one softmax with the extra logit.
    q, k, v = (_randn(*s, dtype=dtype, seed=i) for i, s in enumerate([(9, 4, 16), (13, 4, 16), (13, 4, 16)]))
    sink = torch.tensor([-1.0, 0.0, 2.5, 8.0])
    scale = 0.3
    out, lse = torch_npu.npu_fused_infer_attention_score_v2(
        *to_device(q, k, v), learnable_sink=to_device(sink), num_query_heads=4, input_layout="TND",
        softmax_scale=scale, actual_seq_qlen=[4, 9], actual_seq_kvlen=[6, 13], return_softmax_lse=True)
    out, lse = on_cpu(out), on_cpu(lse)
    segs = [(slice(0, 4), slice(0, 6)), (slice(4, 9), slice(6, 13))]
    ref = torch.cat([_golden_sink(q[a], k[b], v[b], sink, scale) for a, b in segs])
    same = torch.cat([_golden_sink(q[a], k[b], v[b], sink, scale).to(dtype) for a, b in segs])
    check_tolerance("learnable_sink out", out, ref, same)
    ref_lse = torch.cat([torch.logsumexp(torch.cat([
        torch.matmul(q[a].double().transpose(0, 1), k[b].double().transpose(0, 1).transpose(1, 2)) * scale,
        sink.double().view(-1, 1, 1).expand(-1, a.stop - a.start, 1)], -1), -1).transpose(0, 1) for a, b in segs])
    torch.testing.assert_close(lse.double().squeeze(-1), ref_lse, atol=1e-5, rtol=1e-5)


def test_learnable_sink_constraints():
    q, k, v = to_device(*(_randn(2, 6, 4, 16, dtype=torch.float32, seed=s) for s in range(3)))
    sink = to_device(torch.zeros(4))
    with pytest.raises(RuntimeError, match="learnable_sink.*TND"):
        torch_npu.npu_fused_infer_attention_score_v2(q, k, v, learnable_sink=sink, num_query_heads=4,
                                                     input_layout="BSND")
    qt = to_device(_randn(6, 4, 16, dtype=torch.float32))
    with pytest.raises(ValueError, match="learnable_sink.*pse_shift"):
        torch_npu.npu_fused_infer_attention_score_v2(qt, qt, qt, learnable_sink=sink, num_query_heads=4,
                                                     input_layout="TND", actual_seq_qlen=[6], actual_seq_kvlen=[6],
                                                     pse_shift=to_device(torch.zeros(1, 4, 6, 6)))
    with pytest.raises(ValueError, match="learnable_sink"):
        torch_npu.npu_fused_infer_attention_score_v2(qt, qt, qt, learnable_sink=to_device(torch.zeros(3)),
                                                     num_query_heads=4, input_layout="TND", actual_seq_qlen=[6],
                                                     actual_seq_kvlen=[6])


# ---- Ascend950 cases ----------------------------------------------------------------------------------------

ONES_CASES = {
    "bnsd_bsnd_d_unequal": ((32, 8, 1, 192), (32, 8, 256, 192), (32, 8, 256, 128), "BNSD_BSND", {},
                            (32, 1, 8, 128)),
    "bsnd_d_unequal": ((32, 1, 8, 192), (32, 256, 8, 192), (32, 256, 8, 128), "BSND", {}, (32, 1, 8, 128)),
    "bsh_d_unequal": ((32, 1, 1536), (32, 256, 1536), (32, 256, 1024), "BSH", {}, (32, 1, 1024)),
    "nsd_d_unequal": ((8, 1, 192), (8, 256, 192), (8, 256, 128), "NSD", {}, (8, 1, 128)),
    "tnd_d_unequal": ((32, 8, 192), (32, 8, 192), (32, 8, 128), "TND",
                      dict(actual_seq_qlen=[32], actual_seq_kvlen=[32]), (32, 8, 128)),
}


@pytest.mark.parametrize("case", list(ONES_CASES))
def test_d_unequal_ones(case):
    qs, ks, vs, layout, kw, out_shape = ONES_CASES[case]
    dtype = torch.bfloat16 if layout == "TND" else torch.float16
    out = torch_npu.npu_fused_infer_attention_score_v2(
        *to_device(_ones(*qs, dtype=dtype), _ones(*ks, dtype=dtype), _ones(*vs, dtype=dtype)), num_query_heads=8,
        input_layout=layout, softmax_scale=SCALE, pre_tokens=65535, next_tokens=65535, return_softmax_lse=False,
        **kw)[0]
    assert torch.equal(on_cpu(out), _ones(*out_shape, dtype=dtype))


def test_page_attention():
    q, k, v = _ones(2, 1, 2048, 128), _ones(32, 1, 128, 128), _ones(32, 1, 128, 128)
    out = torch_npu.npu_fused_infer_attention_score_v2(
        *to_device(q, k, v), num_query_heads=1, input_layout="BNSD",
        block_table=to_device(torch.ones(2, 32, dtype=torch.int32)), actual_seq_qlen=[2048],
        actual_seq_kvlen=[2048], block_size=128, pre_tokens=65535, next_tokens=65535, return_softmax_lse=False)[0]
    assert torch.equal(on_cpu(out), _ones(2, 1, 2048, 128))


def test_int32_antiquant_not_implemented():
    q = to_device(_ones(2, 1, 1, 128))
    k = to_device(torch.ones(2, 1, 256, 16, dtype=torch.int32))
    scale = to_device(torch.ones(1, 128, dtype=torch.float16))
    with pytest.raises(NotImplementedError, match="dequant_scale_key"):
        torch_npu.npu_fused_infer_attention_score_v2(q, k, k, num_query_heads=1, input_layout="BNSD",
                                                     dequant_scale_key=scale, dequant_scale_value=scale,
                                                     key_quant_mode=0, value_quant_mode=0, pre_tokens=65535,
                                                     next_tokens=65535)


@pytest.mark.parametrize("with_out_dtype", [False, True])
def test_quant_scale_out(with_out_dtype):
    q, k, v = _randn(4, 8, 2, 192), _randn(4, 8, 64, 192, seed=1), _randn(4, 8, 64, 128, seed=2)
    quant_scale_out = torch.randn(1, generator=torch.Generator().manual_seed(3))
    call = lambda **kw: torch_npu.npu_fused_infer_attention_score_v2(  # noqa: E731
        *to_device(q, k, v), num_query_heads=8, input_layout="BNSD", softmax_scale=SCALE, pre_tokens=65535,
        next_tokens=65535, **kw)[0]
    if with_out_dtype:   # an fp8 attention_out: a quantised format this package does not implement
        with pytest.raises(NotImplementedError, match="'out_dtype'"):
            call(quant_scale_out=to_device(quant_scale_out), out_dtype=torch.float8_e5m2)
        return
    ref64 = torch.softmax(q.double() @ k.double().transpose(2, 3) * SCALE, -1) @ v.double()
    float_err = (on_cpu(call()).double() - ref64).abs().max()
    check_int8_output(call(quant_scale_out=to_device(quant_scale_out)), ref64, quant_scale_out,
                      float_err=float(float_err))


# ---- beyond upstream's file --------------------------------------------------------------------------------------

def test_v2_is_v1_renamed():
    q, k, v = (_randn(2, 6, 4, 16, dtype=torch.float32, seed=s) for s in (20, 21, 22))
    mask = to_device(torch.rand(6, 6, generator=torch.Generator().manual_seed(3)) > 0.7)
    v1 = torch_npu.npu_fused_infer_attention_score(*to_device(q, k, v), atten_mask=mask, actual_seq_lengths=[5, 6],
                                                   actual_seq_lengths_kv=[6, 3], num_heads=4, scale=0.3,
                                                   input_layout="BSND", next_tokens=1, softmax_lse_flag=True)
    v2 = torch_npu.npu_fused_infer_attention_score_v2(*to_device(q, k, v), atten_mask=mask, actual_seq_qlen=[5, 6],
                                                      actual_seq_kvlen=[6, 3], num_query_heads=4, softmax_scale=0.3,
                                                      input_layout="BSND", next_tokens=1, return_softmax_lse=True)
    for a, b in zip(v1, v2):
        assert torch.equal(on_cpu(a), on_cpu(b))


def test_reserved_and_unimplemented_arguments():
    q = to_device(_randn(1, 4, 2, 16, dtype=torch.float32))
    one = to_device(torch.ones(1))
    call = torch_npu.npu_fused_infer_attention_score_v2
    for name in ("dequant_scale_key_rope", "quant_scale_p"):
        with pytest.raises(RuntimeError, match=name):          # reserved upstream
            call(q, q, q, num_query_heads=4, input_layout="BNSD", **{name: one})
    with pytest.raises(NotImplementedError, match="key_dtype"):
        call(q, q, q, num_query_heads=4, input_layout="BNSD", key_dtype=1)
    # query_quant_mode 3 (per-token per-head) belongs to an int8 query (MLA full quantisation); 1 is not a mode
    for mode, words in ((3, "needs an int8 query"), (1, "must be 0")):
        with pytest.raises(ValueError, match=f"'query_quant_mode' {words}"):
            call(q, q, q, num_query_heads=4, input_layout="BNSD", query_quant_mode=mode)
    with pytest.raises(NotImplementedError, match="sparse_mode"):
        call(q, q, q, num_query_heads=4, input_layout="BNSD", sparse_mode=9, atten_mask=to_device(torch.zeros(
            1, 2, 2, dtype=torch.bool)))
