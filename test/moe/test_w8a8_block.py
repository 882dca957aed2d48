"""The W8A8 DeepSeek-V3 block (DeepseekV3MoEBlock.quantize_experts, moe.blocks.W8A8GroupedExperts) against

- a float64 emulation of the same quantisation (ref64): the block's int8 weights and float32 per-channel scales,
  every activation quantised per token with the kernels' own float32 formula (moe_init_routing_v2 quant_mode 1 and
  dynamic_quant: round(v / (max|v| / 127)); grouped_matmul_swiglu_quant and dispatch quant_mode 2:
  round(v * (127 / max|v|))), the integer products, dequantisation, SwiGLU, combine and shared expert in float64.
  Rule: max|ours - ref64| <= 2 * max|same - ref64| + 1e-5, `same` = that emulation in plain PyTorch with the
  kernels' dtypes (float32 inside, the expert rows and the output in the block's dtype);
- transformers' unquantised DeepSeek-V3 block in float64: relative error of the output (max|ours - hf64| /
  max|hf64|) under 3% (see QUANT_BOUND);
- expert parallel over 2 gloo ranks (dispatch quant_mode 2 sends int8 rows): the emulation with the dispatch's
  quantisation formula, uneven batches and a rank with no tokens;
plus quantize_per_channel against its float64 formula and the bad-input rules."""
import copy

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("transformers")

from test.moe.test_hf_blocks import H, hf_block  # noqa: E402
from torch_ops_transformer.moe.blocks import (DeepseekV3MoEBlock, GroupedExperts, W8A8GroupedExperts,  # noqa: E402
                                              quantize_per_channel)

# Four quantised operands in series (routed rows, gate/up weights, SwiGLU output, down weights), each with a
# rounding error of at most half a step = max|row or channel| / 254, i.e. about 0.4% of the largest value and ~0.2%
# rms for Gaussian-like data; the errors are independent and add roughly in quadrature over the dot products, so
# the routed part's relative error is ~1% (measured: 1.1% fp32, 1.4% bf16 on this config, 1.2-1.6% over seeds);
# 3% leaves room for other seeds and for bf16's own rounding (0.4%) without hiding a wrong scale (>= 10%).
QUANT_BOUND = 0.03


def _quant_rows(v, formula):
    """Per-token symmetric int8 of v's rows, in float32 as the kernels compute it -> (q, scale) in float64."""
    v = v.float()
    amax = v.abs().amax(-1, keepdim=True)
    q = torch.round(v / (amax / 127)) if formula == "div" else torch.round(v * (127 / amax))
    q = torch.where(amax > 0, q, torch.zeros_like(q)).clamp(-128, 127)
    return q.double(), (amax / 127).double()


def emulate(hf, experts, x, *, fused=True, x_formula="div", exact=True):
    """transformers' block `hf` (gate, shared expert) with the routed experts replaced by the W8A8 computation on
    `experts`' int8 weights and scales. exact: every step in float64 (the quantisations on the float32 value the
    kernel quantises); else the kernels' dtypes: float32 inside, expert rows and output in x's dtype."""
    dt = torch.float64 if exact else torch.float32
    cast = (lambda t: t) if exact else (lambda t: t.to(x.dtype).float())  # noqa: E731
    qgu, sgu = experts.gate_up_weight.to(dt), experts.gate_up_scale.to(dt)
    qd, sd = experts.down_weight.to(dt), experts.down_scale.to(dt)
    x2 = x.reshape(-1, x.shape[-1])
    with torch.no_grad():
        _, weights, idx = hf.gate(x.reshape(1, -1, x.shape[-1]))
        shared = hf.shared_experts(x2).to(dt)
        xq, xs = _quant_rows(x2, x_formula)
        out = shared.clone()
        for t in range(x2.shape[0]):
            for j in range(idx.shape[1]):
                e = int(idx[t, j])
                gu = (xq[t].to(dt) @ qgu[e]) * sgu[e] * xs[t].to(dt)
                half = gu.shape[0] // 2
                h = F.silu(gu[:half]) * gu[half:]
                hq, hs = _quant_rows(h.unsqueeze(0), "mul" if fused else "div")
                y = cast((hq[0].to(dt) @ qd[e]) * sd[e] * hs[0].to(dt))
                out[t] += weights[t, j].to(dt) * y
    return out if exact else out.to(x.dtype)


