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
