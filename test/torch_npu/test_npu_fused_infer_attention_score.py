"""Ported: op-plugin test/test_custom_ops/test_npu_fused_infer_attention_score.py
(torch_npu.npu_fused_infer_attention_score).

Upstream cases (TestFusedInferAttentionScore), and what became of each here:
- test_npu_fused_infer_attention_score: BNSD fp16 [1, 32, 2048, 128], scale 1/0.0078125, pre/next 65535; upstream
  computes its golden but asserts nothing (skipped upstream: "outdated CANN"). -> ported with the assertion.
- test_npu_fused_infer_attention_score_pfa_return_lse / _ifa_return_lse: the same with softmax_lse_flag=True, Q_S
  2048 / 1 (KV 2048). -> ported: out against the softmax golden, lse against upstream's lse golden
  (log Σ exp(s − max) + max; compared by assertRtolEqual with fp32 scores, its fp16 scores being torch_same_dtype in
  the float64 rule). Upstream's golden output in its lse branch multiplies the raw scores by V (no softmax), so the
  output is checked against its no-lse branch.
- test_npu_fused_infer_attention_score_tnd: a 4-D BNSD query with input_layout "TND". Upstream rejects it ("query's
  dim should be consistent with that of Layout") -> ported as that error.
- test_npu_fused_infer_attention_score_v3_param: query_rope / key_rope (rope dim 16) with key_rope_antiquant_scale
  (reserved upstream, unused) on BNSD fp16, Q_S 1, N 32 = N2; upstream asserts nothing. -> ported with a float64
  golden softmax((q·kᵀ + q_rope·k_ropeᵀ)·scale)·v and its lse (KV length cut to 256).
- test_npu_fused_infer_attention_score_tnd_ntd: TND_NTD with D = 512, a 4-D key and no rope (upstream's D = 512 TND
  rules need rope); no assertion upstream. -> ported as the argument error it is here (a 4-D key for TND).
- test_npu_fused_infer_attention_score_ntd_tnd: NTD_TND bf16 ones (Q/K D 192, V D 128), lengths [32]; golden
  softmax(q·kᵀ/0.0078125)·v per head, transposed to TND, prec 1e-6. -> ported.
- test_npu_fused_infer_attention_score_v3_fullquant (int8 ones, BNSD Q_S 2, KV_S 64, every factor 1, int8 output
  with quant_scale2 = 1; nothing asserted upstream) -> ported with the assertion: upstream's full-quantisation
  formula gives uniform attention over equal integer scores, i.e. 1 everywhere, and the int8 output round(1 · 1) = 1
  (the general case is tested against float64 in test/inference/test_quant_attention.py).
- _v3_antiquant (int32-packed int4 KV with key/value_antiquant_scale): -> ported as NotImplementedError naming the
  quantisation arguments.
- test_npu_infer_attention_score_PA: TND decode (B 1, Q_N 16, KV_N 1, D 192, V_D 128) on a paged cache
  (block_size 128, kv length 69), golden over the contiguous cache. -> ported; upstream draws block ids in [0, 10)
  for a cache of one block (its golden reads that block whatever the table says), so the port draws ids the cache
  holds.
- Ascend950 cases: _v3_page_attention (BNSD prefill over a BnNBsD cache, all blocks = block 1, ones),
  _bnsd_bsnd_d_unequal, _bsnd_d_unequal, _bsh_d_unequal, _nsd_d_unequal, _tnd_d_unequal (Q/K D 192, V D 128, ones:
  output ones) -> ported, the KV length cut from 2048 to 256 (all-ones inputs: the result does not depend on it;
  the 950 shapes take ~0.5 GB per run otherwise). _v3_int32_antiquant -> NotImplementedError (quantisation).
  _v3_d_unequal (query D 192 against key D 128 in BNSD, no rope) -> cannot apply: Q·Kᵀ needs equal head dims and
  the A2/A3 documentation has no such mode (an Ascend950-only behaviour we do not claim).
The S = 2048 prefill cases run with S = 256 (the plain-PyTorch golden takes minutes at 2048 on a CPU). With scale
128 the golden is compared in fp32 (cast to fp16) by assertRtolEqual, its fp16 evaluation being torch_same_dtype in
the float64 rule (see test_prompt_flash_attention.py for why).

Not in upstream's file: the layouts the doc lists (BSH_BNSD, BSND_BNSD, BSH_NBSD, BSND_NBSD, BNSD_NBSD, TND_NTD, NTD,
NSD) against the plain ones, length forms (list / CPU / device tensor, longer list cut to B; paged TND), the decode
branch ignoring pre/next_tokens and sparse_modes 0-3 (sparse_mode 4's window applies there: a documented deviation,
docs/inference.md), sparse_mode 2-4 requiring the optimised 2048x2048 mask, and the shape of softmax_lse without the
flag.
"""
import math

