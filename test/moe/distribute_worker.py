"""Rank bodies of the multi-process dispatch / combine tests (spawned by test.common.ranks.run_ranks). Every rank
rebuilds all ranks' seeded data (test/moe/distribute_cases.py), so the float64 reference needs no communication.
A rank writes `ok<rank>` into out_dir when its checks pass."""
import datetime
import os
import time

import torch
import torch.distributed as dist

import torch_ops_transformer as tot
from test.common.reference import check_tolerance
from test.moe.distribute_cases import (active_pairs, apply_local_experts, expert_weights, make_ranks,
                                       reference_combine, reference_dispatch)

OPS = torch.ops.npu_fa


def _init(rank, world, port, timeout_s=30):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=timeout_s))
    return dist.group.WORLD.group_name


def _passed(rank, out_dir):
    open(os.path.join(out_dir, f"ok{rank}"), "w").close()


def _dispatch(d, group, rank, world, experts, dtype, global_bs=0, quant_mode=0, scales=None, token_nums_type=1,
              with_expert_scales=True):
    return tot.npu_moe_distribute_dispatch_v2(
        d.x.to(dtype), d.expert_ids, group, world, rank, experts, scales=scales, x_active_mask=d.mask,
        expert_scales=d.expert_scales.float() if with_expert_scales else None, quant_mode=quant_mode,
        global_bs=global_bs, expert_token_nums_type=token_nums_type)


def check_dispatch_layout(group, rank, world, batch, experts, k, mask="none", global_bs=0, token_nums_type=1,
                          skew=False, seed=0):
    """Every output of dispatch against the reference routing (the rows are copies: exact)."""
    ranks = make_ranks(world, batch, 16, k, experts, seed=seed, mask=mask, skew=skew)
    out = _dispatch(ranks[rank], group, rank, world, experts, torch.float32, global_bs,
                    token_nums_type=token_nums_type)
    expand_x, dyn, assist, token_nums, ep_recv, tp_recv, expand_scales = out
    rows, vals = reference_dispatch(ranks, world, experts, rank)
    local = experts // world
    cap = (global_bs or batch[rank] * world) * min(local, k)
    tag = f"rank {rank} batch {batch} mask {mask} skew {skew}"
    assert expand_x.shape == (cap, 16) and dyn.shape == (cap,) and expand_scales.shape == (cap,), tag
    assert assist.shape == (max(batch[rank] * k, 128 * cap),) and assist.dtype == torch.int32, tag
    n = len(rows)
    assert torch.equal(expand_x[:n], vals.float()) and not expand_x[n:].any(), tag
    counts = [sum(1 for e, *_ in rows if e == rank * local + le) for le in range(local)]
    want_nums = torch.tensor(counts).cumsum(0) if token_nums_type == 0 else torch.tensor(counts)
    assert token_nums.dtype == torch.int64 and torch.equal(token_nums, want_nums), (tag, token_nums, want_nums)
    per = [sum(1 for e, r, *_ in rows if e == rank * local + le and r == src) for le in range(local)
           for src in range(world)]
    assert ep_recv.dtype == torch.int32 and torch.equal(ep_recv, torch.tensor(per).cumsum(0).int()), tag
    assert tp_recv.shape == (0,), tag
    triples = torch.tensor([[r, t, s] for _, r, t, s in rows], dtype=torch.int32).reshape(-1)
    assert torch.equal(assist[:3 * n], triples), tag
    want_scales = torch.tensor([float(ranks[r].expert_scales[t, s]) for _, r, t, s in rows], dtype=torch.float32)
    assert torch.equal(expand_scales[:n], want_scales), tag


def check_round_trip(group, rank, world, batch, experts, k, dtype, mask="none", shared=False, global_bs=0,
                     skew=False, seed=1):
    """dispatch -> per-expert matmul -> combine against the float64 reference (tolerance rule)."""
    ranks = make_ranks(world, batch, 16, k, experts, seed=seed, mask=mask, shared=shared, skew=skew)
    weights = expert_weights(experts, 16)
    d = ranks[rank]
    local = experts // world

    def pipeline(cdtype):
        expand_x, _, assist, nums, ep_recv, tp_recv, es = _dispatch(d, group, rank, world, experts, cdtype, global_bs)
        y = apply_local_experts(expand_x, nums, weights.to(cdtype), rank * local)
        return tot.npu_moe_distribute_combine_v2(
            y, d.expert_ids, assist, ep_recv, d.expert_scales.float(), group, world, rank, experts,
            x_active_mask=d.mask, shared_expert_x=None if d.shared is None else d.shared.to(cdtype),
            tp_send_counts=tp_recv, expand_scales=es, global_bs=global_bs)

    ours = pipeline(dtype)
    ref = reference_combine(ranks, weights, rank)
    # torch_same_dtype: the same reference computed in the test dtype
    same = reference_combine(ranks, weights.to(dtype).double(), rank, xs=d.x.to(dtype).double(),
                             scales=d.expert_scales.float().double(),
                             shared=None if d.shared is None else d.shared.to(dtype).double()).to(dtype)
    check_tolerance(f"rank {rank} {dtype} batch {batch} mask {mask} shared {shared}", ours, ref, same)


