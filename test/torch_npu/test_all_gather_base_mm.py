"""Port of op-plugin test/test_custom_ops/test_all_gather_base_mm.py (torch_npu.npu_all_gather_base_mm).

Upstream cases (an HCCL world of 8 NPUs, `hcom` from `get_hccl_comm_name`, results gathered by the parent):
- test_npu_all_gather_base_mm: float16 x1 [16, 512] and x2 [512, 256] per rank, comm_mode 'aiv' and 'ai_cpu';
  expected out = cat(x1 of all ranks) @ x2 of this rank, gather_out = cat(x1 of all ranks), compared with
  assertEqual. Ported (test_all_gather_base_mm_on_ranks): 2 gloo ranks in spawned processes, smaller shapes, both
  comm modes, float16 and bfloat16; gather_out compared exactly, out with the project's tolerance rule against a
  float64 reference (torch's same-dtype matmul of the gathered x1 as the baseline, as upstream's expected value is
  the device's float16 matmul). Also in the ranks: bias, gather_output=False, output_dtype float16 (a cast of the
  float32 result here), world_size None (the group's size), a ProcessGroup as hcom, and torch_npu's error for
  x1 and x2 with different k.
- test_npu_all_gather_quant_mm: int8 x1/x2 with x1_scale / x2_scale and output_dtype float16. Implemented; its
  numerics are tested across gloo ranks in test/mc2/test_quant.py, its argument errors in
  test_quantisation_argument_errors here.
Argument errors torch_npu raises (world_size outside {2, 4, 8, 16, 32}, comm_mode values, gather_output with
'aiv') are checked in test_argument_errors, without a process group (they are raised before `hcom` is resolved).
"""
import functools

import pytest
import torch

from test.torch_npu import mc2_ranks
from test.torch_npu.common import on_cpu, to_device, torch_npu

OP = "npu_all_gather_base_mm"


def _check_case(rank, world, hcom, dtype, comm_mode, seed):
    m, k, n = 16, 128, 64
    x1s = mc2_ranks.per_rank(seed, world, (m, k), dtype)
    x2s = mc2_ranks.per_rank(seed + 1, world, (k, n), dtype)
    tag = f"{OP} {dtype} comm_mode={comm_mode} rank {rank}"
    x1, x2 = to_device(x1s[rank], x2s[rank])
    out, gather_out = torch_npu.npu_all_gather_base_mm(x1, x2, hcom, world, bias=None, x1_scale=None, x2_scale=None,
                                                       gather_index=0, gather_output=True, comm_turn=0,
                                                       output_dtype=None, comm_mode=comm_mode)
    gathered = torch.cat(x1s)
    assert out.device == gather_out.device == mc2_ranks.rank_device(rank), tag
    assert out.dtype == dtype and out.shape == (world * m, n), tag
    assert torch.equal(on_cpu(gather_out), gathered), f"{tag}: gather_out is not AllGather(x1)"
    mc2_ranks.assert_tolerance(tag, out, gathered.double() @ x2s[rank].double(), gathered @ x2s[rank])


def _check_options(rank, world, group):
    """bias, gather_output=False, output_dtype, world_size None and a ProcessGroup as hcom: our wrapper's
    behaviour beyond upstream's cases."""
    m, k, n = 8, 32, 16
    x1s = mc2_ranks.per_rank(7, world, (m, k), torch.float32)
    x2, bias = mc2_ranks.per_rank(8, 1, (k, n), torch.float32)[0], mc2_ranks.per_rank(9, 1, (n,), torch.float32)[0]
    x1 = to_device(x1s[rank])
    out, gather_out = torch_npu.npu_all_gather_base_mm(x1, to_device(x2), group, bias=to_device(bias),
                                                       gather_output=False, output_dtype=torch.float16)
    assert gather_out.numel() == 0 and out.dtype == torch.float16
    gathered = torch.cat(x1s)
    mc2_ranks.assert_tolerance(f"{OP} bias output_dtype=float16", out,
                               gathered.double() @ x2.double() + bias.double(), (gathered @ x2 + bias).half())
    with pytest.raises(ValueError, match="x1's last dim"):
        torch_npu.npu_all_gather_base_mm(x1, to_device(x2[:-1]), group.group_name, world)


_worker = functools.partial(mc2_ranks.comm_mode_worker, check_case=_check_case, check_options=_check_options)


def test_all_gather_base_mm_on_ranks(tmp_path):
    mc2_ranks.run(_worker, tmp_path)


def _call(**kwargs):
    x1, x2 = to_device(torch.randn(4, 8, dtype=torch.float16), torch.randn(8, 6, dtype=torch.float16))
    args = {"input": x1, "x2": x2, "hcom": "no_group", "world_size": 2, **kwargs}
    return torch_npu.npu_all_gather_base_mm(**args)


@pytest.mark.parametrize("kwargs,fragment", [
    ({"world_size": 3}, "'world_size'"),
    ({"world_size": 1}, "'world_size'"),
    ({"comm_mode": "hccs"}, "'comm_mode'"),
    ({"comm_mode": "aiv", "gather_output": False}, "'gather_output'"),
    ({"comm_turn": -1}, "'comm_turn'"),
])
def test_argument_errors(kwargs, fragment):
    with pytest.raises(RuntimeError, match=fragment) as info:  # torch_npu raises RuntimeError
        _call(**kwargs)
    assert isinstance(info.value, ValueError)  # and ours is a ValueError too


def test_quantisation_argument_errors():
    """The int8 form runs (numerics: test/mc2/test_quant.py); these are torch_npu's argument errors, and an int8
    output is not implemented."""
    with pytest.raises(RuntimeError, match="'x2_scale' must be None with a float input"):
        _call(x2_scale=to_device(torch.ones(1, 6)))
    with pytest.raises(RuntimeError, match="'x1_scale' must be None with a float input"):
        _call(x1_scale=to_device(torch.ones(4, 1)))
    int8 = to_device(torch.ones(4, 8, dtype=torch.int8), torch.ones(8, 6, dtype=torch.int8))
    with pytest.raises(RuntimeError, match="'x2_scale' is required with int8 inputs"):
        torch_npu.npu_all_gather_base_mm(int8[0], int8[1], "no_group", 2)
    with pytest.raises(NotImplementedError, match="'output_dtype'"):
        _call(output_dtype=torch.int8)
