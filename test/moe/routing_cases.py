"""opcheck cases of the MoE gating and routing ops."""
import torch


def _experts(n, k, e, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.stack([torch.randperm(e, generator=g)[:k] for _ in range(n)]).int()


def _gating(shape, k, finished=False, grad=True, dtype=torch.float32):
    def make():
        x = torch.randn(shape, dtype=dtype, requires_grad=grad)
        fin = (torch.rand(shape[:-1]) < 0.5) if finished else None
        return (x, fin, k), {}
    return make


def _gating_v2(renorm, flag, finished=False):
    def make():
        done = torch.tensor([False, True, False, False, True, False]) if finished else None
        return (torch.randn(6, 8, requires_grad=True), done, 3, renorm, flag), {}
    return make


def _gating_grad(renorm):
    def make():
        return (torch.randn(5, 3), torch.randn(5, 7), 3, renorm), {}
    return make


def _group(norm_type, mode, groups, k_group, out_flag, grad=False):
    def make():
        return (torch.randn(5, 16, requires_grad=grad), 4, torch.randn(16) * 0.1, k_group, groups, mode, 0, norm_type,
                out_flag, 2.0, 1e-20), {}
    return make


def _group_grad(norm_type, from_x):
    def make():
        x = torch.randn(5, 16)
        scores = torch.softmax(x, -1) if norm_type == 0 else torch.sigmoid(x)
        experts = _experts(5, 4, 16)
        if from_x:  # the autograd path without out_flag: scores recomputed from x
            return (torch.empty(0), torch.randn(5, 4), experts, 0, norm_type, 2.0, 1e-20, x), {}
        return (scores, torch.randn(5, 4), experts), dict(norm_type=norm_type, routed_scaling_factor=2.0)
    return make


def _init_v1(active):
    def make():
        experts = _experts(6, 2, 4)
        row_idx = (torch.arange(2)[None] * 6 + torch.arange(6)[:, None]).int()
        return (torch.randn(6, 8), row_idx, experts, active), {}
    return make


def _init_v2(**kw):
    def make():
        return (torch.randn(7, 8, requires_grad=True), _experts(7, 2, 4)), kw
    return make


def _init_v2_grad(capacity):
    def make():
        x, experts = torch.randn(7, 8), _experts(7, 2, 4)
        kw = dict(drop_pad_mode=1, expert_num=4, expert_capacity=3) if capacity else {}
        rows, dst = torch.ops.npu_fa.moe_init_routing_v2(x, experts, **kw)[:2]
        return (torch.randn(rows.shape), dst, x, experts), {}
    return make


def _finalize_args(mode, optional):
    x, experts = torch.randn(6, 8), _experts(6, 2, 4)
    if mode in (0, 1):
        row_idx = (torch.arange(2)[None] * 6 + torch.arange(6)[:, None]).int()
        rows, dst, _ = torch.ops.npu_fa.moe_init_routing(x, row_idx, experts, 6)
    else:
        rows, dst = torch.ops.npu_fa.moe_init_routing_v2(x, experts, drop_pad_mode=1, expert_num=4,
                                                         expert_capacity=2)[:2]
    skip2 = torch.randn(6, 8) if optional else None
    bias = torch.randn(4, 8) if optional else None
    return rows, torch.randn(6, 8), skip2, bias, torch.rand(6, 2), dst, experts, mode


def _finalize(mode, optional):
    def make():
        rows, s1, s2, b, sc, dst, ex, m = _finalize_args(mode, optional)
        leaves = [t.requires_grad_() if t is not None else None for t in (rows, s1, s2, b, sc)]
        return (*leaves, dst, ex, m), {}
    return make


def _finalize_grad(optional):
    def make():
        rows, s1, _, b, sc, dst, ex, m = _finalize_args(3, optional)
        return (torch.randn(6, 8), rows, s1, b, sc, dst, ex, m), {}
    return make


def _permute(num_out, topk):
    def make():
        idx = _experts(6, topk, 5)
        return (torch.randn(6, 4, requires_grad=True), idx if topk > 1 else idx.view(-1).long(), num_out, False), {}
    return make


def _permute_grad():
    def make():
        idx = _experts(6, 2, 5)
        _, sorted_idx = torch.ops.npu_fa.moe_token_permute(torch.randn(6, 4), idx, -2, False)
        return (torch.randn(10, 4), sorted_idx, idx), {}
    return make


def _unpermute(with_probs, grad=False):
    def make():
        idx = _experts(6, 2, 5)
        permuted, sorted_idx = torch.ops.npu_fa.moe_token_permute(torch.randn(6, 4), idx, -3, False)
        probs = torch.rand(6, 2, requires_grad=not grad) if with_probs else None
        if grad:
            rows = 6 if with_probs else 12  # without probs every (token, slot) pair is its own output row
            return (permuted, torch.randn(rows, 4), sorted_idx, probs, False, None), {}
        return (permuted.requires_grad_(), sorted_idx, probs, False, None), {}
    return make


OPCHECK_CASES = {
    "moe_gating_top_k_softmax": {"2d_k1": _gating((7, 5), 1), "3d_finished": _gating((2, 3, 6), 3, True),
                                 "bf16_k_eq_e": _gating((4, 4), 4, dtype=torch.bfloat16)},
    "moe_gating_top_k_softmax_v2": {"renorm0_softmax": _gating_v2(0, True), "renorm1": _gating_v2(1, False),
                                    "finished": _gating_v2(0, False, finished=True)},
    "moe_gating_top_k_softmax_grad": {"renorm0": _gating_grad(0), "renorm1": _gating_grad(1)},
    "moe_gating_top_k": {"sigmoid_top2sum": _group(1, 1, 4, 2, True), "softmax_max": _group(0, 0, 4, 1, False),
                         "no_groups": _group(1, 0, 1, 1, False), "grad_sigmoid": _group(1, 1, 4, 2, False, True),
                         "grad_softmax_out": _group(0, 0, 4, 1, True, True)},
    "moe_gating_top_k_grad": {"sigmoid_scores": _group_grad(1, False), "softmax_scores": _group_grad(0, False),
                              "sigmoid_from_x": _group_grad(1, True), "softmax_from_x": _group_grad(0, True)},
    "moe_init_routing": {"all_rows": _init_v1(6), "active_num": _init_v1(3)},
    "moe_init_routing_v2": {
        "dropless_count": _init_v2(expert_num=4, expert_tokens_num_flag=True, expert_tokens_num_type=1),
        "active_num_cumsum": _init_v2(active_num=9, expert_num=4, expert_tokens_num_flag=True),
        "capacity": _init_v2(drop_pad_mode=1, expert_num=4, expert_capacity=3, expert_tokens_num_flag=True,
                             expert_tokens_num_type=1),
        "range_scatter_index": _init_v2(active_expert_range=[1, 3], row_idx_type=1),
    },
    "moe_init_routing_v2_grad": {"dropless": _init_v2_grad(False), "capacity": _init_v2_grad(True)},
    "moe_compute_expert_tokens": {
        "int32": lambda: ((torch.tensor([0, 0, 2, 3, 3], dtype=torch.int32), 5), {}),
        "int64_empty_tail": lambda: ((torch.tensor([1, 1, 1]), 4), {}),
    },
    "moe_finalize_routing": {"v1_all": _finalize(0, True), "v1_minimal": _finalize(1, False),
                             "capacity_token_major": _finalize(3, True)},
    "moe_finalize_routing_grad": {"all": _finalize_grad(True), "minimal": _finalize_grad(False)},
    "moe_token_permute": {"all": _permute(None, 2), "drop_tail": _permute(-4, 2), "topk1_int64": _permute(4, 1)},
    "moe_token_permute_grad": {"drop_tail": _permute_grad()},
    "moe_token_unpermute": {"probs": _unpermute(True), "no_probs": _unpermute(False)},
    "moe_token_unpermute_grad": {"probs": _unpermute(True, grad=True), "no_probs": _unpermute(False, grad=True)},
}
