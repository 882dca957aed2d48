"""Port of op-plugin test/test_custom_ops/test_npu_apply_rotary_pos_emb.py (torch_npu.npu_apply_rotary_pos_emb,
in place on query and key).

Golden (upstream's, in float16): x * cos + cat(-x[..., 64:], x[..., :64]) * sin for query and key (D = 128,
'half'), computed on copies before the call; tolerance 1e-3.

Upstream cases:
- test_npu_apply_rotary_pos_emb: BSND, query and key [4, 1024, 16, 128], cos and sin [4, 1024, 1, 128], float16,
  U(0, 1). Ported; also checks that the returned tensors are the query and key passed in (updated in place).
- test_npu_apply_rotary_pos_emb_TND (skipped upstream until CANN supports TND): query and key [1024, 16, 128],
  cos and sin [1024, 1, 128]. Ported.
"""
import pytest
import torch

from test.torch_npu.common import to_device, torch_npu
from test.torch_npu.rtol import assert_rtol_equal


def rope_half_golden(x, cos, sin):
    rotated = torch.cat((-x[..., 64:], x[..., :64]), dim=-1)
    return rotated * sin + x * cos


@pytest.mark.parametrize("layout,qk_shape,cs_shape", [("BSND", (4, 1024, 16, 128), (4, 1024, 1, 128)),
                                                      ("TND", (1024, 16, 128), (1024, 1, 128))])
def test_npu_apply_rotary_pos_emb(layout, qk_shape, cs_shape):
    gen = torch.Generator().manual_seed(0)
    query, key = (torch.rand(qk_shape, generator=gen).half() for _ in range(2))
    cos, sin = (torch.rand(cs_shape, generator=gen).half() for _ in range(2))
    golden = [rope_half_golden(query, cos, sin), rope_half_golden(key, cos, sin)]
    q, k = to_device(query.clone(), key.clone())
    q_out, k_out = torch_npu.npu_apply_rotary_pos_emb(q, k, to_device(cos), to_device(sin), layout, "half")
    assert q_out is q and k_out is k
    assert_rtol_equal(golden, [q_out.cpu(), k_out.cpu()], 1e-3)
