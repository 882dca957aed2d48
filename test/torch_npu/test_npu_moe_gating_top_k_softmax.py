"""Port of op-plugin test/test_custom_ops/test_npu_moe_gating_top_k_softmax.py
(torch_npu.npu_moe_gating_top_k_softmax).

Upstream cases:
- test_npu_noe_init_routing (sic): every combination of N in {10, 430, 520}, k in {2, 4, 5, 9}, E in {200, 1256,
  5120} and dtype float16 / float32, x ~ U(-1, 1), finished = U(-1, 1) cast to bool (so every row is finished and
  every expert index is E); golden: float32 softmax (rounded to float16 for float16 x), stable descending sort,
  row_idx[i, j] = j*N + i; default tolerances. Ported as is (the same grid and data recipe, seeded).
Added next to it: the same golden with a mix of finished and unfinished rows (float32, where the golden's selection
is well defined), so the expert indices are compared too.
"""
import itertools

import pytest
import torch

from test.torch_npu.common import to_device, torch_npu
from test.torch_npu.rtol import assert_rtol_equal


def gating_golden(x, finished, k):
    """(y, expert_idx, row_idx): softmax in float32 (cast back for float16), the k largest by a stable sort."""
    num_expert = x.shape[-1]
    softmax = torch.softmax(x.float(), dim=-1)
    if x.dtype == torch.float16:
        softmax = softmax.half()
    expert_idx = torch.sort(-softmax.float(), dim=-1, stable=True).indices[:, :k]
    y = softmax.gather(-1, expert_idx)
    if finished is not None:
        expert_idx = torch.where(finished[:, None], num_expert, expert_idx)
    n = x.shape[0]
    row_idx = torch.arange(n * k).reshape(k, n).t()
    return y.to(x.dtype), expert_idx.int(), row_idx.int()


def _check(x, finished, k):
    want = gating_golden(x, finished, k)
    got = torch_npu.npu_moe_gating_top_k_softmax(to_device(x), to_device(finished), k)
    for w, g in zip(want, got):
        assert_rtol_equal(w, g.cpu())


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_npu_noe_init_routing(dtype):
    gen = torch.Generator().manual_seed(0)
    for n, k, col in itertools.product([10, 430, 520], [2, 4, 5, 9], [200, 1256, 5120]):
        x = (torch.rand(n, col, generator=gen, dtype=torch.float64) * 2 - 1).to(dtype)
        finished = (torch.rand(n, generator=gen, dtype=torch.float64) * 2 - 1).bool()  # nonzero: all True
        _check(x, finished, k)


def test_npu_moe_gating_top_k_softmax_mixed_finished_rows():
    gen = torch.Generator().manual_seed(1)
    for n, k, col in [(10, 2, 200), (430, 9, 1256)]:
        x = torch.rand(n, col, generator=gen) * 2 - 1
        finished = torch.rand(n, generator=gen) < 0.3
        _check(x, finished, k)
