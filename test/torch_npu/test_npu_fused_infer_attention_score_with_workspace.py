"""Ported: op-plugin test/test_custom_ops/test_npu_fused_infer_attention_score_with_workspace.py.

Upstream cases (TestFusedInferAttentionScoreWithWorkspace; all skipped upstream, none asserts a result): decode
(q BNSD fp16 [1, 32, 1, 128], KV 2048, scale 1/0.0078125) through torch_npu.npu_fused_infer_attention_score.out with
a workspace from torch_npu._npu_fused_infer_attention_score_get_max_workspace and outputs preallocated by hand or by
torch_npu._npu_fused_infer_attention_score_infer_output:
- test_npu_fused_infer_attention_score_ifa_return_lse_softmax_lse_flag_true
- test_npu_fused_infer_attention_score_ifa_return_lse_softmax_lse_flag_false
- test_npu_fused_infer_attention_score_ifa_return_lse_softmax_lse_flag_true_with_workspace
The workspace / out= / infer_output entry points cannot apply: they manage NPU workspace memory, and the shim does
not provide them (a CPU kernel allocates its own scratch). What the cases compute is ported through
npu_fused_infer_attention_score, with upstream's golden and an assertion: out against the softmax golden, lse
against upstream's lse golden (test_npu_fused_infer_attention_score.py explains the fp32 comparison).
"""
import pytest
import torch

from test.torch_npu.common import on_cpu, to_device, torch_npu
from test.torch_npu.test_npu_fused_infer_attention_score import SCALE, _check_out, _golden_lse, _randn
from test.torch_npu.rtol import assert_rtol_equal


@pytest.mark.parametrize("lse_flag", [True, False], ids=["softmax_lse_flag_true", "softmax_lse_flag_false"])
def test_npu_fused_infer_attention_score_ifa_return_lse(lse_flag):
    q, k, v = _randn(1, 32, 1, 128, seed=1), _randn(1, 32, 2048, 128, seed=2), _randn(1, 32, 2048, 128, seed=3)
    out, lse = torch_npu.npu_fused_infer_attention_score(*to_device(q, k, v), num_heads=32, input_layout="BNSD",
                                                         scale=SCALE, pre_tokens=65535, next_tokens=65535,
                                                         softmax_lse_flag=lse_flag)
    _check_out(out, q, k, v)
    if lse_flag:
        assert_rtol_equal(_golden_lse(q, k, dtype=torch.float32), on_cpu(lse))
    else:
        assert on_cpu(lse).shape == (0,)

