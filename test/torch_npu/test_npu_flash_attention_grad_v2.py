"""op-plugin test/test_custom_ops/test_npu_flash_attention_grad_v2.py: torch_npu.npu_fusion_attention_grad_v2, an op
this project does not claim (torch_npu.npu_fusion_attention_grad_v2 is a stub raising NotImplementedError).

Upstream cases, both not applicable (the op is not claimed); the arguments they use are also
npu_fusion_attention_grad's, whose ports cover the same calls:
- test_npu_flash_attention_v2: as test_npu_flash_attention_grad.py::test_npu_flash_attention.
- test_npu_flash_attention_v2_with_dropmask: as
  test_npu_flash_attention_grad.py::test_npu_flash_attention_with_dropmask.
"""
import pytest

from test.torch_npu.common import torch_npu


def test_npu_fusion_attention_grad_v2_is_not_claimed():
    with pytest.raises(NotImplementedError, match="npu_fusion_attention_grad_v2"):
        torch_npu.npu_fusion_attention_grad_v2()
