"""Expert-parallel dispatch / combine (npu_moe_distribute_dispatch(_v2) / combine(_v2)).

In-process, on a one-rank gloo group: the round trip against the float64 reference, torch.autograd.gradcheck of
both ops, the v1 variants, and one test per argument rule (bad values -> ValueError / TypeError, upstream features
not implemented -> NotImplementedError naming the argument). Across processes (gloo, spawned ranks): world 2 and 4
with uneven expert loads, zero-token ranks, both masks, int8 quantisation, shared-expert outputs, float64 gradients
against the reference, vLLM-Ascend's calls, cross-rank argument checks, and a failing rank that must not hang the
others (test/moe/distribute_worker.py; process starts dominate their time, so each world size is one run).
"""
import pytest
import torch

import torch_ops_transformer as tot
from test.common.ranks import run_ranks
from test.common.tiers import FULL
from test.mc2.mc2_cases import single_rank_group
from test.moe import distribute_worker
from test.moe.distribute_cases import (active_pairs, apply_local_experts, expert_weights, make_ranks,
                                       reference_combine)

OPS = torch.ops.npu_fa
E = 4


@pytest.fixture(scope="module")
def group():
    yield single_rank_group()
    import torch.distributed as dist
    if dist.is_initialized():
        dist.destroy_process_group()


def _data(bs=5, k=2, mask="none", shared=False, seed=0):
    return make_ranks(1, [bs], 8, k, E, seed=seed, mask=mask, shared=shared)


