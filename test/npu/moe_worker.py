"""moe_gating_top_k_softmax(_v2) on the simulated npu device (the Ascend C kernel through the CPU runtime) against the
CPU backend of the same op and the float64 reference of moe_reference.py. Run by test_moe.py through
runner_worker.py (the device is already enabled here).

Expert indices and row_idx must equal the CPU backend's exactly (ties -> lower expert, finished rows -> E); y follows
the tolerance rule against float64; gradients through the npu path equal the CPU path's. Sizes are small: the CPU
runtime executes every vector instruction element by element."""
import torch

from test.common import moe_reference as ref
from test.common.reference import DTYPES, check_tolerance
from test.npu.runner import assert_same_error

OPS = torch.ops.npu_fa
NPU = "npu"


def _inputs(shape, dtype, seed, pattern="randn", finished_rate=0.0):
    g = torch.Generator().manual_seed(seed)
    if pattern == "ties":  # few distinct values: many equal logits in every row
        x = torch.randint(0, 3, shape, generator=g).float()
    else:
        x = torch.randn(shape, generator=g) * 2
    if pattern == "neg_inf":  # -inf logits, but never a whole row
        x[..., 1::3] = float("-inf")
    x = x.to(dtype)
    finished = (torch.rand(shape[:-1], generator=g) < finished_rate) if finished_rate else None
    return x, finished


def _to_npu(t):
    return None if t is None else t.to(NPU)


def _check_v1(x, finished, k):
    y, expert, row_idx = OPS.moe_gating_top_k_softmax(_to_npu(x), _to_npu(finished), k)
    assert y.device.type == NPU and expert.device.type == NPU and row_idx.device.type == NPU
    y_cpu, expert_cpu, row_cpu = OPS.moe_gating_top_k_softmax(x, finished, k)
    assert y.dtype == x.dtype and expert.dtype == torch.int32 and row_idx.dtype == torch.int32
    assert y.shape == y_cpu.shape
    assert torch.equal(expert.cpu(), expert_cpu), "expert_idx differs from the CPU backend"
    assert torch.equal(row_idx.cpu(), row_cpu), "row_idx differs from the CPU backend"
    y64, e64, _, _ = ref.gating_softmax(x, k, finished)
    assert torch.equal(expert.cpu(), e64)
    check_tolerance("y", y.cpu(), y64, ref.gating_softmax(x, k, finished, dtype=x.dtype)[0])


def _check_v2(x, finished, k, renorm, flag):
    y, expert, sm = OPS.moe_gating_top_k_softmax_v2(_to_npu(x), _to_npu(finished), k, renorm, flag)
    y_cpu, expert_cpu, sm_cpu = OPS.moe_gating_top_k_softmax_v2(x, finished, k, renorm, flag)
    assert torch.equal(expert.cpu(), expert_cpu), "expert_idx differs from the CPU backend"
    y64, _, _, p64 = ref.gating_softmax(x, k, finished, renorm=renorm)
    check_tolerance("y", y.cpu(), y64, ref.gating_softmax(x, k, finished, renorm=renorm, dtype=x.dtype)[0])
    assert sm.shape == sm_cpu.shape and sm.dtype == sm_cpu.dtype
    if sm.numel():
        check_tolerance("softmax_result", sm.cpu(), p64, torch.softmax(x.float(), -1))


# ---- v1: dtypes x E x k, tails, 3-D input --------------------------------------------------------------------
def _v1_grid(dtype_name):
    dt = DTYPES[dtype_name]
    for seed, (n, e, k) in enumerate([(5, 8, 1), (53, 8, 2), (7, 8, 8), (49, 60, 2), (3, 60, 60), (97, 256, 1),
                                      (50, 256, 8), (2, 256, 256)]):
        x, finished = _inputs((n, e), dt, seed, finished_rate=0.25 if seed % 2 else 0.0)
        _check_v1(x, finished, k)


def case_v1_fp32_grid():
    _v1_grid("fp32")


def case_v1_fp16_grid():
    _v1_grid("fp16")


def case_v1_bf16_grid():
    _v1_grid("bf16")


def case_v1_3d_input_and_finished():
    for dtype_name in DTYPES:
        x, finished = _inputs((3, 17, 60), DTYPES[dtype_name], 11, finished_rate=0.4)
        _check_v1(x, finished, 4)


def case_v1_rows_span_several_tiles_with_tail():
    # 2500 rows of E = 256 on 48 cores: tiles of a few dozen rows, the last one shorter.
    x, finished = _inputs((2500, 256), torch.float16, 12, finished_rate=0.1)
    _check_v1(x, finished, 2)


def case_ties_go_to_the_lower_expert():
    for dtype_name in DTYPES:
        x, _ = _inputs((40, 13), DTYPES[dtype_name], 13, pattern="ties")
        _check_v1(x, None, 5)
        _check_v2(x, None, 3, 1, False)
    x = torch.tensor([[1.0, 3.0, 3.0, 0.0, 3.0], [2.0, 2.0, 2.0, 2.0, 2.0]])
    assert OPS.moe_gating_top_k_softmax(x.to(NPU), None, 3)[1].cpu().tolist() == [[1, 2, 4], [0, 1, 2]]


