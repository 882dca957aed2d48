"""MOELayer on an empty batch (0 tokens): an empty result, aux_loss 0, zero gradients; expert-parallel with a rank
that has no tokens matches the single-process layer on the other ranks' tokens."""
import os

import pytest
import torch

from test.moe.test_layer import _layer, _sharded_layers
from test.common.ranks import run_ranks


@pytest.mark.asan
@pytest.mark.parametrize("top_k,capacity", [(2, None), (1, None), (2, 3)])
@pytest.mark.parametrize("shape", [(0, 16), (0, 5, 16), (4, 0, 16)])
def test_empty_batch_forward_backward(top_k, capacity, shape):
    layer = _layer(input_dim=16, num_experts=4, top_k=top_k, expert_capacity=capacity, hidden_dim=24)
    x = torch.randn(shape, requires_grad=True)
    y = layer(x)
    assert y.shape == x.shape and y.dtype == x.dtype
    assert layer.aux_loss is not None and float(layer.aux_loss.detach()) == 0.0
    (y.sum() + layer.aux_loss).backward()
    assert x.grad.shape == x.shape
    for name, p in layer.named_parameters():
        assert p.grad is not None, name
        assert torch.equal(p.grad, torch.zeros_like(p)), name


@pytest.mark.asan
def test_empty_batch_fp16_input():
    layer = _layer(input_dim=8, num_experts=2, top_k=1)
    y = layer(torch.randn(0, 8, dtype=torch.float16))
    assert y.shape == (0, 8) and y.dtype == torch.float16


# ---- Expert parallel with a rank that has no tokens (gloo, subprocesses, bounded run time). ----


def _ep_worker(rank, world, port, result_dir):
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=__import__("datetime").timedelta(seconds=60))
    try:
        for capacity in (None, 3):
            _ep_check(rank, world, capacity)
        open(os.path.join(result_dir, f"ok{rank}"), "w").close()
        dist.barrier()
    finally:
        dist.destroy_process_group()


def _ep_check(rank, world, capacity):
    """Rank 0 has 0 tokens, the others 10: outputs and gradients equal the single-process layer's on the
    concatenated batch."""
    full, ep, shard = _sharded_layers(rank, world, input_dim=12, num_experts=4, top_k=2, hidden_dim=16,
                                      expert_capacity=capacity)
    g = torch.Generator().manual_seed(7)
    sizes = [0] + [10] * (world - 1)
    xs = [torch.randn(n, 12, generator=g) for n in sizes]
    dys = [torch.randn(n, 12, generator=g) for n in sizes]
    want = full(torch.cat(xs))
    (want * torch.cat(dys)).sum().backward()
    xr = xs[rank].clone().requires_grad_()
    y = ep(xr)
    (y * dys[rank]).sum().backward()
    tag = f"rank {rank}/{world} capacity {capacity}"
    start = sum(sizes[:rank])
    assert y.shape == (sizes[rank], 12), tag
    torch.testing.assert_close(y.detach(), want.detach()[start:start + sizes[rank]], rtol=1e-5, atol=1e-5,
                               msg=lambda m: f"{tag}: {m}")
    for name in ("w1", "b1", "w2", "b2"):
        torch.testing.assert_close(getattr(ep, name).grad, getattr(full, name).grad[shard],
                                   rtol=1e-4, atol=1e-5, msg=lambda m: f"{tag} {name}: {m}")


def test_expert_parallel_with_a_rank_without_tokens(tmp_path):
    world = 2
    run_ranks(_ep_worker, world, tmp_path)
