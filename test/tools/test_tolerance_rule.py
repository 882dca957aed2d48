"""The tolerance rule of test/common/reference.py itself: PyTorch's error counts as at least the output rounding."""
import pytest
import torch

from test.common.reference import check_tolerance, output_rounding


def test_output_rounding_is_half_an_ulp_at_the_largest_value():
    ref = torch.tensor([0.1, -0.183, 0.0], dtype=torch.float64)
    assert output_rounding(ref, torch.bfloat16) == 2.0 ** -3 * 2.0 ** -7 / 2  # |0.183| is in [2^-3, 2^-2)
    assert output_rounding(ref, torch.float64) == 0.0
    assert output_rounding(torch.zeros(3, dtype=torch.float64), torch.float16) == 0.0


def test_one_ulp_passes_when_pytorch_landed_next_to_the_exact_value():
    exact = torch.tensor([-0.18278142328808555], dtype=torch.float64)
    lucky = torch.tensor([-0.1826171875], dtype=torch.bfloat16)      # PyTorch: the nearest bf16, 1.6e-4 away
    neighbour = torch.tensor([-0.18359375], dtype=torch.bfloat16)    # one ulp further: 8.1e-4 away
    check_tolerance("out", neighbour, exact, lucky)
    two_ulps = torch.tensor([-0.1845703125], dtype=torch.bfloat16)
    with pytest.raises(AssertionError, match="exceeds"):
        check_tolerance("out", two_ulps, exact, lucky)