import pytest
import torch

from test.common.reference import check_tolerance
from test.torch_npu.common import DEVICE, on_cpu, to_device, torch_npu
from test.torch_npu.rtol import assert_rtol_equal

SCALE = 1 / 0.0078125


def _randn(*shape, dtype=torch.float16, seed=0):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def _golden(q, k, v, scale=SCALE, dtype=None):
    """Upstream's no-lse golden on BNSD, evaluated in `dtype` (default: the inputs')."""
    dtype = dtype or q.dtype
    q, k, v = (t.to(dtype) for t in (q, k, v))
    scores = torch.matmul(q, k.transpose(2, 3)) * scale
    scores = torch.max(scores, torch.full((1, 1), torch.finfo(dtype).min, dtype=dtype))
    return torch.matmul(torch.softmax(scores, dim=-1, dtype=torch.float32).to(dtype), v)


def _golden_lse(q, k, scale=SCALE, dtype=None):
    """Upstream's lse golden: scores in `dtype` (default: the inputs'), then log Σ exp(s − max) + max in fp32,
    [B, N, S, 1]."""
    dtype = dtype or q.dtype
    s = (torch.matmul(q.to(dtype), k.to(dtype).transpose(2, 3)) * scale).float()
    m = s.max(dim=-1, keepdim=True).values
    return torch.log(torch.exp(s - m).sum(dim=-1, keepdim=True)) + m


def _check_out(out, q, k, v, scale=SCALE):
    out = on_cpu(out)
    assert out.shape == q.shape[:-1] + (v.shape[-1],) and out.dtype == q.dtype
    assert_rtol_equal(_golden(q, k, v, scale, torch.float32).to(q.dtype), out)
    check_tolerance("npu_fused_infer_attention_score", out, _golden(q, k, v, scale, torch.float64),
                    _golden(q, k, v, scale))


def _bnsd_call(q, k, v, lse_flag):
    return torch_npu.npu_fused_infer_attention_score(*to_device(q, k, v), num_heads=32, input_layout="BNSD",
                                                     scale=SCALE, pre_tokens=65535, next_tokens=65535,
                                                     softmax_lse_flag=lse_flag)


def test_npu_fused_infer_attention_score():
    q, k, v = (_randn(1, 32, 256, 128, seed=s) for s in range(3))
    out, lse = _bnsd_call(q, k, v, False)
    _check_out(out, q, k, v)
    assert on_cpu(lse).shape == (0,) and lse.dtype == torch.float32   # torch_npu: an empty fp32 tensor


@pytest.mark.parametrize("q_len", [256, 1], ids=["pfa", "ifa"])
def test_npu_fused_infer_attention_score_return_lse(q_len):
    kv_len = 256 if q_len > 1 else 2048
    q = _randn(1, 32, q_len, 128, seed=3)
    k, v = _randn(1, 32, kv_len, 128, seed=4), _randn(1, 32, kv_len, 128, seed=5)
    out, lse = _bnsd_call(q, k, v, True)
    _check_out(out, q, k, v)
    lse = on_cpu(lse)
    assert lse.shape == (1, 32, q_len, 1) and lse.dtype == torch.float32
    assert_rtol_equal(_golden_lse(q, k, dtype=torch.float32), lse)
    s64 = torch.matmul(q.double(), k.double().transpose(2, 3)) * SCALE
    check_tolerance("softmax_lse", lse, torch.logsumexp(s64, -1, keepdim=True), _golden_lse(q, k))


