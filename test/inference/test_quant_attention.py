"""Quantised attention in npu_prompt_flash_attention, npu_fused_infer_attention_score (v1, v2) and
npu_incre_flash_attention: int8 output (quant_scale2 / quant_offset2, v2's quant_scale_out / quant_offset_out), full
quantisation (int8 query / key / value with dequant_scale1, quant_scale1, dequant_scale2) and the shared prefix
(key_shared_prefix / value_shared_prefix / actual_shared_prefix_len).

References, independent of the implementation, in plain PyTorch:
* int8 output: float64 attention (test/common/reference.py), then round_half_even(y·scale + offset) saturated to
  [-128, 127]. The op quantises its own float result (in the query's dtype), so an element may differ by 1 where the
  float64 value y·scale + offset lies within the float path's own error (max|ours_float − ref64|·|scale|, plus
  float32 rounding) of a .5 tie; every other element must be equal.
* full quantisation: upstream's documented arithmetic in float64 (exact Q·Kᵀ, P = exp(s − running row max) over
  1024-key tiles quantised with quant_scale1, exact P8·V, dequant_scale2, divided by the row sum); the "same dtype"
  reference is the same formula with the fp16 stages upstream's arithmetic has (fp16 scores, P rounded to fp16),
  written per sequence and head. Tolerance rule: max|ours − ref64| ≤ 2·max|same − ref64| + 1e-5.
* shared prefix: float64 attention on keys / values with the prefix concatenated by hand, tolerance rule against
  the same in the query's dtype; and bit equality with the op on the concatenated tensors.
Bad inputs: one test per rule.
"""
import math

import pytest
import torch

import torch_ops_transformer as tot
from test.common.reference import MAX_TOKENS, check_tolerance, max_abs_err, visible_keys

DT = {"fp16": torch.float16, "bf16": torch.bfloat16}


def _g(seed):
    return torch.Generator().manual_seed(seed)


def _randn(*shape, seed=0, dtype=torch.float32):
    return torch.randn(*shape, generator=_g(seed)).to(dtype)


def _optimised_mask():
    return torch.ones(2048, 2048, dtype=torch.bool).triu(1)


# ================================================================================================================
# int8 output
# ================================================================================================================

def _bnsd(t, layout, heads):
    if layout == "BSH":
        return t.unflatten(-1, (heads, -1)).transpose(1, 2)
    return t.transpose(1, 2) if layout == "BSND" else t


def _attend(q, k, v, vis, scale, dtype=torch.float64):
    """Plain attention on BNSD q [B,N1,Sq,D], k/v [B,N2,Skv,D] with visibility vis [B,1,Sq,Skv] in `dtype` (the
    softmax in float32 for a 16-bit dtype); a row that sees no key gives 0."""
    g = q.shape[1] // k.shape[1]
    q, k, v = q.to(dtype), k.repeat_interleave(g, 1).to(dtype), v.repeat_interleave(g, 1).to(dtype)
    s = (q @ k.transpose(-1, -2)) * scale
    work = torch.float64 if dtype == torch.float64 else torch.float32
    s = s.to(work).masked_fill(~vis, -math.inf)
    seen = vis.any(-1, keepdim=True)
    p = torch.where(seen, torch.softmax(torch.where(seen, s, torch.zeros_like(s)), -1), torch.zeros_like(s))
    return (p.to(dtype) @ v).to(dtype)


def _out_layout(t, layout):
    """BNSD -> the result layout of `layout` (BNSD_BSND gives BSND)."""
    if layout == "BSH":
        return t.transpose(1, 2).flatten(2)
    if layout in ("BSND", "BNSD_BSND"):
        return t.transpose(1, 2)
    return t


def _expected_int8(ref64, scale, offset):
    y = ref64 * scale.double() + (offset.double() if offset is not None else 0.0)
    return y, torch.round(y).clamp(-128, 127)


def _check_int8(name, ours, ours_float, ref64, scale, offset, near_ties_only=True):
    """ours: int8; ours_float: the same call's float result; ref64: the float64 attention (same shape). With
    near_ties_only=False (full quantisation, whose fp16 result is far less precise than the int8 step) an element may
    differ from the float64 expectation by up to max|ours_float − ref64|·|scale| + 1 instead."""
    assert ours.dtype == torch.int8 and ours.shape == ref64.shape
    y, want = _expected_int8(ref64, scale, offset)
    err_f = max_abs_err(ours_float, ref64)
    slack = err_f * float(scale.double().abs().max()) + 1e-6 * (1 + y.abs())
    diff = ours.double() - want
    near_tie = ((y - torch.floor(y)) - 0.5).abs() <= slack
    if near_ties_only:
        bad = (diff != 0) & ~(near_tie & (diff.abs() <= 1))
    else:
        bad = diff.abs() > err_f * float(scale.double().abs().max()) + 1
    assert not bad.any(), (f"{name}: {int(bad.sum())} int8 elements differ beyond the near-tie allowance, e.g. "
                           f"ours {ours[bad][:4].tolist()} vs {want[bad][:4].tolist()} (y = {y[bad][:4].tolist()})")
    # the quantisation of the float result itself is exact (float64 rounding of the same values)
    y_f, want_f = _expected_int8(ours_float.double(), scale, offset)
    exact_tie = ((y_f - torch.floor(y_f)) - 0.5).abs() < 1e-5
    assert not ((ours.double() != want_f) & ~exact_tie).any(), f"{name}: quantisation of the float result differs"
    if near_ties_only:
        assert (diff != 0).float().mean() < 0.05, f"{name}: too many near-tie flips"


def _scale_for(out_shape_nd, per_channel, seed, dtype=torch.float32, with_offset=True):
    n, d = out_shape_nd
    if per_channel:
        s = torch.rand(n, d, generator=_g(seed)) * 60 + 20
        o = torch.randint(-5, 6, (n, d), generator=_g(seed + 1)).float()
    else:
        s = torch.tensor([47.0])
        o = torch.tensor([3.0])
    return s.to(dtype), (o.to(dtype) if with_offset else None)


INT8_OUT = [
    # (api, layout, dtype, per_channel, offset, sq)
    ("pfa", "BNSD", "bf16", False, True, 16),
    ("pfa", "BSH", "fp16", True, True, 16),
    ("pfa", "BNSD_BSND", "fp16", True, False, 16),
    ("fia", "BSND", "bf16", True, True, 16),
    ("fia", "BNSD", "fp16", False, False, 1),
    ("fia", "BSH", "bf16", True, True, 1),
]


