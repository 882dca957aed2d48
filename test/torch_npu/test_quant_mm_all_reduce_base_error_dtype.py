"""Port of op-plugin test/test_custom_ops/test_quant_mm_all_reduce_base_error_dtype.py
(torch_npu.npu_mm_all_reduce_base rejecting an invalid dtype combination).

Upstream case (called in one process, for each of 2 ranks' inputs, with the placeholder hcom "group_name"):
- test_npu_mm_all_reduce_base: int8 x1 [256, 256] with float16 x2 [256, 256], dequant_scale and pertoken_scale
  float32 [256]; expects RuntimeError "when neither dtype of x1 or dtype of x2 is vaild" before any communication.
  Ported (test_integer_x1_with_floating_x2_is_rejected): the same inputs, smaller; our error is a RuntimeError (and
  a ValueError) naming x1 and x2 and their dtypes, raised before the quantisation arguments (NotImplementedError
  here) and before `hcom` is looked up. The rest of the file (quantised results) is not applicable: quantised MC2
  is not implemented.
"""
import pytest
import torch

from test.torch_npu.common import to_device, torch_npu


def _scales(n):
    return to_device(torch.rand(n) * 9 + 1, torch.rand(n) * 4 + 1)  # pertoken in [1, 10), dequant in [1, 5)


def test_integer_x1_with_floating_x2_is_rejected():
    x1 = to_device(torch.randint(-1, 2, (32, 32), dtype=torch.int8))
    x2 = to_device(torch.rand(32, 32, dtype=torch.float16) * 2 - 1)
    pertoken_scale, dequant_scale = _scales(32)
    with pytest.raises(RuntimeError, match=r"x1 \(torch.int8\) and x2 \(torch.float16\)") as info:
        torch_npu.npu_mm_all_reduce_base(x1, x2, "group_name", reduce_op="sum", dequant_scale=dequant_scale,
                                         pertoken_scale=pertoken_scale, bias=None, comm_turn=0)
    assert isinstance(info.value, ValueError)
