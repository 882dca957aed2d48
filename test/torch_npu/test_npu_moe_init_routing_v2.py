"""Port of op-plugin test/test_custom_ops/test_npu_moe_init_routing_v2.py (torch_npu.npu_moe_init_routing_v2).

Upstream cases (32 experts, expert_idx ~ randint(0, 32) [bs, k] int32, active_num = bs*k):
- test_npu_moe_init_routing_empty_tensor: bs 0, H 8192, k 12, bfloat16, range [0, 16], expert token numbers on,
  with quant_mode 1 (dynamic int8 quantisation). Ported unquantised (quant_mode -1; every output empty, the token
  numbers all zero); quant_mode 1 itself is checked to raise NotImplementedError naming 'quant_mode'.
- test_npu_moe_init_routing_no_quant: bs 32, H {14, 200}, k 5, quant_mode -1, x int8 / float16 / float32 /
  bfloat16 / hifloat8, scale None or [bs] float32, dropless with range [0, 16] and token numbers as counts (1) or
  (expert, count) pairs (2), row_idx_type 0 (gather index, -1 for pairs outside the range) or 1 (scatter index).
  Ported for every dtype but hifloat8 (an NPU-only 8-bit float torch lacks), over every combination instead of the
  upstream's random draws (which also return after the first case without scale), plus the cases the upstream
  loop skips but its golden defines: cumsum token numbers (0) and capacity mode (drop_pad_mode 1, range [0, 32],
  expert_capacity in [1, bs], counts before dropping). As upstream, expanded_x / expanded_scale are compared over
  the rows routed, the (expert, count) pairs over the experts with tokens plus one zero row; expanded_row_idx of
  row_idx_type 1 over its first (routed count) entries, the rest being unspecified (torch_npu's documentation).
- test_npu_moe_init_routing_mxfp_no_quant: float8_e4m3fn / float8_e5m2 / float4_e2m1 x routed unquantised. Ported
  for the two float8 dtypes without scale (pure row movement); their scale (float8_e8m0 MX block scales) and the
  float4 x (x_dtype=float4_e2m1fn_x2, raising NotImplementedError here) are quantised formats.
Not applicable (quantised expanded_x, not implemented): test_npu_moe_init_routing_static_quant (0),
test_npu_moe_init_routing_dynamic_quant (1), ..._int4_dynamic_quant_mode_13 and ..._reject_legacy_mode (13, x_dtype
int4), ..._hif8_no_quant (hifloat8 x), ..._mxfp_quant (2, 3, 9, 16, 17), ..._hif8_pertensor_quant (7),
..._hif8_pertoken_quant (8), ..._fp8_perblock_quant (11, 12), ..._fp8_pergroup_quant (4, 5, 14, 15).
"""
import itertools

import pytest
import torch

from test.torch_npu.common import to_device, torch_npu
from test.torch_npu.rtol import assert_rtol_equal

EXPERT_NUM = 32