def check_quant(group, rank, world, experts, k, smooth, seed=2):
    """quant_mode 2: per-row int8 of x (times the expert's smooth scales), scales = max|row| / 127."""
    ranks = make_ranks(world, [6] * world, 32, k, experts, seed=seed, mask="token")
    g = torch.Generator().manual_seed(seed + 50)
    smooth_scales = torch.rand(experts, 32, generator=g) + 0.5 if smooth else None
    expand_x, dyn, *_ = _dispatch(ranks[rank], group, rank, world, experts, torch.bfloat16, quant_mode=2,
                                  scales=smooth_scales)
    assert expand_x.dtype == torch.int8 and dyn.dtype == torch.float32
    rows, _ = reference_dispatch(ranks, world, experts, rank)
    for i, (e, r, t, s) in enumerate(rows):
        row = ranks[r].x[t].to(torch.bfloat16).float()
        if smooth:
            row = row * smooth_scales[e]
        amax = row.abs().max()
        q = torch.round(row * (127.0 / amax)).clamp(-127, 127)
        assert torch.equal(expand_x[i].float(), q), f"rank {rank} row {i}: int8 values differ"
        assert torch.isclose(dyn[i], amax / 127.0, rtol=1e-6), f"rank {rank} row {i}: scale differs"
    assert not dyn[len(rows):].any()


def check_comm_quant(group, rank, world, experts, k, seed=3):
    """combine comm_quant_mode 2: rows travel as int8 + scale; the result within one quantisation step per slot."""
    ranks = make_ranks(world, [5] * world, 32, k, experts, seed=seed)
    d = ranks[rank]
    expand_x, _, assist, nums, ep_recv, *_ = _dispatch(d, group, rank, world, experts, torch.float32)
    args = (expand_x, d.expert_ids, assist, ep_recv, d.expert_scales.float(), group, world, rank, experts)
    exact = tot.npu_moe_distribute_combine_v2(*args)
    quant = tot.npu_moe_distribute_combine_v2(*args, comm_quant_mode=2)
    bound = (d.x.abs().amax(1, keepdim=True) / 127 * 0.5 * d.expert_scales.sum(1, keepdim=True)).float() + 1e-6
    assert ((quant - exact).abs() <= bound).all(), f"rank {rank}: int8 communication error above half a step"
    assert not torch.equal(quant, exact)