def test_npu_fused_infer_attention_score_tnd_rejects_a_4d_query():
    q, k, v = to_device(_randn(1, 32, 1, 128), _randn(1, 32, 64, 128), _randn(1, 32, 64, 128))
    with pytest.raises(RuntimeError, match="query"):
        torch_npu.npu_fused_infer_attention_score(q, k, v, num_heads=32, input_layout="TND", scale=SCALE,
                                                  pre_tokens=65535, next_tokens=65535, softmax_lse_flag=True)


def test_npu_fused_infer_attention_score_v3_param():
    q, k, v = _randn(1, 32, 1, 128), _randn(1, 32, 256, 128, seed=1), _randn(1, 32, 256, 128, seed=2)
    qr, kr, ks = _randn(1, 32, 1, 16, seed=3), _randn(1, 32, 256, 16, seed=4), _randn(1, 1, 1, 16, seed=5)
    out, lse = torch_npu.npu_fused_infer_attention_score(
        *to_device(q, k, v), query_rope=to_device(qr), key_rope=to_device(kr), key_rope_antiquant_scale=to_device(ks),
        num_heads=32, input_layout="BNSD", scale=SCALE, pre_tokens=65535, next_tokens=65535, softmax_lse_flag=True)
    qq, kk = torch.cat([q, qr], -1), torch.cat([k, kr], -1)
    ref64 = _golden(qq, kk, v, dtype=torch.float64)
    check_tolerance("attention_out", on_cpu(out), ref64, _golden(qq, kk, v))
    s64 = torch.matmul(qq.double(), kk.double().transpose(2, 3)) * SCALE
    check_tolerance("softmax_lse", on_cpu(lse), torch.logsumexp(s64, -1, keepdim=True), _golden_lse(qq, kk))


def test_npu_fused_infer_attention_score_tnd_ntd_rejects_a_4d_key():
    q, k, v = to_device(_randn(2, 32, 512), _randn(1, 1, 64, 512), _randn(1, 1, 64, 512))
    with pytest.raises(ValueError):
        torch_npu.npu_fused_infer_attention_score(q, k, v, num_heads=32, input_layout="TND_NTD", scale=SCALE,
                                                  pre_tokens=65535, next_tokens=65535, softmax_lse_flag=True,
                                                  actual_seq_lengths=[2], actual_seq_lengths_kv=[64])


def _golden_ntd(q, k, v, dtype):
    """Upstream's NTD golden: per head softmax(q·kᵀ/0.0078125)·v, [N, T, D] -> [T, N, D]."""
    q, k, v = (t.to(dtype) for t in (q, k, v))
    probs = torch.softmax(torch.matmul(q, k.transpose(1, 2)) * SCALE, dim=-1, dtype=torch.float32).to(dtype)
    return torch.matmul(probs, v).transpose(0, 1)


def test_npu_fused_infer_attention_score_ntd_tnd():
    q, k = torch.ones(2, 32, 192, dtype=torch.bfloat16), torch.ones(2, 32, 192, dtype=torch.bfloat16)
    v = torch.ones(2, 32, 128, dtype=torch.bfloat16)
    out, _ = torch_npu.npu_fused_infer_attention_score(*to_device(q, k, v), num_heads=2, input_layout="NTD_TND",
                                                       scale=SCALE, pre_tokens=65535, next_tokens=65535,
                                                       actual_seq_lengths=[32], actual_seq_lengths_kv=[32])
    out = on_cpu(out)
    assert out.shape == (32, 2, 128)
    assert_rtol_equal(_golden_ntd(q, k, v, torch.bfloat16), out, prec=1e-6, prec16=1e-6)
    check_tolerance("NTD_TND", out, _golden_ntd(q, k, v, torch.float64), _golden_ntd(q, k, v, torch.bfloat16))