def _float_inputs(layout, dtype, sq, b=2, n1=4, n2=2, d=64, skv=40, seed=0):
    q = _randn(b, n1, sq, d, seed=seed)
    k = _randn(b, n2, skv, d, seed=seed + 1)
    v = _randn(b, n2, skv, d, seed=seed + 2)

    def to(t, heads):
        if layout == "BSH":
            return t.transpose(1, 2).flatten(2)
        if layout == "BSND":
            return t.transpose(1, 2)
        return t
    return (to(q, n1).contiguous().to(dtype), to(k, n2).contiguous().to(dtype), to(v, n2).contiguous().to(dtype))


@pytest.mark.parametrize("api,layout,dtype,per_channel,offset,sq", INT8_OUT,
                         ids=[f"{a}-{lay}-{dt}-{'pc' if pc else 'pt'}-{'off' if o else 'sym'}-sq{sq}"
                              for a, lay, dt, pc, o, sq in INT8_OUT])
def test_int8_output(api, layout, dtype, per_channel, offset, sq):
    in_layout = layout.split("_")[0]
    q, k, v = _float_inputs(in_layout, DT[dtype], sq)
    n1, n2, d, scale = 4, 2, 64, 0.125
    s, o = _scale_for((n1, d), per_channel, 3, with_offset=offset)
    kv_lens = [40, 23]
    if api == "pfa":
        kw = dict(num_heads=n1, num_key_value_heads=n2, scale_value=scale, input_layout=layout,
                  actual_seq_lengths_kv=kv_lens, next_tokens=MAX_TOKENS)
        f = tot.npu_prompt_flash_attention(q, k, v, **kw)
        ours = tot.npu_prompt_flash_attention(q, k, v, quant_scale2=s, quant_offset2=o, **kw)
    else:
        kw = dict(num_heads=n1, num_key_value_heads=n2, scale=scale, input_layout=layout,
                  actual_seq_lengths_kv=kv_lens)
        f, _ = tot.npu_fused_infer_attention_score(q, k, v, **kw)
        ours, _ = tot.npu_fused_infer_attention_score(q, k, v, quant_scale2=s, quant_offset2=o, **kw)
    qb, kb, vb = _bnsd(q, in_layout, n1), _bnsd(k, in_layout, n2), _bnsd(v, in_layout, n2)
    vis = _vis(2, sq, 40, 0, MAX_TOKENS, MAX_TOKENS, [sq, sq], kv_lens)
    ref64 = _out_layout(_attend(qb, kb, vb, vis, scale), layout)
    same = _out_layout(_attend(qb, kb, vb, vis, scale, DT[dtype]), layout)
    check_tolerance("float result", f, ref64, same)
    # per-channel factors broadcast over the result's (N, D)
    out_layout = "BSND" if layout == "BNSD_BSND" else layout
    shape = {"BSH": (1, 1, n1 * d), "BSND": (1, 1, n1, d), "BNSD": (1, n1, 1, d)}[out_layout]
    sb = s.reshape(shape) if per_channel else s
    ob = (o.reshape(shape) if per_channel else o) if o is not None else None
    _check_int8(f"{api}-{layout}", ours, f, ref64, sb, ob)


def test_int8_output_bf16_factors_and_upstream_shapes():
    # bfloat16 factors with a bfloat16 query; per-channel (1, N, 1, D) as upstream suggests for BNSD
    q, k, v = _float_inputs("BNSD", torch.bfloat16, 8)
    s = (torch.rand(1, 4, 1, 64, generator=_g(1)) * 40 + 10).bfloat16()
    o = torch.randint(-3, 4, (1, 4, 1, 64), generator=_g(2)).bfloat16()
    kw = dict(num_heads=4, num_key_value_heads=2, scale=0.125, input_layout="BNSD")
    f, _ = tot.npu_fused_infer_attention_score(q, k, v, **kw)
    ours, _ = tot.npu_fused_infer_attention_score(q, k, v, quant_scale2=s, quant_offset2=o, **kw)
    ref64 = _attend(q, k, v, torch.ones(2, 1, 8, 40, dtype=torch.bool), 0.125)
    _check_int8("bf16 factors", ours, f, ref64, s.double(), o.double())


def test_int8_output_saturates():
    q, k, v = _float_inputs("BNSD", torch.float16, 4)
    big = torch.tensor([1000.0])
    ours = tot.npu_prompt_flash_attention(q, k, v, quant_scale2=big, num_heads=4, num_key_value_heads=2,
                                          scale_value=0.125, input_layout="BNSD")
    f = tot.npu_prompt_flash_attention(q, k, v, num_heads=4, num_key_value_heads=2, scale_value=0.125,
                                       input_layout="BNSD")
    want = torch.round(f.double() * 1000).clamp(-128, 127)
    assert (ours == 127).any() and (ours == -128).any()
    assert torch.equal(ours.double(), want)


def test_int8_output_v2_equals_v1():
    q, k, v = _float_inputs("BSH", torch.bfloat16, 8)
    s, o = _scale_for((4, 64), True, 5)
    v1, _ = tot.npu_fused_infer_attention_score(q, k, v, num_heads=4, num_key_value_heads=2, scale=0.125,
                                                quant_scale2=s, quant_offset2=o)
    v2, _ = tot.npu_fused_infer_attention_score_v2(q, k, v, num_query_heads=4, num_key_value_heads=2,
                                                   softmax_scale=0.125, quant_scale_out=s, quant_offset_out=o)
    assert v2.dtype == torch.int8 and torch.equal(v1, v2)


@pytest.mark.parametrize("layout", ["BSH", "BNSD"])
def test_int8_output_incre_flash_attention(layout):
    b, n1, n2, d, skv = 3, 8, 2, 64, 50
    q, k, v = _float_inputs(layout, torch.float16, 1, b=b, n1=n1, n2=n2, d=d, skv=skv, seed=7)
    s, o = _scale_for((n1, d), True, 9)
    lens = [50, 17, 1]
    kw = dict(num_heads=n1, num_key_value_heads=n2, scale_value=d ** -0.5, input_layout=layout,
              actual_seq_lengths=lens)
    f = tot.npu_incre_flash_attention(q, k, v, **kw)
    ours = tot.npu_incre_flash_attention(q, k, v, quant_scale2=s, quant_offset2=o, **kw)
    qb, kb, vb = _bnsd(q, layout, n1), _bnsd(k, layout, n2), _bnsd(v, layout, n2)
    ref64 = _out_layout(_attend(qb, kb, vb, _vis(b, 1, skv, 0, MAX_TOKENS, MAX_TOKENS, [1] * b, lens), d ** -0.5),
                        layout)
    shape = (1, 1, n1 * d) if layout == "BSH" else (1, n1, 1, d)
    _check_int8("ifa", ours, f, ref64, s.reshape(shape), o.reshape(shape))


