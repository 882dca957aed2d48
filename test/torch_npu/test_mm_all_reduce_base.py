"""Port of op-plugin test/test_custom_ops/test_mm_all_reduce_base.py (torch_npu.npu_mm_all_reduce_base).

Upstream's 20 cases (an HCCL world of 8 or 2 NPUs, `hcom` from `get_hccl_comm_name`; its multi-process runner only
joins the ranks, the golden values below are what each case prepares):
- 1-4, test_npu_mm_all_reduce_base_{fp16,bf16}_{fp16,bf16}_{2d,3d}: x1 [128, 512] or [2, 64, 512], x2 [512, 256],
  uniform in [-1, 1]; expected = the float32 sum over ranks of x1 @ x2, cast to x1's dtype. Ported
  (test_mm_all_reduce_base_on_ranks): 2 gloo ranks in spawned processes, smaller shapes, all four dtype/rank
  combinations, checked with torch_npu's relative-error check at 0.05 (the tolerance of the sibling MC2 tests)
  and the project's tolerance rule against a float64 reference (torch's same-dtype matmul then all-reduce as the
  baseline). Also in the ranks: `hcom` as a group name and as a ProcessGroup, bias as torch_npu adds it (on every
  rank, inside the all-reduce: AllReduce(x1 @ x2 + bias)) including a bias on rank 0 only, y_dtype float32 (a
  cast here), and the shape errors torch_npu raises.
- 5-8, *_int8_{perchannel,pertensor}: weight-quantised x2 (int8) with antiquant_scale / antiquant_offset, and
  9-12, *_int8_int8_dequant_*: int8 x1 and x2 with dequant_scale (int64 / bfloat16 / float32) and pertoken_scale.
  Implemented; their numerics are tested across gloo ranks in test/mc2/test_quant.py, their argument errors in
  test_quantisation_argument_errors here.
- 13-20, *_fp8_* / *_hifloat8_*: float8 / hifloat8 inputs given through x1_dtype, x2_dtype, y_dtype with
  dequant_scale (Ascend 950 only). Not applicable (not implemented): test_quantisation_raises_not_implemented
  checks the NotImplementedError naming the arguments.

The other MC2 all-reduce files of op-plugin are quantised only and not ported: test_quant_mm_all_reduce_base.py
and test_quant_mm_all_reduce_base_bf16.py (int8 x1/x2 with dequant_scale), test_weight_quant_mm_all_reduce_base.py
and test_weight_quant_mm_all_reduce_base_with_add.py (int8 x2 with antiquant_scale / antiquant_offset, x3),
test_mm_all_reduce_base_perblock.py (per-block dequant_scale / pertoken_scale with group_sizes, Ascend 950),
test_quant_mm_reduce_scatter.py (int8 npu_mm_reduce_scatter_base with scales). Their one error check that needs no
quantisation kernel is ported as test_quant_mm_all_reduce_base_error_dtype.py.
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
    tag = f"{OP} {dtype} x1 {(*lead, k)} rank {rank}"
    x1, x2 = to_device(x1s[rank], x2s[rank])
    out = torch_npu.npu_mm_all_reduce_base(x1, x2, hcom, reduce_op="sum", bias=None, comm_turn=0)
    assert out.device == mc2_ranks.rank_device(rank) and out.dtype == dtype and out.shape == (*lead, n), tag
    expected = sum(a.float() @ b.float() for a, b in zip(x1s, x2s)).to(dtype)
    mc2_ranks.assert_rtol_equal(tag, out, expected, 0.05)
    ref64 = sum(a.double() @ b.double() for a, b in zip(x1s, x2s))
    mc2_ranks.assert_tolerance(tag, out, ref64, mc2_ranks.all_reduced(x1s[rank] @ x2s[rank]))


def _check_bias_and_hcom_forms(rank, world, group):
    """torch_npu adds the bias on every rank before reducing: AllReduce(x1 @ x2 + bias). Code that wants it once
    passes it on one rank only (as vLLM-Ascend does)."""
    m, k, n = 6, 16, 8
    x1s = mc2_ranks.per_rank(50, world, (m, k), torch.float32)
    x2s = mc2_ranks.per_rank(51, world, (k, n), torch.float32)
    biases = mc2_ranks.per_rank(52, world, (n,), torch.float32)
    products = sum(a.double() @ b.double() for a, b in zip(x1s, x2s))
    x1, x2 = to_device(x1s[rank], x2s[rank])
    for hcom in (group, group.group_name):
        out = torch_npu.npu_mm_all_reduce_base(x1, x2, hcom, bias=to_device(biases[rank]))
        mc2_ranks.assert_rtol_equal(f"{OP} bias on every rank", out, products + sum(b.double() for b in biases), 1e-5)
    out = torch_npu.npu_mm_all_reduce_base(x1, x2, group.group_name, bias=to_device(biases[0]) if rank == 0 else None)
    mc2_ranks.assert_rtol_equal(f"{OP} bias on rank 0 only", out, products + biases[0].double(), 1e-5)
    out = torch_npu.npu_mm_all_reduce_base(x1, x2, group.group_name, y_dtype=torch.bfloat16)
    assert out.dtype == torch.bfloat16
    mc2_ranks.assert_rtol_equal(f"{OP} y_dtype=bfloat16", out, products, 1e-2)
    out = torch_npu.npu_mm_all_reduce_base(x1, x2, group.group_name, y_dtype=5)  # ScalarType code of float16
    assert out.dtype == torch.float16


def _check_shape_errors(world, hcom):
    x1, x2 = to_device(torch.randn(4, 8), torch.randn(8, 5))
    with pytest.raises(ValueError, match="x1's last dim"):  # torch_npu: K of x1 and x2 should be same
        torch_npu.npu_mm_all_reduce_base(x1, x2[:6], hcom)
    with pytest.raises(ValueError, match="x2 must be 2-D"):
        torch_npu.npu_mm_all_reduce_base(x1, x2[None], hcom)
    with pytest.raises(ValueError, match="x1 must be 2-D"):
        torch_npu.npu_mm_all_reduce_base(x1[None, None], x2, hcom)
    with pytest.raises(ValueError, match="bias must have shape"):
        torch_npu.npu_mm_all_reduce_base(x1, x2, hcom, bias=to_device(torch.randn(4)))


def _worker(rank, world, port, out_dir):
    group = mc2_ranks.init_group(rank, world, port)
    hcom = mc2_ranks.hcom_name(group, rank)
    for i, (dtype, lead) in enumerate([(torch.float16, (32,)), (torch.bfloat16, (32,)),
                                       (torch.float16, (2, 16)), (torch.bfloat16, (2, 16))]):
        _check_case(rank, world, hcom, dtype, lead, seed=10 * i)
    _check_bias_and_hcom_forms(rank, world, group)
    _check_shape_errors(world, hcom)
    mc2_ranks.passed(rank, out_dir)


def test_mm_all_reduce_base_on_ranks(tmp_path):
    mc2_ranks.run(_worker, tmp_path)


def _inputs(x1_dtype=torch.float16, x2_dtype=torch.float16):
    return to_device(torch.ones(4, 8, dtype=x1_dtype), torch.ones(8, 6, dtype=x2_dtype))


@pytest.mark.parametrize("case,kwargs,x_dtypes,fragment", [
    ("13-20 fp8", {"y_dtype": torch.bfloat16}, (torch.float8_e4m3fn, torch.float8_e5m2), "float8_e4m3fn"),
    ("13-20 x1_dtype", {"x1_dtype": 290}, (torch.float16, torch.float16), "'x1_dtype'"),
    ("13-20 x2_dtype", {"x2_dtype": torch.float8_e5m2}, (torch.float16, torch.float16), "'x2_dtype'"),
    ("13-20 y_dtype", {"y_dtype": torch.float8_e4m3fn}, (torch.float16, torch.float16), "'y_dtype'"),
    ("comm quant", {"comm_quant_scale_1": torch.ones(6), "comm_quant_scale_2": torch.ones(6)},
     (torch.float16, torch.float16), "'comm_quant_scale_1', 'comm_quant_scale_2'"),
    ("comm quant mode", {"comm_quant_mode": 1}, (torch.float16, torch.float16), "'comm_quant_mode'=1"),
    ("group sizes", {"group_sizes": [1, 128, 128]}, (torch.float16, torch.float16), "'group_sizes'"),
])
def test_quantisation_raises_not_implemented(case, kwargs, x_dtypes, fragment):
    x1, x2 = _inputs(*x_dtypes)
    kwargs = {k: to_device(v) if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}
    with pytest.raises(NotImplementedError, match=fragment):
        torch_npu.npu_mm_all_reduce_base(x1, x2, "no_group", **kwargs)


@pytest.mark.parametrize("case,kwargs,x_dtypes,error,fragment", [
    ("5-8 weight quant: scale of x1's dtype", {"antiquant_scale": torch.ones(6), "antiquant_offset": torch.ones(6)},
     (torch.float16, torch.int8), TypeError, "'antiquant_scale' must have x1's dtype"),
    ("5-8 weight quant args with float x2", {"antiquant_scale": torch.ones(6), "antiquant_offset": torch.ones(6)},
     (torch.float16, torch.float16), ValueError, "'antiquant_scale' and 'antiquant_offset' must be None"),
    ("5-8 pergroup with float x2", {"antiquant_group_size": 32}, (torch.float16, torch.float16), ValueError,
     "'antiquant_group_size' applies to a weight-only int8 x2"),
    ("9-12 dequant packed: shape", {"dequant_scale": torch.ones(7, dtype=torch.int64)}, (torch.int8, torch.int8),
     ValueError, "'dequant_scale' must be \\[1\\]"),
    ("9-12 dequant args with float x2", {"dequant_scale": torch.ones(6), "pertoken_scale": torch.ones(4)},
     (torch.float16, torch.float16), ValueError, "'dequant_scale' must be None"),
])
def test_quantisation_argument_errors(case, kwargs, x_dtypes, error, fragment):
    """Cases 5-12 run (test/mc2/test_quant.py checks their numerics); these are torch_npu's argument errors."""
    x1, x2 = _inputs(*x_dtypes)
    kwargs = {k: to_device(v) if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}
    with pytest.raises(error, match=fragment):
        torch_npu.npu_mm_all_reduce_base(x1, x2, "no_group", **kwargs)


@pytest.mark.parametrize("kwargs,fragment", [
    ({"reduce_op": "max"}, "'reduce_op'"),
    ({"comm_mode": "ring"}, "'comm_mode'"),
    ({"comm_turn": -2}, "'comm_turn'"),
])
def test_argument_errors(kwargs, fragment):
    with pytest.raises(RuntimeError, match=fragment) as info:
        torch_npu.npu_mm_all_reduce_base(*_inputs(), "no_group", **kwargs)
    assert isinstance(info.value, ValueError)


def test_hardware_hints_and_neutral_values_are_accepted_before_the_group_is_resolved():
    """comm_mode, comm_turn, empty group_sizes and dtype codes equal to the inputs' pass the checks: the call then
    fails only on the missing process group (none in this process, or none of that name if another test left one)."""
    with pytest.raises(RuntimeError, match="torch.distributed is not initialised.*'hcom'|'hcom' .* names no process"):
        torch_npu.npu_mm_all_reduce_base(*_inputs(), "no_group", comm_mode="aiv", comm_turn=2, group_sizes=[],
                                         x1_dtype=torch.float16, x2_dtype=5, y_dtype=torch.float16)