def case_neg_inf_logits():
    for dtype_name in DTYPES:
        x, finished = _inputs((30, 10), DTYPES[dtype_name], 14, pattern="neg_inf", finished_rate=0.3)
        _check_v1(x, finished, 9)  # more picks than finite logits: the -inf experts follow in index order
        _check_v2(x, finished, 9, 1, False)


def case_finished_rows_get_expert_E():
    x, _ = _inputs((20, 60), torch.float32, 15)
    finished = torch.zeros(20, dtype=torch.bool)
    finished[::3] = True
    _, expert, _ = OPS.moe_gating_top_k_softmax(x.to(NPU), finished.to(NPU), 2)
    assert (expert.cpu()[finished] == 60).all() and (expert.cpu()[~finished] < 60).all()
    _check_v1(x, finished, 2)


# ---- v2 ----------------------------------------------------------------------------------------------------------
def case_v2_renorm0_with_softmax_output():
    for seed, dtype_name in enumerate(DTYPES):
        x, finished = _inputs((45, 60), DTYPES[dtype_name], 20 + seed, finished_rate=0.2)
        _check_v2(x, finished, 3, 0, True)
        _check_v2(x, None, 2, 0, False)


def case_v2_renorm1():
    for seed, dtype_name in enumerate(DTYPES):
        for e, k in [(8, 2), (256, 8)]:
            x, finished = _inputs((33, e), DTYPES[dtype_name], 30 + seed, finished_rate=0.2)
            _check_v2(x, finished, k, 1, True)  # the flag is ignored with renorm 1: empty softmax_result


# ---- gradients through the npu path --------------------------------------------------------------------------
def case_gradients_match_the_cpu_path():
    for renorm in (0, 1):
        for dtype_name in DTYPES:
            x, _ = _inputs((24, 60), DTYPES[dtype_name], 40 + renorm)
            dy = torch.randn(24, 3, generator=torch.Generator().manual_seed(41)).to(x.dtype)
            xn = x.to(NPU).requires_grad_()
            OPS.moe_gating_top_k_softmax_v2(xn, None, 3, renorm, False)[0].backward(dy.to(NPU))
            xc = x.clone().requires_grad_()
            OPS.moe_gating_top_k_softmax_v2(xc, None, 3, renorm, False)[0].backward(dy)
            assert xn.grad.device.type == NPU
            torch.testing.assert_close(xn.grad.cpu(), xc.grad, atol=0, rtol=0)
    x = torch.randn(10, 8, generator=torch.Generator().manual_seed(42))
    xn = x.to(NPU).requires_grad_()
    (OPS.moe_gating_top_k_softmax(xn, None, 2)[0] * torch.arange(20.0).reshape(10, 2).to(NPU)).sum().backward()
    x64 = x.double().requires_grad_()
    (ref.gating_softmax(x64, 2)[0] * torch.arange(20.0).reshape(10, 2).double()).sum().backward()
    torch.testing.assert_close(xn.grad.cpu().double(), x64.grad, atol=1e-5, rtol=1e-4)


# ---- what runs the CPU kernel on the simulated device (docs/ascendc_moe.md) -------------------------------
def case_fallbacks_give_right_answers():
    x64, finished = _inputs((6, 8), torch.float64, 50, finished_rate=0.5)  # fp64: not a kernel dtype
    _check_v1(x64, finished, 3)
    x, _ = _inputs((9, 12), torch.float32, 51)
    x[2, 5] = float("nan")  # NaN ranks first on the CPU op; the kernel has no defined NaN rank
    y, expert, _ = OPS.moe_gating_top_k_softmax(x.to(NPU), None, 2)
    y_cpu, expert_cpu, _ = OPS.moe_gating_top_k_softmax(x, None, 2)
    assert torch.equal(expert.cpu(), expert_cpu)
    torch.testing.assert_close(y.cpu(), y_cpu, equal_nan=True)
    wide, _ = _inputs((2, 40000), torch.float32, 52)  # a row larger than one UB pass
    _check_v1(wide, None, 2)
    empty = torch.empty(0, 8)
    y, expert, row_idx = OPS.moe_gating_top_k_softmax(empty.to(NPU), None, 2)
    assert y.shape == (0, 2) and expert.shape == (0, 2) and row_idx.shape == (0, 2) and y.device.type == NPU


def case_bad_input_errors_match_the_cpu_op():
    x = torch.randn(4, 8)
    bad_calls = [
        lambda t, f: OPS.moe_gating_top_k_softmax(t, f, 9),                      # k > E
        lambda t, f: OPS.moe_gating_top_k_softmax(t, f, 0),                      # k < 1
        lambda t, f: OPS.moe_gating_top_k_softmax(t, f.int(), 2),                # finished not bool
        lambda t, f: OPS.moe_gating_top_k_softmax(t, f[:3], 2),                  # finished shape
        lambda t, f: OPS.moe_gating_top_k_softmax(t[0], f, 2),                   # 1-D x
        lambda t, f: OPS.moe_gating_top_k_softmax(t.int(), f, 2),                # integer x
        lambda t, f: OPS.moe_gating_top_k_softmax_v2(t, f, 2, 2, False),         # renorm
    ]
    fin = torch.zeros(4, dtype=torch.bool)
    for call in bad_calls:
        assert_same_error(lambda device: call(x.to(device), fin.to(device)))
