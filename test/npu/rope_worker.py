"""rotary_position_embedding (+ its backward) on the simulated npu device vs the CPU backend and a float64
reference, run by test_rope.py through runner.py (see its docstring).

Cases the Ascend C kernel handles run with TOT_NPU_SIM_NO_FALLBACK=1, so a silent fall back to the CPU kernel
would fail them; the documented fallback combinations (docs/ascendc_rope.md) are checked for right answers and for
really being fallbacks (strict mode refuses them)."""
import torch

from test.common.reference import check_tolerance
from test.npu.runner import no_fallback as _strict

OPS = torch.ops.npu_fa
DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _rotate(x, mode):
    if mode == 0:
        x1, x2 = x.chunk(2, dim=-1)
        return torch.cat((-x2, x1), dim=-1)
    return torch.stack((-x[..., 1::2], x[..., 0::2]), dim=-1).flatten(-2)


def _ref(x, cos, sin, mode):
    return x * cos + _rotate(x, mode) * sin


def _inputs(x_shape, t_shape, dtype, t_dtype=None, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(x_shape, generator=g).to(dtype)
    angle = torch.rand(t_shape, generator=g) * 6.3 - 3.15  # independent angles: halves/pairs need not repeat
    td = t_dtype or dtype
    return x, angle.cos().to(td), angle.sin().to(td)


def _check_forward(name, x, cos, sin, mode, strict=True):
    with _strict(strict):
        out = OPS.rotary_position_embedding(x.to("npu"), cos.to("npu"), sin.to("npu"), mode)
    assert out.device.type == "npu" and out.dtype == x.dtype and out.shape == x.shape, name
    cpu = OPS.rotary_position_embedding(x, cos, sin, mode)
    ref64 = _ref(x.double(), cos.double(), sin.double(), mode)
    check_tolerance(name + " npu vs CPU backend", out.cpu(), ref64, cpu)
    # also against what plain PyTorch gets in x's dtype
    check_tolerance(name + " npu vs torch same dtype", out.cpu(), ref64,
                    _ref(x, cos.to(x.dtype), sin.to(x.dtype), mode))


def _check_backward(name, x, cos, sin, mode, strict=True):
    g = torch.Generator().manual_seed(1)
    dy = torch.randn(x.shape, generator=g).to(x.dtype)
    leaves = [t.to("npu").requires_grad_() for t in (x, cos, sin)]
    with _strict(strict):
        OPS.rotary_position_embedding(*leaves, mode).backward(dy.to("npu"))
    cpu_leaves = [t.clone().requires_grad_() for t in (x, cos, sin)]
    OPS.rotary_position_embedding(*cpu_leaves, mode).backward(dy)
    ref_leaves = [t.double().requires_grad_() for t in (x, cos, sin)]
    _ref(*ref_leaves, mode).backward(dy.double())
    for what, npu_leaf, cpu_leaf, ref_leaf in zip(("dx", "dcos", "dsin"), leaves, cpu_leaves, ref_leaves):
        assert npu_leaf.grad.device.type == "npu" and npu_leaf.grad.dtype == npu_leaf.dtype, (name, what)
        check_tolerance(f"{name} {what}", npu_leaf.grad.cpu(), ref_leaf.grad, cpu_leaf.grad)


# ---- layouts / broadcast patterns the kernel handles (x shape, cos/sin shape), S=37 rows per sequence ----------
PATTERNS = {
    "bsnd_1s1d": ((2, 37, 3), (1, 37, 1)),
    "bnsd_11sd": ((2, 3, 37), (1, 1, 37)),
    "bnsd_sd": ((2, 3, 37), (37,)),
    "sbnd_s11d": ((37, 2, 3), (37, 1, 1)),
    "tnd_t1d": ((37, 3), (37, 1)),
    "bsnd_bs1d": ((2, 37, 3), (2, 37, 1)),
    "full": ((2, 37, 3), (2, 37, 3)),
    "one_row": ((2, 37, 3), (1, 1, 1)),
}


def _forward_case(mode, dtype, d, pattern):
    def case():
        xs, ts = PATTERNS[pattern]
        x, cos, sin = _inputs(xs + (d,), ts + (d,), dtype, seed=d + mode)
        _check_forward(f"mode={mode} {dtype} D={d} {pattern}", x, cos, sin, mode)
    return case


# Every (mode, dtype, D) once, patterns rotated across them so each pattern meets both modes and several dtypes.
_names = sorted(PATTERNS)
_i = 0
for _mode in (0, 1):
    for _dtype in DTYPES:
        for _d in (8, 64, 128):
            _pat = _names[_i % len(_names)]
            _i += 1
            globals()[f"case_fwd_m{_mode}_{str(_dtype)[6:]}_d{_d}_{_pat}"] = _forward_case(_mode, _dtype, _d, _pat)


def case_fwd_many_tiles_per_core_with_tails():
    # 2500 rows of D=128 fp16: ~52 rows per AIV, tiles of ~40 rows -> several tiles and a tail per core.
    for mode in (0, 1):
        x, cos, sin = _inputs((1, 1, 2500, 128), (1, 1, 2500, 128), torch.float16, seed=3)
        _check_forward(f"mode={mode} 2500 rows", x, cos, sin, mode)


def case_fwd_repeat_runs_cross_tiles():
    # SBND with many heads per cos row: runs of 40 rows sharing a row straddle tiles and cores.
    for mode in (0, 1):
        x, cos, sin = _inputs((30, 5, 8, 64), (30, 1, 1, 64), torch.bfloat16, seed=4)
        _check_forward(f"mode={mode} SBND repeat 40", x, cos, sin, mode)


def case_fwd_mixed_table_dtypes():
    # cos/sin not in x's dtype: converted to fp32 (as the CPU op computes) and read as fp32 by the kernel.
    for mode in (0, 1):
        for xd, td in ((torch.float16, torch.float32), (torch.bfloat16, torch.float64), (torch.float32, torch.float16)):
            x, cos, sin = _inputs((2, 5, 3, 8), (1, 5, 1, 8), xd, td, seed=5)
            _check_forward(f"mode={mode} x {xd} tables {td}", x, cos, sin, mode)


def case_fwd_odd_rows_small_d():
    # D=2 and D=6 (halves far from a DataBlock), row counts that are prime.
    for mode in (0, 1):
        for d in (2, 6):
            x, cos, sin = _inputs((1, 53, 1, d), (1, 53, 1, d), torch.float16, seed=d)
            _check_forward(f"mode={mode} D={d}", x, cos, sin, mode)


def case_fwd_non_contiguous_x():
    x, cos, sin = _inputs((2, 3, 37, 64), (1, 37, 1, 64), torch.float32, seed=6)
    xt = x.transpose(1, 2)  # BSND view of BNSD memory
    with _strict():
        out = OPS.rotary_position_embedding(x.to("npu").transpose(1, 2), cos.to("npu"), sin.to("npu"), 0)
    check_tolerance("non-contiguous x", out.cpu(), _ref(xt.double(), cos.double(), sin.double(), 0),
                    OPS.rotary_position_embedding(xt, cos, sin, 0))


def case_fwd_empty_x():
    x = torch.empty(0, 3, 8, device="npu")
    out = OPS.rotary_position_embedding(x, torch.ones(8, device="npu"), torch.zeros(8, device="npu"), 0)
    assert out.shape == (0, 3, 8) and out.device.type == "npu"


# ---- gradients through the npu path -----------------------------------------------------------------------------
def case_grad_half_bsnd_dtypes():
    for dtype in DTYPES:
        x, cos, sin = _inputs((2, 37, 3, 64), (1, 37, 1, 64), dtype, seed=7)
        _check_backward(f"grad half {dtype}", x, cos, sin, 0)


def case_grad_interleave_bnsd_dtypes():
    for dtype in DTYPES:
        x, cos, sin = _inputs((2, 3, 37, 8), (1, 1, 37, 8), dtype, seed=8)
        _check_backward(f"grad interleave {dtype}", x, cos, sin, 1)


def case_grad_full_tables_and_d128():
    for mode in (0, 1):
        x, cos, sin = _inputs((3, 29, 128), (3, 29, 128), torch.float32, seed=9)
        _check_backward(f"grad full mode={mode}", x, cos, sin, mode)
        x, cos, sin = _inputs((29, 4, 128), (29, 1, 128), torch.float16, torch.float32, seed=10)
        _check_backward(f"grad TND fp32 tables mode={mode}", x, cos, sin, mode)


# ---- combinations the kernel does not take: CPU kernel on CPU aliases (sim only) ---------------------------------
FALLBACKS = {
    "quarter": ((2, 5, 3, 8), (1, 5, 1, 8), torch.float32, 2),
    "interleave_half": ((2, 5, 3, 8), (1, 5, 1, 8), torch.float16, 3),
    "float64": ((2, 5, 3, 8), (1, 5, 1, 8), torch.float64, 0),
    "table_bcast_table": ((2, 5, 3, 8), (2, 1, 3, 8), torch.float32, 1),  # [B,1,N,D]: not outer x table x repeat
    "d_too_large_for_ub": ((1, 2, 1, 8192), (1, 2, 1, 8192), torch.float16, 0),  # one row needs > 192 KB of UB
}


def case_fallbacks_give_right_answers_and_are_fallbacks():
    for name, (xs, ts, dtype, mode) in FALLBACKS.items():
        x, cos, sin = _inputs(xs, ts, dtype, seed=11)
        if mode in (0, 1):
            _check_forward("fallback " + name, x, cos, sin, mode, strict=False)
        else:  # quarter / interleave-half: compare with the CPU backend directly
            out = OPS.rotary_position_embedding(x.to("npu"), cos.to("npu"), sin.to("npu"), mode)
            torch.testing.assert_close(out.cpu(), OPS.rotary_position_embedding(x, cos, sin, mode), rtol=0, atol=0)
        if mode in (0, 1):
            _check_backward("fallback grad " + name, x, cos, sin, mode, strict=False)
        with _strict():
            try:
                OPS.rotary_position_embedding(x.to("npu"), cos.to("npu"), sin.to("npu"), mode)
            except RuntimeError as e:
                assert "the Ascend C kernel does not handle" in str(e), str(e)
            else:
                raise AssertionError(f"{name}: strict mode should refuse a fallback combination")


def case_fallback_grad_quarter():
    x, cos, sin = _inputs((2, 5, 3, 8), (1, 5, 1, 8), torch.float32, seed=12)
    dy = torch.randn(x.shape)
    npu = OPS.rotary_position_embedding_grad(dy.to("npu"), cos.to("npu"), sin.to("npu"), x.to("npu"), 2)
    cpu = OPS.rotary_position_embedding_grad(dy, cos, sin, x, 2)
    for a, b in zip(npu, cpu):
        assert a.device.type == "npu"
        torch.testing.assert_close(a.cpu(), b, rtol=0, atol=0)


# ---- bad input: the same errors as the CPU op -------------------------------------------------------------------
def _same_error(fn_args):
    msgs = []
    for dev in ("cpu", "npu"):
        args = [a.to(dev) if isinstance(a, torch.Tensor) else a for a in fn_args[1]]
        try:
            fn_args[0](*args)
        except RuntimeError as e:
            msgs.append(str(e).split("\n")[0])
        else:
            raise AssertionError(f"no error on {dev} for {fn_args}")
    assert msgs[0] == msgs[1], msgs


def case_bad_inputs_same_errors():
    f, g = OPS.rotary_position_embedding, OPS.rotary_position_embedding_grad
    x = torch.randn(2, 5, 3, 8)
    c = torch.randn(1, 5, 1, 8)
    for call in [
        (f, [torch.randn(2, 3, 7), torch.randn(7), torch.randn(7), 0]),           # odd D
        (f, [x, c, c, 4]),                                                          # unknown mode
        (f, [torch.randn(2, 3, 6), torch.randn(6), torch.randn(6), 2]),            # quarter needs D % 4
        (f, [x, torch.randn(1, 4, 1, 8), c, 0]),                                    # not broadcastable
        (f, [x, torch.randn(1, 5, 1, 4), c, 0]),                                    # wrong D in cos
        (f, [x.int(), c, c, 0]),                                                    # integer x
        (f, [x, c, c.int(), 1]),                                                    # integer sin
        (g, [torch.randn(2, 5, 3, 4), c, c, x, 0]),                                 # grad shape
        (g, [x.int(), c, c, x, 0]),                                                 # integer grad
    ]:
        _same_error(call)
