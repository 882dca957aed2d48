"""Quantised grouped matmul (`grouped_matmul_quant`, `npu_grouped_matmul` with int8 / int4 inputs) and
`grouped_matmul_swiglu_quant` against float64 references in plain PyTorch.

The references compute the exact integer products in float64 (|x·w| < 2^53) and apply the scales there. The
tolerance rule compares with the same computation done by torch in the output dtype (torch._int_mm, fp32 scales,
one rounding to the output dtype; for weight-only, the weight dequantised into x's dtype and torch.mm)."""
import pytest
import torch

import torch_ops_transformer as tot
from torch_ops_transformer import npu_grouped_matmul, npu_grouped_matmul_swiglu_quant

torch.manual_seed(0)


def _close(ours, torch_same, ref):
    """The tolerance rule: max|ours - ref64| <= 2 * max|torch_same_dtype - ref64| + 1e-5."""
    ours, torch_same = ours.double(), torch_same.double()
    err = (ours - ref).abs().max().item() if ref.numel() else 0.0
    bound = 2 * ((torch_same - ref).abs().max().item() if ref.numel() else 0.0) + 1e-5
    assert err <= bound, f"max|ours-ref64| {err} > {bound}"


def _i8(*shape):
    return torch.randint(-128, 128, shape, dtype=torch.int8)


