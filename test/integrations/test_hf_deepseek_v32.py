"""DeepSeek-V3.2's sparse attention (DSA) in a transformers DeepseekV32ForCausalLM (tiny random config, fixed seed,
float32, index_topk 4 so that every prompt longer than 4 tokens attends to a strict subset of its keys):

- PagedDSARunner (every layer's self_attn swapped for DSAAttention.from_hf: npu_mla_prolog_v3 -> indexer projections
  -> npu_lightning_indexer over a paged indexer-key cache -> npu_sparse_flash_attention over the paged latent cache,
  a ragged TND prefill of three prompts, then BSND decode steps) generates greedily the same tokens as transformers'
  own attention run on each prompt alone; its per-layer hidden states at prefill and its logits at every step are
  within the tolerance rule against the float64 copy of the model (max|ours - hf64| <= 2 * max|hf32 - hf64| + 1e-5),
  with default and yarn rope;
- a training step: PagedDSARunner.lm_loss of a packed ragged batch and the gradients of every parameter are within
  the rule against transformers' summed per-sequence loss (float64 copy; float32 model as the same-dtype peer). The
  indexer gets no gradient on either side (transformers' indexer runs under no_grad);
- in both, the selection matters: with the indexer's top-k widened to every key the results move well beyond the
  tolerance; every layer of every step goes through the four ops; a BSND prefill equals the TND one; from_hf's
  weight layout; bad inputs (PagedMLARunner refuses the model: dense MLA would ignore the indexer).
The norms' weights (and the indexer's LayerNorm bias) are randomised so that their mapping is checked too."""
import copy

import pytest
import torch

transformers = pytest.importorskip("transformers")

import torch_ops_transformer.mla.sparse_attention_runner as dsa_module  # noqa: E402
from torch_ops_transformer.mla import (DSAAttention, DSAIndexer, DSALatentCache, MLALatentCache,  # noqa: E402
                                       PagedDSARunner, PagedMLARunner)
from torch_ops_transformer.mla.attention import _HFMLAAdapter  # noqa: E402

from test.common import hf_generation  # noqa: E402
from test.common.reference import check_tolerance  # noqa: E402

PROMPT_LENS = (9, 14, 3)
TRAIN_LENS = (10, 13, 6)
NEW_TOKENS = 8
TOPK = 4

CONFIGS = {
    "default_rope": dict(),
    "yarn": dict(rope_parameters=dict(rope_type="yarn", rope_theta=10000.0, factor=4.0,
                                      original_max_position_embeddings=64, mscale=1.0, mscale_all_dim=1.0,
                                      beta_fast=32.0, beta_slow=1.0)),
}


def tiny_config(**overrides):
    cfg = dict(vocab_size=128, hidden_size=64, intermediate_size=128, moe_intermediate_size=32, num_hidden_layers=2,
               first_k_dense_replace=1, n_routed_experts=4, num_experts_per_tok=2, n_group=1, topk_group=1,
               n_shared_experts=1, num_attention_heads=4, num_key_value_heads=4, kv_lora_rank=64, q_lora_rank=32,
               qk_rope_head_dim=16, qk_nope_head_dim=32, v_head_dim=32, max_position_embeddings=256, pad_token_id=0,
               initializer_range=0.1, index_topk=TOPK, index_n_heads=8, index_head_dim=32)
    cfg.update(overrides)
    return transformers.DeepseekV32Config(**cfg)


@torch.no_grad()
def tiny_model(name="default_rope"):
    torch.manual_seed(0)
    # eager experts: the default grouped_mm ones have no float64 kernel (the float64 copy is the reference)
    model = transformers.AutoModelForCausalLM.from_config(tiny_config(**CONFIGS[name]), attn_implementation="eager",
                                                          experts_implementation="eager").eval()
    for pname, p in model.named_parameters():
        if "norm" in pname:  # RMSNorm gammas and the indexer's LayerNorm weight and bias start at 1 / 0
            p.add_(0.2 * torch.randn_like(p))
    return model