def _within_rule(ours, same, ref):
    err, base = (ours.double() - ref).abs().max().item(), (same.double() - ref).abs().max().item()
    return err <= 2 * base + 1e-5, f"ours {err:.3g}, same-dtype emulation {base:.3g}"


def _blocks(dtype, seed=1, tokens=(3, 11)):
    base, _ = hf_block("deepseek_v3")
    theirs = copy.deepcopy(base).to(dtype)
    ref = copy.deepcopy(theirs).double()
    x = torch.randn(*tokens, H, generator=torch.Generator().manual_seed(seed)).to(dtype)
    return theirs, ref, x


@pytest.mark.parametrize("fused", [True, False], ids=["swiglu_quant", "unfused"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_w8a8_block_matches_emulation(dtype, fused):
    theirs, ref, x = _blocks(dtype)
    ours = DeepseekV3MoEBlock.from_hf(copy.deepcopy(theirs)).quantize_experts(fused=fused)
    with torch.no_grad():
        out = ours(x)
    assert out.dtype == dtype and out.shape == x.shape
    ref64 = emulate(ref, ours.experts, x.double(), fused=fused).reshape(x.shape)
    same = emulate(theirs, ours.experts, x, fused=fused, exact=False).reshape(x.shape)
    ok, msg = _within_rule(out, same, ref64)
    assert ok, msg


@pytest.mark.parametrize("seed", [1, 2, 3])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_w8a8_block_close_to_transformers(dtype, seed):
    """Relative error of the W8A8 block against transformers' unquantised block in float64 under QUANT_BOUND; the
    unfused chain (grouped_matmul_quant, swiglu, dynamic_quant) gives the fused kernel's result up to a rounding."""
    theirs, ref, x = _blocks(dtype, seed)
    with torch.no_grad():
        hf64 = ref(x.double())
        fused = DeepseekV3MoEBlock.from_hf(copy.deepcopy(theirs)).quantize_experts()(x).double()
        unfused = DeepseekV3MoEBlock.from_hf(copy.deepcopy(theirs)).quantize_experts(fused=False)(x).double()
    rel = (fused - hf64).abs().max().item() / hf64.abs().max().item()
    assert 1e-4 < rel < QUANT_BOUND, rel           # quantised (not a silent float path), within the bound
    assert (unfused - hf64).abs().max().item() / hf64.abs().max().item() < QUANT_BOUND
    torch.testing.assert_close(unfused, fused, rtol=0, atol=0.02 * hf64.abs().max().item())


def test_quantize_per_channel():
    gen = torch.Generator().manual_seed(5)
    w = torch.randn(3, 40, 24, generator=gen, dtype=torch.float64)
    w[1, :, 7] = 0                                           # an all-zero channel
    q, s = quantize_per_channel(w)
    assert q.dtype == torch.int8 and s.dtype == torch.float32 and q.shape == w.shape and s.shape == (3, 24)
    amax = w.abs().amax(dim=1)
    want = torch.where(amax > 0, amax / 127, torch.ones_like(amax))
    torch.testing.assert_close(s.double(), want, rtol=2 ** -23, atol=0)
    assert s[1, 7] == 1 and (q[1, :, 7] == 0).all()
    exact = w / want.unsqueeze(1)
    assert ((q.double() - exact).abs() <= 0.5 + 1e-5).all()  # nearest step (a tie may go either way in float32)
    assert (q.abs().amax(dim=1)[amax > 0] == 127).all()      # the channel's largest value maps to +-127
    # the block's buffers: the experts' [E, 2I, H] / [E, H, I] weights quantised in the [E, K, N] layout
    base, _ = hf_block("deepseek_v3")
    block = DeepseekV3MoEBlock.from_hf(base)
    ex = W8A8GroupedExperts.from_experts(block.experts)
    q, s = quantize_per_channel(base.experts.gate_up_proj.transpose(1, 2))
    assert torch.equal(ex.gate_up_weight, q) and torch.equal(ex.gate_up_scale, s)
    assert ex.down_weight.shape == (16, 16, H) and ex.down_scale.shape == (16, H)


def test_w8a8_empty_batch():
    theirs, _, _ = _blocks(torch.float32)
    ours = DeepseekV3MoEBlock.from_hf(theirs).quantize_experts()
    with torch.no_grad():
        assert ours(torch.randn(0, 4, H)).shape == (0, 4, H)


def test_w8a8_bad_inputs():
    theirs, _, _ = _blocks(torch.float32)
    ours = DeepseekV3MoEBlock.from_hf(theirs).quantize_experts()
    with pytest.raises(ValueError, match="already quantised"):
        ours.quantize_experts()
    with pytest.raises(NotImplementedError, match="hidden_act='gelu'"):
        W8A8GroupedExperts.from_experts(GroupedExperts(4, H, 8, "gelu"))
    with pytest.raises(TypeError, match="'experts'"):
        W8A8GroupedExperts.from_experts(torch.nn.Linear(2, 2))
    with pytest.raises(ValueError, match="'weight'"):
        quantize_per_channel(torch.randn(4, 4))
    with pytest.raises(ValueError, match="'weight'"):
        quantize_per_channel(torch.ones(2, 4, 4, dtype=torch.int8))


def _ep_worker(rank, world, port, result_dir):
    import datetime
    import os

    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=60))
    try:
        for fused in (True, False):
            for tokens in ([9, 6], [7, 0]):      # uneven batches; a rank with no tokens
                _ep_check(rank, world, tokens, fused)
        open(os.path.join(result_dir, f"ok{rank}"), "w").close()
        dist.barrier()
    finally:
        dist.destroy_process_group()