def pack_int4(v):
    """[..., N] ints in [-8, 7] -> int32 [..., N/8], element j of each eight in bits 4j..4j+3."""
    nib = (v.long() & 0xF).reshape(*v.shape[:-1], v.shape[-1] // 8, 8)
    packed = (nib << (4 * torch.arange(8))).sum(-1)
    return ((packed + 2**31) % 2**32 - 2**31).to(torch.int32)


def pack_scale_int64(s):
    """npu_trans_quant_param's packing of an fp32 scale (no offset): the bits truncated to 19, bit 46 set. Returns
    the packed tensor and the fp32 value it carries."""
    bits = s.float().view(torch.int32).long() & 0xFFFFE000
    return bits | (1 << 46), (bits.to(torch.int32)).view(torch.float32)


def _ends(counts):
    return torch.cumsum(torch.tensor(counts), 0)


def ref_w8a8(x, w, counts, scale, pts=None, bias=None, experts=None):
    """float64 reference: rows of group g times w[experts[g]], (acc + int bias) * scale * pts (+ float bias)."""
    experts = experts or list(range(len(counts)))
    out = torch.zeros(x.shape[0], w.shape[-1], dtype=torch.float64)
    r = 0
    for g, c in enumerate(counts):
        e = experts[g]
        acc = x[r:r + c].double() @ w[e].double()
        if bias is not None and bias.dtype == torch.int32:
            acc = acc + bias[e].double()
        y = acc * scale[e].double()
        if pts is not None:
            y = y * pts[r:r + c].double()[:, None]
        if bias is not None and bias.dtype != torch.int32:
            y = y + bias[e].double()
        out[r:r + c] = y
        r += c
    return out


def torch_w8a8(x, w, counts, scale, odt, pts=None, bias=None, experts=None):
    """The same computation in torch at output precision: int32 GEMM, fp32 scales, one rounding."""
    experts = experts or list(range(len(counts)))
    out = torch.zeros(x.shape[0], w.shape[-1], dtype=odt)
    r = 0
    for g, c in enumerate(counts):
        e = experts[g]
        acc = torch._int_mm(x[r:r + c], w[e])
        if bias is not None and bias.dtype == torch.int32:
            acc = acc + bias[e]
        y = acc.float() * scale[e].float()
        if pts is not None:
            y = y * pts[r:r + c, None]
        if bias is not None and bias.dtype != torch.int32:
            y = y + bias[e].float()
        out[r:r + c] = y.to(odt)
        r += c
    return out


COUNTS = [5, 0, 17, 3]


@pytest.mark.parametrize("odt", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("scale_dtype", [torch.float32, torch.bfloat16, torch.int64])
@pytest.mark.parametrize("per_token", [True, False])
def test_w8a8_split_m(odt, scale_dtype, per_token):
    E, K, N = len(COUNTS), 64, 48
    x, w = _i8(sum(COUNTS), K), _i8(E, K, N)
    s = torch.rand(E, N) * 1e-3 + 1e-4
    if scale_dtype == torch.int64:
        s_arg, s = pack_scale_int64(s)
    else:
        s_arg = s.to(scale_dtype)
        s = s_arg.float()
    pts = torch.rand(x.shape[0]) + 0.5 if per_token else None
    got = npu_grouped_matmul([x], [w], scale=[s_arg], per_token_scale=[pts] if per_token else None,
                             group_list=_ends(COUNTS), split_item=3, group_type=0, output_dtype=odt)[0]
    assert got.dtype == odt and got.shape == (x.shape[0], N)
    _close(got, torch_w8a8(x, w, COUNTS, s, odt, pts), ref_w8a8(x, w, COUNTS, s, pts))


@pytest.mark.parametrize("bias_dtype", [torch.int32, torch.float32, torch.bfloat16])
@pytest.mark.parametrize("group_list_type", [0, 1, 2])
def test_w8a8_bias_and_group_list_types(bias_dtype, group_list_type):
    E, K, N = 4, 32, 40
    counts = [4, 0, 9, 6]
    x, w = _i8(sum(counts), K), _i8(E, K, N)
    s, pts = torch.rand(E, N) * 1e-3, torch.rand(x.shape[0]) + 0.5
    bias = torch.randint(-1000, 1000, (E, N), dtype=torch.int32) if bias_dtype == torch.int32 \
        else torch.randn(E, N).to(bias_dtype)
    experts = None
    if group_list_type == 0:
        gl = _ends(counts)
    elif group_list_type == 1:
        gl = torch.tensor(counts)
    else:  # (expert, count) pairs in any expert order
        experts = [2, 0, 3]
        counts = [9, 4, 6]
        gl = torch.tensor([[e, c] for e, c in zip(experts, counts)])
    got = npu_grouped_matmul([x], [w], bias=[bias], scale=[s], per_token_scale=[pts], group_list=gl, split_item=2,
                             group_type=0, group_list_type=group_list_type, output_dtype=torch.bfloat16)[0]
    _close(got, torch_w8a8(x, w, counts, s, torch.bfloat16, pts, bias, experts),
           ref_w8a8(x, w, counts, s, pts, bias, experts))


def test_w8a8_weight_lists_split_item_0_and_transposed_weight():
    K, N = 32, 24
    x = _i8(sum(COUNTS), K)
    w = [_i8(N, K).t() for _ in COUNTS]  # transposed (non-contiguous) weights, as torch_npu accepts
    s = [torch.rand(N) * 1e-2 for _ in COUNTS]
    pts = torch.rand(x.shape[0])
    got = npu_grouped_matmul([x], w, scale=s, per_token_scale=[pts], group_list=_ends(COUNTS), split_item=0,
                             group_type=0, output_dtype=torch.float32)
    assert [t.shape[0] for t in got] == COUNTS
    ws, ss = torch.stack(w), torch.stack(s)
    _close(torch.cat(got), torch_w8a8(x, ws.contiguous(), COUNTS, ss, torch.float32, pts),
           ref_w8a8(x, ws, COUNTS, ss, pts))


def test_w8a8_group_type_minus_one_and_several_x():
    xs = [_i8(3, 16), _i8(2, 5, 8)]
    ws = [_i8(16, 12), _i8(8, 12)]
    ss = [torch.rand(12) * 1e-2, torch.rand(1) * 1e-2]  # per channel and per tensor
    got = npu_grouped_matmul(xs, ws, scale=ss, group_type=-1, output_dtype=torch.float32)
    assert got[1].shape == (2, 5, 12)
    for xi, wi, si, gi in zip(xs, ws, ss, got):
        x2 = xi.reshape(-1, xi.shape[-1])
        ref = (x2.double() @ wi.double()) * si.double()
        _close(gi.reshape(ref.shape), (torch._int_mm(x2, wi).float() * si).float(), ref)
    # several x with group_type 0 and split_item 2: one concatenated output
    xs2 = [_i8(3, 16), _i8(4, 16)]
    cat = npu_grouped_matmul(xs2, [ws[0], _i8(16, 12)], scale=[ss[0], ss[0]], group_type=0, split_item=2,
                             output_dtype=torch.bfloat16)
    assert len(cat) == 1 and cat[0].shape == (7, 12)


def test_w8a8_int8_and_int32_outputs():
    E, K, N = 3, 64, 16
    counts = [7, 2, 5]
    x, w = _i8(sum(counts), K), _i8(E, K, N)
    bias = torch.randint(-100, 100, (E, N), dtype=torch.int32)
    raw = npu_grouped_matmul([x], [w], bias=[bias], group_list=torch.tensor(counts), split_item=3, group_type=0,
                             group_list_type=1, output_dtype=torch.int32)[0]
    assert raw.dtype == torch.int32
    exact = ref_w8a8(x, w, counts, torch.ones(E, N), bias=bias)
    assert torch.equal(raw.double(), exact)
    packed, s = pack_scale_int64(torch.rand(E, N) * 2e-3)
    q = npu_grouped_matmul([x], [w], bias=[bias], scale=[packed], group_list=_ends(counts), split_item=3,
                           group_type=0)[0]  # output_dtype None: int8 (torch_npu's per-channel requantisation)
    assert q.dtype == torch.int8
    ref = ref_w8a8(x, w, counts, s, bias=bias).round().clamp(-128, 127)
    assert (q.double() - ref).abs().max() <= 1  # fp32 vs fp64 products can straddle a .5


@pytest.mark.parametrize("act_type", [1, 2, 4, 5])
def test_w8a8_activation_per_token(act_type):
    E, K, N = 2, 32, 16
    counts = [6, 5]
    x, w = _i8(11, K), _i8(E, K, N)
    s, pts = torch.rand(E, N) * 1e-3, torch.rand(11)
    got = npu_grouped_matmul([x], [w], scale=[s], per_token_scale=[pts], group_list=_ends(counts), split_item=3,
                             group_type=0, act_type=act_type, output_dtype=torch.float32)[0]
    acts = {1: torch.relu, 2: lambda v: torch.nn.functional.gelu(v, approximate="tanh"),
            4: lambda v: v * torch.sigmoid(1.702 * v), 5: torch.nn.functional.silu}
    ref = acts[act_type](ref_w8a8(x, w, counts, s, pts))
    same = acts[act_type](torch_w8a8(x, w, counts, s, torch.float32, pts))
    _close(got, same, ref)


def test_group_list_shorter_than_x_leaves_zero_rows():
    E, K, N = 2, 16, 8
    x, w = _i8(10, K), _i8(E, K, N)
    s = torch.rand(E, N)
    got = npu_grouped_matmul([x], [w], scale=[s], group_list=torch.tensor([3, 4]), split_item=3, group_type=0,
                             group_list_type=1, output_dtype=torch.float32)[0]
    assert torch.equal(got[7:], torch.zeros(3, N))
    _close(got[:7], torch_w8a8(x[:7], w, [3, 4], s, torch.float32), ref_w8a8(x[:7], w, [3, 4], s))
    per_group = npu_grouped_matmul([x], [w], scale=[s], group_list=torch.tensor([3, 7]), split_item=0, group_type=0,
                                   output_dtype=torch.float32)
    assert [t.shape[0] for t in per_group] == [3, 4]


def ref_dequant(w, scale, offset):
    """float64 (w + offset) * scale; scale/offset [N] or [G, N] (groups of K/G rows)."""
    K, N = w.shape
    s = scale.double().reshape(-1, N)
    o = offset.double().reshape(-1, N) if offset is not None else torch.zeros_like(s)
    G = s.shape[0]
    return ((w.double().reshape(G, K // G, N) + o[:, None]) * s[:, None]).reshape(K, N)


def _weight_only_case(dtype, int4, groups, with_offset, with_bias):
    E, K, N = 3, 64, 32
    counts = [6, 0, 9]
    x = torch.randn(sum(counts), K).to(dtype)
    lo, hi = (-8, 8) if int4 else (-128, 128)
    wq = torch.randint(lo, hi, (E, K, N), dtype=torch.int8)
    shape = (E, N) if groups == 0 else (E, groups, N)
    s = (torch.rand(shape) * 0.02).to(dtype)
    o = torch.randn(shape).to(dtype) if with_offset else None
    b = torch.randn(E, N) if with_bias else None
    w_arg = pack_int4(wq) if int4 else wq
    return E, counts, x, wq, w_arg, s, o, b


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("int4,groups", [(False, 0), (True, 0), (True, 4), (False, 2)])
@pytest.mark.parametrize("with_offset", [True, False])
def test_weight_only(dtype, int4, groups, with_offset):
    E, counts, x, wq, w_arg, s, o, b = _weight_only_case(dtype, int4, groups, with_offset, with_bias=True)
    got = npu_grouped_matmul([x], [w_arg], bias=[b], antiquant_scale=[s],
                             antiquant_offset=[o] if with_offset else None, group_list=_ends(counts), split_item=3,
                             group_type=0, output_dtype=dtype)[0]
    assert got.dtype == dtype
    ref = torch.zeros(x.shape[0], wq.shape[-1], dtype=torch.float64)
    same = torch.zeros(x.shape[0], wq.shape[-1], dtype=dtype)
    r = 0
    for e, c in enumerate(counts):
        wd = ref_dequant(wq[e], s[e], None if o is None else o[e])
        ref[r:r + c] = x[r:r + c].double() @ wd + b[e].double()
        same[r:r + c] = (torch.mm(x[r:r + c], wd.to(dtype)).float() + b[e]).to(dtype)
        r += c
    _close(got, same, ref)


def test_int4_packing_is_low_nibble_first():
    v = torch.tensor([[1, -2, 3, -4, 5, -6, 7, -8]], dtype=torch.int8)
    x = torch.eye(1, dtype=torch.bfloat16)
    got = npu_grouped_matmul([x], [pack_int4(v)], antiquant_scale=[torch.ones(8, dtype=torch.bfloat16)],
                             group_type=-1)[0]
    assert torch.equal(got.float(), v.float())


# ---- grouped_matmul_swiglu_quant ----

def ref_swiglu_quant(x, w, ws, xs, ends, limit=0.0):
    """float64 reference: dequant, silu(first half) * second half (with limit > 0: silu(min(first, limit)) *
    clamp(second, -limit, limit)), per-row int8 quantisation."""
    M, H = x.shape[0], w.shape[-1] // 2
    v = torch.zeros(M, H, dtype=torch.float64)
    r = 0
    for e, end in enumerate(ends):
        h = (x[r:end].double() @ w[e].double()) * ws[e].double() * xs[r:end].double()[:, None]
        a, b = h[:, :H], h[:, H:]
        if limit > 0:
            a, b = a.clamp(max=limit), b.clamp(-limit, limit)
        v[r:end] = torch.nn.functional.silu(a) * b
        r = end
    amax = v.abs().amax(1)
    q = torch.where(amax[:, None] > 0, (v * (127 / amax[:, None])).round(), torch.zeros_like(v))
    return q, amax / 127, r


@pytest.mark.parametrize("ws_dtype", [torch.float32, torch.bfloat16])
def test_grouped_matmul_swiglu_quant(ws_dtype):
    E, K, N = 4, 64, 32
    ends = [5, 5, 12, 16]  # the last rows (16..19) are not in any group
    x, w = _i8(20, K), _i8(E, K, N)
    ws = (torch.rand(E, N) * 1e-3).to(ws_dtype)
    xs = torch.rand(20) + 0.5
    q, scale, offset = npu_grouped_matmul_swiglu_quant(x, w, torch.tensor(ends), ws, xs)
    assert q.dtype == torch.int8 and q.shape == (20, N // 2) and scale.shape == (20,) and offset.shape == ()
    rq, rs, covered = ref_swiglu_quant(x, w, ws.float(), xs, ends)
    assert (q[:covered].double() - rq[:covered]).abs().max() <= 1
    torch.testing.assert_close(scale[:covered].double(), rs[:covered], rtol=1e-5, atol=0)
    assert torch.equal(q[covered:], torch.zeros_like(q[covered:]))
    # dequantised, the output is within one step of the float64 SwiGLU
    deq = q[:covered].double() * scale[:covered, None].double()
    assert ((deq - rq[:covered] * rs[:covered, None]).abs() <= scale[:covered, None] * 1.01).all()


def test_grouped_matmul_swiglu_quant_swiglu_limit():
    """vLLM-Ascend's swiglu_limit: the activated half clamped from above, the other on both sides (0: no clamp)."""
    E, K, N = 2, 64, 32
    ends = [6, 11]
    x, w = _i8(12, K), _i8(E, K, N)
    ws, xs = torch.rand(E, N) * 2e-3, torch.rand(12) + 0.5
    gl = torch.tensor(ends)
    plain = torch.ops.npu_fa.grouped_matmul_swiglu_quant(x, w, gl, ws, xs)
    assert all(torch.equal(p, q) for p, q in zip(plain, torch.ops.npu_fa.grouped_matmul_swiglu_quant(
        x, w, gl, ws, xs, swiglu_limit=0.0)))
    limit = 0.5  # well inside the values' range: most of both halves are clamped
    q, scale, _ = torch.ops.npu_fa.grouped_matmul_swiglu_quant(x, w, gl, ws, xs, swiglu_limit=limit)
    rq, rs, covered = ref_swiglu_quant(x, w, ws, xs, ends, limit)
    _, rs_plain, _ = ref_swiglu_quant(x, w, ws, xs, ends)
    assert (rs[:covered] < rs_plain[:covered]).any()
    assert (q[:covered].double() - rq[:covered]).abs().max() <= 1
    torch.testing.assert_close(scale[:covered].double(), rs[:covered], rtol=1e-5, atol=0)
    assert (q[covered:] == 0).all() and (scale[covered:] == 0).all()
    for bad in (-1.0, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="'swiglu_limit' must be finite and >= 0"):
            torch.ops.npu_fa.grouped_matmul_swiglu_quant(x, w, gl, ws, xs, swiglu_limit=bad)


def test_grouped_matmul_swiglu_quant_v2_matches_v1():
    E, K, N = 3, 32, 16
    counts = [4, 0, 6]
    x, w = _i8(10, K), _i8(E, K, N)
    ws, xs = torch.rand(E, N) * 1e-3, torch.rand(10)
    q1, s1, _ = npu_grouped_matmul_swiglu_quant(x, w, _ends(counts), ws, xs)
    q2, s2 = tot.npu_grouped_matmul_swiglu_quant_v2(x, [w], [ws], xs, torch.tensor(counts), group_list_type=1)
    assert torch.equal(q1, q2) and torch.equal(s1, s2)


# ---- bad inputs: one test per rule ----

def _w8a8_args():
    x, w = _i8(6, 16), _i8(2, 16, 8)
    return x, w, torch.rand(2, 8), torch.rand(6), torch.tensor([2, 6])


def test_bad_dtypes():
    x, w, s, pts, gl = _w8a8_args()
    with pytest.raises(TypeError, match="int8 and int8"):
        npu_grouped_matmul([x.float()], [w], scale=[s], group_list=gl, group_type=0, split_item=3)
    with pytest.raises(TypeError, match="'scale' must be float32, bfloat16 or int64"):
        npu_grouped_matmul([x], [w], scale=[s.half()], group_list=gl, group_type=0, split_item=3,
                           output_dtype=torch.float32)
    with pytest.raises(TypeError, match="'per_token_scale' must be float32"):
        npu_grouped_matmul([x], [w], scale=[s], per_token_scale=[pts.double()], group_list=gl, group_type=0,
                           split_item=3, output_dtype=torch.bfloat16)
    with pytest.raises(TypeError, match="'bias' must be int32"):
        npu_grouped_matmul([x], [w], bias=[torch.ones(2, 8, dtype=torch.int64)], scale=[s], group_list=gl,
                           group_type=0, split_item=3, output_dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="'output_dtype' must be None or one of"):
        npu_grouped_matmul([x], [w], scale=[s], group_list=gl, group_type=0, split_item=3, output_dtype=torch.int16)
    with pytest.raises(ValueError, match="outputs x's dtype"):
        npu_grouped_matmul([x.bfloat16()], [w], antiquant_scale=[s.bfloat16()], group_list=gl, group_type=0,
                           split_item=3, output_dtype=torch.float32)
    with pytest.raises(ValueError, match="'antiquant_scale' must have x's dtype"):
        npu_grouped_matmul([x.bfloat16()], [w], antiquant_scale=[s.half()], group_list=gl, group_type=0,
                           split_item=3)


def test_bad_scale_shapes():
    x, w, s, pts, gl = _w8a8_args()
    with pytest.raises(ValueError, match="'scale' of expert 0 must hold 1 .* or N=8"):
        npu_grouped_matmul([x], [w], scale=[torch.rand(2, 5)], group_list=gl, group_type=0, split_item=3,
                           output_dtype=torch.float32)
    with pytest.raises(ValueError, match="'scale' must be one tensor with a leading expert axis of 2"):
        npu_grouped_matmul([x], [w], scale=[torch.rand(3, 8)], group_list=gl, group_type=0, split_item=3,
                           output_dtype=torch.float32)
    with pytest.raises(ValueError, match="'scale' must hold one tensor per weight"):
        npu_grouped_matmul([x], [w[0], w[1]], scale=[s[0]], group_list=gl, group_type=0, split_item=3,
                           output_dtype=torch.float32)
    with pytest.raises(ValueError, match=r"'per_token_scale'\[0\] must be \[6\]"):
        npu_grouped_matmul([x], [w], scale=[s], per_token_scale=[pts[:5]], group_list=gl, group_type=0,
                           split_item=3, output_dtype=torch.float32)
    with pytest.raises(ValueError, match="'bias' of expert 0 must be"):
        npu_grouped_matmul([x], [w], bias=[torch.ones(2, 7, dtype=torch.int32)], scale=[s], group_list=gl,
                           group_type=0, split_item=3, output_dtype=torch.float32)
    packed, _ = pack_scale_int64(s)
    with pytest.raises(NotImplementedError, match="offset"):
        npu_grouped_matmul([x], [w], scale=[packed | (3 << 37)], group_list=gl, group_type=0, split_item=3)


def test_bad_antiquant_shapes():
    x = torch.randn(6, 16, dtype=torch.bfloat16)
    w = _i8(2, 16, 8)
    gl = torch.tensor([2, 6])
    with pytest.raises(ValueError, match="'antiquant_scale' of expert 0 must be \\[N=8\\]"):
        npu_grouped_matmul([x], [w], antiquant_scale=[torch.rand(2, 7, dtype=torch.bfloat16)], group_list=gl,
                           group_type=0, split_item=3)
    with pytest.raises(ValueError, match="G=3 groups, which must divide K=16"):
        npu_grouped_matmul([x], [w], antiquant_scale=[torch.rand(2, 3, 8, dtype=torch.bfloat16)], group_list=gl,
                           group_type=0, split_item=3)
    with pytest.raises(ValueError, match="'antiquant_offset' of expert 0 must have antiquant_scale's shape"):
        npu_grouped_matmul([x], [w], antiquant_scale=[torch.rand(2, 8, dtype=torch.bfloat16)],
                           antiquant_offset=[torch.rand(2, 2, 8, dtype=torch.bfloat16)], group_list=gl,
                           group_type=0, split_item=3)
    with pytest.raises(ValueError, match="'antiquant_scale' is required"):
        npu_grouped_matmul([x], [w], group_list=gl, group_type=0, split_item=3)
    with pytest.raises(ValueError, match="'scale' and 'per_token_scale' belong to W8A8"):
        npu_grouped_matmul([x], [w], antiquant_scale=[torch.rand(2, 8, dtype=torch.bfloat16)],
                           scale=[torch.rand(2, 8)], group_list=gl, group_type=0, split_item=3)
    with pytest.raises(ValueError, match="'antiquant_scale' and 'antiquant_offset' belong to weight-only"):
        npu_grouped_matmul([_i8(6, 16)], [w], antiquant_scale=[torch.rand(2, 8)], scale=[torch.rand(2, 8)],
                           group_list=gl, group_type=0, split_item=3, output_dtype=torch.float32)


def test_bad_modes():
    x, w, s, pts, gl = _w8a8_args()
    with pytest.raises(ValueError, match="group_type -1 and 0 only"):
        npu_grouped_matmul([x], [w[0]], scale=[s[0]], group_list=torch.tensor([8, 16]), group_type=2)
    with pytest.raises(ValueError, match="'group_list_type' 2 .* int8 x"):
        npu_grouped_matmul([x.float()], [w.float()], group_list=gl, group_type=0, group_list_type=2)
    with pytest.raises(ValueError, match="group_list_type 2\\) row 0 names expert 5"):
        npu_grouped_matmul([x], [w], scale=[s], group_list=torch.tensor([[5, 6]]), group_type=0, group_list_type=2,
                           split_item=3, output_dtype=torch.float32)
    with pytest.raises(ValueError, match="covers 9 rows but x has only 6"):
        npu_grouped_matmul([x], [w], scale=[s], group_list=torch.tensor([2, 9]), group_type=0, split_item=3,
                           output_dtype=torch.float32)
    with pytest.raises(ValueError, match="'act_type' needs per-token quantisation"):
        npu_grouped_matmul([x], [w], scale=[s], group_list=gl, group_type=0, split_item=3, act_type=1,
                           output_dtype=torch.float32)
    with pytest.raises(ValueError, match="'scale' is required for a dequantised"):
        npu_grouped_matmul([x], [w], group_list=gl, group_type=0, split_item=3, output_dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="int32 returns the raw accumulation"):
        npu_grouped_matmul([x], [w], scale=[s], group_list=gl, group_type=0, split_item=3, output_dtype=torch.int32)
    with pytest.raises(NotImplementedError, match="'offset'"):
        npu_grouped_matmul([x], [w], scale=[s], offset=[s], group_list=gl, group_type=0, split_item=3)
    with pytest.raises(NotImplementedError, match="'weight_dtype'"):
        npu_grouped_matmul([x], [w], scale=[s], group_list=gl, group_type=0, split_item=3, weight_dtype=296)


def test_swiglu_quant_bad_inputs():
    x, w = _i8(6, 16), _i8(2, 16, 8)
    ws, xs, gl = torch.rand(2, 8), torch.rand(6), torch.tensor([2, 6])
    with pytest.raises(TypeError, match="'x' and 'weight' must be int8"):
        npu_grouped_matmul_swiglu_quant(x.float(), w, gl, ws, xs)
    with pytest.raises(ValueError, match="N even"):
        npu_grouped_matmul_swiglu_quant(x, _i8(2, 16, 7), gl, torch.rand(2, 7), xs)
    with pytest.raises(ValueError, match="'weight_scale' must be \\[E=2, N=8\\]"):
        npu_grouped_matmul_swiglu_quant(x, w, gl, torch.rand(8), xs)
    with pytest.raises(ValueError, match="'x_scale' must be \\[M=6\\]"):
        npu_grouped_matmul_swiglu_quant(x, w, gl, ws, xs[:4])
    with pytest.raises(ValueError, match="non-decreasing"):
        npu_grouped_matmul_swiglu_quant(x, w, torch.tensor([4, 2]), ws, xs)
    with pytest.raises(NotImplementedError, match="'bias'"):
        npu_grouped_matmul_swiglu_quant(x, w, gl, ws, xs, bias=torch.rand(2, 8))
    with pytest.raises(NotImplementedError, match="'smooth_scale'"):
        tot.npu_grouped_matmul_swiglu_quant_v2(x, [w], [ws], xs, gl, smooth_scale=torch.rand(4))



def test_serving_engine_call_forms():
    """The argument combinations vLLM-Ascend's MoE and linear layers pass (keyword style, int64 counts, bf16 or fp32
    scales, list-wrapped single tensors, tuning_config hints)."""
    E, M, K, N = 4, 12, 32, 16
    counts = torch.tensor([3, 0, 5, 4])
    x, w13 = _i8(M, K), _i8(E, K, N)
    pts, s = torch.rand(M), torch.rand(E, N) * 1e-3
    # W8A8 dynamic: bf16 scale, per-token scale, counts, split_item 2 / 3
    for split_item in (2, 3):
        y = npu_grouped_matmul(x=[x], weight=[w13], scale=[s.to(torch.bfloat16)], bias=None, per_token_scale=[pts],
                               split_item=split_item, group_type=0, group_list=counts, group_list_type=1,
                               output_dtype=torch.bfloat16)[0]
        assert y.shape == (M, N) and y.dtype == torch.bfloat16
    # raw int32 accumulation for a separate dequant + SwiGLU + quant step
    raw = npu_grouped_matmul([x], [w13], group_list=counts, split_item=3, output_dtype=torch.int32, group_type=0,
                             group_list_type=1, tuning_config=[0])[0]
    assert torch.equal(raw.double(), ref_w8a8(x, w13, counts.tolist(), torch.ones(E, N)))
    # a quantised linear layer as one group: weight [K, N], scale [1, 1, N], fp32 bias [1, N]
    w, sl, bl = _i8(K, N), torch.rand(N) * 1e-3, torch.randn(N)
    y = npu_grouped_matmul(x=[x], weight=[w], scale=[sl.reshape(1, 1, -1)], bias=[bl.reshape(1, -1)],
                           per_token_scale=[pts], split_item=2, group_list=torch.full((1,), M), group_type=0,
                           group_list_type=1, output_dtype=torch.bfloat16)[0]
    _close(y, torch_w8a8(x, w[None], [M], sl[None], torch.bfloat16, pts, bl[None]),
           ref_w8a8(x, w[None], [M], sl[None], pts, bl[None]))
    # weight-only int8 with offsets, cumulative group_list
    xb = torch.randn(M, K, dtype=torch.bfloat16)
    sa, oa = (torch.rand(E, N) * 1e-2).to(torch.bfloat16), torch.randn(E, N).to(torch.bfloat16)
    y = npu_grouped_matmul(x=[xb], weight=[w13], antiquant_scale=[sa], antiquant_offset=[oa], split_item=2,
                           group_list_type=0, group_type=0, group_list=torch.cumsum(counts, 0),
                           output_dtype=torch.bfloat16)[0]
    assert y.shape == (M, N) and y.dtype == torch.bfloat16


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_w8a8_column_tiles_and_threads(threads):
    """Wide groups are cut into column tiles run on the intra-op threads: same result for any thread count."""
    E, K, N = 3, 64, 320
    counts = [40, 0, 90]
    x, w = _i8(sum(counts), K), _i8(E, K, N)
    s, pts = torch.rand(E, N) * 1e-3, torch.rand(x.shape[0])
    bias = torch.randint(-500, 500, (E, N), dtype=torch.int32)
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        got = npu_grouped_matmul([x], [w], bias=[bias], scale=[s], per_token_scale=[pts], group_list=_ends(counts),
                                 split_item=3, group_type=0, act_type=5, output_dtype=torch.float32)[0]
    finally:
        torch.set_num_threads(old)
    silu = torch.nn.functional.silu
    _close(got, silu(torch_w8a8(x, w, counts, s, torch.float32, pts, bias)), silu(ref_w8a8(x, w, counts, s, pts, bias)))


@pytest.mark.parametrize("threads", [1, 2])
def test_swiglu_quant_row_chunks(threads):
    """Groups longer than one task's rows (128) are split into row chunks: same result for any thread count."""
    E, K, N = 2, 32, 16
    ends = [300, 430]
    x, w = _i8(430, K), _i8(E, K, N)
    ws, xs = torch.rand(E, N) * 1e-3, torch.rand(430) + 0.5
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        q, scale, _ = npu_grouped_matmul_swiglu_quant(x, w, torch.tensor(ends), ws, xs)
    finally:
        torch.set_num_threads(old)
    rq, rs, _ = ref_swiglu_quant(x, w, ws, xs, ends)
    assert (q.double() - rq).abs().max() <= 1
    torch.testing.assert_close(scale.double(), rs, rtol=1e-5, atol=0)


def test_weight_only_column_tiles_agree_across_threads():
    """Weight-only groups are dequantised and multiplied in column tiles: same result for any thread count."""
    E, K, N = 2, 64, 384
    x = torch.randn(70, K, dtype=torch.bfloat16)
    wq = torch.randint(-8, 8, (E, K, N), dtype=torch.int8)
    s, o = (torch.rand(E, 4, N) * 0.02).to(torch.bfloat16), torch.randn(E, 4, N).to(torch.bfloat16)
    b = torch.randn(E, N)
    outs = []
    old = torch.get_num_threads()
    for threads in (1, 2, 3):
        torch.set_num_threads(threads)
        try:
            outs.append(npu_grouped_matmul([x], [pack_int4(wq)], bias=[b], antiquant_scale=[s], antiquant_offset=[o],
                                           group_list=torch.tensor([30, 70]), split_item=3, group_type=0)[0])
        finally:
            torch.set_num_threads(old)
    assert torch.equal(outs[0], outs[1]) and torch.equal(outs[0], outs[2])
    ref = torch.cat([x[:30].double() @ ref_dequant(wq[0], s[0], o[0]) + b[0].double(),
                     x[30:].double() @ ref_dequant(wq[1], s[1], o[1]) + b[1].double()])
    same = torch.cat([(torch.mm(x[:30], ref_dequant(wq[0], s[0], o[0]).bfloat16()).float() + b[0]).bfloat16(),
                      (torch.mm(x[30:], ref_dequant(wq[1], s[1], o[1]).bfloat16()).float() + b[1]).bfloat16()])
    _close(outs[0], same, ref)


def test_w8a8_expert_mlp_chain_matches_fused_swiglu_quant():
    """The W8A8 expert MLP as serving engines chain it — npu_dynamic_quant, grouped matmul (int32 out or
    dequantised), npu_swiglu, npu_dynamic_quant, grouped matmul — agrees with the fused
    npu_grouped_matmul_swiglu_quant on its first half and ends close to the float64 MLP."""
    E, K, F, M = 4, 64, 32, 24
    counts = torch.tensor([5, 0, 11, 8])
    h = torch.randn(M, K)
    w13 = _i8(E, K, 2 * F)
    w2 = _i8(E, F, K)
    s13, s2 = torch.rand(E, 2 * F) * 1e-3 + 1e-4, torch.rand(E, K) * 1e-3 + 1e-4
    xq, xs = tot.npu_dynamic_quant(h)
    gate_up = npu_grouped_matmul([xq], [w13], scale=[s13], per_token_scale=[xs], group_list=counts, split_item=3,
                                 group_type=0, group_list_type=1, output_dtype=torch.float32)[0]
    act_q, act_s = tot.npu_dynamic_quant(tot.npu_swiglu(gate_up))
    fused_q, fused_s, _ = npu_grouped_matmul_swiglu_quant(xq, w13, torch.cumsum(counts, 0), s13, xs)
    assert (act_q.int() - fused_q.int()).abs().max() <= 1
    torch.testing.assert_close(act_s, fused_s, rtol=1e-5, atol=0)
    out = npu_grouped_matmul([act_q], [w2], scale=[s2], per_token_scale=[act_s], group_list=counts, split_item=2,
                             group_type=0, group_list_type=1, output_dtype=torch.bfloat16)[0]
    # float64 MLP on the dequantised weights and the unquantised activations
    ref, r = torch.zeros(M, K, dtype=torch.float64), 0
    for e, c in enumerate(counts.tolist()):
        g = h[r:r + c].double() @ (w13[e].double() * s13[e].double())
        a = torch.nn.functional.silu(g[:, :F]) * g[:, F:]
        ref[r:r + c] = a @ (w2[e].double() * s2[e].double())
        r += c
    assert (out.double() - ref).abs().max() <= 0.05 * ref.abs().max()  # two int8 activation quantisations