def token_lists(lens, seed):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(1, 128, (n,), generator=g).tolist() for n in lens]


def hf_run(model, prompt):
    return hf_generation.hf_run(model, prompt, NEW_TOKENS)


def run_runner(runner, prompts):
    return hf_generation.runner_steps(runner, prompts, NEW_TOKENS)


def widen_selection(runner):
    """Every layer's indexer keeps every key: dense MLA over the same caches (the control of 'selection matters')."""
    for layer in runner.model.model.layers:
        layer.self_attn.mla.indexer.topk = 2048


@pytest.mark.parametrize("name", list(CONFIGS))
def test_generation_matches_transformers(name):
    model = tiny_model(name)
    model64 = copy.deepcopy(model).double()
    ps = token_lists(PROMPT_LENS, 5)
    ref = [hf_run(model, p) for p in ps]
    runner = PagedDSARunner(copy.deepcopy(model), num_blocks=32, block_size=4)
    tokens, step_logits, hidden = run_runner(runner, ps)
    assert runner.cache.num_free_blocks == runner.cache.num_blocks

    for b, (p, (hf_tokens, hf_logits, hf_hidden)) in enumerate(zip(ps, ref)):
        assert tokens[b] == hf_tokens, f"prompt {b} ({len(p)} tokens): ours {tokens[b]} vs transformers {hf_tokens}"
        logits64, hidden64 = hf_generation.hf_forced(model64, p, hf_tokens)
        check_tolerance(f"{name}: logits of prompt {b}", step_logits[b], logits64, hf_logits)
        start = sum(PROMPT_LENS[:b])
        for layer, (h_ours, h32, h64) in enumerate(zip(hidden, hf_hidden, hidden64)):
            check_tolerance(f"{name}: prompt {b} hidden state {layer}", h_ours[0, start:start + len(p)], h64, h32)

    # The control: attending to every key moves the prefill logits of the prompts longer than the top-k far beyond
    # the tolerance, and leaves those of the 3-token prompt (which has fewer keys than the top-k) as they were.
    widen_selection(runner)
    _, dense_logits, _ = run_runner(runner, ps)
    for b, n in enumerate(PROMPT_LENS):
        diff = (dense_logits[b][0] - step_logits[b][0]).abs().max().item()
        assert (diff > 1e-2) if n > TOPK else (diff < 1e-5), f"prompt {b} ({n} tokens): dense vs top-{TOPK} {diff}"


def hf_layout_grads(model):
    """Our model's gradients under transformers' parameter names and layouts (the inverse of from_hf's layout; the
    model's rope is interleaved, so no column permutation). The indexer's entries are None when it got no gradient."""
    out = {}
    for name, p in model.named_parameters():
        g = p.grad
        if ".self_attn.mla." not in name:
            out[name] = g
            continue
        prefix, leaf = name.split(".mla.")
        if leaf.startswith("indexer."):
            hf_leaf = {"indexer.wq_b": "indexer.wq_b.weight", "indexer.wk": "indexer.wk.weight",
                       "indexer.weights_proj": "indexer.weights_proj.weight"}.get(leaf, leaf)
            out[f"{prefix}.{hf_leaf}"] = None if g is None else (g if g.dim() == 1 else g.t())
            continue
        if leaf in ("weight_uk", "weight_uv"):
            continue
        hf_leaf = {"weight_dq": "q_a_proj.weight", "gamma_cq": "q_a_layernorm.weight",
                   "weight_uq_qr": "q_b_proj.weight", "weight_dkv_kr": "kv_a_proj_with_mqa.weight",
                   "gamma_ckv": "kv_a_layernorm.weight", "o_proj.weight": "o_proj.weight"}[leaf]
        out[f"{prefix}.{hf_leaf}"] = g.t() if leaf in ("weight_dq", "weight_uq_qr", "weight_dkv_kr") else g
    for layer in model.model.layers:
        m = layer.self_attn.mla
        i = m.layer_idx
        kvb = torch.cat([m.weight_uk.grad, m.weight_uv.grad], dim=1)  # [N, D + Dv, r]
        out[f"model.layers.{i}.self_attn.kv_b_proj.weight"] = kvb.reshape(-1, m.kv_lora_rank)
    return out