def test_npu_fused_infer_attention_score_v3_fullquant():
    q, k, v = to_device(torch.ones(1, 32, 2, 128, dtype=torch.int8), torch.ones(1, 32, 64, 128, dtype=torch.int8),
                        torch.ones(1, 32, 64, 128, dtype=torch.int8))
    one = to_device(torch.ones(1))
    out, _ = torch_npu.npu_fused_infer_attention_score(q, k, v, dequant_scale1=one, dequant_scale2=one,
                                                       quant_scale1=one, quant_scale2=one, num_heads=32,
                                                       input_layout="BNSD", scale=SCALE, pre_tokens=65535,
                                                       next_tokens=65535)
    # Every score is 128·SCALE: P = exp(0) = 1 quantises to round(1 · quant_scale1) = 1, O = Σ 1·1·1 / Σ 1 = 1, and
    # the int8 output is round(1 · quant_scale2) = 1 (float64 softmax of equal scores times ones: the same 1).
    assert torch.equal(on_cpu(out), torch.ones(1, 32, 2, 128, dtype=torch.int8))


def check_int8_output(out8, ref64, scale, offset=None, float_err=0.0):
    """An int8 attention_out against upstream's formula on the float64 attention ref64:
    saturate(round_half_even(ref64 · scale + offset)). The op quantises its own float result, so an element may
    differ by one where ref64 · scale + offset lies within that result's error (float_err, times |scale|) of a .5
    tie; every other element must be equal."""
    out8 = on_cpu(out8)
    assert out8.dtype == torch.int8 and out8.shape == ref64.shape
    y = ref64 * scale.double() + (0.0 if offset is None else offset.double())
    diff = (out8.double() - torch.round(y).clamp(-128, 127)).abs()
    near_tie = (y - y.floor() - 0.5).abs() <= float_err * float(scale.abs().max()) + 1e-6
    assert bool(((diff == 0) | ((diff == 1) & near_tie)).all()), float(diff.max())


@pytest.mark.parametrize("upstream_case", ["v3_antiquant", "v3_int32_antiquant"])
def test_npu_fused_infer_attention_score_antiquant_not_implemented(upstream_case):
    q = to_device(torch.ones(2, 1, 1, 128, dtype=torch.float16))
    kv = to_device(torch.full((2, 1, 64, 16), 286331153, dtype=torch.int32))
    scale = to_device(torch.ones(1, 128, dtype=torch.float16))
    kw = dict(key_antiquant_scale=scale, value_antiquant_scale=scale)
    if upstream_case == "v3_antiquant":
        kw.update(key_antiquant_mode=1, value_antiquant_mode=1)
    with pytest.raises(NotImplementedError, match="key_antiquant_scale"):
        torch_npu.npu_fused_infer_attention_score(q, kv, kv, num_heads=1, input_layout="BNSD", scale=SCALE,
                                                  pre_tokens=65535, next_tokens=65535, **kw)


def _int_partition(total, parts, seed):
    """`parts` positive ints summing to `total` (upstream's generate_int_tensor_with_sum)."""
    g = torch.Generator().manual_seed(seed)
    cuts = (torch.randperm(total - 1, generator=g)[:parts - 1] + 1).sort().values.tolist()
    edges = [0] + cuts + [total]
    return torch.tensor([b - a for a, b in zip(edges, edges[1:])], dtype=torch.int32)


