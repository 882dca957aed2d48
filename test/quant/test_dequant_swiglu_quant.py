"""npu_dequant_swiglu_quant against an independent float64 reference written from torch_npu's documented formula
(tolerance rule: max|ours - ref64| <= 2 * max|torch_same_dtype - ref64| + 1e-5): every swiglu_mode, activate_left,
dynamic and static quantisation, per-group scales (group_index), float inputs, activate_dim, torch.compile and
every bad-input rule. (torch.ops.npu.npu_dequant_swiglu_quant: test/compat/test_npu_ops.py, on the signature parity
test's sample.)"""
import pytest
import torch
import torch.nn.functional as F

import torch_ops_transformer as tot
from test.common.reference import check_tolerance

OPS = torch.ops.npu_fa


# ---- reference -----------------------------------------------------------------------------------------------------
def _table(t, groups, n, dtype):
    """A per-group parameter as a [G, n] table, by the documented shapes: [G, n] / [1, n] / [n] per channel, [G] /
    [G, 1] / [1] one value per group (a 1-D tensor of n values is per channel)."""
    t = t.to(dtype)
    if t.dim() == 1:
        t = t.view(1, n) if t.shape[0] == n else t.view(-1, 1)
    return t.expand(groups, n)


def dsq_reference(x, weight_scale=None, activation_scale=None, bias=None, quant_scale=None, quant_offset=None,
                  group_index=None, activate_left=False, quant_mode=0, activate_dim=-1, swiglu_mode=0,
                  clamp_limit=7.0, glu_alpha=1.702, glu_bias=1.0, dtype=torch.float64):
    """(y, scale) in `dtype`: y rounded half to even and saturated to int8's range (as floats)."""
    cols = x.shape[-1]
    rows = x.numel() // cols
    counts = [rows] if group_index is None else [int(c) for c in group_index.tolist()]
    bounds, start = [], 0
    for c in counts:
        bounds.append((start, start + c))
        start += c
    active = start
    xr = x.reshape(rows, cols)[:active]
    # 1. dequantisation (an int32 x only)
    if x.dtype == torch.int32:
        int_bias = bias is not None and bias.dtype == torch.int32
        d = (xr + bias.reshape(1, cols) if int_bias else xr).to(dtype)
        if weight_scale is not None:
            ws = _table(weight_scale, len(counts), cols, dtype)
            d = torch.cat([d[a:b] * ws[g] for g, (a, b) in enumerate(bounds)])
        if activation_scale is not None:
            d = d * activation_scale.reshape(rows, 1)[:active].to(dtype)
        if bias is not None and not int_bias:
            d = d + bias.to(dtype).reshape(1, cols)
    else:
        d = xr.to(dtype)
    # 2. SwiGLU along activate_dim
    t = d.reshape(x.shape if active == rows else (active, cols)).movedim(activate_dim, -1)
    if swiglu_mode == 1:
        a, b = t[..., 0::2], t[..., 1::2]
    else:
        first, second = t.chunk(2, -1)
        a, b = (first, second) if activate_left else (second, first)
    if swiglu_mode == 0:
        s = F.silu(a) * b
    else:
        ac = a.clamp(max=clamp_limit)
        s = ac * torch.sigmoid(ac * glu_alpha) * (b.clamp(-clamp_limit, clamp_limit) + glu_bias)
    s = s.movedim(-1, activate_dim)
    out_shape = list(x.shape)
    out_shape[activate_dim] //= 2
    n = out_shape[-1]
    s = s.reshape(-1, n)
    # 3. quantisation per row of s
    y = torch.zeros(rows * cols // 2 // n, n, dtype=dtype)
    scale = torch.zeros(y.shape[0], dtype=dtype)
    if s.numel():
        groups = len(counts)
        row_group = torch.cat([torch.full((b - a,), g) for g, (a, b) in enumerate(bounds)]) if groups > 1 else \
            torch.zeros(s.shape[0], dtype=torch.long)
        if quant_mode == 1:
            v = s * _table(quant_scale, groups, n, dtype)[row_group] if quant_scale is not None else s
            sc = v.abs().amax(-1) / 127
            q = torch.where(sc[:, None] > 0, v / sc[:, None], torch.zeros((), dtype=dtype))
            scale[:s.shape[0]] = sc
        else:
            q = s / _table(quant_scale, groups, n, dtype)[row_group] if quant_scale is not None else s
            q = q + _table(quant_offset, groups, n, dtype)[row_group] if quant_offset is not None else q
        y[:s.shape[0]] = q.round().clamp(-128, 127)
    return y.reshape(out_shape), scale.reshape(out_shape[:-1])


def _check(x, **kw):
    y, scale = tot.npu_dequant_swiglu_quant(x, **kw)
    ref_kw = {k: v for k, v in kw.items() if k not in ("dst_type", "round_mode")}
    y64, s64 = dsq_reference(x, **ref_kw)
    y32, s32 = dsq_reference(x, **ref_kw, dtype=torch.float32)
    assert y.dtype == torch.int8 and y.shape == y64.shape and scale.dtype == torch.float32 and scale.shape == s64.shape
    check_tolerance("y", y, y64, y32)
    check_tolerance("scale", scale, s64, s32)
    return y, scale


def _int32_inputs(rows=24, cols=64, groups=None, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(-300, 300, (rows, cols), dtype=torch.int32, generator=g)
    G = 1 if groups is None else len(groups)
    kw = dict(weight_scale=torch.rand(G, cols, generator=g) * 0.02 + 0.001,
              activation_scale=torch.rand(rows, 1, generator=g) + 0.5)
    if groups is not None:
        kw["group_index"] = torch.tensor(groups, dtype=torch.int64)
    return x, kw, G


# ---- dynamic quantisation ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("swiglu_mode", [0, 1, 2])
@pytest.mark.parametrize("activate_left", [True, False])
@pytest.mark.parametrize("groups", [None, [5, 0, 11, 8]])
def test_dynamic(swiglu_mode, activate_left, groups):
    x, kw, G = _int32_inputs(groups=groups)
    kw["quant_scale"] = torch.rand(G, 32) + 0.5
    _check(x, quant_mode=1, activate_left=activate_left, swiglu_mode=swiglu_mode, clamp_limit=3.0, glu_alpha=1.5,
           glu_bias=0.5, **kw)


def test_activate_left_selects_the_activated_half():
    x = torch.tensor([[10, 20, 30, 40]], dtype=torch.int32)
    ws = torch.full((4,), 0.1)
    left, _ = tot.npu_dequant_swiglu_quant(x, weight_scale=ws, quant_scale=torch.ones(1), activate_left=True)
    right, _ = tot.npu_dequant_swiglu_quant(x, weight_scale=ws, quant_scale=torch.ones(1), activate_left=False)
    v = x.double() * 0.1
    assert left.tolist() == (F.silu(v[:, :2]) * v[:, 2:]).round().tolist()       # swish(first) * second
    assert right.tolist() == (F.silu(v[:, 2:]) * v[:, :2]).round().tolist()      # swish(second) * first


def test_dynamic_without_scales_and_zero_rows():
    x, kw, _ = _int32_inputs(rows=6, cols=16, seed=1)
    x[2] = 0
    y, scale = _check(x, quant_mode=1, **kw)
    assert scale[2] == 0 and (y[2] == 0).all()
    _check(x, quant_mode=1)  # no weight_scale / activation_scale: x taken as is


def test_groups_past_the_sum_are_zero():
    x, kw, _ = _int32_inputs(rows=10, cols=16, groups=[3, 4], seed=2)
    kw["quant_scale"] = torch.rand(16 // 2) + 0.5                      # [H]: shared by the groups
    y, scale = _check(x, quant_mode=1, **kw)
    assert (y[7:] == 0).all() and (scale[7:] == 0).all() and (scale[:7] > 0).all()


def test_group_scales_select_each_groups_row():
    """One group's tokens with the other group's scale row give that group's result, not the op's."""
    x, kw, _ = _int32_inputs(rows=8, cols=16, groups=[3, 5], seed=3)
    y, scale = tot.npu_dequant_swiglu_quant(x, quant_mode=1, **kw)
    ys, ss = tot.npu_dequant_swiglu_quant(x[3:], weight_scale=kw["weight_scale"][1],
                                          activation_scale=kw["activation_scale"][3:], quant_mode=1)
    assert torch.equal(y[3:], ys) and torch.equal(scale[3:], ss)


# ---- static quantisation -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("swiglu_mode", [0, 1, 2])
@pytest.mark.parametrize("scales", ["channel", "group", "scalar", "none"])
def test_static(swiglu_mode, scales):
    groups = [7, 9, 8] if scales == "group" else None
    x, kw, G = _int32_inputs(groups=groups, seed=4)
    g = torch.Generator().manual_seed(5)
    if scales == "channel":
        kw.update(quant_scale=torch.rand(1, 32, generator=g) * 0.05 + 0.01,
                  quant_offset=torch.randn(1, 32, generator=g) * 3)
    elif scales == "group":
        kw.update(quant_scale=torch.rand(G, generator=g) * 0.05 + 0.01, quant_offset=torch.randn(G, 1, generator=g))
    elif scales == "scalar":
        kw.update(quant_scale=torch.tensor([0.03]), quant_offset=torch.tensor([2.0]))
    y, scale = _check(x, quant_mode=0, swiglu_mode=swiglu_mode, activate_left=True, **kw)
    assert (scale == 0).all()
    if scales == "none":
        assert (y.abs() == 127).any() or y.abs().max() > 10   # unscaled values saturate or are large


@pytest.mark.parametrize("bias_dtype", [torch.int32, torch.float32, torch.bfloat16])
def test_bias(bias_dtype):
    x, kw, _ = _int32_inputs(seed=6)
    bias = (torch.randn(64) * 40).to(bias_dtype)
    _check(x, bias=bias, quant_mode=1, **kw)
    _check(x, bias=bias.view(1, 64), quant_scale=torch.tensor([0.05]), quant_mode=0, **kw)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("quant_mode", [0, 1])
def test_float_input(dtype, quant_mode):
    x = (torch.randn(3, 5, 64) * 4).to(dtype)
    qs = torch.rand(32) * 0.05 + 0.01 if quant_mode == 0 else (torch.rand(32) + 0.5).to(dtype)
    y, scale = _check(x, quant_scale=qs, quant_mode=quant_mode, swiglu_mode=2)
    # A weight_scale is accepted with a float x and not applied (the input is already dequantised).
    y2, scale2 = tot.npu_dequant_swiglu_quant(x, weight_scale=torch.rand(64), quant_scale=qs, quant_mode=quant_mode,
                                              swiglu_mode=2)
    assert torch.equal(y, y2) and torch.equal(scale, scale2)


@pytest.mark.parametrize("swiglu_mode", [0, 1])
def test_activate_dim_not_last(swiglu_mode):
    x, kw, _ = _int32_inputs(rows=24, cols=16, seed=7)
    x = x.view(2, 12, 16)
    kw["activation_scale"] = kw["activation_scale"].view(2, 12)
    y, scale = _check(x, activate_dim=1, swiglu_mode=swiglu_mode, quant_scale=torch.rand(16) * 0.05 + 0.01,
                      quant_offset=torch.tensor([1.0]), **kw)
    assert y.shape == (2, 6, 16) and scale.shape == (2, 6)


def test_three_dim_input_last_dim_and_noncontiguous():
    x, kw, _ = _int32_inputs(rows=12, cols=32, seed=8)
    x3 = x.view(3, 4, 32).transpose(0, 1)              # [4, 3, 32], not contiguous
    act = kw["activation_scale"].view(3, 4).t()
    _check(x3, weight_scale=kw["weight_scale"], activation_scale=act, quant_mode=1)


def test_rounding_is_half_to_even_and_saturates():
    # A float input through static quantisation with scale 1: s / 1 lands on exact .5 ties.
    a = torch.tensor([[40.0, 40.0, 40.0, 40.0]], dtype=torch.bfloat16)        # silu(40) = 40 in fp32
    b = torch.tensor([[0.0625, 0.1875, 100.0, -100.0]], dtype=torch.bfloat16)  # 2.5, 7.5, 4000, -4000 (saturated)
    y, _ = tot.npu_dequant_swiglu_quant(torch.cat([a, b], 1), activate_left=True, quant_scale=torch.ones(1))
    assert y.tolist() == [[2, 8, 127, -128]]


def test_upstream_defaults_match_explicit_values():
    x, kw, _ = _int32_inputs(rows=4, cols=16, seed=9)
    a = tot.npu_dequant_swiglu_quant(x, quant_mode=1, **kw)
    b = tot.npu_dequant_swiglu_quant(x, quant_mode=1, dst_type=torch.int8, round_mode=0, activate_dim=-1, **kw)
    c = tot.npu_dequant_swiglu_quant(x, quant_mode=1, dst_type=1, round_mode=None, activate_dim=None, **kw)
    assert all(torch.equal(p, q) and torch.equal(p, r) for p, q, r in zip(a, b, c))


# ---- native behaviour ----------------------------------------------------------------------------------------------
def test_compile_fullgraph():
    x, kw, _ = _int32_inputs(rows=8, cols=32, groups=[3, 5], seed=10)

    def f(x, ws, act, gi):
        return tot.npu_dequant_swiglu_quant(x, weight_scale=ws, activation_scale=act, group_index=gi, quant_mode=1,
                                            swiglu_mode=1)

    args = (x, kw["weight_scale"], kw["activation_scale"], kw["group_index"])
    compiled = torch.compile(f, fullgraph=True)
    assert all(torch.equal(p, q) for p, q in zip(compiled(*args), f(*args)))


def test_empty_rows():
    y, scale = tot.npu_dequant_swiglu_quant(torch.zeros(0, 8, dtype=torch.int32), weight_scale=torch.ones(8),
                                            activation_scale=torch.ones(0, 1), quant_mode=1)
    assert y.shape == (0, 4) and scale.shape == (0,)


# ---- bad input: one rule each --------------------------------------------------------------------------------------
def _x(rows=4, cols=8):
    return torch.randint(-5, 5, (rows, cols), dtype=torch.int32)


def _call(x=None, **kw):
    return tot.npu_dequant_swiglu_quant(_x() if x is None else x, **kw)


REJECTS = {
    "x_dtype": (lambda: _call(torch.randn(4, 8)), "'x' must be int32"),
    "x_rank": (lambda: _call(_x()[0]), "at least 2 dimensions"),
    "quant_mode": (lambda: _call(quant_mode=2), "'quant_mode' must be 0"),
    "swiglu_mode": (lambda: _call(swiglu_mode=3), "'swiglu_mode' must be 0"),
    "clamp_limit": (lambda: _call(swiglu_mode=1, clamp_limit=0.0), "'clamp_limit' must be positive"),
    "glu_alpha": (lambda: _call(glu_alpha=float("inf")), "'glu_alpha' must be finite"),
    "glu_bias": (lambda: _call(glu_bias=float("nan")), "'glu_bias' must be finite"),
    "activate_dim_range": (lambda: _call(activate_dim=2), "'activate_dim' must be in"),
    "odd_size": (lambda: _call(_x(4, 7)), "even size along activate_dim"),
    "dim_with_groups": (lambda: _call(_x(4, 8), activate_dim=0, group_index=torch.tensor([4])),
                        "'group_index' must be None when activate_dim"),
    "dim_dynamic": (lambda: _call(activate_dim=0, quant_mode=1), "needs activate_dim to be x's last"),
    "group_dtype": (lambda: _call(group_index=torch.tensor([4.0])), "'group_index' must be int64"),
    "group_rank": (lambda: _call(group_index=torch.tensor([[4]])), "'group_index' must be 1-D"),
    "group_negative": (lambda: _call(group_index=torch.tensor([1, -1])), "counts >= 0"),
    "group_sum": (lambda: _call(group_index=torch.tensor([3, 2])), "sum to at most the row count"),
    "weight_scale_dtype": (lambda: _call(weight_scale=torch.ones(8, dtype=torch.float16)),
                           "'weight_scale' must be float32"),
    "weight_scale_shape": (lambda: _call(weight_scale=torch.ones(2, 8)), "'weight_scale' must have shape"),
    "activation_scale_float_x": (lambda: _call(torch.randn(4, 8).half(), activation_scale=torch.ones(4)),
                                 "'activation_scale' must be None for"),
    "activation_scale_dtype": (lambda: _call(activation_scale=torch.ones(4, dtype=torch.float64)),
                               "'activation_scale' must be float32"),
    "activation_scale_shape": (lambda: _call(activation_scale=torch.ones(3, 1)), "'activation_scale' must have shape"),
    "bias_float_x": (lambda: _call(torch.randn(4, 8).bfloat16(), bias=torch.ones(8)), "'bias' must be None for"),
    "bias_groups": (lambda: _call(bias=torch.ones(8), group_index=torch.tensor([4])),
                    "'bias' must be None with group_index"),
    "bias_dtype": (lambda: _call(bias=torch.ones(8, dtype=torch.int64)), "'bias' must be int32, float32"),
    "bias_shape": (lambda: _call(bias=torch.ones(4)), "'bias' must have shape"),
    "quant_scale_static_dtype": (lambda: _call(quant_scale=torch.ones(4, dtype=torch.float16)),
                                 "'quant_scale' must be float32 in static"),
    "quant_scale_dtype": (lambda: _call(quant_scale=torch.ones(4, dtype=torch.float64), quant_mode=1),
                          "'quant_scale' must be float32, float16"),
    "quant_scale_shape": (lambda: _call(quant_scale=torch.ones(3, 4), quant_mode=1), "'quant_scale' must have shape"),
    "quant_offset_dynamic": (lambda: _call(quant_offset=torch.ones(1), quant_mode=1),
                             "'quant_offset' applies to static quantisation only"),
    "quant_offset_dtype": (lambda: _call(quant_offset=torch.ones(1, dtype=torch.int32)),
                           "'quant_offset' must be float32, float16"),
    "quant_offset_shape": (lambda: _call(quant_offset=torch.ones(5)), "'quant_offset' must have shape"),
    "dst_type": (lambda: _call(dst_type=torch.float32), "'dst_type' must be None, torch.int8"),
    "dst_type_python_type": (lambda: _call(dst_type="int8"), "'dst_type' must be None, a torch.dtype"),
    "round_mode_range": (lambda: _call(round_mode=5), "'round_mode' must be in"),
    "round_mode_int8": (lambda: _call(round_mode=2), "rounds with 'rint' only"),
    "activate_dim_type": (lambda: _call(activate_dim=1.0), "'activate_dim' must be an int"),
}


@pytest.mark.parametrize("rule", sorted(REJECTS))
def test_rejects(rule):
    fn, words = REJECTS[rule]
    with pytest.raises((ValueError, TypeError, RuntimeError), match=words):
        fn()


@pytest.mark.parametrize("dst_type", [torch.float8_e4m3fn, torch.float8_e5m2, 291, 292, 296])
def test_float8_outputs_not_implemented(dst_type):
    with pytest.raises(NotImplementedError, match=f"dst_type={dst_type!r}"):
        _call(dst_type=dst_type)
