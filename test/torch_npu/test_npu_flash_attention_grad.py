"""Port of op-plugin test/test_custom_ops/test_npu_flash_attention_grad.py (torch_npu.npu_fusion_attention_grad).

The golden re-derives upstream's math: softmax of the scaled scores (its max and sum repeated 8 times as the saved
statistics), the forward output as attention_in, and FlashAttention's backward (dP = dy vᵀ, dropped by the mask and
scaled by 1/keep_prob, dS = P * (dP - rowsum(P * dP)) * scale); dq is checked with torch_npu's assertRtolEqual at
upstream's precision (0.005).

Upstream cases:
- test_npu_flash_attention (BSH fp16, 32 heads, no dropout): ported.
- test_npu_flash_attention_with_dropmask (keep_prob 0.9; the golden's mask is _npu_dropout_gen_mask([B, N, S, S],
  seed=2, offset=0), the grad gets seed=2, offset=0 and regenerates it): ported unchanged in substance — the mask of
  _npu_dropout_gen_mask is the one the grad regenerates from the same seed/offset.
- test_npu_flash_attention_tensor, test_npu_flash_attention_tensor_with_dropmask: not applicable, they call
  npu_fusion_attention_grad_v3 (seed/offset as tensors), an op this project does not claim.
- test_npu_flash_attention_tensor_graph, test_npu_flash_attention_tensor_with_dropmask_graph: not applicable,
  npu_fusion_attention_v3/npu_fusion_attention_grad_v3 captured in an NPUGraph (NPU graph mode, ops not claimed).

Beyond upstream: the results torch_npu returns for absent pse and sink (dpse None, dsink an empty float32 tensor).
"""
import torch

from test.torch_npu.common import on_cpu, to_device, torch_npu
from test.torch_npu.test_npu_flash_attention import SCALE, bnsd_to_bsh, golden_backward, golden_forward, unpack_mask
from torch_ops_transformer.compat.testing import TestCase


class TestNPUFlashAttentionGrad(TestCase):
    def run_grad(self, *args, **kw):
        return torch_npu.npu_fusion_attention_grad(*args, **kw)

    def check(self, s, keep_prob, seed):
        g = torch.Generator().manual_seed(s)
        q, k, v, dy = (torch.randn(1, 32, s, 128, generator=g).half() for _ in range(4))
        keep, numels = None, 0
        if keep_prob < 1.0:
            numels = 32 * s * s
            mask = torch_npu._npu_dropout_gen_mask(to_device(q), [1, 32, s, s], p=1 - keep_prob, seed=seed,
                                                   offset=0, parallel=True, sync=False)
            keep = unpack_mask(mask, numels).view(1, 32, s, s).float()
        qf, kf, vf, dyf = (t.float() for t in (q, k, v, dy))
        out, probs, row_max, row_sum = golden_forward(qf, kf, vf, SCALE, keep, keep_prob)
        dq = golden_backward(dyf, qf, kf, vf, probs, SCALE, keep, keep_prob)[0]
        x_max, x_sum = (to_device(t.expand(1, 32, s, 8)) for t in (row_max, row_sum))
        result = self.run_grad(
            *to_device(bnsd_to_bsh(q), bnsd_to_bsh(k), bnsd_to_bsh(v), bnsd_to_bsh(dy)), head_num=32,
            input_layout="BSH", softmax_max=x_max, softmax_sum=x_sum, attention_in=to_device(bnsd_to_bsh(out).half()),
            scale_value=SCALE, keep_prob=keep_prob, numels=numels, seed=seed, offset=0)
        self.assertRtolEqual(bnsd_to_bsh(dq), on_cpu(result[0]).float(), prec=0.005, prec16=0.005)
        return result

    def test_npu_flash_attention(self):
        result = self.check(128, 1.0, 2)
        self.assertEqual(len(result), 5)
        self.assertIsNone(result[3])  # dpse: undefined without pse, as upstream
        self.assertEqual((tuple(result[4].shape), result[4].dtype), ((0,), torch.float32))

    def test_npu_flash_attention_with_dropmask(self):
        self.check(256, 0.9, 2)