def _golden_paged(query, key_cache, value_cache, heads, kv_heads, seq_lens, scale):
    """Upstream's compute_golden_output_cpu: [B, N, D] queries against the whole cache read in block order, keys
    past seq_lens masked; MQA (one KV head) or MHA."""
    nb, bs, _ = key_cache.shape
    k = key_cache.view(nb, bs, kv_heads, -1).permute(2, 0, 1, 3).reshape(kv_heads, nb * bs, -1)
    v = value_cache.view(nb, bs, kv_heads, -1).permute(2, 0, 1, 3).reshape(kv_heads, nb * bs, -1)
    if kv_heads == 1:
        k, v = k.expand(heads, -1, -1), v.expand(heads, -1, -1)
    scores = torch.matmul(query.unsqueeze(-2), k.unsqueeze(0).transpose(-1, -2)) * scale
    visible = (torch.arange(nb * bs).unsqueeze(0) < seq_lens.unsqueeze(1)).unsqueeze(1).unsqueeze(1)
    probs = torch.softmax(scores.masked_fill(~visible, float("-inf")), dim=-1)
    return torch.matmul(probs, v.unsqueeze(0))


def test_npu_infer_attention_score_pa():
    B, T, D, N, KVN, block_num, bs = 1, 69, 192, 16, 1, 1, 128
    g = torch.Generator().manual_seed(6)
    block_table = torch.randint(0, block_num, (B, 32), generator=g, dtype=torch.int32)
    query = torch.rand(B, N, D, generator=g).half()
    key_cache = torch.rand(block_num, bs, KVN * D, generator=g).half()
    value_cache = torch.rand(block_num, bs, KVN * 128, generator=g).half()
    scale = D ** -0.5
    seq_lens = _int_partition(T, B, seed=7)
    query_lens = to_device(torch.ones(B, dtype=torch.int32))
    out = torch_npu.npu_fused_infer_attention_score(
        *to_device(query, key_cache, value_cache), num_heads=N, num_key_value_heads=KVN, input_layout="TND",
        scale=scale, block_table=to_device(block_table), block_size=bs, actual_seq_lengths=query_lens,
        actual_seq_lengths_kv=seq_lens)[0]
    out = on_cpu(out)
    golden = _golden_paged(query.float(), key_cache.float(), value_cache.float(), N, KVN, seq_lens, scale)
    assert_rtol_equal(golden.reshape(out.shape).half(), out)
    golden64 = _golden_paged(query.double(), key_cache.double(), value_cache.double(), N, KVN, seq_lens, scale)
    same = _golden_paged(query, key_cache, value_cache, N, KVN, seq_lens, scale)
    check_tolerance("paged TND", out, golden64.reshape(out.shape), same.reshape(out.shape))


# ---- Ascend950 cases with all-ones inputs: the output is ones ---------------------------------------------------

def _ones(*shape, dtype=torch.float16):
    return torch.ones(shape, dtype=dtype)


def test_npu_fused_infer_attention_score_v3_page_attention():
    q, k, v = _ones(2, 1, 2048, 128), _ones(32, 1, 128, 128), _ones(32, 1, 128, 128)
    block_table = torch.ones(2, 32, dtype=torch.int32)
    out = torch_npu.npu_fused_infer_attention_score(
        *to_device(q, k, v), num_heads=1, input_layout="BNSD", block_table=to_device(block_table),
        actual_seq_lengths=[2048], actual_seq_lengths_kv=[2048], block_size=128, scale=SCALE, pre_tokens=65535,
        next_tokens=65535, softmax_lse_flag=False)[0]
    assert torch.equal(on_cpu(out), _ones(2, 1, 2048, 128))


ONES_CASES = {
    # upstream case: (q shape, k shape, v shape, num_heads, input_layout, extra kwargs, output shape)
    "bnsd_bsnd_d_unequal": ((32, 8, 1, 192), (32, 8, 256, 192), (32, 8, 256, 128), 8, "BNSD_BSND", {},
                            (32, 1, 8, 128)),
    "bsnd_d_unequal": ((32, 1, 8, 192), (32, 256, 8, 192), (32, 256, 8, 128), 8, "BSND", {}, (32, 1, 8, 128)),
    "bsh_d_unequal": ((32, 1, 1536), (32, 256, 1536), (32, 256, 1024), 8, "BSH", {}, (32, 1, 1024)),
    "nsd_d_unequal": ((8, 1, 192), (8, 256, 192), (8, 256, 128), 8, "NSD", {}, (8, 1, 128)),
    "tnd_d_unequal": ((32, 8, 192), (32, 8, 192), (32, 8, 128), 8, "TND",
                      dict(actual_seq_lengths=[32], actual_seq_lengths_kv=[32]), (32, 8, 128)),
}


