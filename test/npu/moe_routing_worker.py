"""moe_finalize_routing on the simulated npu device (the Ascend C kernel, ascendc/kernels/moe/
moe_finalize_routing_kernel.cpp, through the CPU runtime) against the float64 reference of moe_reference.py and the
CPU backend. Run by test_moe_routing.py through runner_worker.py (the device is already enabled here).

The grid covers the dtypes, the four drop_pad_modes (column- and token-major pairs, capacity layout), every
optional argument present or absent, dropped pairs (-1), rows read by several pairs, int32 and int64 indices, hidden
sizes with tails and several UB chunks, and more tokens than AIVs. The grid runs with CPU fallbacks refused, so it
proves the kernel ran.
"""
import itertools

import torch

from test.common import moe_reference as ref
from test.common.reference import DTYPES, check_tolerance
from test.npu.runner import assert_same_error, no_fallback

OPS = torch.ops.npu_fa
NPU = "npu"


def _case(n, k, h, dtype, mode, optional, seed, drop=0.2, index_dtype=torch.int32, experts=4, repeats=False):
    """Inputs of one call: optional = (skip1, skip2, bias, scales) present or not; repeats: the rows are drawn with
    replacement (pairs may read the same row, as in torch_npu's documented examples)."""
    g = torch.Generator().manual_seed(seed)
    has_skip1, has_skip2, has_bias, has_scales = optional
    pairs = n * k
    if mode in (1, 3):  # capacity layout [E, C, H]
        capacity = (pairs + experts - 1) // experts + 1
        rows = torch.randn(experts, capacity, h, generator=g).to(dtype)
    else:
        rows = torch.randn(pairs + 3, h, generator=g).to(dtype)
    total = rows.numel() // h
    dst = torch.randint(0, total, (pairs,), generator=g) if repeats else torch.randperm(total, generator=g)[:pairs]
    dst[torch.rand(pairs, generator=g) < drop] = -1
    args = dict(
        rows=rows,
        skip1=torch.randn(n, h, generator=g).to(dtype) if has_skip1 else None,
        skip2=torch.randn(n, h, generator=g).to(dtype) if has_skip2 else None,
        bias=torch.randn(experts, h, generator=g).to(dtype) if has_bias else None,
        scales=torch.rand(n, k, generator=g).to(dtype) if has_scales else None,
        dst=dst.to(index_dtype),
        experts=torch.randint(0, experts, (n, k), generator=g, dtype=torch.int32),
        mode=mode,
    )
    return args


def _call(a, device):
    def on(t):
        return None if t is None else t.to(device)
    return OPS.moe_finalize_routing(on(a["rows"]), on(a["skip1"]), on(a["skip2"]), on(a["bias"]), on(a["scales"]),
                                    on(a["dst"]), on(a["experts"]), a["mode"])


def _reference(a, dtype):
    return ref.finalize(a["rows"], a["skip1"], a["skip2"], a["bias"], a["scales"], a["dst"], a["experts"], a["mode"],
                        n=a["experts"].shape[0], dtype=dtype)


def _check(a, what):
    out = _call(a, NPU)
    assert out.device.type == NPU and out.dtype == a["rows"].dtype, what
    cpu = _call(a, "cpu")
    check_tolerance(what, out.cpu(), _reference(a, torch.float64), _reference(a, a["rows"].dtype))
    torch.testing.assert_close(out.cpu().float(), cpu.float(), rtol=1e-2 if out.dtype != torch.float32 else 1e-5,
                               atol=1e-2 if out.dtype != torch.float32 else 1e-5, msg=what)


def _grid(dtype_name):
    dt = DTYPES[dtype_name]
    seed = 0
    with no_fallback(True):
        for mode, optional in itertools.product(range(4), itertools.product((False, True), repeat=4)):
            seed += 1
            n, k, h = (5, 2, 40) if seed % 2 else (3, 4, 72)
            _check(_case(n, k, h, dt, mode, optional, seed), f"{dtype_name} mode {mode} optional {optional}")


def case_fp32_grid():
    _grid("fp32")


def case_fp16_grid():
    _grid("fp16")


def case_bf16_grid():
    _grid("bf16")


def case_long_rows_span_several_chunks():
    """H beyond one UB chunk (8192 elements) with a tail; the bf16 conversion buffer in use."""
    with no_fallback(True):
        for dt in (torch.float32, torch.bfloat16):
            _check(_case(3, 2, 8192 + 100, dt, 2, (True, True, True, True), 7), f"long rows {dt}")


def case_more_tokens_than_cores_and_int64_indices():
    with no_fallback(True):
        _check(_case(101, 3, 24, torch.float16, 0, (True, False, True, True), 8, index_dtype=torch.int64),
               "101 tokens, int64 dst")


