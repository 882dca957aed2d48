"""op-plugin test/test_custom_ops/test_npu_flash_attention_v2.py: torch_npu.npu_fusion_attention_v2, an op this project
does not claim (torch_npu.npu_fusion_attention_v2 is a stub raising NotImplementedError).

Upstream cases, all not applicable (the op is not claimed); the arguments they use are also npu_fusion_attention's,
whose ports cover the same calls:
- test_npu_flash_attention_v2 (BSH fp16): as test_npu_flash_attention.py::test_npu_flash_attention.
- test_npu_flash_attention_v2_with_dropmask: as test_npu_flash_attention.py::test_npu_flash_attention_with_dropmask.
- test_npu_flash_attention_v2_with_external_dropout_mask: as
  test_npu_flash_attention.py::test_npu_flash_attention_with_external_dropout_mask.
- test_npu_flash_attention_v2_dropout_mask_reproducibility: as
  test_npu_flash_attention.py::test_npu_flash_attention_dropout_mask_reproducibility.
- test_npu_flash_attention_v2_without_dropout_mask: as
  test_npu_flash_attention.py::test_npu_flash_attention_without_dropout_mask.
- test_npu_flash_attention_v2_dropout_mask_with_offset_seed (Ascend950 only): the seed/offset echo, covered by
  test/attention/test_dropout.py::test_seed_and_offset_ints.
"""
import pytest

from test.torch_npu.common import torch_npu


def test_npu_fusion_attention_v2_is_not_claimed():
    """Keeps this file's statement true: should v2 be implemented, its upstream tests get ported here."""
    with pytest.raises(NotImplementedError, match="npu_fusion_attention_v2"):
        torch_npu.npu_fusion_attention_v2()