def _ep_check(rank, world, tokens, fused):
    """This rank's W8A8 expert-parallel block (int8 dispatch) against the emulation with the dispatch's
    quantisation formula on this rank's tokens; its int8 shard equals the slice of the whole block's."""
    import torch.distributed as dist

    base, _ = hf_block("deepseek_v3")
    ref = copy.deepcopy(base).double()
    full = DeepseekV3MoEBlock.from_hf(copy.deepcopy(base)).quantize_experts(fused=fused)
    ep = DeepseekV3MoEBlock.from_hf(copy.deepcopy(base)).shard_experts(dist.group.WORLD).quantize_experts(fused=fused)
    local = ep.experts.gate_up_weight.shape[0]
    assert torch.equal(ep.experts.gate_up_weight, full.experts.gate_up_weight[rank * local:(rank + 1) * local])
    x = torch.randn(sum(tokens), H, generator=torch.Generator().manual_seed(4))
    start = sum(tokens[:rank])
    xr = x[start:start + tokens[rank]]
    with torch.no_grad():
        y = ep(xr)
    tag = f"rank {rank}/{world} tokens {tokens} fused {fused}"
    assert y.shape == xr.shape, tag
    if tokens[rank]:
        ref64 = emulate(ref, full.experts, xr.double(), fused=fused, x_formula="mul")
        same = emulate(base, full.experts, xr, fused=fused, x_formula="mul", exact=False)
        ok, msg = _within_rule(y, same, ref64)
        assert ok, f"{tag}: {msg}"


def test_w8a8_expert_parallel_world2(tmp_path):
    from test.common.ranks import run_ranks

    run_ranks(_ep_worker, 2, tmp_path)
