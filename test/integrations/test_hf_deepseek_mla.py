"""MLAAttention in a transformers DeepSeek-V3 (tiny random config, fixed seed, float32): PagedMLARunner (every
layer's self_attn swapped for MLAAttention.from_hf, one paged latent cache, a ragged TND prefill of three prompts of
different lengths, then BSND decode steps) generates greedily the same 16 new tokens as transformers' own attention
run on each prompt alone, and its per-layer hidden states at prefill and its logits at every step are within the
tolerance rule against the float64 copy of the model (max|ours - hf64| <= 2 * max|hf32 - hf64| + 1e-5). Configs: q
LoRA + default rope, and no q LoRA + yarn rope (mscale in the softmax scale and in cos/sin) + rope_interleave=False
(the rope columns permuted for the interleaved-rope prolog). Also from_hf's weight split and bad inputs."""
import copy

import pytest
import torch

transformers = pytest.importorskip("transformers")

from torch_ops_transformer.mla import MLAAttention, PagedMLARunner  # noqa: E402

from test.common import hf_generation  # noqa: E402
from test.common.reference import check_tolerance  # noqa: E402

PROMPT_LENS = (7, 12, 3)
NEW_TOKENS = 16

CONFIGS = {
    "q_lora": dict(q_lora_rank=32),
    "no_q_lora_yarn": dict(q_lora_rank=None, rope_interleave=False,
                           rope_parameters=dict(rope_type="yarn", rope_theta=10000.0, factor=4.0,
                                                original_max_position_embeddings=64, mscale=1.0, mscale_all_dim=1.0,
                                                beta_fast=32.0, beta_slow=1.0)),
}


def tiny_config(**overrides):
    cfg = dict(vocab_size=128, hidden_size=64, intermediate_size=128, moe_intermediate_size=32, num_hidden_layers=2,
               first_k_dense_replace=1, n_routed_experts=4, num_experts_per_tok=2, n_group=1, topk_group=1,
               n_shared_experts=1, num_attention_heads=4, num_key_value_heads=4, kv_lora_rank=64, q_lora_rank=32,
               qk_rope_head_dim=16, qk_nope_head_dim=32, v_head_dim=32, max_position_embeddings=256, pad_token_id=0,
               initializer_range=0.1)
    cfg.update(overrides)
    return transformers.DeepseekV3Config(**cfg)


def tiny_model(name):
    torch.manual_seed(0)
    # eager experts: the default grouped_mm ones have no float64 kernel (the float64 copy is the reference)
    return transformers.AutoModelForCausalLM.from_config(tiny_config(**CONFIGS[name]), attn_implementation="eager",
                                                         experts_implementation="eager").eval()


def prompts():
    g = torch.Generator().manual_seed(5)
    return [torch.randint(1, 128, (n,), generator=g).tolist() for n in PROMPT_LENS]


def hf_run(model, prompt):
    return hf_generation.hf_run(model, prompt, NEW_TOKENS)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_generation_matches_transformers(name):
    model = tiny_model(name)
    model64 = copy.deepcopy(model).double()
    ps = prompts()
    ref = [hf_run(model, p) for p in ps]
    runner = PagedMLARunner(copy.deepcopy(model), num_blocks=64, block_size=4)
    seq_ids, logits = runner.prefill(ps, output_hidden_states=True)
    hidden = runner.last_outputs.hidden_states  # packed [1, T, H] per layer
    tokens, step_logits = [[] for _ in ps], [[] for _ in ps]
    for step in range(NEW_TOKENS):
        nxt = logits.argmax(-1).tolist()
        for b, t in enumerate(nxt):
            tokens[b].append(t)
            step_logits[b].append(logits[b])
        if step + 1 < NEW_TOKENS:
            logits = runner.decode(seq_ids, nxt)
    blocks_used = runner.cache.num_blocks - runner.cache.num_free_blocks
    assert blocks_used == sum(-(-(n + NEW_TOKENS - 1) // 4) for n in PROMPT_LENS)
    runner.free(seq_ids)
    assert runner.cache.num_free_blocks == runner.cache.num_blocks

    for b, (p, (hf_tokens, hf_logits, hf_hidden)) in enumerate(zip(ps, ref)):
        assert tokens[b] == hf_tokens, f"prompt {b} ({len(p)} tokens): ours {tokens[b]} vs transformers {hf_tokens}"
        ours_logits = torch.stack(step_logits[b])
        logits64, hidden64 = hf_generation.hf_forced(model64, p, hf_tokens)
        check_tolerance(f"{name}: logits of prompt {b}", ours_logits, logits64, hf_logits)
        start = sum(PROMPT_LENS[:b])
        for layer, (h_ours, h32, h64) in enumerate(zip(hidden, hf_hidden, hidden64)):
            check_tolerance(f"{name}: prompt {b} hidden state {layer}", h_ours[0, start:start + len(p)], h64, h32)


def test_generate_helper_and_batch_order_independence():
    model = tiny_model("q_lora")
    ps = prompts()
    expected = [hf_run(model, p)[0] for p in ps]
    runner = PagedMLARunner(model, num_blocks=64, block_size=8)
    assert runner.generate(ps, NEW_TOKENS) == expected
    assert runner.generate(ps[::-1], NEW_TOKENS) == expected[::-1]  # blocks were freed and are reused
    assert runner.cache.num_free_blocks == 64


def test_from_hf_weight_layout():
    model = tiny_model("q_lora")
    a = model.model.layers[1].self_attn
    m = MLAAttention.from_hf(a)
    n, d, dv, r = 4, 32, 32, 64
    kvb = a.kv_b_proj.weight.reshape(n, d + dv, r)
    assert torch.equal(m.weight_uk, kvb[:, :d]) and torch.equal(m.weight_uv, kvb[:, d:])
    assert torch.equal(m.weight_dq, a.q_a_proj.weight.t()) and torch.equal(m.weight_uq_qr, a.q_b_proj.weight.t())
    assert torch.equal(m.weight_dkv_kr, a.kv_a_proj_with_mqa.weight.t())
    assert m.scaling == a.scaling and m.layer_idx == 1 and m.q_norm_eps == a.q_a_layernorm.variance_epsilon
    yarn = tiny_model("no_q_lora_yarn").model.layers[0].self_attn
    assert MLAAttention.from_hf(yarn).scaling == yarn.scaling != (32 + 16) ** -0.5  # yarn's mscale^2


def test_bad_inputs():
    with pytest.raises(TypeError, match="DeepseekV3Attention"):
        MLAAttention.from_hf(torch.nn.Linear(2, 2))
    with pytest.raises(NotImplementedError, match="attention_bias"):
        torch.manual_seed(0)
        MLAAttention.from_hf(transformers.AutoModelForCausalLM.from_config(
            tiny_config(attention_bias=True)).model.layers[0].self_attn)
    with pytest.raises(TypeError, match="causal LM"):
        PagedMLARunner(torch.nn.Linear(2, 2), num_blocks=4)
    model = tiny_model("q_lora")
    runner = PagedMLARunner(model, num_blocks=2, block_size=4)
    with pytest.raises(ValueError, match="already swapped"):
        PagedMLARunner(model, num_blocks=2)
    with pytest.raises(RuntimeError, match="out of blocks"):
        runner.prefill([[1] * 5, [2] * 5])
    assert runner.cache.num_free_blocks == 2  # the failed prefill registered no sequence
    with pytest.raises(RuntimeError, match="PagedMLARunner"):
        model(torch.tensor([[1, 2]]))
    with pytest.raises(ValueError, match="prompts"):
        runner.prefill([[]])
