"""grouped_matmul on the simulated npu device — the Ascend C kernel (ascendc/kernels/moe/grouped_matmul_kernel.cpp)
run by the CPU runtime — against a float64 reference and the CPU backend, run by test_grouped_matmul.py through
runner_worker. Kernel cases run under TOT_NPU_SIM_NO_FALLBACK=1, so a silent fallback to the CPU kernel would fail
them; the documented fallbacks are checked for really being fallbacks and for giving the CPU op's answer."""
import torch

from test.common.moe_reference import split_m_ref
from test.common.reference import check_tolerance
from test.npu.runner import no_fallback

OPS = torch.ops.npu_fa
DTYPES = (torch.float32, torch.float16, torch.bfloat16)
ACTS = (0, 1, 4, 5)  # the kernel's activations: none, relu, fast_gelu, silu



def _npu(v):
    if isinstance(v, list):
        return [t.to("npu") for t in v]
    return v.to("npu") if isinstance(v, torch.Tensor) else v


def _reference(x, w, bias, rows, act, dtype):
    """act(x_e @ w[e] + b[e]) per group and the pre-activation, computed in `dtype`."""
    return split_m_ref(x, w, bias, rows, act, dtype), split_m_ref(x, w, bias, rows, 0, dtype)


def _inputs(m_rows, k, n, dtype, bias_dtype=torch.float32, bias=True, seed=0):
    g = torch.Generator().manual_seed(seed)
    e = len(m_rows)
    x = torch.randn(sum(m_rows), k, generator=g).to(dtype)
    w = (torch.randn(e, k, n, generator=g) / k ** 0.5).to(dtype)
    b = torch.randn(e, n, generator=g).to(bias_dtype) if bias else None
    return x, w, b


def _check(rows, k, n, dtype, act, list_type=1, bias=True, bias_dtype=torch.float32, group_list_dtype=torch.int64,
           group_list_on_npu=False):
    x, w, b = _inputs(rows, k, n, dtype, bias_dtype, bias)
    counts = torch.tensor(rows, dtype=group_list_dtype)
    gl = counts if list_type == 1 else counts.cumsum(0).to(group_list_dtype)
    bl = [b] if bias else []
    with no_fallback(True):
        out, act_in = OPS.grouped_matmul(_npu([x]), _npu([w]), _npu(bl), _npu(gl) if group_list_on_npu else gl, 0,
                                         list_type, act)
    assert out[0].device.type == "npu" and out[0].dtype == dtype and out[0].shape == (sum(rows), n)
    name = f"rows {rows} k {k} n {n} {dtype} act {act}"
    ref64, pre64 = _reference(x, w, b, rows, act, torch.float64)
    same, pre_same = _reference(x, w, b, rows, act, dtype)
    cpu_out, cpu_pre = OPS.grouped_matmul([x], [w], bl, gl, 0, list_type, act)
    check_tolerance(name + " vs torch", out[0].cpu(), ref64, same)
    check_tolerance(name + " vs CPU backend", out[0].cpu(), ref64, cpu_out[0])
    if act:
        check_tolerance(name + " act_input", act_in[0].cpu(), pre64, pre_same)
    else:
        assert act_in[0].numel() == 0


def case_dtypes_and_activations():
    for dtype in DTYPES:
        for act in ACTS:
            _check([10, 0, 27], 24, 40, dtype, act)


def case_two_row_and_column_blocks_with_tails():
    # M groups beyond one 128-row block, N beyond one 256-column block (tail 44), odd K.
    _check([150, 3, 0, 131], 33, 300, torch.float16, 5)
    _check([129], 8, 257, torch.float32, 1)


def case_cumulative_list_no_bias_bias_in_x_dtype():
    _check([5, 17, 9], 16, 32, torch.bfloat16, 0, list_type=0, bias=False)
    _check([5, 17, 9], 16, 32, torch.bfloat16, 4, bias_dtype=torch.bfloat16, group_list_dtype=torch.int32)
    _check([5, 17, 9], 16, 32, torch.float32, 5, list_type=0, group_list_on_npu=True)


def case_more_items_than_cores():
    # 60 groups x 2 column blocks = 120 items over at most 48 AIVs: several per core, both workspace slices.
    _check([3] * 60, 16, 272, torch.float16, 0, bias=False)


def _refused_then_equal(args, why):
    with no_fallback(True):
        try:
            OPS.grouped_matmul(*[_npu(a) for a in args])
        except RuntimeError as e:
            assert "TOT_NPU_SIM_NO_FALLBACK" in str(e) and why in str(e), str(e)
        else:
            raise AssertionError("the fallback was not refused")
    with no_fallback(False):
        npu = OPS.grouped_matmul(*[_npu(a) for a in args])
    cpu = OPS.grouped_matmul(*args)
    for a, b in zip(npu[0] + npu[1], cpu[0] + cpu[1]):
        assert a.device.type == "npu" and torch.equal(a.cpu(), b)


def case_fallbacks_give_the_cpu_ops_answer():
    x, w, b = _inputs([4, 6], 8, 16, torch.float32)
    gl = torch.tensor([4, 6])
    _refused_then_equal([[x], [w[0], w[1]], [], gl, 0, 1, 0], "weight other than one")
    _refused_then_equal([[x], [w], [b], gl, 0, 1, 2], "act_type 2")
    _refused_then_equal([[x[:4], x[4:]], [w[0], w[1]], [], None, -1, 0, 0], "group_type -1")


def case_bad_group_list_raises_the_cpu_ops_error():
    x, w, _ = _inputs([4, 6], 8, 16, torch.float32)
    for gl in (torch.tensor([4, 5]), torch.tensor([4, 7]), torch.tensor([4, 6, 0])):
        errors = []
        for dev in ("cpu", "npu"):
            try:
                OPS.grouped_matmul(*(_npu(a) if dev == "npu" else a for a in ([x], [w], [], gl, 0, 1, 0)))
            except RuntimeError as e:
                errors.append(str(e).split("\n")[0])
            else:
                errors.append(None)
        assert errors[0] is not None and errors[0] == errors[1], errors


def case_autograd_on_npu_matches_cpu():
    x, w, b = _inputs([7, 9], 8, 16, torch.float32)
    gl = torch.tensor([7, 9])
    grads = []
    for dev in ("cpu", "npu"):
        xs, ws, bs = (t.detach().to(dev).requires_grad_() for t in (x, w, b))
        out = OPS.grouped_matmul([xs], [ws], [bs], gl, 0, 1, 5)[0][0]
        out.square().sum().backward()
        grads.append([t.grad.cpu() for t in (xs, ws, bs)])
    for a, c in zip(*grads):
        assert torch.allclose(a, c, rtol=1e-5, atol=1e-5)