def case_every_pair_dropped_and_k_one():
    with no_fallback(True):
        _check(_case(6, 1, 16, torch.float32, 2, (True, True, False, True), 9, drop=1.0), "all dropped")
        _check(_case(6, 1, 16, torch.float32, 0, (False, False, False, True), 10, drop=0.0), "k = 1")


def case_gradients_match_the_cpu_path():
    _gradients_match(_case(4, 2, 24, torch.float32, 3, (True, True, True, True), 11))


def case_rows_read_by_several_pairs():
    """expanded_src_to_dst_row naming a row more than once (every drop_pad_mode reads through it): each pair adds
    its row, on the kernel as in the float64 reference and on the CPU backend; gradients sum over those pairs."""
    with no_fallback(True):
        for mode in range(4):
            a = _case(6, 3, 40, torch.float32, mode, (True, True, True, True), 20 + mode, drop=0.1, repeats=True)
            a["dst"][1] = a["dst"][0] = max(int(a["dst"][0]), 0)  # at least one row named twice
            _check(a, f"repeated rows, mode {mode}")
        every = _case(4, 2, 16, torch.bfloat16, 2, (True, False, False, True), 24, drop=0.0)
        every["dst"].fill_(3)  # all pairs read one row
        _check(every, "one row for every pair")
    a = _case(4, 2, 24, torch.float32, 0, (True, False, True, True), 25, drop=0.0, repeats=True)
    a["dst"][:3] = 2
    _gradients_match(a)


def _gradients_match(a):
    leaves = {name: a[name].clone().requires_grad_() for name in ("rows", "skip1", "skip2", "bias", "scales")
              if a[name] is not None}
    grads = {}
    for device in (NPU, "cpu"):
        xs = {name: t.detach().to(device).requires_grad_() for name, t in leaves.items()}
        out = OPS.moe_finalize_routing(xs["rows"], xs.get("skip1"), xs.get("skip2"), xs.get("bias"),
                                       xs.get("scales"), a["dst"].to(device), a["experts"].to(device), a["mode"])
        out.square().sum().backward()
        grads[device] = {name: t.grad.cpu() for name, t in xs.items()}
    for name in leaves:
        torch.testing.assert_close(grads[NPU][name], grads["cpu"][name], rtol=1e-5, atol=1e-5, msg=name)


def case_fallback_for_float64():
    a = _case(4, 2, 16, torch.float64, 0, (True, False, True, True), 12)
    torch.testing.assert_close(_call(a, NPU).cpu(), _call(a, "cpu"))


def case_bad_input_errors_match_the_cpu_op():
    """Validation runs before the kernel or any fallback: the npu call raises the CPU op's error, also with CPU
    fallbacks refused."""
    base = _case(4, 2, 8, torch.float32, 2, (True, False, True, True), 13, drop=0.0)

    def with_(**changes):
        a = dict(base)
        a.update(changes)
        return a

    bad = [
        with_(dst=torch.full_like(base["dst"], 99)),            # destination row out of range
        with_(dst=torch.full_like(base["dst"], -2)),            # below -1
        with_(experts=torch.full_like(base["experts"], 7)),      # expert beyond bias rows
        with_(scales=base["scales"][:, :1]),                      # scales not [N, k]
        with_(mode=4),                                            # drop_pad_mode
        with_(dst=base["dst"].float()),                           # float indices
        with_(skip1=base["skip1"].double()),                      # skip dtype differs
        with_(dst=base["dst"][:-1]),                              # N*k not a multiple of N
    ]
    with no_fallback(True):
        for a in bad:
            assert_same_error(lambda device: _call(a, device))


def case_empty_batch():
    a = _case(1, 2, 8, torch.float32, 2, (True, False, False, True), 14)
    a.update(skip1=a["skip1"][:0], scales=a["scales"][:0], dst=a["dst"][:0], experts=a["experts"][:0])
    with no_fallback(True):
        out = _call(a, NPU)
    assert out.shape == (0, 8) and out.device.type == NPU


def case_positions_past_the_rows():
    """Dropless modes: an entry in [rows, N*k) is a sorted position past the rows (moe_init_routing_v2 with
    active_num gives those pairs no row): the pair adds nothing, as -1, on the kernel as on the CPU backend."""
    with no_fallback(True):
        for mode in (0, 2):
            a = _case(5, 2, 24, torch.float32, mode, (True, False, True, True), 30 + mode, drop=0.1)
            rows = a["rows"].shape[0]
            a["rows"] = a["rows"][:rows - 6]  # the last six rows gone: entries naming them are past the rows
            a["dst"][a["dst"] >= rows - 6] = rows - 4
            _check(a, f"past the rows, mode {mode}")
