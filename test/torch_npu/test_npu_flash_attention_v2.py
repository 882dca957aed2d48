"""Port of op-plugin test/test_custom_ops/test_npu_flash_attention_v2.py (torch_npu.npu_fusion_attention_v2).

Upstream's cases are npu_fusion_attention's cases called through the v2 function (keyword-only arguments, the same
math and precisions), so each runs the v1 port's check (test_npu_flash_attention.py) with the call made through
npu_fusion_attention_v2:
- test_npu_flash_attention_v2 (BSH fp16, 32 heads): ported.
- test_npu_flash_attention_v2_with_dropmask: ported, with the v1 port's adaptation (the golden mask is made from the
  seed/offset the op returns).
- test_npu_flash_attention_v2_with_external_dropout_mask: ported.
- test_npu_flash_attention_v2_dropout_mask_reproducibility: ported.
- test_npu_flash_attention_v2_without_dropout_mask: ported.
- test_npu_flash_attention_v2_dropout_mask_with_offset_seed (Ascend950 only): the seed/offset echo with an external
  mask, which test_npu_flash_attention_v2_with_external_dropout_mask checks here too.
The v2 arguments (pse_type 2/3, q/kv_start_idx, query_rope/key_rope) are tested against float64 references in
test/attention/test_fusion_attention_v2.py.
"""
from test.torch_npu import test_npu_flash_attention as v1
from test.torch_npu.common import to_device, torch_npu
from torch_ops_transformer.compat.testing import TestCase


class TestNPUFlashAttentionV2(TestCase):
    def run_fa(self, q, k, v, head_num, input_layout, **kw):
        return torch_npu.npu_fusion_attention_v2(*to_device(q, k, v), head_num=head_num, input_layout=input_layout,
                                                 **kw)

    test_npu_flash_attention_v2 = v1.TestNPUFlashAttention.test_npu_flash_attention
    test_npu_flash_attention_v2_with_dropmask = v1.TestNPUFlashAttention.test_npu_flash_attention_with_dropmask
    test_npu_flash_attention_v2_with_external_dropout_mask = (
        v1.TestNPUFlashAttention.test_npu_flash_attention_with_external_dropout_mask)
    test_npu_flash_attention_v2_dropout_mask_reproducibility = (
        v1.TestNPUFlashAttention.test_npu_flash_attention_dropout_mask_reproducibility)
    test_npu_flash_attention_v2_without_dropout_mask = (
        v1.TestNPUFlashAttention.test_npu_flash_attention_without_dropout_mask)
