"""The comparison of torch_npu's TestCase.assertRtolEqual, which op-plugin's ported tests use, as a function.

An element passes when |expected - actual| <= prec or |expected - actual| / (max(|expected|, |actual|) + tiny) <= prec;
the comparison fails only when more than size * prec elements fail each criterion. Shapes and dtypes must match and
NaNs must sit at the same positions. float16 and bfloat16 use prec16 (bfloat16 values are compared in float32);
booleans must be equal."""
from typing import Sequence, Union

import numpy as np
import torch

Array = Union[torch.Tensor, np.ndarray]


def _numpy(t: Array):
    if isinstance(t, torch.Tensor):
        t = t.detach().cpu()
        half = t.dtype in (torch.float16, torch.bfloat16)
        return (t.float() if t.dtype == torch.bfloat16 else t).numpy(), half, t.dtype
    a = np.asarray(t)
    return a, a.dtype == np.float16, a.dtype


def assert_rtol_equal(expected: Union[Array, Sequence[Array]], actual: Union[Array, Sequence[Array]],
                      prec: float = 1e-4, prec16: float = 1e-3) -> None:
    if isinstance(expected, (list, tuple)):
        assert isinstance(actual, (list, tuple)) and len(expected) == len(actual), (len(expected), actual)
        for e, a in zip(expected, actual):
            assert_rtol_equal(e, a, prec, prec16)
        return
    x, half, x_dtype = _numpy(expected)
    y, _, y_dtype = _numpy(actual)
    assert x.shape == y.shape, f"shape error: expected {x.shape}, got {y.shape}"
    assert str(x_dtype).split(".")[-1] == str(y_dtype).split(".")[-1], f"dtype error: {x_dtype} vs {y_dtype}"
    if x.dtype == np.bool_:
        assert np.array_equal(x, y), "result error (bool)"
        return
    p, tiny = (prec16, 6e-8) if half else (prec, 1e-9)
    x64, y64 = x.astype(np.float64), y.astype(np.float64)
    nan = np.isnan(x64)
    assert np.array_equal(nan, np.isnan(y64)), "NaN positions differ"
    diff = np.abs(np.where(nan, 0.0, y64 - x64))
    atol_fail = int(np.sum(~(diff <= p)))
    rtol_fail = int(np.sum(~(diff / (np.maximum(np.abs(x64), np.abs(y64)) + tiny) <= p)))
    limit = x.size * p
    assert not (atol_fail > limit and rtol_fail > limit), (
        f"result error: {atol_fail} elements beyond atol {p} and {rtol_fail} beyond rtol {p} of {x.size} "
        f"(allowed {limit:g}); max abs diff {diff.max() if diff.size else 0:g}")
