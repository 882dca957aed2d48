"""Port of op-plugin test/test_custom_ops/test_npu_dynamic_quant_asymmetric.py
(torch_npu.npu_dynamic_quant_asymmetric).

Upstream cases (x [2, 32, 256] ~ randn; y within 1 of the golden, scale and offset within rtol 1e-4):
- test_npu_dynamic_quant_asymmetric_fp16_input, ..._bf16_input: no smooth scales. Ported.
- ..._fp16_input_smooth_group, ..._bfp16_input_smooth_group: 64 groups of smooth scales. Ported.
- ..._int4_fp16_input, ..._int4_bf16_input, ..._int4_fp16_input_smooth_group, ..._int4_bf16_input_smooth_group:
  dst_type=torch.quint4x2. Ported.
- the per-channel case (quant_mode "perchannel", Ascend950). Not applicable: not implemented; checked to raise
  NotImplementedError naming 'quant_mode'.
"""
import pytest
import torch

from test.torch_npu._dynamic_quant_common import SHAPE, inputs, int4_to_int8, smoothed
from test.torch_npu.common import to_device, torch_npu


def golden(x, smooth, group_index, int4):
    v = smoothed(x, smooth, group_index)
    hi, lo = v.amax(-1, keepdim=True), v.amin(-1, keepdim=True)
    qmax = 7 if int4 else 127
    scale = (hi - lo) / (2 * qmax + 1)
    offset = qmax - hi / scale
    return torch.round(v / scale + offset), scale.squeeze(-1), offset.squeeze(-1)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("group_num", [1, 64])
@pytest.mark.parametrize("int4", [False, True])
def test_npu_dynamic_quant_asymmetric(dtype, group_num, int4):
    x, smooth, group_index = inputs(dtype, group_num, seed=10 + group_num + int4)
    if group_num == 1:
        smooth = None
    want_y, want_scale, want_offset = golden(x, smooth, group_index, int4)
    y, scale, offset = torch_npu.npu_dynamic_quant_asymmetric(
        to_device(x), smooth_scales=to_device(smooth), group_index=to_device(group_index),
        dst_type=torch.quint4x2 if int4 else torch.int8)
    y, scale, offset = y.cpu(), scale.cpu(), offset.cpu()
    if int4:
        y = int4_to_int8(y).view(SHAPE)
    torch.testing.assert_close(y.float(), want_y, atol=1.0, rtol=0.0)
    torch.testing.assert_close(scale, want_scale, atol=0.0, rtol=1e-4)
    torch.testing.assert_close(offset, want_offset, atol=0.0, rtol=1e-4)


def test_npu_dynamic_quant_asymmetric_perchannel_not_implemented():
    with pytest.raises(NotImplementedError, match="'quant_mode'"):
        torch_npu.npu_dynamic_quant_asymmetric(to_device(torch.randn(SHAPE, dtype=torch.float16)),
                                               quant_mode="perchannel")