# ================================================================================================================
# Full quantisation
# ================================================================================================================

TILE = 1024


def _fp19(x: float) -> float:
    bits = torch.tensor([x], dtype=torch.float32).view(torch.int32) & -8192
    return float(bits.view(torch.float32))


def _full_quant_reference(q8, k8, v8, deq1, qs1, deq2, scale, vis, pse=None, fp16_stages=False):
    """Upstream's full-quantisation arithmetic for BNSD int8 q [B,N1,Sq,D], k/v [B,N2,Skv,D]; vis [B,N1|1,Sq,Skv].
    fp16_stages=False: float64 throughout (the float64 reference); True: scores and P rounded to fp16 as upstream's
    arithmetic does (the same-dtype reference). Returns (out float64 [B,N1,Sq,Dv], lse float64 [B,N1,Sq])."""
    b, n1, sq, _ = q8.shape
    n2, skv = k8.shape[1], k8.shape[2]
    g = n1 // n2
    deq1 = _fp19(deq1)
    out = torch.zeros(b, n1, sq, v8.shape[-1], dtype=torch.float64)
    lse = torch.full((b, n1, sq), -math.inf, dtype=torch.float64)
    for bi in range(b):
        for h in range(n1):
            qh = q8[bi, h].double()
            kh, vh = k8[bi, h // g].double(), v8[bi, h // g].double()
            s_int = qh @ kh.T                                         # exact
            if fp16_stages:
                s = (s_int * deq1).clamp(-65504, 65504).half() * torch.tensor(scale).half()
                if pse is not None:
                    s = s + pse[min(bi, pse.shape[0] - 1), h].half()
                s = s.double()
            else:
                s = s_int * deq1 * scale
                if pse is not None:
                    s = s + pse[min(bi, pse.shape[0] - 1), h].double()
            visible = vis[bi, min(h, vis.shape[1] - 1)]
            s = s.masked_fill(~visible, -math.inf)
            m = torch.full((sq, 1), -math.inf, dtype=torch.float64)
            l_sum = torch.zeros(sq, 1, dtype=torch.float64)
            o = torch.zeros(sq, vh.shape[-1], dtype=torch.float64)
            for c in range(0, skv, TILE):
                st = s[:, c:c + TILE]
                m_new = torch.maximum(m, st.max(-1, keepdim=True).values)
                base = torch.where(torch.isfinite(m_new), m_new, torch.zeros_like(m_new))
                p = torch.exp(st - base)
                a = torch.exp(m - base)
                l_sum = l_sum * a + p.sum(-1, keepdim=True)
                if fp16_stages:
                    p8 = torch.round((p.half() * torch.tensor(qs1).half()).double()).clamp(-128, 127)
                else:
                    p8 = torch.round(p * qs1).clamp(-128, 127)
                o = o * a + (p8 @ vh[c:c + TILE]) * deq2
                m = m_new
            seen = l_sum[:, 0] > 0
            out[bi, h][seen] = o[seen] / l_sum[seen]
            lse[bi, h][seen] = (m + torch.log(l_sum))[seen, 0]
    if fp16_stages:
        out = out.half().double()
    return out, lse


def _int8_qkv(b, n1, n2, sq, skv, d, seed):
    q = torch.randint(-127, 128, (b, n1, sq, d), generator=_g(seed), dtype=torch.int8)
    k = torch.randint(-127, 128, (b, n2, skv, d), generator=_g(seed + 1), dtype=torch.int8)
    v = torch.randint(-127, 128, (b, n2, skv, d), generator=_g(seed + 2), dtype=torch.int8)
    return q, k, v


def _vis(b, sq, skv, sparse_mode, pre, nxt, q_lens, kv_lens, mask=None):
    vis = torch.zeros(b, 1, sq, skv, dtype=torch.bool)
    for bi in range(b):
        ql, kl = q_lens[bi], kv_lens[bi]
        m = None if mask is None else (mask if mask.dim() == 2 else mask[bi, 0])[:ql, :kl].unsqueeze(0)
        vis[bi, 0, :ql, :kl] = visible_keys(ql, kl, sparse_mode, pre, nxt, m)[0]
    return vis


FULL = [
    # layout, b, n1, n2, sq, skv, d, sparse_mode, q_lens, kv_lens, mask, pse
    ("BNSD", 2, 4, 2, 8, 300, 64, 0, None, None, False, False),
    ("BSH", 2, 4, 4, 16, 200, 32, 3, [16, 9], [200, 120], False, False),
    ("BSND", 2, 4, 2, 12, 96, 64, 0, None, [96, 50], True, True),
    ("BNSD", 1, 2, 1, 4, 1500, 64, 0, None, None, False, False),      # two key tiles
    ("BNSD", 2, 4, 2, 1, 130, 64, 0, None, [130, 77], False, False),  # one query token (the decode branch)
]


def _to_layout(t, layout):
    if layout == "BSH":
        return t.transpose(1, 2).flatten(2).contiguous()
    if layout == "BSND":
        return t.transpose(1, 2).contiguous()
    return t


def _full_case(case, seed=11):
    layout, b, n1, n2, sq, skv, d, mode, q_lens, kv_lens, with_mask, with_pse = case
    q, k, v = _int8_qkv(b, n1, n2, sq, skv, d, seed)
    deq1 = 0.9 / (127.0 * 127.0 * math.sqrt(d) ** 0) * 4.0     # scores of a few units after the scale
    factors = dict(deq1=deq1, qs1=127.0, deq2=0.02 / 127.0)
    mask = None
    if with_mask:
        mask = torch.rand(sq, skv, generator=_g(seed + 5)) < 0.3
        mask[:, 0] = False
    pse = _randn(b, n1, sq, skv, seed=seed + 6).half() if with_pse else None
    return q, k, v, factors, mask, pse


@pytest.mark.parametrize("case", FULL, ids=[f"{c[0]}-sq{c[4]}-skv{c[5]}-mode{c[7]}{'-mask' if c[10] else ''}"
                                            f"{'-pse' if c[11] else ''}" for c in FULL])
def test_full_quant(case):
    layout, b, n1, n2, sq, skv, d, mode, q_lens, kv_lens, _, _ = case
    q, k, v, f, mask, pse = _full_case(case)
    scale = d ** -0.5
    atten = _optimised_mask() if mode == 3 else mask
    ours, lse = tot.npu_fused_infer_attention_score(
        _to_layout(q, layout), _to_layout(k, layout), _to_layout(v, layout), num_heads=n1, num_key_value_heads=n2,
        input_layout=layout, scale=scale, sparse_mode=mode, atten_mask=atten, pse_shift=pse,
        actual_seq_lengths=q_lens, actual_seq_lengths_kv=kv_lens, softmax_lse_flag=True,
        dequant_scale1=torch.tensor([f["deq1"]]), quant_scale1=torch.tensor([f["qs1"]]),
        dequant_scale2=torch.tensor([f["deq2"]]))
    assert ours.dtype == torch.float16
    ql = q_lens or [sq] * b
    kl = kv_lens or [skv] * b
    if sq == 1:
        ql = [1] * b
    vis = _vis(b, sq, skv, mode, MAX_TOKENS, MAX_TOKENS, ql, kl, mask)
    ref64, lse64 = _full_quant_reference(q, k, v, f["deq1"], f["qs1"], f["deq2"], scale, vis, pse)
    same, _ = _full_quant_reference(q, k, v, f["deq1"], f["qs1"], f["deq2"], scale, vis, pse, fp16_stages=True)
    check_tolerance("full quant", ours, _to_layout(ref64, layout), _to_layout(same, layout))
    finite = torch.isfinite(lse64)
    assert torch.equal(torch.isfinite(lse[..., 0]), finite)
    torch.testing.assert_close(lse[..., 0][finite].double(), lse64[finite], atol=2e-2, rtol=1e-3)


def test_full_quant_pfa_equals_fia_and_int8_output():
    case = ("BNSD", 2, 4, 2, 8, 300, 64, 0, None, None, False, False)
    q, k, v, f, _, _ = _full_case(case, seed=3)
    fac = dict(quant_scale1=torch.tensor([f["qs1"]]))
    pfa = tot.npu_prompt_flash_attention(q, k, v, num_heads=4, num_key_value_heads=2, input_layout="BNSD",
                                         scale_value=0.125, deq_scale1=torch.tensor([f["deq1"]]),
                                         deq_scale2=torch.tensor([f["deq2"]]), next_tokens=MAX_TOKENS, **fac)
    fia, _ = tot.npu_fused_infer_attention_score(q, k, v, num_heads=4, num_key_value_heads=2, input_layout="BNSD",
                                                 scale=0.125, dequant_scale1=torch.tensor([f["deq1"]]),
                                                 dequant_scale2=torch.tensor([f["deq2"]]), **fac)
    assert torch.equal(pfa, fia)
    s = torch.tensor([300.0])
    q8, _ = tot.npu_fused_infer_attention_score(q, k, v, num_heads=4, num_key_value_heads=2, input_layout="BNSD",
                                                scale=0.125, dequant_scale1=torch.tensor([f["deq1"]]),
                                                dequant_scale2=torch.tensor([f["deq2"]]), quant_scale2=s, **fac)
    vis = torch.ones(2, 1, 8, 300, dtype=torch.bool)
    ref64, _ = _full_quant_reference(q, k, v, f["deq1"], f["qs1"], f["deq2"], 0.125, vis)
    _check_int8("full quant + int8 out", q8, fia, ref64, s, None, near_ties_only=False)


def _packed(x: float) -> torch.Tensor:
    """torch_npu.npu_trans_quant_param's documented packing: FP19 bits in the low 32 bits, bit 46 set."""
    bits = int(torch.tensor([x]).view(torch.int32)) & 0xFFFFE000
    return torch.tensor([bits | (1 << 46)], dtype=torch.int64)


@pytest.mark.parametrize("dtype", [torch.int64, torch.uint64])
def test_full_quant_packed_scales(dtype):
    case = ("BSH", 1, 2, 2, 4, 64, 32, 0, None, None, False, False)
    q, k, v, f, _, _ = _full_case(case, seed=5)
    q, k, v = (_to_layout(t, "BSH") for t in (q, k, v))
    common = dict(num_heads=2, input_layout="BSH", scale=32 ** -0.5, quant_scale1=torch.tensor([f["qs1"]]))
    packed, _ = tot.npu_fused_infer_attention_score(q, k, v, dequant_scale1=_packed(f["deq1"]).to(dtype),
                                                    dequant_scale2=_packed(f["deq2"]).to(dtype), **common)
    floats, _ = tot.npu_fused_infer_attention_score(q, k, v, dequant_scale1=torch.tensor([f["deq1"]]),
                                                    dequant_scale2=torch.tensor([_fp19(f["deq2"])]), **common)
    assert torch.equal(packed, floats)


def test_full_quant_upstream_case():
    # op-plugin's test_npu_fused_infer_attention_score_v3_fullquant: all-ones int8, unit factors -> all ones
    q = torch.ones(1, 32, 2, 128, dtype=torch.int8)
    k = torch.ones(1, 32, 2048, 128, dtype=torch.int8)
    one = torch.ones(1)
    out, _ = tot.npu_fused_infer_attention_score(q, k, k, dequant_scale1=one, dequant_scale2=one, quant_scale1=one,
                                                 quant_scale2=one, num_heads=32, input_layout="BNSD",
                                                 scale=1 / 0.0078125, pre_tokens=65535, next_tokens=65535)
    assert out.dtype == torch.int8 and torch.equal(out, torch.ones(1, 32, 2, 128, dtype=torch.int8))


def test_full_quant_inner_precise_does_not_change_results():
    case = ("BNSD", 1, 2, 2, 4, 64, 32, 0, None, None, False, False)
    q, k, v, f, _, _ = _full_case(case, seed=8)
    kw = dict(num_heads=2, input_layout="BNSD", scale=0.2, dequant_scale1=torch.tensor([f["deq1"]]),
              quant_scale1=torch.tensor([f["qs1"]]), dequant_scale2=torch.tensor([f["deq2"]]))
    a, _ = tot.npu_fused_infer_attention_score(q, k, v, inner_precise=0, **kw)
    b, _ = tot.npu_fused_infer_attention_score(q, k, v, inner_precise=1, **kw)
    assert torch.equal(a, b)


# ================================================================================================================
# Shared prefix
# ================================================================================================================

PREFIX = [
    # layout, dtype, sq, skv, prefix_s, prefix_len, kv_lens, sparse_mode, mask
    ("BNSD", "bf16", 6, 40, 24, 17, [40, 12], 0, False),
    ("BSH", "fp16", 8, 32, 16, None, [32, 20], 3, False),
    ("BSND", "bf16", 5, 30, 10, 10, None, 0, True),
    ("BNSD", "fp16", 1, 50, 20, 7, [50, 3], 0, False),        # one query token
    ("BNSD_BSND", "bf16", 6, 40, 24, 0, [40, 12], 0, False),   # an empty prefix
]


def _concat_prefix(kp, vp, k, v, plen, axis):
    b = k.shape[0]
    expand = lambda p, t: p.narrow(axis, 0, plen).expand(*[b if i == 0 else (plen if i == axis else s)  # noqa: E731
                                                           for i, s in enumerate(t.shape)])
    return torch.cat([expand(kp, k), k], axis), torch.cat([expand(vp, v), v], axis)


@pytest.mark.parametrize("case", PREFIX, ids=[f"{c[0]}-{c[1]}-sq{c[2]}-P{c[5]}-mode{c[7]}" for c in PREFIX])
def test_shared_prefix(case):
    layout, dtype, sq, skv, ps, plen, kv_lens, mode, with_mask = case
    in_layout = layout.split("_")[0]
    b, n1, n2, d = 2, 4, 2, 64
    q, k, v = _float_inputs(in_layout, DT[dtype], sq, b=b, n1=n1, n2=n2, d=d, skv=skv, seed=21)
    axis = 2 if in_layout == "BNSD" else 1
    kp_shape, vp_shape = list(k.shape), list(v.shape)
    kp_shape[0] = vp_shape[0] = 1
    kp_shape[axis] = vp_shape[axis] = ps
    kp = _randn(*kp_shape, seed=31, dtype=DT[dtype])
    vp = _randn(*vp_shape, seed=32, dtype=DT[dtype])
    p = ps if plen is None else plen
    total = p + skv
    mask = None
    if with_mask:
        mask = torch.rand(sq, total, generator=_g(4)) < 0.3
        mask[:, 0] = False
    atten = _optimised_mask() if mode == 3 else mask
    kw = dict(num_heads=n1, num_key_value_heads=n2, scale=d ** -0.5, input_layout=layout, sparse_mode=mode,
              atten_mask=atten, softmax_lse_flag=True)
    ours, lse = tot.npu_fused_infer_attention_score(
        q, k, v, key_shared_prefix=kp, value_shared_prefix=vp,
        actual_shared_prefix_len=None if plen is None else [plen], actual_seq_lengths_kv=kv_lens, **kw)
    kc, vc = _concat_prefix(kp, vp, k, v, p, axis)
    lens_c = None if kv_lens is None else [p + x for x in kv_lens]
    direct, direct_lse = tot.npu_fused_infer_attention_score(q, kc, vc, actual_seq_lengths_kv=lens_c, **kw)
    assert torch.equal(ours, direct) and torch.equal(lse, direct_lse)
    lens = lens_c or [total] * b
    vis = _vis(b, sq, total, 0 if sq == 1 else mode, MAX_TOKENS, MAX_TOKENS, [sq] * b, lens, mask)
    qb, kb, vb = _bnsd(q, in_layout, n1), _bnsd(kc, in_layout, n2), _bnsd(vc, in_layout, n2)
    ref64 = _out_layout(_attend(qb, kb, vb, vis, d ** -0.5), layout)
    same = _out_layout(_attend(qb, kb, vb, vis, d ** -0.5, DT[dtype]), layout)
    check_tolerance("shared prefix", ours, ref64, same)


def test_shared_prefix_int8_kv_per_channel():
    # an int8 prefix with an int8 cache: the per-channel factors dequantise both
    b, n1, n2, d, skv, ps = 2, 4, 2, 64, 40, 16
    q = _randn(b, n1, 1, d, seed=1, dtype=torch.float16)
    k = torch.randint(-100, 100, (b, n2, skv, d), generator=_g(2), dtype=torch.int8)
    v = torch.randint(-100, 100, (b, n2, skv, d), generator=_g(3), dtype=torch.int8)
    kp = torch.randint(-100, 100, (1, n2, ps, d), generator=_g(4), dtype=torch.int8)
    vp = torch.randint(-100, 100, (1, n2, ps, d), generator=_g(5), dtype=torch.int8)
    sc = (torch.rand(1, n2, 1, d, generator=_g(6)) * 0.02).half()
    kw = dict(num_heads=n1, num_key_value_heads=n2, scale=d ** -0.5, input_layout="BNSD",
              key_antiquant_scale=sc, value_antiquant_scale=sc)
    ours, _ = tot.npu_fused_infer_attention_score(q, k, v, key_shared_prefix=kp, value_shared_prefix=vp,
                                                  actual_seq_lengths_kv=[40, 9], **kw)
    kc, vc = _concat_prefix(kp, vp, k, v, ps, 2)
    direct, _ = tot.npu_fused_infer_attention_score(q, kc, vc, actual_seq_lengths_kv=[56, 25], **kw)
    assert torch.equal(ours, direct)


# ================================================================================================================
# Bad inputs: one test per rule
# ================================================================================================================

def _fq():
    return _float_inputs("BNSD", torch.float16, 4)


def _fia(q, k, v, **kw):
    base = dict(num_heads=4, num_key_value_heads=2, scale=0.125, input_layout="BNSD")
    base.update(kw)
    return tot.npu_fused_infer_attention_score(q, k, v, **base)


def _i8():
    q, k, v = _int8_qkv(1, 4, 2, 4, 32, 64, 0)
    return q, k, v, dict(dequant_scale1=torch.tensor([1e-4]), quant_scale1=torch.tensor([127.0]),
                         dequant_scale2=torch.tensor([1e-4]))


def test_bad_offset_without_scale():
    with pytest.raises(ValueError, match=r"'quant_offset2' needs 'quant_scale2'"):
        _fia(*_fq(), quant_offset2=torch.zeros(1))


def test_bad_v2_offset_without_scale_names_v2_argument():
    q, k, v = _fq()
    with pytest.raises(ValueError, match=r"'quant_offset_out' needs 'quant_scale_out'"):
        tot.npu_fused_infer_attention_score_v2(q, k, v, num_query_heads=4, num_key_value_heads=2,
                                               input_layout="BNSD", quant_offset_out=torch.zeros(1))


def test_bad_bf16_scale_with_fp16_query():
    with pytest.raises(TypeError, match=r"'quant_scale2' must be torch.float32 .*got torch.bfloat16"):
        _fia(*_fq(), quant_scale2=torch.ones(1, dtype=torch.bfloat16))


def test_bad_offset_dtype():
    with pytest.raises(TypeError, match=r"'quant_offset2' must have the dtype of 'quant_scale2'"):
        _fia(*_fq(), quant_scale2=torch.ones(1), quant_offset2=torch.ones(1, dtype=torch.float64))


def test_bad_offset_shape():
    with pytest.raises(ValueError, match=r"'quant_offset2' must have the shape of 'quant_scale2' \(\[4, 64\]\)"):
        _fia(*_fq(), quant_scale2=torch.ones(4, 64), quant_offset2=torch.ones(256))


def test_bad_scale_numel():
    with pytest.raises(ValueError, match=r"'quant_scale2' must have one element .* or N\*D = 4\*64 elements"):
        _fia(*_fq(), quant_scale2=torch.ones(4, 32))


def test_bad_int8_output_band_with_negative_tokens():
    with pytest.raises(ValueError, match=r"sparse_mode=4 with a negative pre_tokens / next_tokens"):
        _fia(*_fq(), quant_scale2=torch.ones(1), sparse_mode=4, atten_mask=_optimised_mask(), next_tokens=-1)


def test_bad_scale_not_a_tensor():
    with pytest.raises(TypeError, match=r"'quant_scale2' must be a Tensor"):
        _fia(*_fq(), quant_scale2=2.0)


def test_bad_dequant_with_float_query():
    with pytest.raises(ValueError, match=r"'dequant_scale1' need an int8 query"):
        _fia(*_fq(), dequant_scale1=torch.ones(1))


def test_bad_int8_query_without_dequant_scale1():
    q, k, v, f = _i8()
    f.pop("dequant_scale1")
    with pytest.raises(ValueError, match=r"int8 query .* needs argument 'dequant_scale1'; got None"):
        _fia(q, k, v, **f)


def test_bad_int8_query_with_float_key():
    q, k, v, f = _i8()
    with pytest.raises(TypeError, match=r"needs an int8 'key'; got torch.float16"):
        _fia(q, k.half(), v, **f)


def test_bad_dequant_scale_not_per_tensor():
    q, k, v, f = _i8()
    f["dequant_scale2"] = torch.ones(2)
    with pytest.raises(ValueError, match=r"'dequant_scale2' must be per-tensor \(one element\); got shape \[2\]"):
        _fia(q, k, v, **f)


def test_bad_dequant_scale_dtype():
    q, k, v, f = _i8()
    f["dequant_scale1"] = torch.ones(1, dtype=torch.float16)
    with pytest.raises(TypeError, match=r"'dequant_scale1' must be float32 or the int64/uint64 packed form"):
        _fia(q, k, v, **f)


def test_bad_quant_scale1_dtype():
    q, k, v, f = _i8()
    f["quant_scale1"] = torch.ones(1, dtype=torch.int64)
    with pytest.raises(TypeError, match=r"'quant_scale1' must be float32; got torch.int64"):
        _fia(q, k, v, **f)


def test_bad_int8_query_paged():
    q, k, v, f = _i8()
    with pytest.raises(ValueError, match=r"int8 query .* cannot be combined with 'block_table'"):
        _fia(q, k, v, block_table=torch.zeros(1, 1, dtype=torch.int32), block_size=128,
             actual_seq_lengths_kv=[32], **f)


def test_bad_int8_query_tnd():
    q, k, v, f = _i8()
    with pytest.raises(ValueError, match=r"full quantisation .* supports input_layout BSH, BSND, BNSD"):
        _fia(q[0].transpose(0, 1).contiguous(), k[0].transpose(0, 1).contiguous(),
             v[0].transpose(0, 1).contiguous(), input_layout="TND", actual_seq_lengths=[4],
             actual_seq_lengths_kv=[32], **f)


def test_bad_int8_query_with_antiquant():
    q, k, v, f = _i8()
    with pytest.raises(ValueError, match=r"takes no KV antiquant factors; got 'key_antiquant_scale'"):
        _fia(q, k, v, key_antiquant_scale=torch.ones(2, 64), value_antiquant_scale=torch.ones(2, 64), **f)


def test_bad_incre_flash_attention_dequant():
    q, k, v = _float_inputs("BNSD", torch.float16, 1)
    with pytest.raises(ValueError, match=r"'quant_scale1' must be None: .*int8 query"):
        tot.npu_incre_flash_attention(q, k, v, num_heads=4, num_key_value_heads=2, input_layout="BNSD",
                                      quant_scale1=torch.ones(1))


def _prefix(q_dtype=torch.float16, **over):
    kp = _randn(1, 2, 8, 64, seed=3, dtype=q_dtype)
    kw = dict(key_shared_prefix=kp, value_shared_prefix=kp.clone())
    kw.update(over)
    return kw


def test_bad_prefix_key_only():
    kw = _prefix()
    kw.pop("value_shared_prefix")
    with pytest.raises(ValueError, match=r"'key_shared_prefix' and 'value_shared_prefix' must be given together"):
        _fia(*_fq(), **kw)


def test_bad_prefix_len_without_prefix():
    with pytest.raises(ValueError, match=r"'actual_shared_prefix_len' needs 'key_shared_prefix'"):
        _fia(*_fq(), actual_shared_prefix_len=[3])


def test_bad_prefix_batch():
    kp = _randn(2, 2, 8, 64, seed=3, dtype=torch.float16)
    with pytest.raises(ValueError, match=r"'key_shared_prefix' must have shape \[1, 2, 'prefix_S', 64\]"):
        _fia(*_fq(), key_shared_prefix=kp, value_shared_prefix=kp)


def test_bad_prefix_dtype():
    with pytest.raises(TypeError, match=r"'key_shared_prefix' must have the dtype of 'key' \(torch.float16\)"):
        _fia(*_fq(), **_prefix(torch.bfloat16))


def test_bad_prefix_len_too_long():
    with pytest.raises(ValueError, match=r"'actual_shared_prefix_len' must be in \[0, 8\].*got 9"):
        _fia(*_fq(), **_prefix(actual_shared_prefix_len=[9]))


def test_bad_prefix_paged():
    q, k, v = _fq()
    with pytest.raises(ValueError, match=r"shared prefix cannot be combined with 'block_table'"):
        _fia(q, k, v, block_table=torch.zeros(2, 1, dtype=torch.int32), block_size=128,
             actual_seq_lengths_kv=[40, 40], **_prefix())


def test_bad_prefix_tnd():
    q, k, v = _fq()
    with pytest.raises(ValueError, match=r"shared prefix needs input_layout BSH, BSND or BNSD"):
        _fia(q[0].transpose(0, 1).contiguous(), k[0].transpose(0, 1).contiguous(),
             v[0].transpose(0, 1).contiguous(), input_layout="TND", actual_seq_lengths=[4],
             actual_seq_lengths_kv=[40], **_prefix())


def test_bad_prefix_mask_too_short():
    q, k, v = _fq()
    with pytest.raises(ValueError, match=r"last dim of 'atten_mask' must be at least .* = 8 \+ 40 = 48"):
        _fia(q, k, v, atten_mask=torch.zeros(4, 40, dtype=torch.bool), **_prefix())


def test_bad_prefix_kv_length_counts_prefix():
    q, k, v = _fq()
    with pytest.raises(ValueError, match=r"'actual_seq_lengths_kv' counts the key's own tokens"):
        _fia(q, k, v, actual_seq_lengths_kv=[45, 10], **_prefix())


# ================================================================================================================
# torch.compile: one graph, the eager result
# ================================================================================================================

def test_compiles_to_one_graph():
    q8, k8, v8, fac = _i8()
    q, k, v = _fq()

    def fn(q8, k8, v8, q, k, v):
        full, lse = _fia(q8, k8, v8, softmax_lse_flag=True, **fac)
        out8, _ = _fia(q, k, v, quant_scale2=torch.full((4, 64), 40.0), quant_offset2=torch.ones(4, 64))
        return full, lse, out8

    eager = fn(q8, k8, v8, q, k, v)
    torch._dynamo.reset()
    try:
        compiled = torch.compile(fn, fullgraph=True, backend="aot_eager")(q8, k8, v8, q, k, v)
    finally:  # leave no compiled state or counters to tests that count graphs
        torch._dynamo.reset()
        torch._dynamo.utils.counters.clear()
    for a, b in zip(eager, compiled):
        assert torch.equal(a, b)


# ================================================================================================================
# v2: MLA full quantisation (int8 query / key / value, query_quant_mode 3, bf16 rope parts)
# ================================================================================================================
# Reference: upstream's formula in float64 on the integers and factors,
#   softmax((Q8·K8ᵀ + q_rope·k_ropeᵀ)·dsq[b, n, s]·dsk·scale + mask)·V8·dsv,
# with one latent KV head; the same-dtype reference is it rounded to bfloat16 (the output dtype).

MLA_D, MLA_DR = 512, 64


def _mla_reference(q8, dsq, qr, k8, kr, dsk, dsv, scale, vis):
    """q8 [B, N, Sq, D] int8, dsq [B, N, Sq], qr [B, N, Sq, Dr] bf16, k8 [B, Skv, D] (key = value), kr [B, Skv, Dr];
    vis [B, 1, Sq, Skv]. Returns (out float64 [B, N, Sq, D], lse [B, N, Sq, 1])."""
    k, r = k8.double().unsqueeze(1), kr.double().unsqueeze(1)
    s = (q8.double() @ k.transpose(-1, -2) + qr.double() @ r.transpose(-1, -2)) * dsq.double().unsqueeze(-1) \
        * float(dsk) * scale
    s = s.masked_fill(~vis, -math.inf)
    lse = torch.logsumexp(s, -1, keepdim=True)
    seen = vis.any(-1, keepdim=True)
    p = torch.where(seen, torch.exp(s - torch.where(seen, lse, torch.zeros_like(lse))), torch.zeros_like(s))
    return (p @ k) * float(dsv), torch.where(seen, lse, torch.full_like(lse, -math.inf))


def _mla_quant_inputs(b, n, sq, skv, seed=40):
    q8 = torch.randint(-127, 128, (b, n, sq, MLA_D), generator=_g(seed), dtype=torch.int8)
    dsq = (torch.rand(b, n, sq, generator=_g(seed + 1)) + 0.5) * 2e-4   # scores of a few units
    qr = _randn(b, n, sq, MLA_DR, seed=seed + 2, dtype=torch.bfloat16)
    k8 = torch.randint(-127, 128, (b, skv, MLA_D), generator=_g(seed + 3), dtype=torch.int8)
    kr = _randn(b, skv, MLA_DR, seed=seed + 4, dtype=torch.bfloat16)
    return q8, dsq, qr, k8, kr, torch.tensor([0.5]), torch.tensor([0.03])


def _paged(x, block, nz):
    """[B, Skv, Dx] -> a paged cache (B * Skv/block blocks, sequence b in blocks b*per .. , reversed order) as
    ND [blocks, block, 1, Dx] or NZ [blocks, 1, Dx/c0, block, c0], and its block table."""
    b, skv, dx = x.shape
    per = skv // block
    table = torch.arange(b * per, dtype=torch.int32).flip(0).reshape(b, per)
    cache = torch.empty(b * per, block, 1, dx, dtype=x.dtype)
    cache[table.flatten().long()] = x.reshape(b * per, block, 1, dx)
    if nz:
        c0 = 32 // x.element_size()
        cache = cache.reshape(b * per, block, 1, dx // c0, c0).permute(0, 2, 3, 1, 4).contiguous()
    return cache, table


MLA_QUANT = [
    # input_layout, b, n, sq, skv, sparse_mode, kv_lens, cache ("nd", "paged", "nz")
    ("BSND_NBSD", 3, 4, 1, 64, 0, [64, 17, 40], "nz"),      # vLLM-Ascend's decode call
    ("BSND", 2, 2, 3, 64, 3, [64, 30], "paged"),            # multi-token prediction: causal over the last rows
    ("BSH", 2, 2, 2, 48, 0, None, "nd"),
    ("TND", 2, 4, 4, 64, 3, [64, 37], "paged"),
    ("BNSD", 1, 8, 1, 96, 0, [70], "nz"),
]


def _mla_call_inputs(layout, q8, dsq, qr, k8, kr, cache, block):
    base = layout.split("_")[0]
    b, n, sq, _ = q8.shape

    def q_form(t, per_token=False):                      # BNSD query-side tensors in the call's layout
        if base == "BNSD":
            return t
        t = t.transpose(1, 2)                             # [B, S, N, ...]
        if base == "TND":
            return t.flatten(0, 1)
        if base == "BSH" and not per_token:
            return t.flatten(2)
        return t

    q, r = q_form(q8), q_form(qr)
    scale_q = q_form(dsq.unsqueeze(-1), per_token=True).squeeze(-1)
    kw = {}
    if cache == "nd":
        k, krope = k8, kr                                 # BSH with one KV head: [B, Skv, 512]
        if base == "BNSD":
            k, krope = k8.unsqueeze(1), kr.unsqueeze(1)
        elif base in ("BSND", "TND"):
            k, krope = k8.unsqueeze(2), kr.unsqueeze(2)
    else:
        k, table = _paged(k8, block, cache == "nz")
        krope, _ = _paged(kr, block, cache == "nz")
        kw = dict(block_table=table, block_size=block)
    return q, scale_q, r, k, krope, kw


@pytest.mark.parametrize("case", MLA_QUANT, ids=[f"{c[0]}-{c[7]}-sq{c[3]}-mode{c[5]}" for c in MLA_QUANT])
def test_v2_mla_full_quant(case):
    layout, b, n, sq, skv, mode, kv_lens, cache = case
    q8, dsq, qr, k8, kr, dsk, dsv = _mla_quant_inputs(b, n, sq, skv)
    q, scale_q, r, k, krope, kw = _mla_call_inputs(layout, q8, dsq, qr, k8, kr, cache, block=16)
    scale = 1 / math.sqrt(MLA_D + MLA_DR)
    lens = kv_lens or [skv] * b
    if layout.startswith("TND"):
        kw["actual_seq_qlen"] = [sq * (i + 1) for i in range(b)]
    if mode == 3:
        kw["atten_mask"] = _optimised_mask()
    out, lse = tot.npu_fused_infer_attention_score_v2(
        q, k, k, query_rope=r, key_rope=krope, num_query_heads=n, num_key_value_heads=1, input_layout=layout,
        softmax_scale=scale, sparse_mode=mode, actual_seq_kvlen=kv_lens, query_quant_mode=3,
        dequant_scale_query=scale_q, dequant_scale_key=dsk, dequant_scale_value=dsv, return_softmax_lse=True,
        out_dtype=torch.bfloat16, **kw)
    vis = _vis(b, sq, skv, mode, MAX_TOKENS, MAX_TOKENS, [sq] * b, lens)
    ref, ref_lse = _mla_reference(q8, dsq, qr, k8, kr, dsk, dsv, scale, vis)
    assert out.dtype == torch.bfloat16
    if layout == "BSND_NBSD":
        ref = ref.permute(1, 0, 2, 3)                     # NBSD
    elif layout == "TND":
        ref, ref_lse = ref.transpose(1, 2).flatten(0, 1), ref_lse.transpose(1, 2).flatten(0, 1)
    elif layout != "BNSD":
        ref = _out_layout(ref, layout)
    check_tolerance(f"mla-full-quant {case}", out, ref, ref.to(torch.bfloat16))
    assert lse.shape == ref_lse.shape
    assert max_abs_err(lse, ref_lse) <= 1e-4


def test_v2_mla_full_quant_value_factor_and_separate_value():
    # value given as its own int8 tensor (same integers) and a different dequant_scale_value: out scales with it
    q8, dsq, qr, k8, kr, dsk, _ = _mla_quant_inputs(1, 2, 1, 32, seed=50)
    q, scale_q, r, k, krope, _ = _mla_call_inputs("BNSD", q8, dsq, qr, k8, kr, "nd", 16)
    call = lambda value, dsv: tot.npu_fused_infer_attention_score_v2(  # noqa: E731
        q, k, value, query_rope=r, key_rope=krope, num_query_heads=2, num_key_value_heads=1, input_layout="BNSD",
        softmax_scale=0.05, query_quant_mode=3, dequant_scale_query=scale_q, dequant_scale_key=dsk,
        dequant_scale_value=dsv)[0]
    a, b2 = call(k, torch.tensor([0.25])), call(k.clone(), torch.tensor([0.5]))
    assert torch.equal(b2, (a.float() * 2).bfloat16())


# ---- bad inputs of MLA full quantisation: one per rule ----

def _mla_bad_call(**over):
    q8, dsq, qr, k8, kr, dsk, dsv = _mla_quant_inputs(1, 2, 1, 32, seed=60)
    q, scale_q, r, k, krope, _ = _mla_call_inputs("BNSD", q8, dsq, qr, k8, kr, "nd", 16)
    kw = dict(query_rope=r, key_rope=krope, num_query_heads=2, num_key_value_heads=1, input_layout="BNSD",
              query_quant_mode=3, dequant_scale_query=scale_q, dequant_scale_key=dsk, dequant_scale_value=dsv)
    q, k, v = over.pop("query", q), over.pop("key", k), over.pop("value", k)
    kw.update(over)
    kw = {name: value for name, value in kw.items() if value is not ...}   # `...` drops an argument
    return tot.npu_fused_infer_attention_score_v2(q, k, v, **kw)


_FQ = torch.randn(1, 2, 1, MLA_D)
BAD_MLA_QUANT = [
    # (exception, regex, overrides)
    (ValueError, "'query_quant_mode' must be 0 .* or 3", dict(query_quant_mode=1)),
    (ValueError, "'query_quant_mode' needs an int8 query", dict(query=_FQ, dequant_scale_query=...,
                                                                dequant_scale_key=..., dequant_scale_value=...)),
    (ValueError, "'dequant_scale_query' needs an int8 query", dict(query=_FQ, query_quant_mode=0,
                                                                   dequant_scale_key=..., dequant_scale_value=...)),
    (NotImplementedError, "int8 'query' without query_rope.*'dequant_scale_key'", dict(query_rope=..., key_rope=...)),
    (ValueError, "needs 'query_quant_mode'=3", dict(query_quant_mode=0)),
    (TypeError, "needs an int8 'key'", dict(key=torch.randn(1, 1, 32, MLA_D))),
    (TypeError, "bfloat16 'query_rope'", dict(query_rope=torch.randn(1, 2, 1, MLA_DR, dtype=torch.float16))),
    (ValueError, "head dim D = 512.*'query'", dict(query=torch.zeros(1, 2, 1, 128, dtype=torch.int8),
                                                   key=torch.zeros(1, 1, 32, 128, dtype=torch.int8))),
    (ValueError, "'dequant_offset_key'", dict(dequant_offset_key=torch.tensor([0.0]))),
    (ValueError, "'quant_scale_out'", dict(quant_scale_out=torch.tensor([1.0]))),
    (ValueError, "'pse_shift'", dict(pse_shift=torch.zeros(1, 2, 1, 32, dtype=torch.bfloat16))),
    (ValueError, "'key_quant_mode' must be 0", dict(key_quant_mode=1)),
    (ValueError, "'sparse_mode'=4", dict(sparse_mode=4, atten_mask=_optimised_mask())),
    (ValueError, "needs 'dequant_scale_query'", dict(dequant_scale_query=...)),
    (TypeError, "'dequant_scale_query' must be float32", dict(dequant_scale_query=torch.ones(1, 2, 1).half())),
    (ValueError, r"'dequant_scale_query' must have the query's shape without D.*\[1, 2, 1\]",
     dict(dequant_scale_query=torch.ones(1, 2, 1, 1))),
    (ValueError, "needs 'dequant_scale_value'", dict(dequant_scale_value=...)),
    (ValueError, "'dequant_scale_key' must be per-tensor", dict(dequant_scale_key=torch.ones(2))),
    (TypeError, "'dequant_scale_key' must be float32", dict(dequant_scale_key=torch.ones(1).half())),
    (NotImplementedError, "'out_dtype'", dict(out_dtype=torch.float8_e5m2)),
]


@pytest.mark.parametrize("exc,pattern,over", BAD_MLA_QUANT, ids=[c[1][:40] for c in BAD_MLA_QUANT])
def test_bad_v2_mla_full_quant(exc, pattern, over):
    with pytest.raises(exc, match=pattern):
        _mla_bad_call(**dict(over))