def check_autograd(group, rank, world, batch, experts, k, mask="none", shared=True, global_bs=0, seed=4):
    """float64 gradients of x, expert_scales, shared_expert_x and the expert weights through dispatch -> experts ->
    combine against autograd through the single-process reference."""
    ranks = make_ranks(world, batch, 8, k, experts, seed=seed, mask=mask, shared=shared)
    weights = expert_weights(experts, 8)
    local = experts // world
    gens = torch.Generator().manual_seed(seed + 7)
    dys = [torch.randn(b, 8, generator=gens, dtype=torch.float64) for b in batch]
    d = ranks[rank]
    x = d.x.clone().requires_grad_(True)
    es = d.expert_scales.clone().requires_grad_(True)
    sh = d.shared.clone().requires_grad_(True) if shared else None
    w = weights.clone().requires_grad_(True)
    expand_x, _, assist, nums, ep_recv, *_ = tot.npu_moe_distribute_dispatch_v2(
        x, d.expert_ids, group, world, rank, experts, x_active_mask=d.mask, global_bs=global_bs)
    y = apply_local_experts(expand_x, nums, w, rank * local)
    out = tot.npu_moe_distribute_combine_v2(y, d.expert_ids, assist, ep_recv, es, group, world, rank, experts,
                                            x_active_mask=d.mask, shared_expert_x=sh, global_bs=global_bs)
    (out * dys[rank]).sum().backward()
    grad_w = w.grad.clone()
    dist.all_reduce(grad_w)  # each rank holds the gradient of its own experts' uses

    # reference: every rank's loss, differentiated through the plain-PyTorch routing
    rx = [r.x.clone().requires_grad_(True) for r in ranks]
    res = [r.expert_scales.clone().requires_grad_(True) for r in ranks]
    rsh = [r.shared.clone().requires_grad_(True) if shared else None for r in ranks]
    rw = weights.clone().requires_grad_(True)
    loss = sum((reference_combine(ranks, rw, r, rx[r], res[r], rsh[r]) * dys[r]).sum() for r in range(world))
    loss.backward()
    for t in rx + res + (rsh if shared else []):
        if t.grad is None:  # a rank without tokens: nothing reads its (empty) tensors
            t.grad = torch.zeros_like(t)
    tag = f"rank {rank} batch {batch} mask {mask}"
    torch.testing.assert_close(out.detach(), reference_combine(ranks, weights, rank), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(x.grad, rx[rank].grad, rtol=1e-10, atol=1e-12, msg=lambda m: f"{tag} x: {m}")
    want_es = res[rank].grad * active_pairs(d)
    torch.testing.assert_close(es.grad, want_es, rtol=1e-10, atol=1e-12, msg=lambda m: f"{tag} scales: {m}")
    if shared:
        torch.testing.assert_close(sh.grad, rsh[rank].grad, rtol=1e-10, atol=1e-12, msg=lambda m: f"{tag} sh: {m}")
    torch.testing.assert_close(grad_w, rw.grad, rtol=1e-10, atol=1e-12, msg=lambda m: f"{tag} weights: {m}")


def check_vllm_ascend_calls(group, rank, world, experts, k, seed=5):
    """The keyword calls vLLM-Ascend's MC2 token dispatcher makes (dynamic int8 quant, expert_token_nums_type 0,
    group_tp with tp_world_size 1, a one-element tp_send_counts), with the expert dequantising its int8 rows."""
    from torch_ops_transformer.mc2 import hccl_names

    hccl_names.install()  # what the torch_npu shim does on import
    # vLLM-Ascend names the group by its HCCL communicator name (through the npu backend when the npu device exists,
    # which needs the simulated device; the group's own method otherwise, as torch_npu on older torch)
    group = dist.group.WORLD.get_hccl_comm_name(rank)
    ranks = make_ranks(world, [4] * world, 32, k, experts, seed=seed, mask="token")
    weights = expert_weights(experts, 32)
    d = ranks[rank]
    local = experts // world
    kwargs = {"x": d.x.to(torch.bfloat16), "expert_ids": d.expert_ids, "expert_shard_type": 0,
              "shared_expert_rank_num": 0, "moe_expert_num": experts, "global_bs": 0, "expert_token_nums_type": 0,
              "x_active_mask": d.mask, "scales": None, "quant_mode": 2, "group_ep": group, "ep_world_size": world,
              "ep_rank_id": rank, "comm_alg": "", "group_tp": group, "tp_world_size": 1, "tp_rank_id": 0,
              "expert_scales": d.expert_scales.float()}
    expand_x, dyn, assist, cum, ep_recv, tp_recv, expand_scales = tot.npu_moe_distribute_dispatch_v2(**kwargs)[0:7]
    counts = torch.diff(cum, prepend=cum.new_zeros(1))
    deq = (expand_x.float() * dyn.unsqueeze(1)).double()
    y = apply_local_experts(deq, counts, weights, rank * local).to(torch.bfloat16)
    out = tot.npu_moe_distribute_combine_v2(
        expand_x=y, expert_ids=d.expert_ids, expert_scales=d.expert_scales.float(), expert_shard_type=0,
        shared_expert_rank_num=0, moe_expert_num=experts, global_bs=0, x_active_mask=d.mask,
        ep_send_counts=ep_recv, group_ep=group, ep_world_size=world, ep_rank_id=rank, expand_scales=expand_scales,
        comm_quant_mode=0, comm_alg="", assist_info_for_combine=assist,
        tp_send_counts=torch.empty(1, dtype=torch.int32), group_tp=group, tp_world_size=1, tp_rank_id=0)
    assert out.dtype == torch.bfloat16 and out.shape == d.x.shape
    ref = reference_combine(ranks, weights, rank)
    # int8 activations: about 1/127 of each row's magnitude per slot, then bfloat16 rounding
    bound = d.x.abs().amax(1, keepdim=True) / 127 * k * 2 + ref.abs() * 2 ** -7 + 1e-3
    assert ((out.double() - ref).abs() <= bound).all(), f"rank {rank}: vLLM-Ascend-style round trip off"


def expect_raise(exc, text, fn):
    try:
        fn()
    except exc as e:
        assert text in str(e), f"expected {text!r} in {e}"
        return
    raise AssertionError(f"expected {exc.__name__} containing {text!r}")


def check_bad_inputs(group, rank, world, experts):
    d = make_ranks(world, [4] * world, 16, 2, experts, seed=6)[rank]
    call = tot.npu_moe_distribute_dispatch_v2
    # local checks: every rank raises before communicating
    expect_raise(ValueError, "ep_rank_id", lambda: call(d.x, d.expert_ids, group, world, (rank + 1) % world, experts))
    expect_raise(ValueError, "ep_world_size", lambda: call(d.x, d.expert_ids, group, world + 1, rank, experts * 2))
    # cross-rank: ranks disagreeing on H all raise the same error
    h = 16 if rank == 0 else 8
    expect_raise(ValueError, "disagree on x.shape[1] (H)",
                 lambda: call(torch.randn(4, h), d.expert_ids, group, world, rank, experts))
    # uneven batches need global_bs
    bs = 4 if rank == 0 else 3
    expect_raise(ValueError, "same batch size",
                 lambda: call(torch.randn(bs, 16), d.expert_ids[:bs], group, world, rank, experts))
    # combine with counts that do not match what the sources expect
    expand_x, _, assist, _, ep_recv, *_ = call(d.x, d.expert_ids, group, world, rank, experts)
    wrong = ep_recv.clone()
    if rank == 0:
        wrong[-1] += 1
    expect_raise(ValueError, "returns",
                 lambda: tot.npu_moe_distribute_combine_v2(expand_x, d.expert_ids, assist, wrong,
                                                           d.expert_scales.float(), group, world, rank, experts))


def main_worker(rank, world, port, out_dir):
    group = _init(rank, world, port)
    experts = 2 * world
    # world 4 (4 processes on few cores: slow to start) runs the core checks; world 2 all of them
    check_dispatch_layout(group, rank, world, [0] + [6] * (world - 1), experts, 3, global_bs=6 * world,
                          token_nums_type=0, skew=True)
    check_round_trip(group, rank, world, [3] + [7] * (world - 1), experts, 3, torch.bfloat16, global_bs=8 * world,
                     skew=True, mask="token", shared=True)
    check_quant(group, rank, world, experts, 2, smooth=world == 2)
    check_autograd(group, rank, world, [0] + [5] * (world - 1), experts, 3, mask="token", global_bs=5 * world)
    if world == 2:
        check_dispatch_layout(group, rank, world, [5] * world, experts, 2)
        check_dispatch_layout(group, rank, world, [5] * world, experts, 2, mask="pair")
        check_round_trip(group, rank, world, [6] * world, experts, 2, torch.float32, mask="token", shared=True)
        check_round_trip(group, rank, world, [4, 0], experts, 2, torch.float16, mask="pair", shared=True,
                         global_bs=8)
        check_comm_quant(group, rank, world, experts, 2)
        check_vllm_ascend_calls(group, rank, world, experts, 2)
        check_bad_inputs(group, rank, world, experts)
        check_autograd(group, rank, world, [4] * world, experts, 2, mask="pair")
    if world == 2:
        # last: it breaks the group (one process start saved, CI time matters)
        check_failing_rank(group, rank, world)
        _passed(rank, out_dir)
        os._exit(0)  # the group is broken on purpose: no orderly teardown
    dist.barrier()
    dist.destroy_process_group()
    _passed(rank, out_dir)


def check_failing_rank(group, rank, world):
    """Rank 1 rejects its arguments (an expert id out of range) and leaves; rank 0 is inside the collective and
    must get an error, not hang: gloo reports the lost peer, or the process-group timeout (30 s here) expires."""
    x = torch.randn(4, 16)
    ids = torch.tensor([[0, 1], [2, 3], [1, 2], [3, 0]], dtype=torch.int32)
    start = time.monotonic()
    if rank == 1:
        ids[2, 1] = 99
        expect_raise(ValueError, "expert_ids must lie in", lambda: tot.npu_moe_distribute_dispatch_v2(
            x, ids, group, world, rank, 4))
        return  # main_worker then exits: rank 1 leaves the group while rank 0 waits in the collective
    expect_raise(RuntimeError, "", lambda: tot.npu_moe_distribute_dispatch_v2(x, ids, group, world, rank, 4))
    assert time.monotonic() - start < 40
