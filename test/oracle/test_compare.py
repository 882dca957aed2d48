"""The oracle's judgement of one call (torch_ops_transformer/oracle/compare.py), on plain CPU tensors."""
import math

import torch

from torch_ops_transformer.oracle.compare import compare, compare_one


def test_fa2_rule_with_a_float64_reference():
    ref = torch.linspace(-1, 1, 101, dtype=torch.float64)
    cpu = ref.to(torch.bfloat16)
    assert compare_one(0, cpu.clone(), cpu, ref) is None
    # One ulp of the largest value is allowed beyond twice the CPU kernel's error; ten percent is not.
    off = cpu.clone()
    off[7] = off[7] * 1.1
    bad = compare_one(0, off, cpu, ref)
    assert bad is not None and bad.where == (7,) and bad.error > bad.allowed and "FA2" in bad.what


def test_without_a_float64_reference_the_dtype_tolerance_applies():
    cpu = torch.randn(50)
    assert compare_one(0, cpu + 1e-7, cpu, None) is None
    bad = compare_one(0, cpu + 1e-2, cpu, None)
    assert bad is not None and "dtype tolerance" in bad.what


def test_infinities_nan_integers_and_shapes():
    ref = torch.tensor([0.5, -math.inf, math.nan], dtype=torch.float64)
    cpu = ref.float()
    assert compare_one(0, cpu.clone(), cpu, ref) is None
    finite_instead = torch.tensor([0.5, -1e30, math.nan])
    assert "non-finite" in compare_one(0, finite_instead, cpu, ref).what
    idx = torch.tensor([[0, 3], [2, 1]], dtype=torch.int32)
    moved = idx.clone()
    moved[1, 0] = 5
    bad = compare_one(1, moved, idx, None)
    assert bad.output == 1 and bad.where == (1, 0) and "must be equal" in bad.what
    assert "shape/dtype" in compare_one(0, idx.long(), idx, None).what
    assert "outputs" in compare([idx], [idx, idx], None).what
    assert compare([torch.empty(0)], [torch.empty(0)], None) is None
