"""Port of op-plugin test/test_custom_ops/test_npu_moe_init_routing.py (torch_npu.npu_moe_init_routing, v1).

Upstream cases:
- test_npu_noe_init_routing (sic): every combination of N in {10, 430, 520}, k in {2, 4, 5, 9}, H in {200, 1256,
  5120} and x float16 / float32; row_idx[i, j] = j*N + i (int32), expert_idx ~ randint(0, 100) [N, k] (int32),
  active_num = N. Golden: a stable sort of the flattened expert indices; expanded_expert_idx = the sorted indices,
  expanded_row_idx[row_idx at sorted position p] = p, expanded_x = x[that row_idx % N] for the first
  min(active_num, N) * k positions. Default tolerances. Ported as is (the same grid, seeded).
"""
import itertools

import pytest
import torch

from test.torch_npu.common import to_device, torch_npu
from test.torch_npu.rtol import assert_rtol_equal


def init_routing_golden(x, row_idx, expert_idx, active_num):
    n, k = expert_idx.shape
    order = torch.sort(expert_idx.reshape(-1), stable=True).indices
    expanded_expert_idx = expert_idx.reshape(-1)[order]
    dst_to_src = row_idx.reshape(-1)[order].long()
    expanded_row_idx = torch.zeros(n * k, dtype=torch.int32)
    expanded_row_idx[dst_to_src] = torch.arange(n * k, dtype=torch.int32)
    active = min(active_num, n) * k
    return x[dst_to_src[:active] % n], expanded_row_idx, expanded_expert_idx.int()


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_npu_noe_init_routing(dtype):
    gen = torch.Generator().manual_seed(0)
    for n, k, col in itertools.product([10, 430, 520], [2, 4, 5, 9], [200, 1256, 5120]):
        x = (torch.rand(n, col, generator=gen) * 2 - 1).to(dtype)
        row_idx = torch.arange(n * k, dtype=torch.int32).reshape(k, n).t().contiguous()
        expert_idx = torch.randint(0, 100, (n, k), generator=gen, dtype=torch.int32)
        want = init_routing_golden(x, row_idx, expert_idx, n)
        got = torch_npu.npu_moe_init_routing(to_device(x), to_device(row_idx), to_device(expert_idx), n)
        for w, g in zip(want, got):
            assert_rtol_equal(w, g.cpu())
