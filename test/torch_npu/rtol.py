"""torch_npu's TestCase.assertRtolEqual(expected, actual, prec, prec16), the comparison op-plugin's tests use, as a
function over tensors (on any device), numpy arrays and lists of them. The criterion is the shim's implementation
(torch_ops_transformer.compat.testing): NaNs in the same places, then every element within `prec` absolutely, or
every element within `prec` relatively, or at most size * prec elements outside both; float16 uses prec16. numpy has
no bfloat16: bfloat16 values are compared in float32 (which holds them exactly) with prec16, bfloat16 being a
16-bit format too."""
from typing import Sequence, Union

import numpy as np
import torch

from torch_ops_transformer.compat.testing import TestCase

Array = Union[torch.Tensor, np.ndarray]


def assert_rtol_equal(expected: Union[Array, Sequence[Array]], actual: Union[Array, Sequence[Array]],
                      prec: float = 1e-4, prec16: float = 1e-3) -> None:
    if isinstance(expected, (list, tuple)):
        assert isinstance(actual, (list, tuple)) and len(expected) == len(actual), (len(expected), actual)
        for e, a in zip(expected, actual):
            assert_rtol_equal(e, a, prec, prec16)
        return
    if isinstance(expected, torch.Tensor):
        expected = expected.detach().cpu()
    if isinstance(actual, torch.Tensor):
        actual = actual.detach().cpu()
    bf16 = [isinstance(t, torch.Tensor) and t.dtype == torch.bfloat16 for t in (expected, actual)]
    assert bf16[0] == bf16[1], f"dtype error: {expected.dtype} vs {actual.dtype}"
    if bf16[0]:
        expected, actual, prec = expected.float(), actual.float(), prec16
    TestCase().assertRtolEqual(expected, actual, prec, prec16)
