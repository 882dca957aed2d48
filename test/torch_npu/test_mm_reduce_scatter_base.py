"""Port of op-plugin test/test_custom_ops/test_mm_reduce_scatter_base.py (torch_npu.npu_mm_reduce_scatter_base).

Upstream cases (an HCCL world of 8 NPUs, `hcom` from `get_hccl_comm_name`):
- test_npu_mm_reduce_scatter_base: float16 x1 [128, 512], x2 [512, 256] per rank, comm_mode 'aiv' and 'ai_cpu',
  reduce_op 'sum', bias None; expected = (sum over ranks of x1 @ x2 in float32) cast to float16, rank r's rows
  [r*m/W, (r+1)*m/W); checked with assertRtolEqual(out, expected, 0.05, 0.05). Ported
  (test_mm_reduce_scatter_base_on_ranks): 2 gloo ranks in spawned processes, smaller shapes, both comm modes, the
  same golden and relative-error check, plus the project's tolerance rule against a float64 reference (torch's
  same-dtype matmul then reduce-scatter as the baseline); bfloat16 too. Also in the ranks: a bias (added once
  after the reduction here; torch_npu documents bias as unsupported), output_dtype float16 (a cast here),
  world_size None, a ProcessGroup as hcom, and torch_npu's error for m not divisible by world_size.
- test_npu_mm_reduce_scatter_quant: int8 x1/x2 with x1_scale / x2_scale, output_dtype float16 / bfloat16.
  Implemented; its numerics are tested across gloo ranks in test/mc2/test_quant.py, its argument errors in
  test_quantisation_argument_errors here.
The argument errors torch_npu raises before communicating (world_size, reduce_op, comm_mode) are checked in
test_argument_errors without a process group.
"""
import functools

import pytest
import torch
import torch.distributed as dist

from test.torch_npu import mc2_ranks
from test.torch_npu.common import on_cpu, to_device, torch_npu

OP = "npu_mm_reduce_scatter_base"


def _check_case(rank, world, hcom, dtype, comm_mode, seed):
    m, k, n = 32, 128, 64
    x1s = mc2_ranks.per_rank(seed, world, (m, k), dtype)
    x2s = mc2_ranks.per_rank(seed + 1, world, (k, n), dtype)
    tag = f"{OP} {dtype} comm_mode={comm_mode} rank {rank}"
    x1, x2 = to_device(x1s[rank], x2s[rank])
    out = torch_npu.npu_mm_reduce_scatter_base(x1, x2, hcom, world, reduce_op="sum", bias=None, comm_turn=0,
                                               comm_mode=comm_mode)
    assert out.device == mc2_ranks.rank_device(rank) and out.dtype == dtype and out.shape == (m // world, n), tag
    rows = slice(rank * m // world, (rank + 1) * m // world)
    # upstream's golden: the float32 sum of every rank's product, cast to the input dtype
    expected = sum(a.float() @ b.float() for a, b in zip(x1s, x2s)).to(dtype)[rows]
    mc2_ranks.assert_rtol_equal(tag, out, expected, 0.05)
    ref64 = sum(a.double() @ b.double() for a, b in zip(x1s, x2s))[rows]
    same = (x1s[rank] @ x2s[rank]).contiguous()  # torch's unfused same-dtype path: matmul, then reduce-scatter
    same_out = same.new_empty(m // world, n)
    dist.reduce_scatter_tensor(same_out, same)
    mc2_ranks.assert_tolerance(tag, out, ref64, same_out)


def _check_options(rank, world, group):
    m, k, n = 8, 16, 12
    x1s = mc2_ranks.per_rank(40, world, (m, k), torch.float32)
    x2s = mc2_ranks.per_rank(41, world, (k, n), torch.float32)
    bias = mc2_ranks.per_rank(42, 1, (n,), torch.float32)[0]
    out = torch_npu.npu_mm_reduce_scatter_base(to_device(x1s[rank]), to_device(x2s[rank]), group,
                                               bias=to_device(bias), output_dtype=torch.float16)
    rows = slice(rank * m // world, (rank + 1) * m // world)
    ref = sum(a.double() @ b.double() for a, b in zip(x1s, x2s))[rows] + bias.double()
    assert out.dtype == torch.float16
    mc2_ranks.assert_rtol_equal(f"{OP} bias output_dtype=float16", out, ref, 1e-2)
    with pytest.raises(ValueError, match="divisible by world_size"):  # torch_npu: M must divide by world_size
        torch_npu.npu_mm_reduce_scatter_base(to_device(x1s[rank][:m - 1]), to_device(x2s[rank]), group.group_name,
                                             world)


_worker = functools.partial(mc2_ranks.comm_mode_worker, check_case=_check_case, check_options=_check_options)


def test_mm_reduce_scatter_base_on_ranks(tmp_path):
    mc2_ranks.run(_worker, tmp_path)


def _call(**kwargs):
    x1, x2 = to_device(torch.randn(4, 8, dtype=torch.float16), torch.randn(8, 6, dtype=torch.float16))
    args = {"input": x1, "x2": x2, "hcom": "no_group", "world_size": 2, **kwargs}
    return torch_npu.npu_mm_reduce_scatter_base(**args)


@pytest.mark.parametrize("kwargs,fragment", [
    ({"world_size": 6}, "'world_size'"),
    ({"reduce_op": "max"}, "'reduce_op'"),
    ({"comm_mode": "AIV"}, "'comm_mode'"),
])
def test_argument_errors(kwargs, fragment):
    with pytest.raises(RuntimeError, match=fragment) as info:
        _call(**kwargs)
    assert isinstance(info.value, ValueError)


def test_quantisation_argument_errors():
    """The int8 form runs (numerics: test/mc2/test_quant.py); scales with a float input, or an int8 input without
    x2_scale, are torch_npu's argument errors."""
    with pytest.raises(RuntimeError, match="'x1_scale' and 'x2_scale' must be None with a float input"):
        _call(x1_scale=to_device(torch.ones(4, 1)), x2_scale=to_device(torch.ones(1, 6)))
    int8 = to_device(torch.ones(4, 8, dtype=torch.int8), torch.ones(8, 6, dtype=torch.int8))
    with pytest.raises(RuntimeError, match="'x2_scale' is required with int8 inputs"):
        torch_npu.npu_mm_reduce_scatter_base(int8[0], int8[1], "no_group", 2, output_dtype=torch.bfloat16)
