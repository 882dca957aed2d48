"""MOELayer against a float64 per-token reference (dropless and capacity modes, k = 1
and k = E, activations), its load-balancing loss, torch.compile(fullgraph) forward+backward, expert parallelism
over gloo with 2 and 4 ranks (same outputs and gradients as one process) and bad configurations."""
import os
import sys

import pytest
import torch
import torch.nn.functional as F

from test.common.moe_reference import act_ref
from torch_ops_transformer import MOELayer
from test.common.ranks import run_ranks
from test.common.tiers import full_only

ACT = {"gelu": 2, "relu": 1, "silu": 5, "fast_gelu": 4}


def reference_moe(layer, x, dtype=torch.float64):
    """Per-token loop in `dtype`: softmax router, top-k, renormalised weights, capacity in token order (CANN's
    moe_init_routing_v2: token t's choices before token t+1's), FFN per chosen expert."""
    p = {n: t.to(dtype) for n, t in layer.named_parameters()}
    x2 = x.reshape(-1, layer.input_dim).to(dtype)
    probs = torch.softmax(x2 @ p["gate.weight"].t(), -1)
    top_w, top_e = probs.topk(layer.top_k, -1)
    if layer.top_k > 1:
        top_w = top_w / top_w.sum(-1, keepdim=True)
    out = torch.zeros_like(x2)
    used = [0] * layer.num_experts
    for t in range(x2.shape[0]):
        for j in range(layer.top_k):
            e = int(top_e[t, j])
            if layer.expert_capacity is not None and used[e] >= layer.expert_capacity:
                continue
            used[e] += 1
            h = act_ref(x2[t] @ p["w1"][e] + p["b1"][e], ACT[layer.activation])
            out[t] += top_w[t, j] * (h @ p["w2"][e] + p["b2"][e])
    return out.reshape(x.shape)


def _layer(**kw):
    torch.manual_seed(kw.pop("seed", 0))
    layer = MOELayer(**kw)
    with torch.no_grad():  # non-zero biases so they are tested too
        layer.b1.normal_()
        layer.b2.normal_()
    return layer


def _sharded_layers(rank, world, **cfg):
    """(the single-process layer, this rank's expert-parallel shard of it over the default group, the slice of the
    expert axis that shard holds)."""
    import torch.distributed as dist

    full = _layer(**cfg)
    ep = MOELayer(**cfg, process_group=dist.group.WORLD)
    local = cfg["num_experts"] // world
    shard = slice(rank * local, (rank + 1) * local)
    with torch.no_grad():
        ep.gate.weight.copy_(full.gate.weight)
        for name in ("w1", "b1", "w2", "b2"):
            getattr(ep, name).copy_(getattr(full, name)[shard])
    return full, ep, shard


@pytest.mark.parametrize("top_k,capacity,activation", [
    (2, None, "gelu"), (1, None, "relu"), (4, None, "silu"),    # k = E
    (2, 3, "fast_gelu"),                                        # overflow: most experts drop rows
    (1, 40, "gelu"),                                            # underflow: nothing dropped, empty slots padded
])
def test_matches_reference(top_k, capacity, activation):
    layer = _layer(input_dim=16, num_experts=4, top_k=top_k, expert_capacity=capacity, hidden_dim=24,
                   activation=activation)
    x = torch.randn(3, 7, 16)
    y = layer(x)
    ref = reference_moe(layer, x)
    assert y.shape == x.shape and y.dtype == x.dtype
    torch.testing.assert_close(y.double(), ref, rtol=1e-5, atol=1e-5)


def test_gradients_match_reference():
    layer = _layer(input_dim=12, num_experts=4, top_k=2, expert_capacity=5, hidden_dim=20)
    x = torch.randn(2, 9, 12, requires_grad=True)
    dy = torch.randn(2, 9, 12)
    (layer(x) * dy).sum().backward()
    ref_layer = _layer(input_dim=12, num_experts=4, top_k=2, expert_capacity=5, hidden_dim=20)
    ref_layer.load_state_dict(layer.state_dict())
    ref_layer.double()
    xr = x.detach().double().requires_grad_()
    (reference_moe(ref_layer, xr) * dy.double()).sum().backward()
    torch.testing.assert_close(x.grad.double(), xr.grad, rtol=1e-5, atol=1e-5)
    for (name, p), (_, pr) in zip(layer.named_parameters(), ref_layer.named_parameters()):
        torch.testing.assert_close(p.grad.double(), pr.grad, rtol=1e-5, atol=1e-5, msg=lambda m: f"{name}: {m}")


def test_reference_uses_the_layers_parameters_in_float64():
    # reference_moe reads parameters by name; the ref layer above is the same module type in float64.
    layer = _layer(input_dim=8, num_experts=2, top_k=1, hidden_dim=8).double()
    x = torch.randn(5, 8, dtype=torch.float64)
    torch.testing.assert_close(layer(x), reference_moe(layer, x))


def test_documented_example_fp16_input():
    # docs/moe.md's example (a smaller input_dim and sequence so the test stays fast): fp16 input, fp32 layer.
    moe_layer = MOELayer(input_dim=256, num_experts=8, top_k=2, expert_capacity=32)
    input_tensor = torch.randn(4, 64, 256, dtype=torch.float16)
    output = moe_layer(input_tensor)
    assert output.shape == (4, 64, 256) and output.dtype == torch.float16
    ref = reference_moe(moe_layer, input_tensor.float())
    torch.testing.assert_close(output.double(), ref, rtol=2e-3, atol=2e-3)


