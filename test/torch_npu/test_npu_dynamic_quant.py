"""Port of op-plugin test/test_custom_ops/test_npu_dynamic_quant.py (torch_npu.npu_dynamic_quant).

Upstream cases (x [2, 32, 256] ~ randn; y within 1 of the golden int8, scale within rtol 1e-4):
- test_npu_dynamic_quant_fp16_input, ..._bf16_input: no smooth scales. Ported.
- test_npu_dynamic_quant_fp16_input_smooth_group, ..._bfp16_input_smooth_group: 64 groups of smooth scales with
  group_index. Ported.
- test_npu_dynamic_quant_int4_fp16_input, ..._int4_bf16_input, ..._int4_fp16_input_smooth_group,
  ..._int4_bf16_input_smooth_group: dst_type=torch.quint4x2 (int4 packed in int32), unpacked and compared. Ported.
- test_npu_dynamic_quant_int8_bf16_input_smooth_perchannel: quant_mode "perchannel" (Ascend950). Not applicable:
  the per-channel mode is not implemented; checked to raise NotImplementedError naming 'quant_mode'.
"""
import pytest
import torch

from test.torch_npu._dynamic_quant_common import SHAPE, inputs, int4_to_int8, smoothed
from test.torch_npu.common import to_device, torch_npu


def golden(x, smooth, group_index, int4):
    v = smoothed(x, smooth, group_index)
    scale = v.abs().amax(-1, keepdim=True) / (7 if int4 else 127)
    return torch.round(v / scale), scale.squeeze(-1)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("group_num", [1, 64])
@pytest.mark.parametrize("int4", [False, True])
def test_npu_dynamic_quant(dtype, group_num, int4):
    x, smooth, group_index = inputs(dtype, group_num, seed=group_num + int4)
    if group_num == 1:
        smooth = None  # upstream's single-group cases pass x only
    want_y, want_scale = golden(x, smooth, group_index, int4)
    y, scale = torch_npu.npu_dynamic_quant(to_device(x), smooth_scales=to_device(smooth),
                                           group_index=to_device(group_index),
                                           dst_type=torch.quint4x2 if int4 else torch.int8)
    y, scale = y.cpu(), scale.cpu()
    if int4:
        assert y.dtype == torch.int32
        y = int4_to_int8(y).view(SHAPE)
    else:
        assert y.dtype == torch.int8
    torch.testing.assert_close(y.float(), want_y, atol=1.0, rtol=0.0)
    torch.testing.assert_close(scale, want_scale, atol=0.0, rtol=1e-4)


def test_npu_dynamic_quant_smooth_without_groups():
    x, smooth, _ = inputs(torch.float16, 1, seed=9)
    want_y, want_scale = golden(x, smooth, None, False)
    y, scale = torch_npu.npu_dynamic_quant(to_device(x), smooth_scales=to_device(smooth))
    torch.testing.assert_close(y.cpu().float(), want_y, atol=1.0, rtol=0.0)
    torch.testing.assert_close(scale.cpu(), want_scale, atol=0.0, rtol=1e-4)


def test_npu_dynamic_quant_perchannel_not_implemented():
    x = torch.randn(SHAPE, dtype=torch.bfloat16)
    with pytest.raises(NotImplementedError, match="'quant_mode'"):
        torch_npu.npu_dynamic_quant(to_device(x), smooth_scales=to_device(torch.randn(32, dtype=torch.bfloat16)),
                                    dst_type=torch.int8, quant_mode="perchannel")
