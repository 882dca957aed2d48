"""Port of op-plugin test/test_custom_ops/test_npu_moe_gating_top_k_softmax_v2.py
(torch_npu.npu_moe_gating_top_k_softmax_v2, called with keywords x=, k=, finished=, renorm=, output_softmax=).

Upstream cases:
- test_npu_noe_gating_top_k_softmax_v2: every combination of N in {10, 430, 520}, k in {2, 4, 5, 9}, E in {200,
  1256, 5120}, output_softmax True / False, renorm 0 / 1, dtype float16 / float32; x ~ U(-1, 1), finished = U(-1,
  1) cast to bool (every row finished: expert index E). Golden: renorm 0 = float32 softmax over E, then the k
  largest (stable); renorm 1 = the k largest logits (stable), then a float32 softmax over them; softmax_result =
  the float32 softmax when renorm 0 and output_softmax, else an empty float32 tensor. Default tolerances. Ported
  as is (the same grid and data recipe, seeded).
Added: a 3-D x [B, S, E] with a mix of finished rows (float32), and None for renorm / output_softmax (their `int?` /
`bool?` defaults).
"""
import itertools

import pytest
import torch

from test.torch_npu.common import to_device, torch_npu
from test.torch_npu.rtol import assert_rtol_equal


def gating_v2_golden(x, k, finished, renorm, output_softmax):
    num_expert = x.shape[-1]
    lead = x.shape[:-1]
    x2 = x.reshape(-1, num_expert)
    softmax = torch.softmax(x2.float(), dim=-1)
    if renorm == 1:
        idx = torch.sort(-x2.float(), dim=-1, stable=True).indices[:, :k]
        out = torch.softmax(x2.gather(-1, idx).float(), dim=-1).to(x.dtype)
    else:
        idx = torch.sort(-softmax, dim=-1, stable=True).indices[:, :k]
        out = softmax.gather(-1, idx).to(x.dtype)
    idx = idx.int()
    if finished is not None:
        idx = torch.where(finished.reshape(-1, 1), num_expert, idx).int()
    sm = softmax.reshape(*lead, num_expert) if renorm == 0 and output_softmax else torch.empty(0)
    return out.reshape(*lead, k), idx.reshape(*lead, k), sm


def _check(x, k, finished, renorm, output_softmax):
    want = gating_v2_golden(x, k, finished, renorm, output_softmax)
    got = torch_npu.npu_moe_gating_top_k_softmax_v2(x=to_device(x), k=k, finished=to_device(finished),
                                                    renorm=renorm, output_softmax=output_softmax)
    for w, g in zip(want, got):
        assert_rtol_equal(w, g.cpu())


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize("renorm", [0, 1])
def test_npu_noe_gating_top_k_softmax_v2(dtype, renorm):
    gen = torch.Generator().manual_seed(renorm)
    for n, k, col, flag in itertools.product([10, 430, 520], [2, 4, 5, 9], [200, 1256, 5120], [True, False]):
        x = (torch.rand(n, col, generator=gen, dtype=torch.float64) * 2 - 1).to(dtype)
        finished = (torch.rand(n, generator=gen, dtype=torch.float64) * 2 - 1).bool()  # nonzero: all True
        _check(x, k, finished, renorm, flag)


@pytest.mark.parametrize("renorm", [0, 1])
def test_npu_moe_gating_top_k_softmax_v2_3d_and_none_defaults(renorm):
    gen = torch.Generator().manual_seed(2)
    x = torch.rand(3, 7, 64, generator=gen) * 2 - 1
    finished = torch.rand(3, 7, generator=gen) < 0.3
    _check(x, 4, finished, renorm, True)
    y, idx, sm = torch_npu.npu_moe_gating_top_k_softmax_v2(to_device(x), k=4, renorm=None, output_softmax=None)
    want = gating_v2_golden(x, 4, None, 0, False)
    for w, g in zip(want, (y, idx, sm)):
        assert_rtol_equal(w, g.cpu())