def test_aux_loss_is_the_switch_formula_and_differentiable():
    layer = _layer(input_dim=8, num_experts=4, top_k=2)
    x = torch.randn(30, 8)
    layer(x)
    probs = torch.softmax(layer.gate(x).float(), -1)
    top_e = probs.topk(2, -1).indices
    f = torch.stack([(top_e == e).sum() for e in range(4)]).float() / top_e.numel()
    torch.testing.assert_close(layer.aux_loss, 4 * (f * probs.mean(0)).sum())
    layer.aux_loss.backward()
    assert layer.gate.weight.grad.abs().sum() > 0


@pytest.mark.parametrize("capacity", [None, 4])
def test_compile_fullgraph_forward_backward(capacity):
    torch._dynamo.reset()
    layer = _layer(input_dim=8, num_experts=4, top_k=2, expert_capacity=capacity, hidden_dim=16)
    x = torch.randn(2, 6, 8)

    def loss(m, x):
        return (m(x) ** 2).sum() + 0.01 * m.aux_loss

    eager_loss = loss(layer, x)
    eager_grads = torch.autograd.grad(eager_loss, list(layer.parameters()))
    compiled = torch.compile(loss, backend="aot_eager", fullgraph=True)
    got = compiled(layer, x)
    got_grads = torch.autograd.grad(got, list(layer.parameters()))
    torch.testing.assert_close(got, eager_loss)
    for g, w in zip(got_grads, eager_grads):
        torch.testing.assert_close(g, w)


@pytest.mark.slow
def test_compile_inductor_forward_backward():
    torch._dynamo.reset()
    layer = _layer(input_dim=16, num_experts=4, top_k=2, hidden_dim=32)
    loss = lambda m, x: (m(x) ** 2).sum() + 0.01 * m.aux_loss  # noqa: E731
    compiled = torch.compile(loss, backend="inductor", fullgraph=True)
    for tokens in (8, 11):
        x = torch.randn(3, tokens, 16)
        want = loss(layer, x)
        want_grads = torch.autograd.grad(want, list(layer.parameters()))
        got = compiled(layer, x)
        got_grads = torch.autograd.grad(got, list(layer.parameters()))
        torch.testing.assert_close(got, want)
        for g, w in zip(got_grads, want_grads):
            torch.testing.assert_close(g, w)


@pytest.mark.parametrize("kw,message", [
    (dict(top_k=5), "top_k must be in \\[1, num_experts=4\\]"),
    (dict(top_k=0), "top_k must be in"),
    (dict(expert_capacity=0), "expert_capacity must be a positive"),
    (dict(expert_capacity=-3), "expert_capacity must be a positive"),
    (dict(activation="tanh"), "activation must be one of"),
])
def test_bad_config(kw, message):
    args = dict(input_dim=8, num_experts=4, top_k=2)
    args.update(kw)
    with pytest.raises(ValueError, match=message):
        MOELayer(**args)


def test_bad_input_dim():
    with pytest.raises(ValueError, match="last dimension must be input_dim=8; got shape \\(3, 9\\)"):
        MOELayer(input_dim=8, num_experts=4, top_k=2)(torch.randn(3, 9))


# ---- Expert parallel over gloo, in subprocesses with a bounded run time. ----


def _ep_worker(rank, world, port, result_dir):
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=__import__("datetime").timedelta(seconds=60))
    try:
        for capacity in (None, 3):       # dropless; capacity 3 of ~5 rows per expert drops rows
            _ep_check(rank, world, capacity)
        open(os.path.join(result_dir, f"ok{rank}"), "w").close()
        dist.barrier()                    # nobody tears its connections down while a peer is still exchanging
    finally:
        dist.destroy_process_group()


def _ep_check(rank, world, capacity):
    """This rank's shard of an expert-parallel layer against the single-process layer on the global batch."""
    import torch.distributed as dist

    # the single-process layer (the same on every rank) and this rank's shard of it
    full, ep, shard = _sharded_layers(rank, world, input_dim=12, num_experts=8, top_k=2, hidden_dim=16,
                                      expert_capacity=capacity)
    g = torch.Generator().manual_seed(5)
    x = torch.randn(world, 10, 12, generator=g)              # every rank knows the global batch
    dy = torch.randn(world, 10, 12, generator=g)
    want = full(x)
    (want * dy).sum().backward()
    xr = x[rank].clone().requires_grad_()
    y = ep(xr)
    (y * dy[rank]).sum().backward()
    tag = f"rank {rank}/{world} capacity {capacity}"
    torch.testing.assert_close(y.detach(), want.detach()[rank], rtol=1e-5, atol=1e-5, msg=lambda m: f"{tag}: {m}")
    for name in ("w1", "b1", "w2", "b2"):
        torch.testing.assert_close(getattr(ep, name).grad, getattr(full, name).grad[shard],
                                   rtol=1e-4, atol=1e-5, msg=lambda m: f"{tag} {name}: {m}")
    gate_grad = ep.gate.weight.grad.clone()
    dist.all_reduce(gate_grad)                               # the data-parallel gradient of the replicated gate
    torch.testing.assert_close(gate_grad, full.gate.weight.grad, rtol=1e-4, atol=1e-5, msg=lambda m: f"{tag}: {m}")


@pytest.mark.parametrize("world", [2, *full_only(4)])
def test_expert_parallel_matches_single_process(world, tmp_path):
    run_ranks(_ep_worker, world, tmp_path)