def init_routing_v2_golden(x, expert_idx, scale, expert_range, row_idx_type, flag, tokens_type, drop_pad_mode,
                           active_num, expert_capacity):
    """(expanded_x, expanded_row_idx, token numbers, expanded_scale, routed count), unquantised."""
    start, end = expert_range
    n, k = expert_idx.shape
    flat = expert_idx.reshape(-1).long().clone()
    inside = (flat >= start) & (flat < end)
    routed = int(inside.sum())
    flat[flat < start] = torch.iinfo(torch.int32).max  # experts below the range sort last
    order = torch.sort(flat, stable=True).indices
    sorted_experts = flat[order]
    if row_idx_type == 1:
        row_idx = order.int()
    else:
        row_idx = torch.full((n * k,), -1, dtype=torch.int32)
        row_idx[order[:routed]] = torch.arange(routed, dtype=torch.int32)
    tokens = None
    if flag:
        counts = torch.bincount(sorted_experts[:routed] - start, minlength=end - start)
        if tokens_type == 0 and drop_pad_mode == 0:
            tokens = torch.cumsum(counts, 0)
        elif tokens_type == 2 and drop_pad_mode == 0:
            ids = torch.nonzero(counts).reshape(-1)
            tokens = torch.stack([ids + start, counts[ids]], dim=1)
            if tokens.shape[0] < EXPERT_NUM:
                tokens = torch.cat([tokens, torch.zeros(1, 2, dtype=tokens.dtype)])
        else:
            tokens = counts
        tokens = tokens.long()
    expanded_scale = None
    if drop_pad_mode == 0:
        active = routed if active_num == 0 else min(active_num, routed)
        src = order[:active] // k
        rows = x.view(torch.uint8) if x.dtype in (torch.float8_e4m3fn, torch.float8_e5m2) else x  # row copies
        expanded_x = rows[src].view(x.dtype)
        if scale is not None:
            expanded_scale = scale[src]
        return expanded_x, row_idx, tokens, expanded_scale, active
    # capacity: each expert keeps its first expert_capacity pairs in token order, the rest is dropped (-1)
    slots = torch.full((EXPERT_NUM * expert_capacity,), -1, dtype=torch.long)
    row_idx = torch.full((n * k,), -1, dtype=torch.int32)
    seen = {}
    for p in range(routed):
        e = int(sorted_experts[p])
        pos = seen.get(e, 0)
        seen[e] = pos + 1
        if pos < expert_capacity:
            slots[e * expert_capacity + pos] = order[p]
            row_idx[order[p]] = e * expert_capacity + pos
    kept = slots >= 0
    expanded_x = torch.zeros((EXPERT_NUM * expert_capacity,) + tuple(x.shape[1:]), dtype=x.dtype)
    expanded_x[kept] = x[slots[kept] // k]
    if scale is not None:
        expanded_scale = torch.zeros(EXPERT_NUM * expert_capacity, dtype=scale.dtype)
        expanded_scale[kept] = scale[slots[kept] // k]
    return expanded_x.reshape(EXPERT_NUM, expert_capacity, -1), row_idx, tokens, expanded_scale, None


def _x(bs, h, dtype, gen):
    if dtype == torch.int8:
        return torch.randint(-127, 128, (bs, h), generator=gen, dtype=torch.int8)
    return (torch.rand(bs, h, generator=gen) * 2 - 1).to(dtype)


def _run_and_compare(x, expert_idx, scale, expert_range, row_idx_type, flag, tokens_type, drop_pad_mode,
                     active_num, expert_capacity):
    want_x, want_row, want_tokens, want_scale, active = init_routing_v2_golden(
        x, expert_idx, scale, expert_range, row_idx_type, flag, tokens_type, drop_pad_mode, active_num,
        expert_capacity)
    got_x, got_row, got_tokens, got_scale = torch_npu.npu_moe_init_routing_v2(
        to_device(x), to_device(expert_idx), scale=to_device(scale), offset=None, active_num=active_num,
        expert_capacity=expert_capacity, expert_num=EXPERT_NUM, drop_pad_mode=drop_pad_mode,
        expert_tokens_num_type=tokens_type, expert_tokens_num_flag=flag, quant_mode=-1,
        active_expert_range=expert_range, row_idx_type=row_idx_type)
    got_x, got_row, got_tokens, got_scale = (t.cpu() for t in (got_x, got_row, got_tokens, got_scale))
    if drop_pad_mode == 0:
        got_x, got_scale = got_x[:active], got_scale[:active]
    if x.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):  # compared as float32, like upstream's float8 check
        want_x, got_x = want_x.float(), got_x.float()
    assert_rtol_equal(want_x, got_x)
    if row_idx_type == 1:  # only the routed entries of the scatter index are specified
        routed = int(((expert_idx >= expert_range[0]) & (expert_idx < expert_range[1])).sum())
        want_row, got_row = want_row[:routed], got_row[:routed]
    assert_rtol_equal(want_row, got_row)
    if flag:
        assert_rtol_equal(want_tokens, got_tokens[:want_tokens.shape[0]])
    if scale is not None:
        assert_rtol_equal(want_scale, got_scale)


@pytest.mark.parametrize("dtype", [torch.int8, torch.float16, torch.float32, torch.bfloat16])
def test_npu_moe_init_routing_no_quant(dtype):
    gen = torch.Generator().manual_seed(0)
    bs, k = 32, 5
    for h, with_scale, tokens_type, row_idx_type in itertools.product([14, 200], [False, True], [0, 1, 2], [0, 1]):
        x = _x(bs, h, dtype, gen)
        expert_idx = torch.randint(0, EXPERT_NUM, (bs, k), generator=gen, dtype=torch.int32)
        scale = torch.rand(bs, generator=gen) * 2 - 1 if with_scale else None
        _run_and_compare(x, expert_idx, scale, [0, 16], row_idx_type, True, tokens_type, 0, bs * k, -1)


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32, torch.bfloat16])
def test_npu_moe_init_routing_no_quant_drop_pad(dtype):
    gen = torch.Generator().manual_seed(1)
    bs, k = 32, 5
    for h, with_scale, capacity in itertools.product([14, 200], [False, True], [1, 7, 32]):
        x = _x(bs, h, dtype, gen)
        expert_idx = torch.randint(0, EXPERT_NUM, (bs, k), generator=gen, dtype=torch.int32)
        scale = torch.rand(bs, generator=gen) * 2 - 1 if with_scale else None
        _run_and_compare(x, expert_idx, scale, [0, EXPERT_NUM], 0, True, 1, 1, bs * k, capacity)