def hf_loss_and_grads(model, seqs):
    """transformers' loss of each sequence alone (mean next-token cross entropy), summed, and its gradients."""
    model.zero_grad()
    loss = sum(model(torch.tensor([s]), labels=torch.tensor([s])).loss for s in seqs)
    loss.backward()
    return loss.detach(), {n: p.grad for n, p in model.named_parameters()}


def test_training_step_matches_transformers():
    model = tiny_model()
    seqs = token_lists(TRAIN_LENS, 7)
    loss32, grads32 = hf_loss_and_grads(model, seqs)
    loss64, grads64 = hf_loss_and_grads(copy.deepcopy(model).double(), seqs)
    runner = PagedDSARunner(copy.deepcopy(model), num_blocks=4, block_size=4)
    loss = runner.lm_loss(seqs)
    loss.backward()
    check_tolerance("loss", loss.detach(), loss64, loss32)
    ours = hf_layout_grads(runner.model)
    assert set(ours) == set(grads32)
    for name, g in ours.items():
        if ".indexer." in name:  # not trained by transformers' forward: no gradient on either side
            assert g is None and grads32[name] is None, name
            continue
        check_tolerance(f"grad of {name}", g, grads64[name], grads32[name])
    assert runner.cache.num_free_blocks == 4  # training uses no cache

    widen_selection(runner)
    with torch.no_grad():
        dense = runner.lm_loss(seqs)
    assert abs(dense.item() - loss.item()) > 1e-3, "the selection must matter for this batch"


def test_every_layer_runs_on_the_ops(monkeypatch):
    calls = {}

    def counting(fn_name):
        fn = getattr(dsa_module, fn_name)

        def wrapper(*args, **kwargs):
            calls[fn_name] = calls.get(fn_name, 0) + 1
            return fn(*args, **kwargs)
        monkeypatch.setattr(dsa_module, fn_name, wrapper)

    for fn_name in ("npu_mla_prolog_v3", "npu_scatter_nd_update_", "npu_lightning_indexer",
                    "npu_sparse_flash_attention"):
        counting(fn_name)
    model = tiny_model()
    ps = token_lists(PROMPT_LENS, 5)
    expected = [hf_run(model, p)[0][:3] for p in ps]
    runner = PagedDSARunner(model, num_blocks=32, block_size=8)
    assert runner.generate(ps, 3) == expected
    steps = 3  # one prefill, two decode steps, each through both layers
    assert calls == {"npu_mla_prolog_v3": 2 * steps, "npu_scatter_nd_update_": 2 * steps,
                     "npu_lightning_indexer": 2 * steps, "npu_sparse_flash_attention": 2 * steps}
    assert runner.generate(ps[::-1], 3) == expected[::-1]  # blocks were freed and are reused
    assert runner.cache.num_free_blocks == 32


def test_bsnd_prefill_equals_tnd():
    """DSAAttention on a uniform batch laid out BSND (the runner's prefill is TND) gives the TND result."""
    model = tiny_model()
    attn = DSAAttention.from_hf(model.model.layers[0].self_attn)
    torch.manual_seed(1)
    x = torch.randn(2, 7, 64)
    cos, sin = model.model.rotary_emb(x, torch.arange(7).expand(2, 7))
    outs = []
    for tnd in (True, False):
        cache = DSALatentCache(8, 4, 64, 16, 32)
        batch = cache.prepare([cache.add_sequence(), cache.add_sequence()], [7, 7])
        if tnd:
            out = attn(x.reshape(14, 64), cos.reshape(14, 16), sin.reshape(14, 16), cache, batch)
            outs.append(out.reshape(2, 7, 64))
        else:
            outs.append(attn(x, cos, sin, cache, batch))
    torch.testing.assert_close(outs[1], outs[0], rtol=1e-5, atol=1e-6)


