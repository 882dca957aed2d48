"""The tolerance rule of test/common/reference.py itself: PyTorch's error counts as at least one ulp of the output."""
import pytest
import torch

from test.common.reference import check_tolerance, same_dtype_floor


def test_floor_is_one_ulp_at_the_largest_value():
    ref = torch.tensor([0.1, -0.183, 0.0], dtype=torch.float64)
    assert same_dtype_floor(ref, torch.bfloat16) == 2.0 ** -3 * 2.0 ** -7  # |0.183| is in [2^-3, 2^-2)
    assert same_dtype_floor(ref, torch.float64) == 0.0
    assert same_dtype_floor(torch.zeros(3, dtype=torch.float64), torch.float16) == 0.0


def test_two_ulps_pass_when_pytorch_landed_next_to_the_exact_value():
    exact = torch.tensor([-0.18278142328808555], dtype=torch.float64)
    lucky = torch.tensor([-0.1826171875], dtype=torch.bfloat16)      # PyTorch: the nearest bf16, 1.6e-4 away
    neighbour = torch.tensor([-0.18359375], dtype=torch.bfloat16)    # one ulp further: 8.1e-4 away
    check_tolerance("out", neighbour, exact, lucky)
    check_tolerance("out", torch.tensor([-0.1845703125], dtype=torch.bfloat16), exact, lucky)  # two ulps: 1.8e-3
    three_ulps = torch.tensor([-0.185546875], dtype=torch.bfloat16)  # 2.8e-3 > 2 * 9.8e-4 + 1e-5
    with pytest.raises(AssertionError, match="exceeds"):
        check_tolerance("out", three_ulps, exact, lucky)


def test_pytorchs_own_error_still_sets_the_bar_on_realistic_tensors():
    exact = torch.full((64,), 0.75, dtype=torch.float64)
    same = exact.to(torch.float16).double()
    same[3] += 8 * 2.0 ** -11                                        # PyTorch 8 ulps off somewhere
    ours = exact.clone()
    ours[5] += 15 * 2.0 ** -11                                       # 15 ulps: within 2 * 8 ulps
    check_tolerance("out", ours.to(torch.float16), exact, same.to(torch.float16))


def test_an_output_that_cancels_keeps_the_rounding_of_p_at_the_values_scale():
    """Two bf16 outputs near 0.05 from values up to 1.7 (full-tier case: 12 keys, v_head_dim 1): rounding P to bf16
    costs up to eps/2 * max|v| there, far more than an ulp of the output; PyTorch had landed near the exact values."""
    exact = torch.tensor([0.05035198753015102, 0.04205890833018455], dtype=torch.float64)
    lucky = torch.tensor([0.05029296875, 0.042236328125], dtype=torch.bfloat16)
    ours = torch.tensor([0.051025390625, 0.04150390625], dtype=torch.bfloat16)
    with pytest.raises(AssertionError, match="exceeds"):
        check_tolerance("out", ours, exact, lucky)
    check_tolerance("out", ours, exact, lucky, value_scale=1.7109375)
    assert same_dtype_floor(exact, torch.bfloat16, 1.7109375) == (2.0 ** -5 * 2.0 ** -7 + 2.0 ** -7) / 2
    with pytest.raises(AssertionError, match="exceeds"):  # a real error stays one: 0.01 off
        check_tolerance("out", (exact + 0.01).to(torch.bfloat16), exact, lucky, value_scale=1.7109375)