def test_npu_moe_init_routing_empty_tensor():
    x = torch.empty(0, 8192, dtype=torch.bfloat16)
    expert_idx = torch.empty(0, 12, dtype=torch.int32)
    scale = torch.empty(0)
    for tokens_type, row_idx_type in itertools.product([0, 1, 2], [0, 1]):
        outs = torch_npu.npu_moe_init_routing_v2(
            to_device(x), to_device(expert_idx), scale=to_device(scale), active_num=0, expert_num=EXPERT_NUM,
            expert_tokens_num_type=tokens_type, expert_tokens_num_flag=True, quant_mode=-1,
            active_expert_range=[0, 16], row_idx_type=row_idx_type)
        expanded_x, expanded_row_idx, tokens, expanded_scale = (t.cpu() for t in outs)
        assert expanded_x.numel() == 0 and expanded_row_idx.numel() == 0 and expanded_scale.numel() == 0
        assert torch.all(tokens == 0)
    with pytest.raises(NotImplementedError, match="'quant_mode'"):
        torch_npu.npu_moe_init_routing_v2(to_device(x), to_device(expert_idx), scale=to_device(scale),
                                          expert_num=EXPERT_NUM, quant_mode=1, active_expert_range=[0, 16])


@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.float8_e5m2])
def test_npu_moe_init_routing_mxfp_no_quant(dtype):
    gen = torch.Generator().manual_seed(2)
    bs, k = 32, 5
    for h, tokens_type, row_idx_type in itertools.product([14, 200], [1, 2], [0, 1]):
        x = torch.randn(bs, h, generator=gen).to(dtype)
        expert_idx = torch.randint(0, EXPERT_NUM, (bs, k), generator=gen, dtype=torch.int32)
        _run_and_compare(x, expert_idx, None, [0, 16], row_idx_type, True, tokens_type, 0, bs * k, -1)
    for x_dtype in (torch_npu.float4_e2m1fn_x2, torch_npu.hifloat8):  # torch_npu's codes of its own dtypes
        with pytest.raises(NotImplementedError, match="'x_dtype'"):
            torch_npu.npu_moe_init_routing_v2(to_device(torch.zeros(4, 8, dtype=torch.uint8)),
                                              to_device(torch.zeros(4, 2, dtype=torch.int32)), expert_num=EXPERT_NUM,
                                              x_dtype=x_dtype)