@pytest.mark.parametrize("case", list(ONES_CASES))
def test_npu_fused_infer_attention_score_d_unequal_ones(case):
    qs, ks, vs, heads, layout, kw, out_shape = ONES_CASES[case]
    dtype = torch.bfloat16 if layout == "TND" else torch.float16
    out = torch_npu.npu_fused_infer_attention_score(
        *to_device(_ones(*qs, dtype=dtype), _ones(*ks, dtype=dtype), _ones(*vs, dtype=dtype)), num_heads=heads,
        input_layout=layout, scale=SCALE, pre_tokens=65535, next_tokens=65535, softmax_lse_flag=False, **kw)[0]
    assert torch.equal(on_cpu(out), _ones(*out_shape, dtype=dtype))


# ---- beyond upstream's file ------------------------------------------------------------------------------------

def _bsnd_inputs(seed=8, B=2, Sq=5, Skv=9, N=4, N2=2, D=16, vD=8):
    return (_randn(B, Sq, N, D, dtype=torch.float32, seed=seed), _randn(B, Skv, N2, D, dtype=torch.float32,
                                                                         seed=seed + 1),
            _randn(B, Skv, N2, vD, dtype=torch.float32, seed=seed + 2))


@pytest.mark.parametrize("layout", ["BSH_BNSD", "BSND_BNSD", "BSH_NBSD", "BSND_NBSD", "BNSD_NBSD", "NSD"])
def test_input_output_layouts_match_the_plain_layout(layout):
    q, k, v = _bsnd_inputs()
    if layout == "NSD":
        q, k, v = q[:1], k[:1], v[:1]
    kw = dict(num_heads=4, num_key_value_heads=2, scale=0.3, softmax_lse_flag=True)
    ref, ref_lse = torch_npu.npu_fused_infer_attention_score(*to_device(q, k, v), input_layout="BSND", **kw)
    ref = on_cpu(ref)                                                    # [B, S, N, vD]
    src = layout.split("_")[0]
    if src == "BSH":
        args = (q.flatten(2), k.flatten(2), v.flatten(2))
    elif src in ("BNSD", "NSD"):
        args = tuple(t.transpose(1, 2) for t in (q, k, v))
        args = tuple(t[0] for t in args) if src == "NSD" else args
    else:
        args = (q, k, v)
    out, lse = torch_npu.npu_fused_infer_attention_score(*to_device(*args), input_layout=layout, **kw)
    want = {"BNSD": ref.transpose(1, 2), "NBSD": ref.permute(2, 0, 1, 3), "NSD": ref[0].transpose(0, 1)}
    assert torch.equal(on_cpu(out), want[layout.split("_")[-1]])
    assert torch.equal(on_cpu(lse), on_cpu(ref_lse))


def test_ntd_and_tnd_ntd_layouts_match_tnd():
    q, k, v = _randn(12, 4, 16, dtype=torch.float32), _randn(10, 2, 16, dtype=torch.float32, seed=1), \
        _randn(10, 2, 8, dtype=torch.float32, seed=2)
    kw = dict(num_heads=4, scale=0.3, actual_seq_lengths=[5, 12], actual_seq_lengths_kv=[4, 10], sparse_mode=3,
              atten_mask=to_device(torch.ones(2048, 2048, dtype=torch.bool).triu(1)), softmax_lse_flag=True)
    ref, ref_lse = (on_cpu(t) for t in torch_npu.npu_fused_infer_attention_score(*to_device(q, k, v),
                                                                                   input_layout="TND", **kw))
    ntd = [t.transpose(0, 1).contiguous() for t in (q, k, v)]
    for layout, args, want in (("NTD", ntd, ref.transpose(0, 1)), ("NTD_TND", ntd, ref),
                               ("TND_NTD", (q, k, v), ref.transpose(0, 1))):
        out, lse = torch_npu.npu_fused_infer_attention_score(*to_device(*args), input_layout=layout, **kw)
        assert torch.equal(on_cpu(out), want), layout
        assert torch.equal(on_cpu(lse), ref_lse), layout


