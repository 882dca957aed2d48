"""Ported: op-plugin test/test_custom_ops/test_npu_fused_infer_attention_score_v2_with_workspace.py.

Upstream cases (TestFusedInferAttentionV2WithWorkspace; all skipped upstream, none asserts a result): decode
(q BNSD fp16 [1, 32, 1, 128], KV 2048, softmax_scale 1/0.0078125) through
torch_npu.npu_fused_infer_attention_score_v2.out with a workspace from
torch_npu._npu_fused_infer_attention_score_v2_get_max_workspace and outputs preallocated by hand or by
torch_npu._npu_fused_infer_attention_score_v2_infer_output:
- test_npu_fused_infer_attention_score_v2_ifa_return_lse_return_softmax_lse_true
- test_npu_fused_infer_attention_score_v2_ifa_return_lse_return_softmax_lse_false
- test_npu_fused_infer_attention_score_v2_ifa_return_lse_return_softmax_lse_true_with_workspace
The workspace / out= / infer_output entry points cannot apply (NPU workspace memory; not provided by the shim).
What the cases compute is ported through npu_fused_infer_attention_score_v2, with upstream's golden and an
assertion (out against the softmax golden, lse against upstream's lse golden).
"""
import pytest
import torch

from test.torch_npu.common import on_cpu, to_device, torch_npu
from test.torch_npu.test_npu_fused_infer_attention_score import SCALE, _check_out, _golden_lse, _randn
from test.torch_npu.rtol import assert_rtol_equal


@pytest.mark.parametrize("lse", [True, False], ids=["return_softmax_lse_true", "return_softmax_lse_false"])
def test_npu_fused_infer_attention_score_v2_ifa_return_lse(lse):
    q, k, v = _randn(1, 32, 1, 128, seed=4), _randn(1, 32, 2048, 128, seed=5), _randn(1, 32, 2048, 128, seed=6)
    out, softmax_lse = torch_npu.npu_fused_infer_attention_score_v2(
        *to_device(q, k, v), num_query_heads=32, input_layout="BNSD", softmax_scale=SCALE, pre_tokens=65535,
        next_tokens=65535, return_softmax_lse=lse)
    _check_out(out, q, k, v)
    if lse:
        assert_rtol_equal(_golden_lse(q, k, dtype=torch.float32), on_cpu(softmax_lse))
    else:
        assert on_cpu(softmax_lse).shape == (0,)

