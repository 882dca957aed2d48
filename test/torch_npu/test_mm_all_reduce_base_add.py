"""Port of op-plugin test/test_custom_ops/test_mm_all_reduce_base_add.py (torch_npu.npu_mm_all_reduce_base with
x3, the addend fused before the all-reduce).

Upstream case (an HCCL world of 2 NPUs, `hcom` from `get_hccl_comm_name`):
- test_npu_mm_all_reduce_base_add: float16 x1 [128, 512] and x2 [512, 256] per rank, one x3 [128, 256] passed by
  every rank; expected = the float32 sum over ranks of (x1 @ x2 + x3), cast to float16 (x3 is added on every rank,
  before the reduction: AllReduce(x1 @ x2 + x3)); checked with assertRtolEqual(out, expected, 0.05, 0.05).
  Ported (test_mm_all_reduce_base_add_on_ranks): 2 gloo ranks in spawned processes, smaller shapes, the same golden
  and relative-error check, plus the project's tolerance rule against a float64 reference (torch's same-dtype
  matmul + x3 then all-reduce as the baseline); bfloat16 and a 3-D x1 too; x3 that differs per rank, x3 with a
  bias, the gradient of x3, and torch_npu's x3 shape and dtype errors.
"""
import pytest
import torch

from test.torch_npu import mc2_ranks
from test.torch_npu.common import on_cpu, to_device, torch_npu

OP = "npu_mm_all_reduce_base"


def _check_case(rank, world, hcom, dtype, lead, seed):
    k, n = 128, 64
    x1s = mc2_ranks.per_rank(seed, world, (*lead, k), dtype)
    x2s = mc2_ranks.per_rank(seed + 1, world, (k, n), dtype)
    add = mc2_ranks.per_rank(seed + 2, 1, (*lead, n), dtype)[0]  # one x3, passed by every rank
    tag = f"{OP} x3 {dtype} x1 {(*lead, k)} rank {rank}"
    x1, x2, x3 = to_device(x1s[rank], x2s[rank], add)
    out = torch_npu.npu_mm_all_reduce_base(x1, x2, hcom, reduce_op="sum", bias=None, x3=x3, comm_turn=0)
    assert out.device == mc2_ranks.rank_device(rank) and out.dtype == dtype and out.shape == (*lead, n), tag
    expected = sum(a.float() @ b.float() + add.float() for a, b in zip(x1s, x2s)).to(dtype)
    mc2_ranks.assert_rtol_equal(tag, out, expected, 0.05)
    ref64 = sum(a.double() @ b.double() + add.double() for a, b in zip(x1s, x2s))
    mc2_ranks.assert_tolerance(tag, out, ref64, mc2_ranks.all_reduced(x1s[rank] @ x2s[rank] + add))


def _check_per_rank_x3_bias_and_grad(rank, world, hcom):
    m, k, n = 6, 16, 8
    x1s = mc2_ranks.per_rank(60, world, (m, k), torch.float32)
    x2s = mc2_ranks.per_rank(61, world, (k, n), torch.float32)
    x3s = mc2_ranks.per_rank(62, world, (m, n), torch.float32)
    bias = mc2_ranks.per_rank(63, 1, (n,), torch.float32)[0]
    x1, x2, x3, b = (to_device(t.clone()).requires_grad_() for t in (x1s[rank], x2s[rank], x3s[rank], bias))
    out = torch_npu.npu_mm_all_reduce_base(x1, x2, hcom, bias=b, x3=x3)
    ref = sum(a.double() @ w.double() + c.double() + bias.double() for a, w, c in zip(x1s, x2s, x3s))
    mc2_ranks.assert_rtol_equal(f"{OP} per-rank x3 and bias", out, ref, 1e-5)
    # the all-reduce's backward is the identity (a loss every rank computes alike): dx3 = dout, dbias = Σ_rows dout
    dout = mc2_ranks.per_rank(64, 1, (m, n), torch.float32)[0]
    out.backward(to_device(dout))
    torch.testing.assert_close(on_cpu(x3.grad), dout)
    torch.testing.assert_close(on_cpu(b.grad), dout.sum(0))
    torch.testing.assert_close(on_cpu(x1.grad), dout @ x2s[rank].T)


def _check_x3_errors(hcom):
    x1, x2 = to_device(torch.randn(4, 8, dtype=torch.float16), torch.randn(8, 5, dtype=torch.float16))
    with pytest.raises(ValueError, match="x3 must have the output's shape"):  # torch_npu: x3 with shape ... doesn't
        torch_npu.npu_mm_all_reduce_base(x1, x2, hcom, x3=to_device(torch.randn(4, 6, dtype=torch.float16)))
    with pytest.raises(ValueError, match="x3's dtype"):  # torch_npu: x3 with dtype ... doesn't match the output dtype
        torch_npu.npu_mm_all_reduce_base(x1, x2, hcom, x3=to_device(torch.randn(4, 5)))


def _worker(rank, world, port, out_dir):
    group = mc2_ranks.init_group(rank, world, port)
    hcom = mc2_ranks.hcom_name(group, rank)
    _check_case(rank, world, hcom, torch.float16, (32,), seed=0)
    _check_case(rank, world, hcom, torch.bfloat16, (2, 16), seed=10)
    _check_per_rank_x3_bias_and_grad(rank, world, hcom)
    _check_x3_errors(hcom)
    mc2_ranks.passed(rank, out_dir)


def test_mm_all_reduce_base_add_on_ranks(tmp_path):
    mc2_ranks.run(_worker, tmp_path)
