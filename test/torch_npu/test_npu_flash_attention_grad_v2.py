"""Port of op-plugin test/test_custom_ops/test_npu_flash_attention_grad_v2.py (torch_npu.npu_fusion_attention_grad_v2).

Upstream's two cases are npu_fusion_attention_grad's cases called through the v2 function, which returns seven
results (dq, dk, dv, dpse, dq_rope, dk_rope, dsink); each runs the v1 port's check
(test_npu_flash_attention_grad.py) through npu_fusion_attention_grad_v2:
- test_npu_flash_attention_v2 (BSH fp16, 32 heads, no dropout): ported, plus the absent results (dpse, dq_rope,
  dk_rope None; dsink an empty float32 tensor).
- test_npu_flash_attention_v2_with_dropmask (keep_prob 0.9, seed 2): ported.
"""
import torch

from test.torch_npu import test_npu_flash_attention_grad as v1
from test.torch_npu.common import torch_npu
from torch_ops_transformer.compat.testing import TestCase


class TestNPUFlashAttentionGradV2(TestCase):
    def run_grad(self, *args, **kw):
        return torch_npu.npu_fusion_attention_grad_v2(*args, **kw)

    check = v1.TestNPUFlashAttentionGrad.check

    def test_npu_flash_attention_v2(self):
        result = self.check(128, 1.0, 2)
        self.assertEqual(len(result), 7)
        self.assertEqual(result[3:6], (None, None, None))
        self.assertEqual((tuple(result[6].shape), result[6].dtype), ((0,), torch.float32))

    def test_npu_flash_attention_v2_with_dropmask(self):
        self.check(256, 0.9, 2)
