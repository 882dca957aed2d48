"""Port of op-plugin test/test_custom_ops/test_npu_moe_compute_tokens.py (torch_npu.npu_moe_compute_expert_tokens).

Upstream cases:
- test_npu_moe_compute_expert_tokens: 302 sorted int32 expert indices drawn from [0, 31] with num_expert = 31 (so
  index 31 = num_expert, as finished rows carry, can occur), golden = a binary search for the end of each expert's
  run. Ported, with a fixed seed, plus a case where the index num_expert does occur and one with int64 indices.
"""
import random

import torch

from test.torch_npu.common import DEVICE, to_device, torch_npu
from test.torch_npu.rtol import assert_rtol_equal


def run_ends(sorted_experts, num_expert):
    """Golden: for each expert, one past the last position whose index is <= the expert (binary search)."""
    ends = []
    for target in range(num_expert):
        lo, hi, last = 0, len(sorted_experts) - 1, -1
        while lo <= hi:
            mid = (lo + hi) // 2
            if sorted_experts[mid] > target:
                hi = mid - 1
            else:
                lo, last = mid + 1, mid
        ends.append(last + 1)
    return ends


def _check(sorted_experts, num_expert, dtype=torch.int32):
    golden = torch.tensor(run_ends(sorted_experts, num_expert), dtype=torch.float32)
    out = torch_npu.npu_moe_compute_expert_tokens(to_device(torch.tensor(sorted_experts, dtype=dtype)), num_expert)
    assert out.device.type == DEVICE and out.dtype == torch.int32 and out.shape == (num_expert,)
    assert_rtol_equal(golden, out.cpu().float())


def test_npu_moe_compute_expert_tokens():
    rng = random.Random(0)
    num_expert = 31
    _check(sorted(rng.randint(0, num_expert) for _ in range(302)), num_expert)


def test_npu_moe_compute_expert_tokens_with_finished_index_and_int64():
    _check([0, 0, 2, 5, 5, 5, 7, 7], 7, dtype=torch.int64)  # 7 = num_expert: counted by no expert
