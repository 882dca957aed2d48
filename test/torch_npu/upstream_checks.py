"""torch_npu's result comparison (`TestCase.assertRtolEqual` of torch_npu.testing), re-stated for the ported tests.

An element passes with |a - b| <= prec (absolute) or |a - b| / (max(|a|, |b|) + tiny) <= prec (relative); the
comparison fails only when more than a fraction `prec` of the elements miss the relative bound *and* more than that
fraction miss the absolute bound. fp16 uses `prec16`; other floating dtypes and integers `prec`. NaNs must sit in
the same places. bf16 (which numpy cannot hold) is compared in fp32 with `prec`. The ported tests also apply the
project's float64 rule (test.common.reference.check_tolerance)."""
import torch
from torch import Tensor


def _check(a: Tensor, b: Tensor, prec: float, tiny: float, what: str) -> None:
    a, b = a.double(), b.double()
    nan_a, nan_b = torch.isnan(a), torch.isnan(b)
    assert torch.equal(nan_a, nan_b), f"{what}: NaNs at different places"
    diff = (a - b).abs().masked_fill(nan_a, 0.0)
    bad_abs = diff > prec
    bad_rel = diff / (torch.maximum(a.abs(), b.abs()).masked_fill(nan_a, 0.0) + tiny) > prec
    n, limit = a.numel(), a.numel() * prec
    failed = bad_rel.any() and bad_abs.any() and bad_rel.sum() > limit and bad_abs.sum() > limit
    assert not failed, (f"{what}: {int(bad_rel.sum())} of {n} elements exceed the relative bound {prec:g} and "
                        f"{int(bad_abs.sum())} the absolute one (allowed: {limit:.1f}); max |diff| = "
                        f"{float(diff.max()):.3e}")


def assert_rtol_equal(expected, actual, prec: float = 1e-4, prec16: float = 1e-3, what: str = "result") -> None:
    """torch_npu's assertRtolEqual(expected, actual, prec, prec16) on CPU copies."""
    if not isinstance(expected, Tensor):
        expected = torch.as_tensor(expected)
    if not isinstance(actual, Tensor):
        actual = torch.as_tensor(actual)
    expected, actual = expected.detach().cpu(), actual.detach().cpu()
    assert expected.shape == actual.shape, f"{what}: shape {list(actual.shape)}, expected {list(expected.shape)}"
    assert expected.dtype == actual.dtype, f"{what}: dtype {actual.dtype}, expected {expected.dtype}"
    if expected.dtype == torch.bool:
        assert torch.equal(expected, actual), f"{what}: boolean results differ"
    elif expected.dtype == torch.float16:
        _check(expected, actual, prec16, 6e-8, what)
    else:
        _check(expected, actual, prec, 1e-9, what)