@pytest.mark.parametrize("mask", ["none", "token", "pair"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_round_trip_one_rank_matches_reference(group, mask, dtype):
    ranks = _data(mask=mask, shared=True)
    d, weights = ranks[0], expert_weights(E, 8)
    expand_x, _, assist, nums, ep_recv, _, _ = tot.npu_moe_distribute_dispatch_v2(
        d.x.to(dtype), d.expert_ids, group, 1, 0, E, x_active_mask=d.mask)
    y = apply_local_experts(expand_x, nums, weights.to(dtype), 0)
    out = tot.npu_moe_distribute_combine_v2(y, d.expert_ids, assist, ep_recv, d.expert_scales.float(), group, 1, 0, E,
                                            x_active_mask=d.mask, shared_expert_x=d.shared.to(dtype))
    from test.common.reference import check_tolerance
    same = reference_combine(ranks, weights.to(dtype).double(), 0, xs=d.x.to(dtype).double(),
                             scales=d.expert_scales.float().double(), shared=d.shared.to(dtype).double()).to(dtype)
    check_tolerance(f"{mask} {dtype}", out, reference_combine(ranks, weights, 0), same)
    assert int(nums.sum()) == int(active_pairs(d).sum())


def test_gradcheck_dispatch_and_combine(group):
    d = _data(bs=4, mask="pair", shared=True, seed=3)[0]
    ids, mask = d.expert_ids, d.mask

    def dispatch(x):
        return OPS.moe_distribute_dispatch_v2(x, ids, group, 1, 0, E, None, mask)[0]

    out = OPS.moe_distribute_dispatch_v2(d.x, ids, group, 1, 0, E, None, mask)

    def combine(expand_x, scales, shared):
        return OPS.moe_distribute_combine_v2(expand_x, ids, out[2], out[4], scales, group, 1, 0, E, mask, shared)

    assert torch.autograd.gradcheck(dispatch, (d.x.clone().requires_grad_(True),))
    args = (torch.randn_like(out[0]).requires_grad_(True), d.expert_scales.clone().requires_grad_(True),
            d.shared.clone().requires_grad_(True))
    assert torch.autograd.gradcheck(combine, args)


def test_v1_variants_and_expand_idx(group):
    d = _data(bs=6, k=3, seed=4)[0]
    v1 = tot.npu_moe_distribute_dispatch(d.x, d.expert_ids, group, 1, 0, E, expert_token_nums_type=0)
    v2 = tot.npu_moe_distribute_dispatch_v2(d.x, d.expert_ids, group, 1, 0, E, expert_token_nums_type=0)
    for i in (0, 1, 3, 4, 5, 6):
        assert torch.equal(v1[i], v2[i])
    # expand_idx: index of each pair among the earlier pairs of the same expert (token-major)
    flat = d.expert_ids.reshape(-1).tolist()
    want = [flat[:f].count(e) for f, e in enumerate(flat)]
    assert v1[2].dtype == torch.int32 and v1[2].tolist() == want
    out1 = tot.npu_moe_distribute_combine(v1[0], d.expert_ids, v1[2], v1[4], d.expert_scales.float(), group, 1, 0, E)
    out2 = tot.npu_moe_distribute_combine_v2(v2[0], d.expert_ids, v2[2], v2[4], d.expert_scales.float(), group, 1,
                                             0, E)
    assert torch.equal(out1, out2)


def test_hints_accepted(group):
    d = _data()[0]
    x = d.x.float()
    base = tot.npu_moe_distribute_dispatch_v2(x, d.expert_ids, group, 1, 0, E)
    for kw in ({"comm_alg": "hierarchy"}, {"comm_alg": "fullmesh_v2"}, {"group_tp": group, "tp_world_size": 1},
               {"performance_info": torch.zeros(1, dtype=torch.int64)}, {"shared_expert_num": 0},
               {"x_dtype": 6, "y_dtype": 6}):
        out = tot.npu_moe_distribute_dispatch_v2(x, d.expert_ids, group, 1, 0, E, **kw)
        assert torch.equal(out[0], base[0]), kw
    assert tot.npu_moe_distribute_dispatch_v2(x, d.expert_ids, group, 1, 0, E, tp_world_size=1)[5].tolist() == [10]


NOT_IMPLEMENTED = [
    ({"shared_expert_rank_num": 0, "tp_world_size": 2}, "tp_world_size"),
    ({"quant_mode": 1}, "quant_mode"),
    ({"quant_mode": 4}, "quant_mode"),
    ({"zero_expert_num": 1}, "zero_expert_num"),
    ({"copy_expert_num": 2}, "copy_expert_num"),
    ({"const_expert_num": 1}, "const_expert_num"),
    ({"elastic_info": torch.zeros(8, dtype=torch.int32)}, "elastic_info"),
    ({"y_dtype": 291}, "y_dtype"),
]


@pytest.mark.parametrize("kwargs,name", NOT_IMPLEMENTED, ids=[n + str(i) for i, (_, n) in enumerate(NOT_IMPLEMENTED)])
def test_dispatch_not_implemented_names_the_argument(group, kwargs, name):
    d = _data()[0]
    with pytest.raises(NotImplementedError, match=name):
        tot.npu_moe_distribute_dispatch_v2(d.x, d.expert_ids, group, 1, 0, E, **kwargs)


def test_shared_expert_ranks_and_int32_x_not_implemented(group):
    d = _data()[0]
    with pytest.raises(NotImplementedError, match="shared_expert_rank_num"):
        tot.npu_moe_distribute_dispatch_v2(d.x, d.expert_ids, group, 2, 0, E, shared_expert_rank_num=1)
    with pytest.raises(NotImplementedError, match="int32 x"):
        tot.npu_moe_distribute_dispatch_v2(d.x.int(), d.expert_ids, group, 1, 0, E)
    out = tot.npu_moe_distribute_dispatch_v2(d.x, d.expert_ids, group, 1, 0, E)
    with pytest.raises(NotImplementedError, match="const_expert_num"):
        tot.npu_moe_distribute_combine_v2(out[0], d.expert_ids, out[2], out[4], d.expert_scales.float(), group, 1, 0,
                                          E, const_expert_num=1)
    with pytest.raises(NotImplementedError, match="int32 expand_x"):
        tot.npu_moe_distribute_combine_v2(out[0].int(), d.expert_ids, out[2], out[4], d.expert_scales.float(), group,
                                          1, 0, E)


def _mask_after_false():
    return torch.tensor([True, False, True, True, True])


BAD_DISPATCH = [
    (lambda d: {"x": d.x[0]}, "x must be 2-D"),
    (lambda d: {"expert_ids": d.expert_ids[:, :0]}, "K >= 1"),
    (lambda d: {"expert_ids": d.expert_ids[:4]}, "x's BS"),
    (lambda d: {"expert_ids": d.expert_ids + 10}, "expert_ids must lie in"),
    (lambda d: {"expert_ids": torch.zeros_like(d.expert_ids)}, "distinct"),
    (lambda d: {"moe_expert_num": 0}, "moe_expert_num"),
    (lambda d: {"ep_rank_id": 1}, "ep_rank_id"),
    (lambda d: {"ep_world_size": 2}, "ep_world_size"),
    (lambda d: {"x_active_mask": _mask_after_false()}, "trues before"),
    (lambda d: {"x_active_mask": torch.ones(3, dtype=torch.bool)}, "x_active_mask must be"),
    (lambda d: {"scales": torch.ones(E, 8)}, "needs quant_mode 2"),
    (lambda d: {"scales": torch.ones(E, 7), "quant_mode": 2}, "scales must be"),
    (lambda d: {"expert_scales": torch.ones(5, 3)}, "expert_scales must have"),
    (lambda d: {"global_bs": 3}, "global_bs"),
    (lambda d: {"global_bs": -1}, "global_bs"),
    (lambda d: {"quant_mode": 7}, "quant_mode"),
    (lambda d: {"expert_token_nums_type": 2}, "expert_token_nums_type"),
    (lambda d: {"comm_alg": "ring"}, "comm_alg"),
    (lambda d: {"expert_shard_type": 1}, "expert_shard_type"),
    (lambda d: {"shared_expert_num": 5}, "shared_expert_num"),
    (lambda d: {"tp_world_size": 3}, "tp_world_size"),
    (lambda d: {"tp_world_size": 1, "tp_rank_id": 1}, "tp_rank_id"),
    (lambda d: {"performance_info": torch.zeros(2, dtype=torch.int64)}, "performance_info"),
    (lambda d: {"group_ep": "no-such-group"}, "group_ep"),
]


@pytest.mark.parametrize("make,text", BAD_DISPATCH, ids=[t for _, t in BAD_DISPATCH])
def test_dispatch_bad_input(group, make, text):
    d = _data()[0]
    kw = dict(x=d.x, expert_ids=d.expert_ids, group_ep=group, ep_world_size=1, ep_rank_id=0, moe_expert_num=E)
    kw.update(make(d))
    with pytest.raises(ValueError, match=text) as info:
        tot.npu_moe_distribute_dispatch_v2(**kw)
    assert isinstance(info.value, RuntimeError)  # ArgumentError: torch_npu code catching RuntimeError works too


def test_dispatch_bad_types(group):
    d = _data()[0]
    with pytest.raises(TypeError, match="expert_ids must be int32"):
        tot.npu_moe_distribute_dispatch_v2(d.x, d.expert_ids.float(), group, 1, 0, E)
    with pytest.raises(TypeError, match="x_active_mask must be bool"):
        tot.npu_moe_distribute_dispatch_v2(d.x, d.expert_ids, group, 1, 0, E, x_active_mask=torch.ones(5))
    with pytest.raises(TypeError, match="'x' must be"):
        tot.npu_moe_distribute_dispatch_v2(d.x.to(torch.int8), d.expert_ids, group, 1, 0, E)
    with pytest.raises(TypeError, match="quant_mode"):
        tot.npu_moe_distribute_dispatch_v2(d.x, d.expert_ids, group, 1, 0, E, quant_mode=2.0)


BAD_COMBINE = [
    (lambda d, o: {"ep_send_counts": o[4][:-1]}, "ep_send_counts must be 1-D"),
    (lambda d, o: {"ep_send_counts": o[4].flip(0)}, "non-decreasing"),
    (lambda d, o: {"ep_send_counts": o[4] + 1000}, "counts"),
    (lambda d, o: {"expert_scales": torch.ones(5, 3)}, "expert_scales must have"),
    (lambda d, o: {"expand_x": o[0][:, :3].contiguous(), "shared_expert_x": torch.ones(5, 8)}, "shared_expert_x"),
    (lambda d, o: {"shared_expert_x": torch.ones(4, 8)}, "shared_expert_x must be"),
    (lambda d, o: {"comm_quant_mode": 1}, "comm_quant_mode"),
    (lambda d, o: {"expand_scales": torch.ones(3, 3)}, "expand_scales"),
    (lambda d, o: {"tp_send_counts": torch.ones(1)}, "tp_send_counts"),
    (lambda d, o: {"assist_info_for_combine": o[2].view(-1, 2)}, "assist_info_for_combine"),
    (lambda d, o: {"expert_ids": d.expert_ids + 10}, "expert_ids must lie in"),
    (lambda d, o: {"comm_alg": "x"}, "comm_alg"),
]


@pytest.mark.parametrize("make,text", BAD_COMBINE, ids=[t for _, t in BAD_COMBINE])
def test_combine_bad_input(group, make, text):
    d = _data()[0]
    out = tot.npu_moe_distribute_dispatch_v2(d.x, d.expert_ids, group, 1, 0, E)
    kw = dict(expand_x=out[0], expert_ids=d.expert_ids, assist_info_for_combine=out[2], ep_send_counts=out[4],
              expert_scales=d.expert_scales.float(), group_ep=group, ep_world_size=1, ep_rank_id=0, moe_expert_num=E)
    kw.update(make(d, out))
    with pytest.raises((ValueError, TypeError), match=text):
        tot.npu_moe_distribute_combine_v2(**kw)


def test_combine_v1_reserved_arguments(group):
    d = _data()[0]
    out = tot.npu_moe_distribute_dispatch(d.x, d.expert_ids, group, 1, 0, E)
    args = (out[0], d.expert_ids, out[2], out[4], d.expert_scales.float(), group, 1, 0, E)
    for kw in ({"group_list": torch.ones(2)}, {"out_dtype": 1}, {"weight_scale": torch.ones(2)}):
        with pytest.raises(ValueError, match="reserved"):
            tot.npu_moe_distribute_combine(*args, **kw)
    with pytest.raises(ValueError, match="expand_idx"):
        tot.npu_moe_distribute_combine(out[0], d.expert_ids, out[2][:3], *args[3:])


def test_world2_matches_reference_and_a_failing_rank_ends_the_others_with_an_error(tmp_path):
    """World 2, every check; the last one has rank 1 raise on bad input and leave while rank 0 is inside the
    collective: rank 0 must raise, not hang (process starts are the bulk of this test's time, hence one run)."""
    run_ranks(distribute_worker.main_worker, 2, tmp_path, timeout_s=150.0)


@FULL
def test_world4_matches_reference(tmp_path):
    run_ranks(distribute_worker.main_worker, 4, tmp_path, timeout_s=150.0)
