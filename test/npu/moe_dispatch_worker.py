"""moe_init_routing_v2 on the simulated npu device (the Ascend C kernel, ascendc/kernels/moe/
moe_init_routing_v2_kernel.cpp, through the CPU runtime) against the reference of moe_reference.py and the CPU
backend. Run by test_moe_dispatch.py through runner_worker.py (the device is already enabled here).

Every output is an exact copy or an integer, so the npu results must equal the CPU op's bit for bit. The grid covers
dropless and capacity modes, active_num cuts, active_expert_range drops, both row_idx_types, the three
expert_tokens_num_types, scale given or not, 1-D and 2-D expert_idx, dtypes of every element size, hidden sizes
with tails and several UB chunks, and more pairs than AIVs (so the ranks cross the cores' shares). It runs with CPU
fallbacks refused, so it proves the kernel ran.
"""
import itertools

import torch

from test.common import moe_reference as ref
from test.npu.runner import assert_same_error, no_fallback

OPS = torch.ops.npu_fa
NPU = "npu"


def _inputs(n, k, h, dtype, experts, seed, skew=False):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(n, h, generator=g) * 4).to(dtype)
    if skew:  # most pairs on two experts: long runs, capacity drops
        idx = torch.where(torch.rand(n, k, generator=g) < 0.7, torch.randint(0, 2, (n, k), generator=g),
                          torch.randint(0, experts, (n, k), generator=g))
    else:
        idx = torch.randint(0, experts, (n, k), generator=g)
    scale = torch.rand(n, generator=g)
    return x, idx.int(), scale


def _call(device, x, idx, scale, **kw):
    on = (lambda t: None if t is None else t.to(device))
    return OPS.moe_init_routing_v2(on(x), on(idx), scale=on(scale), **kw)


def _check(x, idx, scale, what, **kw):
    out = _call(NPU, x, idx, scale, **kw)
    cpu = _call("cpu", x, idx, scale, **kw)
    names = ("expanded_x", "expanded_row_idx", "expert_tokens", "expanded_scale")
    for name, o, c in zip(names, out, cpu):
        assert o.device.type == NPU, (what, name)
        assert o.dtype == c.dtype and o.shape == c.shape, (what, name, o.dtype, c.dtype, o.shape, c.shape)
        assert torch.equal(o.cpu(), c), (what, name)
    if kw.get("expert_tokens_num_type", 0) != 2:  # the reference has no key-value form
        want = ref.init_routing_v2(x, idx, scale=scale, **kw)
        for name, o, r in zip(names, out, want):
            if name == "expert_tokens" and not kw.get("expert_tokens_num_flag", False):
                continue
            assert torch.equal(o.cpu().to(r.dtype), r), (what, name)


def case_dropless_grid():
    """active_num, expert ranges, row_idx_type, token counts, scale, over fp32 / bf16."""
    seed = 0
    with no_fallback(True):
        for dtype, active, rng, rit, ttype, with_scale in itertools.product(
                (torch.float32, torch.bfloat16), (-1, 9), ((), (2, 6)), (0, 1), (0, 1, 2), (False, True)):
            seed += 1
            n, k, h = (7, 3, 40) if seed % 2 else (5, 2, 72)
            x, idx, scale = _inputs(n, k, h, dtype, 8, seed)
            _check(x, idx, scale if with_scale else None, f"dropless {dtype} {active} {rng} {rit} {ttype}",
                   active_num=active, expert_num=8, active_expert_range=list(rng), row_idx_type=rit,
                   expert_tokens_num_type=ttype, expert_tokens_num_flag=True)


def case_capacity_grid():
    """Capacity slots with drops (skewed routing) and empty slots, scale, 1-D expert_idx."""
    seed = 100
    with no_fallback(True):
        for dtype, capacity, with_scale, skew in itertools.product(
                (torch.float16, torch.float32), (1, 3, 40), (False, True), (False, True)):
            seed += 1
            x, idx, scale = _inputs(11, 2, 24, dtype, 6, seed, skew=skew)
            _check(x, idx, scale if with_scale else None, f"capacity {dtype} C={capacity} skew={skew}",
                   drop_pad_mode=1, expert_num=6, expert_capacity=capacity, expert_tokens_num_type=1,
                   expert_tokens_num_flag=True)
        x, idx, scale = _inputs(9, 1, 16, torch.float32, 4, 7)
        _check(x, idx[:, 0], scale, "1-D expert_idx", drop_pad_mode=1, expert_num=4, expert_capacity=2)


def case_every_element_size():
    """Rows move as bytes: int8, fp16, fp32 and fp64 x all take the kernel."""
    with no_fallback(True):
        for dtype in (torch.int8, torch.float16, torch.float32, torch.float64):
            x, idx, scale = _inputs(6, 2, 33, torch.float32, 5, 3)
            _check(x.to(dtype), idx, scale, f"dtype {dtype}", expert_num=5, expert_tokens_num_flag=True)


def case_long_rows_and_many_pairs():
    """H over one UB chunk with a tail; 600 pairs over 38 AIVs with a skew (ranks cross the shares)."""
    with no_fallback(True):
        x, idx, scale = _inputs(3, 2, 8192 + 100, torch.bfloat16, 4, 5)
        _check(x, idx, scale, "long rows", expert_num=4)
        x, idx, scale = _inputs(150, 4, 16, torch.float32, 64, 6, skew=True)
        for rit in (0, 1):
            _check(x, idx, scale, f"600 pairs row_idx_type {rit}", expert_num=64, row_idx_type=rit,
                   active_num=500, expert_tokens_num_flag=True, expert_tokens_num_type=0)
        _check(x, idx, None, "600 pairs capacity", drop_pad_mode=1, expert_num=64, expert_capacity=5,
               expert_tokens_num_flag=True, expert_tokens_num_type=1)


