"""Port of op-plugin test/test_custom_ops/test_npu_moe_gating_topk.py (torch_npu.npu_moe_gating_top_k, DeepSeek-V3
group-limited routing).

Upstream cases (all ported; 256 experts in 8 groups, k_group 4, group_select_mode 1 (sum of each group's top two),
renorm 0, norm_type 1 (sigmoid), with a bias; x, bias ~ U(-2, 2)):
- test_npu_moe_gating_topk_1: x [8, 256] float32, k 6.
- test_npu_moe_gating_topk_2: x [1002, 256] float16, k 1.
- test_npu_moe_gating_topk_3: x [128, 256] bfloat16, k 16.
- test_npu_moe_gating_topk_4: as 3 with routed_scaling_factor 0.
Golden: float32 sigmoid, bias added for the selection only, groups scored by their top-two sum, the k_group best
groups kept (stable), the top k experts among them (stable); y = the selected sigmoid scores / (their sum + eps) *
routed_scaling_factor in x's dtype. y and expert_idx compared with the default tolerances.
"""
import pytest
import torch

from test.torch_npu.common import to_device, torch_npu
from test.torch_npu.rtol import assert_rtol_equal


def gating_top_k_golden(x, k, bias, k_group, group_count, group_select_mode, norm_type, routed_scaling_factor, eps):
    xf = x.float()
    scores = torch.softmax(xf, dim=-1) if norm_type == 0 else 1 / (1 + torch.exp(-xf))
    sel = scores + bias.float()
    n = x.shape[0]
    grouped = sel.reshape(n, group_count, -1)
    if group_select_mode == 0:
        group_score = grouped.max(-1).values
    else:
        group_score = torch.sort(grouped, dim=-1, descending=True, stable=True).values[..., :2].sum(-1)
    keep = torch.sort(-group_score, dim=-1, stable=True).indices[:, :k_group]
    masked = torch.ones(n, group_count, dtype=torch.bool)
    masked[torch.arange(n)[:, None], keep] = False
    sel = torch.where(masked[..., None], float("-inf"), grouped).reshape(n, -1)
    idx = torch.sort(-sel, dim=-1, stable=True).indices[:, :k]
    y = scores.gather(1, idx)
    if norm_type == 1:
        y = y / (y.sum(-1, keepdim=True) + eps)
    return (y * routed_scaling_factor).to(x.dtype), idx.int()


@pytest.mark.parametrize("case,rows,dtype,k,scale", [(1, 8, torch.float32, 6, 1.0), (2, 1002, torch.float16, 1, 1.0),
                                                     (3, 128, torch.bfloat16, 16, 1.0),
                                                     (4, 128, torch.bfloat16, 16, 0.0)])
def test_npu_moe_gating_topk(case, rows, dtype, k, scale):
    gen = torch.Generator().manual_seed(case)
    x = (torch.rand(rows, 256, generator=gen) * 4 - 2).to(dtype)
    bias = (torch.rand(256, generator=gen) * 4 - 2).to(dtype)
    kw = dict(k_group=4, group_count=8, group_select_mode=1, norm_type=1, routed_scaling_factor=scale, eps=1e-20)
    y, idx = gating_top_k_golden(x, k, bias, **kw)
    y_npu, idx_npu, _ = torch_npu.npu_moe_gating_top_k(to_device(x), k, bias=to_device(bias), renorm=0,
                                                       out_flag=False, **kw)
    assert_rtol_equal(y, y_npu.cpu())
    assert_rtol_equal(idx, idx_npu.cpu())
