"""Our MoE blocks (torch_ops_transformer.moe.blocks) against transformers' own DeepSeek-V3 and Qwen3-MoE blocks on
tiny random configs: the block's output and the gradients of its input and of every parameter within the
project's tolerance rule (max|ours - ref64| <= 2 * max|transformers_same_dtype - ref64| + 1e-5, ref64 =
transformers' block in float64 on the same rounded weights and input), greedy generation of the whole tiny model
token for token, the experts interface (experts_implementation="npu_moe", also on gpt-oss's expert layout),
GLM-4.5's identical block, torch.compile(fullgraph=True), expert parallel over 2 gloo ranks through
moe_distribute_dispatch_v2 / combine_v2 (block outputs and gradients, whole-model generation), and the bad-input
rules."""
import copy

import pytest
import torch

transformers = pytest.importorskip("transformers")

import torch_ops_transformer as tot  # noqa: E402
from torch_ops_transformer.integrations import hf  # noqa: E402
from torch_ops_transformer.moe import blocks  # noqa: E402
from torch_ops_transformer.moe.blocks import DeepseekV3MoEBlock, Qwen3MoeBlock, routed_experts  # noqa: E402
from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3MoE  # noqa: E402
from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock  # noqa: E402

H = 32


def deepseek_config(**overrides):
    cfg = dict(vocab_size=128, hidden_size=H, intermediate_size=64, moe_intermediate_size=16, num_hidden_layers=2,
               num_attention_heads=4, num_key_value_heads=4, n_routed_experts=16, num_experts_per_tok=4, n_group=4,
               topk_group=2, n_shared_experts=2, routed_scaling_factor=2.5, norm_topk_prob=True,
               first_k_dense_replace=1, q_lora_rank=16, kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8,
               v_head_dim=8,
               max_position_embeddings=128, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    cfg.update(overrides)
    return transformers.DeepseekV3Config(**cfg)


def qwen_config(**overrides):
    cfg = dict(vocab_size=128, hidden_size=H, intermediate_size=64, moe_intermediate_size=16, num_hidden_layers=2,
               num_attention_heads=4, num_key_value_heads=2, head_dim=8, num_experts=8, num_experts_per_tok=2,
               norm_topk_prob=True, max_position_embeddings=128, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    cfg.update(overrides)
    return transformers.Qwen3MoeConfig(**cfg)


def randomise(module, seed=0):
    """Random weights (transformers initialises the router and the correction bias to zeros)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.2)
        for name, b in module.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.copy_(torch.randn(b.shape, generator=gen) * 0.1)
    return module


def hf_block(kind, **overrides):
    if kind == "glm4_moe":  # GLM-4.5's block is DeepSeek-V3's
        from transformers.models.glm4_moe.modeling_glm4_moe import Glm4MoeMoE

        cfg = transformers.Glm4MoeConfig(**{k: v for k, v in deepseek_config(**overrides).to_dict().items() if k in (
            "hidden_size", "moe_intermediate_size", "n_routed_experts", "num_experts_per_tok", "n_group", "topk_group",
            "n_shared_experts", "routed_scaling_factor", "norm_topk_prob")})
        cfg._experts_implementation = "eager"
        return randomise(Glm4MoeMoE(cfg)), DeepseekV3MoEBlock
    if kind == "deepseek_v3":
        cfg = deepseek_config(**overrides)
        cfg._experts_implementation = "eager"
        return randomise(DeepseekV3MoE(cfg)), DeepseekV3MoEBlock
    cfg = qwen_config(**overrides)
    cfg._experts_implementation = "eager"
    return randomise(Qwen3MoeSparseMoeBlock(cfg)), Qwen3MoeBlock


def bound_ok(ours, same, ref):
    err, base = (ours.double() - ref).abs().max().item(), (same.double() - ref).abs().max().item()
    return err <= 2 * base + 1e-5, f"ours {err:.3g}, transformers {base:.3g}"


def run(block, x, grad):
    x = x.clone().requires_grad_()
    out = block(x)
    block.zero_grad(set_to_none=True)
    out.backward(grad.to(out.dtype))
    grads = {n: p.grad.clone() for n, p in block.named_parameters()}
    return out.detach(), x.grad, grads


CASES = [("deepseek_v3", {}), ("deepseek_v3", {"norm_topk_prob": False}),
         ("deepseek_v3", {"n_group": 1, "topk_group": 1, "n_shared_experts": 1, "routed_scaling_factor": 1.0}),
         ("qwen3_moe", {}), ("qwen3_moe", {"norm_topk_prob": False}), ("glm4_moe", {})]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("kind,overrides", CASES, ids=[f"{k}-{i}" for i, (k, _) in enumerate(CASES)])
def test_block_matches_transformers(kind, overrides, dtype):
    base, cls = hf_block(kind, **overrides)
    theirs = copy.deepcopy(base).to(dtype)
    ref = copy.deepcopy(theirs).double()          # float64 on the same rounded weights
    ours = cls.from_hf(copy.deepcopy(theirs))
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(3, 11, H, generator=gen).to(dtype)
    grad = torch.randn(3, 11, H, generator=gen, dtype=torch.float64)
    r_out, r_dx, r_grads = run(ref, x.double(), grad)
    t_out, t_dx, t_grads = run(theirs, x, grad)
    o_out, o_dx, o_grads = run(ours, x, grad)
    assert o_out.dtype == dtype and o_out.shape == x.shape
    for what, o, t, r in [("out", o_out, t_out, r_out), ("dx", o_dx, t_dx, r_dx)] + [
            (n, o_grads[n], t_grads[n], r_grads[n]) for n in r_grads]:
        ok, msg = bound_ok(o, t, r)
        assert ok, f"{what}: {msg}"
    assert set(o_grads) == set(r_grads)  # every parameter of transformers' block gets its gradient


def test_block_shares_parameters_and_state_dict():
    base, _ = hf_block("deepseek_v3")
    ours = DeepseekV3MoEBlock.from_hf(base)
    assert ours.state_dict().keys() == base.state_dict().keys()
    assert ours.experts.gate_up_proj is base.experts.gate_up_proj and ours.gate.weight is base.gate.weight
    # a freshly built block loads transformers' state dict as it is
    fresh = DeepseekV3MoEBlock.from_config(base.config)
    fresh.load_state_dict(base.state_dict())
    x = torch.randn(5, H)
    torch.testing.assert_close(fresh(x), ours(x))


def test_routed_experts_against_dense_reference():
    """routed_experts alone vs a float64 dense sum over every (token, choice) pair, with biases and a skip."""
    gen = torch.Generator().manual_seed(3)
    n, k, e, i = 9, 3, 5, 6
    x = torch.randn(n, H, generator=gen, dtype=torch.float64)
    idx = torch.stack([torch.randperm(e, generator=gen)[:k] for _ in range(n)])
    w = torch.rand(n, k, generator=gen, dtype=torch.float64)
    wgu, wd = torch.randn(e, H, 2 * i, generator=gen, dtype=torch.float64), torch.randn(e, i, H, generator=gen,
                                                                                         dtype=torch.float64)
    bgu, bd, skip = torch.randn(e, 2 * i, dtype=torch.float64), torch.randn(e, H, dtype=torch.float64), torch.randn(
        n, H, dtype=torch.float64)
    ref = skip.clone()
    for t in range(n):
        for j in range(k):
            ex = int(idx[t, j])
            gu = x[t] @ wgu[ex] + bgu[ex]
            ref[t] += w[t, j] * ((torch.nn.functional.silu(gu[:i]) * gu[i:]) @ wd[ex] + bd[ex])
    out = routed_experts(x, idx, w, wgu, wd, skip=skip, bias_gate_up=bgu, bias_down=bd)
    torch.testing.assert_close(out, ref)


def test_empty_batch():
    base, _ = hf_block("deepseek_v3")
    ours = DeepseekV3MoEBlock.from_hf(base)
    x = torch.randn(0, 4, H, requires_grad=True)
    out = ours(x)
    assert out.shape == x.shape
    out.sum().backward()
    assert x.grad.shape == x.shape


def _tiny_model(kind, seed=0, **kw):
    torch.manual_seed(seed)
    if kind == "deepseek_v3":
        model = transformers.DeepseekV3ForCausalLM(deepseek_config())
    else:
        model = transformers.Qwen3MoeForCausalLM(qwen_config())
    randomise(model, seed)
    return model.eval()


@pytest.mark.parametrize("kind", ["deepseek_v3", "qwen3_moe"])
def test_generate_equal_to_transformers(kind):
    model = _tiny_model(kind)
    prompt = torch.tensor([[1, 5, 17, 42, 9, 77, 3], [1, 8, 8, 100, 64, 12, 30]])
    kw = dict(max_new_tokens=12, min_new_tokens=12, do_sample=False, pad_token_id=0)
    with torch.no_grad():
        theirs = model.generate(prompt, **kw)
        logits_theirs = model(theirs).logits
        state = {k: v.clone() for k, v in model.state_dict().items()}
        tot.replace_moe_blocks(model)
        blocks = [m for m in model.modules() if isinstance(m, (DeepseekV3MoEBlock, Qwen3MoeBlock))]
        assert len(blocks) == (1 if kind == "deepseek_v3" else 2)
        assert model.state_dict().keys() == state.keys()
        ours = model.generate(prompt, **kw)
        logits_ours = model(theirs).logits
    assert torch.equal(ours, theirs)
    torch.testing.assert_close(logits_ours, logits_theirs, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("kind", ["deepseek_v3", "qwen3_moe"])
def test_experts_implementation(kind, monkeypatch):
    """experts_implementation="npu_moe": transformers' own block and gating, our experts."""
    calls = []
    original = blocks.routed_experts
    monkeypatch.setattr(blocks, "routed_experts", lambda *a, **k: calls.append(1) or original(*a, **k))
    model = _tiny_model(kind)
    prompt = torch.tensor([[1, 5, 17, 42, 9, 77, 3]])
    kw = dict(max_new_tokens=10, do_sample=False, pad_token_id=0)
    with torch.no_grad():
        model.set_experts_implementation("eager")
        theirs, logits_theirs = model.generate(prompt, **kw), model(prompt).logits
        model.set_experts_implementation(tot.register_hf_experts())
        assert model.config._experts_implementation == "npu_moe"
        ours, logits_ours = model.generate(prompt, **kw), model(prompt).logits
    assert calls  # our experts ran
    assert torch.equal(ours, theirs)
    torch.testing.assert_close(logits_ours, logits_theirs, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("kind", ["deepseek_v3", "qwen3_moe"])
def test_compile_fullgraph(kind):
    base, cls = hf_block(kind)
    ours = cls.from_hf(base)
    _check_compiled(torch.compile(ours, fullgraph=True, backend="aot_eager"), ours, (2, 5, H))


def _check_compiled(compiled, ours, shape):
    """The compiled block's output and input gradient equal eager's."""
    x = torch.randn(*shape, requires_grad=True)
    x2 = x.detach().clone().requires_grad_()
    out, ref = compiled(x), ours(x2)
    torch.testing.assert_close(out, ref)
    out.sum().backward()
    ref.sum().backward()
    torch.testing.assert_close(x.grad, x2.grad)


def test_replace_moe_blocks_glm4_moe():
    cfg = transformers.Glm4MoeConfig(vocab_size=128, hidden_size=H, intermediate_size=64, moe_intermediate_size=16,
                                     num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                                     n_routed_experts=8, num_experts_per_tok=2, n_group=2, topk_group=1,
                                     first_k_dense_replace=1, pad_token_id=0)
    torch.manual_seed(0)
    model = randomise(transformers.Glm4MoeForCausalLM(cfg)).eval()
    prompt = torch.tensor([[1, 5, 17, 42, 9, 77, 3]])
    kw = dict(max_new_tokens=8, min_new_tokens=8, do_sample=False, pad_token_id=0)
    with torch.no_grad():
        theirs = model.generate(prompt, **kw)
        tot.replace_moe_blocks(model)
        assert isinstance(model.model.layers[1].mlp, DeepseekV3MoEBlock)
        assert torch.equal(model.generate(prompt, **kw), theirs)


@pytest.mark.slow
def test_compile_inductor():
    """Inductor, forward and backward, then a new token count (minutes of compilation on a loaded 2-core machine)."""
    torch._dynamo.reset()
    base, cls = hf_block("deepseek_v3")
    ours = cls.from_hf(base)
    compiled = torch.compile(ours, fullgraph=True)
    for shape in ((2, 5, H), (3, 7, H)):
        _check_compiled(compiled, ours, shape)


def test_bad_inputs():
    base, _ = hf_block("deepseek_v3")
    ours = DeepseekV3MoEBlock.from_hf(base)
    with pytest.raises(ValueError, match="hidden_size=32"):
        ours(torch.randn(2, H + 1))
    with pytest.raises(TypeError, match="DeepseekV3MoE"):
        DeepseekV3MoEBlock.from_hf(torch.nn.Linear(2, 2))
    with pytest.raises(TypeError, match="Qwen3MoeSparseMoeBlock"):
        Qwen3MoeBlock.from_hf(torch.nn.Linear(2, 2))
    with pytest.raises(ValueError, match="'top_k'"):
        DeepseekV3MoEBlock(H, 16, 8, 9)
    with pytest.raises(ValueError, match="'n_group'"):
        DeepseekV3MoEBlock(H, 16, 8, 2, n_group=3, topk_group=1)
    with pytest.raises(ValueError, match="top two"):
        DeepseekV3MoEBlock(H, 16, 8, 2, n_group=8, topk_group=4)
    with pytest.raises(ValueError, match="kept groups"):
        DeepseekV3MoEBlock(H, 16, 8, 5, n_group=4, topk_group=2)
    with pytest.raises(ValueError, match="'n_shared_experts'"):
        DeepseekV3MoEBlock(H, 16, 8, 2, n_shared_experts=-1)
    with pytest.raises(ValueError, match="'hidden_act'"):
        DeepseekV3MoEBlock(H, 16, 8, 2, hidden_act="tanh")
    with pytest.raises(ValueError, match="'top_k'"):
        Qwen3MoeBlock(H, 16, 4, 5)
    with pytest.raises(ValueError, match="no block of a supported type"):
        hf.replace_moe_blocks(torch.nn.Sequential(torch.nn.Linear(2, 2)))
    with pytest.raises(TypeError, match="'model'"):
        hf.replace_moe_blocks("model")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_experts_implementation_gpt_oss_layout(dtype):
    """gpt-oss's experts: interleaved gate/up, [E, K, N] (transposed) weights, biases, its own clamped gate —
    "npu_moe" against transformers' eager experts, output and gradients within the tolerance rule."""
    from transformers.models.gpt_oss.modeling_gpt_oss import GptOssExperts

    cfg = transformers.GptOssConfig(hidden_size=H, intermediate_size=16, num_local_experts=8, num_experts_per_tok=3,
                                    swiglu_limit=0.5)
    cfg._experts_implementation = "eager"
    theirs = randomise(GptOssExperts(cfg)).to(dtype)
    ref = copy.deepcopy(theirs).double()
    ours = copy.deepcopy(theirs)
    ours.config = copy.deepcopy(cfg)
    ours.config._experts_implementation = tot.register_hf_experts()
    gen = torch.Generator().manual_seed(2)
    n = 13
    x = torch.randn(n, H, generator=gen).to(dtype)
    idx = torch.stack([torch.randperm(8, generator=gen)[:3] for _ in range(n)])
    w = torch.softmax(torch.randn(n, 3, generator=gen), -1).to(dtype)
    grad = torch.randn(n, H, generator=gen, dtype=torch.float64)
    results = []
    for module, xin, win in ((ref, x.double(), w.double()), (theirs, x, w), (ours, x, w)):
        xin = xin.clone().requires_grad_()
        out = module(xin, idx, win)
        module.zero_grad(set_to_none=True)
        out.backward(grad.to(out.dtype))
        results.append((out.detach(), xin.grad, {k: p.grad for k, p in module.named_parameters()}))
    (r_out, r_dx, r_g), (t_out, t_dx, t_g), (o_out, o_dx, o_g) = results
    assert o_out.dtype == dtype
    for what, o, t, r in [("out", o_out, t_out, r_out), ("dx", o_dx, t_dx, r_dx)] + [
            (k, o_g[k], t_g[k], r_g[k]) for k in r_g]:
        ok, msg = bound_ok(o, t, r)
        assert ok, f"{what}: {msg}"


def _ep_worker(rank, world, port, result_dir):
    import datetime
    import os

    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                           timeout=datetime.timedelta(seconds=60))
    try:
        for kind in ("deepseek_v3", "qwen3_moe"):
            for tokens in ([9, 6], [7, 0]):      # uneven batches; a rank with no tokens
                _ep_check(rank, world, kind, tokens)
        _ep_generate(rank, world)
        from torch_ops_transformer.moe.blocks import GroupedExperts

        with pytest.raises(ValueError, match="divisible by the process group's size"):
            GroupedExperts(3, H, 8).shard(dist.group.WORLD)
        with pytest.raises(ValueError, match="already sharded"):
            GroupedExperts(4, H, 8).shard(dist.group.WORLD).shard(dist.group.WORLD)
        open(os.path.join(result_dir, f"ok{rank}"), "w").close()
        dist.barrier()
    finally:
        dist.destroy_process_group()


def _ep_check(rank, world, kind, tokens):
    """This rank's expert-parallel block against the single-process block on the ranks' tokens concatenated:
    outputs, input gradients, the expert weights' gradients (this rank's slice) and the replicated parameters'
    gradients summed over the ranks."""
    import torch.distributed as dist

    base, cls = hf_block(kind)                # the same random weights on every rank
    full = cls.from_hf(copy.deepcopy(base))
    ep = cls.from_hf(copy.deepcopy(base)).shard_experts(dist.group.WORLD)
    gen = torch.Generator().manual_seed(4)
    x = torch.randn(sum(tokens), H, generator=gen)
    dy = torch.randn(sum(tokens), H, generator=gen)
    xf = x.clone().requires_grad_()
    (full(xf) * dy).sum().backward()
    start = sum(tokens[:rank])
    part = slice(start, start + tokens[rank])
    xr = x[part].clone().requires_grad_()
    y = ep(xr)
    (y * dy[part]).sum().backward()
    tag = f"{kind} rank {rank}/{world} tokens {tokens}"
    torch.testing.assert_close(y.detach(), full(x).detach()[part], rtol=1e-5, atol=1e-5, msg=lambda m: f"{tag}: {m}")
    torch.testing.assert_close(xr.grad, xf.grad[part], rtol=1e-5, atol=1e-5, msg=lambda m: f"{tag} dx: {m}")
    local = ep.experts.gate_up_proj.shape[0]
    shard = slice(rank * local, (rank + 1) * local)
    full_grads = dict(full.named_parameters())
    for name, p in ep.named_parameters():
        want = full_grads[name].grad
        if name.startswith("experts."):
            want = want[shard]
        else:                                 # replicated: the data-parallel sum over the ranks
            got = p.grad.clone()
            dist.all_reduce(got)
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5, msg=lambda m: f"{tag} {name}: {m}")
            continue
        torch.testing.assert_close(p.grad, want, rtol=1e-4, atol=1e-5, msg=lambda m: f"{tag} {name}: {m}")


def _ep_generate(rank, world):
    """Whole tiny models, experts sharded over the ranks, each rank generating for its own prompt (in lock step:
    the same number of new tokens): the tokens transformers generates in one process."""
    import torch.distributed as dist

    prompt = [torch.tensor([[1, 5, 17, 42, 9, 77, 3]]), torch.tensor([[1, 8, 100, 64]])][rank % 2]
    kw = dict(max_new_tokens=8, min_new_tokens=8, do_sample=False, pad_token_id=0)
    for kind in ("deepseek_v3", "qwen3_moe"):
        model = _tiny_model(kind)
        with torch.no_grad():
            theirs = model.generate(prompt, **kw)
            tot.replace_moe_blocks(model, process_group=dist.group.WORLD)
            ours = model.generate(prompt, **kw)
        assert torch.equal(ours, theirs), f"{kind} rank {rank}: {ours} != {theirs}"


def test_expert_parallel_world2(tmp_path):
    from test.common.ranks import run_ranks

    run_ranks(_ep_worker, 2, tmp_path)