def test_from_hf_weight_layout():
    model = tiny_model()
    a = model.model.layers[1].self_attn
    m = DSAAttention.from_hf(a)
    assert torch.equal(m.weight_dq, a.q_a_proj.weight.t()) and m.scaling == a.scaling and m.layer_idx == 1
    ix = m.indexer
    assert (ix.n_heads, ix.head_dim, ix.qk_rope_head_dim, ix.topk) == (8, 32, 16, TOPK)
    assert torch.equal(ix.wq_b, a.indexer.wq_b.weight.t()) and torch.equal(ix.wk, a.indexer.wk.weight.t())
    assert torch.equal(ix.weights_proj, a.indexer.weights_proj.weight.t())
    assert torch.equal(ix.k_norm.bias, a.indexer.k_norm.bias) and ix.k_norm.eps == a.indexer.k_norm.eps
    assert ix.weights_scale == pytest.approx(8 ** -0.5 * a.indexer.softmax_scale)
    yarn = tiny_model("yarn").model.layers[0].self_attn
    assert DSAAttention.from_hf(yarn).scaling == yarn.scaling != (32 + 16) ** -0.5  # yarn's mscale^2
    cache = PagedDSARunner(model, num_blocks=3, block_size=2).cache
    assert isinstance(cache, DSALatentCache) and cache.index_cache(1).shape == (3, 2, 1, 32)


def test_bad_inputs():
    torch.manual_seed(0)
    v3 = transformers.AutoModelForCausalLM.from_config(transformers.DeepseekV3Config(
        vocab_size=32, hidden_size=32, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=2, kv_lora_rank=16, q_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8,
        v_head_dim=8, n_routed_experts=2, num_experts_per_tok=1, n_group=1, topk_group=1))
    with pytest.raises(TypeError, match="DeepseekV32Attention.*indexer"):
        DSAAttention.from_hf(v3.model.layers[0].self_attn)
    with pytest.raises(TypeError, match="DeepseekV32Indexer"):
        DSAIndexer.from_hf(torch.nn.Linear(2, 2))
    with pytest.raises(ValueError, match="q_lora_rank"):
        DSAAttention(64, 4, 64, 32, 16, 32, None)
    with pytest.raises(ValueError, match="head_dim"):
        DSAIndexer(64, 32, 4, 8, 16, TOPK)
    with pytest.raises(ValueError, match="index_head_dim"):
        DSALatentCache(4, 4, 64, 16, 0)
    with pytest.raises(TypeError, match="DeepseekV32ForCausalLM"):
        PagedDSARunner(torch.nn.Linear(2, 2), num_blocks=4)
    model = tiny_model()
    with pytest.raises(TypeError, match="PagedDSARunner"):
        PagedMLARunner(model, num_blocks=4)  # dense MLA would ignore the indexer
    assert not isinstance(model.model.layers[0].self_attn, _HFMLAAdapter)  # nothing was swapped
    attn = DSAAttention.from_hf(model.model.layers[0].self_attn)
    x, cs = torch.randn(5, 64), torch.randn(5, 16)
    with pytest.raises(TypeError, match="DSALatentCache"):
        attn(x, cs, cs, MLALatentCache(4, 4, 64, 16), None)
    with pytest.raises(ValueError, match="cu_seqlens"):
        attn.forward_train(x, cs, cs, [2, 4])
    with pytest.raises(ValueError, match="TND"):
        attn.forward_train(x[None], cs, cs, [5])
    runner = PagedDSARunner(model, num_blocks=2, block_size=4)
    with pytest.raises(ValueError, match="already swapped"):
        PagedDSARunner(model, num_blocks=2)
    with pytest.raises(RuntimeError, match="PagedDSARunner"):
        model(torch.tensor([[1, 2]]))
    with pytest.raises(RuntimeError, match="out of blocks"):
        runner.prefill([[1] * 5, [2] * 5])
    with pytest.raises(ValueError, match="sequences"):
        runner.train_forward([[1, 2], []])
    with pytest.raises(ValueError, match="at least 2 tokens"):
        runner.lm_loss([[1, 2], [3]])