def case_experts_outside_the_range_and_h_zero():
    with no_fallback(True):
        x, idx, scale = _inputs(8, 2, 8, torch.float32, 10, 9)
        idx[0, 0] = 1 << 20  # far outside the range: dropped
        _check(x, idx, scale, "far expert dropped", active_expert_range=[3, 7], expert_tokens_num_flag=True,
               expert_tokens_num_type=1)
        _check(x, idx.long(), scale, "int64 expert_idx", active_expert_range=[0, 2], row_idx_type=1)
        x0, idx0, _ = _inputs(5, 2, 0, torch.float32, 3, 10)
        _check(x0, idx0, None, "H = 0", expert_num=3, expert_tokens_num_flag=True)


def case_scatter_index_lists_the_dropped_pairs_in_npu_order():
    """row_idx_type 1 with active_expert_range: every position holds a pair, the dropped ones after the routed ones
    (above the range by expert, far ids and ids beyond int32 included, then below it), across the cores' shares;
    row_idx_type 0 gives routed pairs their positions also past active_num's rows."""
    with no_fallback(True):
        x, idx, scale = _inputs(300, 3, 24, torch.float16, 40, 14)
        wide = idx.long()
        wide[0, 0], wide[5, 1], wide[7, 2], wide[9, 0] = 1 << 20, 2**31 - 1, 2**33, 1 << 20
        for active, rit in itertools.product((-1, 100), (0, 1)):
            _check(x, wide, scale, f"dropped pairs, active_num {active}, row_idx_type {rit}",
                   active_expert_range=[10, 20], active_num=active, row_idx_type=rit, expert_tokens_num_flag=True,
                   expert_tokens_num_type=1)


def case_gradients_match_the_cpu_path():
    x, idx, _ = _inputs(6, 2, 16, torch.float32, 4, 11)
    grads = {}
    for device in (NPU, "cpu"):
        xs = x.detach().to(device).requires_grad_()
        out = OPS.moe_init_routing_v2(xs, idx.to(device), expert_num=4, active_num=10)[0]
        (out.square() * torch.arange(out.numel(), device=device).view_as(out)).sum().backward()
        grads[device] = xs.grad.cpu()
    torch.testing.assert_close(grads[NPU], grads["cpu"])
    for kw in (dict(active_expert_range=[1, 3], row_idx_type=1), dict(active_expert_range=[1, 3], active_num=5)):
        for device in (NPU, "cpu"):
            xs = x.detach().to(device).requires_grad_()
            OPS.moe_init_routing_v2(xs, idx.to(device), **kw)[0].square().sum().backward()
            grads[device] = xs.grad.cpu()
        torch.testing.assert_close(grads[NPU], grads["cpu"])


def case_fallbacks_refused_and_equal_without_the_switch():
    """Quantised rows and calls without an expert count run the CPU kernel (refused under the switch)."""
    x, idx, _ = _inputs(6, 2, 16, torch.float32, 4, 12)
    forms = [dict(quant_mode=1, expert_num=4), dict()]
    for kw in forms:
        with no_fallback(True):
            try:
                _call(NPU, x, idx, None, **kw)
            except RuntimeError as e:
                assert "does not handle" in str(e), str(e)
            else:
                raise AssertionError(f"{kw}: the kernel ran a form it does not take")
        with no_fallback(False):
            for o, c in zip(_call(NPU, x, idx, None, **kw), _call("cpu", x, idx, None, **kw)):
                assert torch.equal(o.cpu(), c), kw


def case_bad_input_errors_match_the_cpu_op():
    x, idx, scale = _inputs(4, 2, 8, torch.float32, 4, 13)
    bad_idx = idx.clone()
    bad_idx[1, 1] = 9
    bad = [
        (idx, dict(expert_num=4, drop_pad_mode=2)),
        (bad_idx, dict(expert_num=4)),                                   # expert beyond expert_num
        (idx, dict(expert_num=4, drop_pad_mode=1)),                      # capacity without expert_capacity
        (idx, dict(expert_num=4, row_idx_type=1, drop_pad_mode=1, expert_capacity=2)),
        (idx, dict(expert_num=4, expert_tokens_num_type=3)),
        (idx, dict(active_expert_range=[3, 1])),
        (idx[:3], dict(expert_num=4)),                                    # N differs
        (idx.float(), dict(expert_num=4)),
    ]
    with no_fallback(True):
        for i, kw in bad:
            assert_same_error(lambda device: _call(device, x, i, None, **kw), str(kw))
        assert_same_error(lambda device: _call(device, x, idx, scale[:2], expert_num=4), "scale not [N]")


def case_empty_batch():
    x, idx, scale = _inputs(1, 2, 8, torch.float32, 4, 14)
    with no_fallback(True):
        for kw in (dict(expert_num=4, expert_tokens_num_flag=True, expert_tokens_num_type=2),
                   dict(drop_pad_mode=1, expert_num=4, expert_capacity=2, expert_tokens_num_flag=True,
                        expert_tokens_num_type=1)):
            _check(x[:0], idx[:0], scale[:0], f"empty {kw}", **kw)