LENGTH_FORMS = {
    "list": lambda x: list(x),
    "cpu_int32": lambda x: torch.tensor(x, dtype=torch.int32),
    "device": lambda x: to_device(torch.tensor(x, dtype=torch.int64)),
}


@pytest.mark.parametrize("form", list(LENGTH_FORMS))
def test_length_forms(form):
    q, k, v = _bsnd_inputs(seed=11)
    make = LENGTH_FORMS[form]
    kw = dict(num_heads=4, num_key_value_heads=2, scale=0.3, input_layout="BSND")
    want = on_cpu(torch_npu.npu_fused_infer_attention_score(*to_device(q, k, v), actual_seq_lengths=[3, 5],
                                                            actual_seq_lengths_kv=[9, 2], **kw)[0])
    out = torch_npu.npu_fused_infer_attention_score(*to_device(q, k, v), actual_seq_lengths=make([3, 5]),
                                                    actual_seq_lengths_kv=make([9, 2]), **kw)[0]
    assert torch.equal(on_cpu(out), want)
    longer = torch_npu.npu_fused_infer_attention_score(*to_device(q, k, v), actual_seq_lengths=make([3, 5, 1]),
                                                       actual_seq_lengths_kv=make([9, 2, 7]), **kw)[0]
    assert torch.equal(on_cpu(longer), want)
    # TND, paged: the per-sequence KV lengths in every form
    qt, kc = _randn(2, 4, 16, dtype=torch.float32, seed=12), _randn(4, 16, 2 * 16, dtype=torch.float32, seed=13)
    table = to_device(torch.tensor([[2, 0], [3, 1]], dtype=torch.int32))
    paged = torch_npu.npu_fused_infer_attention_score(
        *to_device(qt, kc, kc), block_table=table, block_size=16, actual_seq_lengths=make([1, 2]),
        actual_seq_lengths_kv=make([20, 7]), num_heads=4, num_key_value_heads=2, scale=0.3, input_layout="TND")[0]
    contiguous = torch_npu.npu_fused_infer_attention_score(
        *to_device(qt, torch.cat([kc[2], kc[0][:4], kc[3][:7]]).view(27, 2, 16),
                   torch.cat([kc[2], kc[0][:4], kc[3][:7]]).view(27, 2, 16)),
        actual_seq_lengths=[1, 2], actual_seq_lengths_kv=[20, 27], num_heads=4, num_key_value_heads=2, scale=0.3,
        input_layout="TND")[0]
    torch.testing.assert_close(on_cpu(paged), on_cpu(contiguous), atol=1e-6, rtol=1e-6)


@pytest.mark.skipif(DEVICE != "npu", reason="npu length tensors next to CPU inputs need the npu device")
def test_npu_lengths_with_cpu_inputs():
    q, k, v = _bsnd_inputs(seed=14)
    kw = dict(num_heads=4, num_key_value_heads=2, scale=0.3, input_layout="BSND")
    want = torch_npu.npu_fused_infer_attention_score(q, k, v, actual_seq_lengths=[3, 5],
                                                     actual_seq_lengths_kv=[9, 2], **kw)[0]
    out = torch_npu.npu_fused_infer_attention_score(q, k, v, actual_seq_lengths=to_device(torch.tensor([3, 5])),
                                                    actual_seq_lengths_kv=to_device(torch.tensor([9, 2])), **kw)[0]
    assert out.device.type == "cpu" and torch.equal(out, want)


