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


def test_a_float32_reference_for_a_half_call():
    from torch_ops_transformer.oracle.compare import Evidence

    ref32 = torch.linspace(-2, 2, 64)
    cpu = ref32.to(torch.bfloat16)
    assert compare([cpu.clone()], [cpu], [Evidence(ref=ref32, ref_kind="the CPU kernel in float32")]) is None
    off = cpu.clone()
    off[3] = off[3] * 1.2
    bad = compare([off], [cpu], [Evidence(ref=ref32, ref_kind="the CPU kernel in float32")])
    assert bad is not None and "float32" in bad.what and bad.where == (3,)


def test_the_rounding_noise_rule_scales_with_the_noise():
    cpu = torch.randn(100)
    dev = cpu + 3e-4
    # A long reduction whose perturbed runs move by 1e-4: 3e-4 is inside 4x the noise; with no noise it is not.
    assert compare_one(0, dev, cpu, None, noise=1e-4) is None
    bad = compare_one(0, dev, cpu, None, noise=1e-6)
    assert bad is not None and "perturbed-input noise" in bad.what


def test_an_fp32_statistic_of_half_inputs_is_held_to_fp32():
    """The float64 reference saw the same rounded inputs: a 1% error in an fp32 output is caught even when the
    call's inputs were bf16 (the bound is not widened to bf16's ulp)."""
    ref = torch.linspace(1, 12, 32, dtype=torch.float64)
    cpu = ref.float()
    dev = cpu.clone()
    dev[-1] *= 1.005
    assert compare_one(0, dev, cpu, ref, precision=torch.bfloat16) is not None