def test_decode_branch_ignores_band_sparse_mode_and_query_lengths():
    # Upstream: with Q_S = 1 (no rope) pre_tokens, next_tokens and sparse_mode have no effect; actual_seq_lengths
    # has none outside TND. Kept for sparse_modes 0-3; sparse_mode 4's window applies (docs/inference.md).
    q, k, v = _bsnd_inputs(seed=15, Sq=1)
    kw = dict(num_heads=4, num_key_value_heads=2, scale=0.3, input_layout="BSND", actual_seq_lengths_kv=[9, 4])
    want = on_cpu(torch_npu.npu_fused_infer_attention_score(*to_device(q, k, v), **kw)[0])
    mask = to_device(torch.ones(2048, 2048, dtype=torch.bool).triu(1))
    for extra in (dict(sparse_mode=2, atten_mask=mask), dict(sparse_mode=3, atten_mask=mask),
                  dict(pre_tokens=0, next_tokens=0), dict(actual_seq_lengths=[0, 0])):
        out = torch_npu.npu_fused_infer_attention_score(*to_device(q, k, v), **kw, **extra)[0]
        assert torch.equal(on_cpu(out), want), extra
    # sparse_mode 4, pre_tokens = next_tokens = 0: each sequence's query sees only its last key
    out = on_cpu(torch_npu.npu_fused_infer_attention_score(*to_device(q, k, v), sparse_mode=4, atten_mask=mask,
                                                           pre_tokens=0, next_tokens=0, **kw)[0])
    last = torch.stack([v[0, 8], v[1, 3]]).repeat_interleave(2, 1)          # [B, N, vD]
    torch.testing.assert_close(out[:, 0], last)


def test_sparse_modes_2_to_4_need_the_optimised_mask():
    # Upstream: modes 2-4 take the optimised (2048, 2048) mask, also as (1, 2048, 2048) or (1, 1, 2048, 2048);
    # none, or another shape, is an error.
    q, k, v = _bsnd_inputs(seed=19)
    kw = dict(num_heads=4, num_key_value_heads=2, scale=0.3, input_layout="BSND", sparse_mode=3)
    causal = torch.ones(2048, 2048, dtype=torch.bool).triu(1)
    outs = [on_cpu(torch_npu.npu_fused_infer_attention_score(*to_device(q, k, v), atten_mask=to_device(m), **kw)[0])
            for m in (causal, causal[None], causal[None, None])]
    assert torch.equal(outs[0], outs[1]) and torch.equal(outs[0], outs[2])
    for bad in (None, to_device(causal[:5, :9])):
        with pytest.raises(ValueError, match="sparse_mode=3.*atten_mask"):
            torch_npu.npu_fused_infer_attention_score(*to_device(q, k, v), atten_mask=bad, **kw)
        with pytest.raises(RuntimeError, match="sparse_mode=3.*atten_mask"):
            torch_npu.npu_prompt_flash_attention(*to_device(q, k, v), atten_mask=bad, num_heads=4,
                                                 num_key_value_heads=2, input_layout="BSND", sparse_mode=3)


def test_bad_layout_is_an_argument_error():
    q, k, v = to_device(*_bsnd_inputs())
    with pytest.raises(RuntimeError, match="input_layout"):
        torch_npu.npu_fused_infer_attention_score(q, k, v, num_heads=4, input_layout="SBH")
    with pytest.raises(ValueError, match="input_layout"):
        torch_npu.npu_fused_infer_attention_score(q, k, v, num_heads=4, input_layout="NBSD")


def test_scale_default_and_math_sqrt_scale():
    # The doc's first example: MHA prefill, BNSD, scale 1/sqrt(D), act lengths given as one-element lists.
    q, k, v = (_randn(1, 8, 20, 128, dtype=torch.float16, seed=s) for s in (16, 17, 18))
    out, _ = torch_npu.npu_fused_infer_attention_score(*to_device(q, k, v), actual_seq_lengths=[20],
                                                       actual_seq_lengths_kv=[20], num_heads=8, input_layout="BNSD",
                                                       scale=1.0 / math.sqrt(128), pre_tokens=65535,
                                                       next_tokens=65535)
    _check_out(out, q, k, v, 1.0 / math.sqrt(128))
