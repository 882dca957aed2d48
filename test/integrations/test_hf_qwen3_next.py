"""Qwen3-Next (hybrid Gated DeltaNet + gated full attention) in a transformers Qwen3NextForCausalLM (tiny random
config, fixed seed, float32, layers linear / linear / linear / full, MoE MLPs):

- Qwen3NextRunner (every Gated DeltaNet layer on npu_fused_causal_conv1d -> npu_chunk_gated_delta_rule (prefill) /
  npu_recurrent_gated_delta_rule (decode, in place on the state cache) -> rms_norm_gated, every full-attention layer
  on npu_rms_norm, npu_rotary_mul and npu_fused_infer_attention_score over a paged KV cache) generates greedily the
  same tokens as transformers run on each prompt alone, for ragged prompts longer than one 64-token chunk; its logits
  at every step are within the tolerance rule against a float64 copy of the model;
- a training step: Qwen3NextRunner.lm_loss of a packed ragged batch (npu_masked_causal_conv1d and
  npu_chunk_gated_delta_rule with their autograd, npu_fusion_attention) and the gradients of every parameter are
  within the rule against transformers' summed per-sequence loss.
transformers' own gated delta rule computes in float32 even in a float64 model, so the float64 reference runs the
model with that function replaced by the float64 token-by-token recurrence of test/linear_attention."""
import copy

import pytest
import torch

transformers = pytest.importorskip("transformers")
qwen3_next = pytest.importorskip("transformers.models.qwen3_next.modeling_qwen3_next")

from torch_ops_transformer.linear_attention import qwen3_next as runner_module  # noqa: E402
from torch_ops_transformer.linear_attention.qwen3_next import Qwen3NextRunner  # noqa: E402

from test.common import hf_generation  # noqa: E402
from test.common.reference import check_tolerance  # noqa: E402
from test.linear_attention.chunk_gated_delta_rule_reference import chunk_gated_delta_rule_ref  # noqa: E402

PROMPT_LENS = (70, 9, 133)
TRAIN_LENS = (70, 13, 40)
NEW_TOKENS = 6


def tiny_model():
    cfg = transformers.Qwen3NextConfig(
        vocab_size=128, hidden_size=64, intermediate_size=64, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
        linear_value_head_dim=16, linear_conv_kernel_dim=4, num_experts=4, num_experts_per_tok=2,
        moe_intermediate_size=32, shared_expert_intermediate_size=32, max_position_embeddings=512, pad_token_id=0,
        initializer_range=0.1)
    torch.manual_seed(0)
    # eager experts: the grouped_mm ones have no float64 kernel (the float64 copy is the reference)
    model = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="eager",
                                                          experts_implementation="eager").eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:  # zero-centred RMSNorm weights and the gated norm's ones: randomised
                p.add_(0.2 * torch.randn_like(p))
    return model


def gdn_float64(query, key, value, g, beta, chunk_size=64, initial_state=None, output_final_state=False,
                use_qk_l2norm_in_kernel=False, **kwargs):
    """transformers' chunked gated delta rule's contract ([B, S, H, D], state [B, Nv, Dk, Dv]) on the float64
    token-by-token reference, in the inputs' dtype."""
    if use_qk_l2norm_in_kernel:
        query, key = (qwen3_next.l2norm(t, dim=-1, eps=1e-6) for t in (query, key))
    outs, finals = [], []
    for b in range(query.shape[0]):
        init = None if initial_state is None else initial_state[b:b + 1].transpose(-1, -2)
        o, f = chunk_gated_delta_rule_ref(query[b], key[b], value[b], beta[b], init, [query.shape[1]],
                                          query.shape[-1] ** -0.5, g[b], dtype=query.dtype)
        outs.append(o)
        finals.append(f[0].transpose(-1, -2))
    return torch.stack(outs), (torch.stack(finals) if output_final_state else None)


@pytest.fixture
def float64_gdn(monkeypatch):
    monkeypatch.setattr(qwen3_next, "torch_chunk_gated_delta_rule", gdn_float64)


def token_lists(lens, seed):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(1, 128, (n,), generator=g).tolist() for n in lens]


def run_runner(runner, prompts):
    return hf_generation.runner_steps(runner, prompts, NEW_TOKENS)[:2]


def test_generation_matches_transformers(monkeypatch):
    model = tiny_model()
    ps = token_lists(PROMPT_LENS, 5)
    ref = [hf_generation.hf_run(model, p, NEW_TOKENS) for p in ps]
    runner = Qwen3NextRunner(copy.deepcopy(model), num_blocks=64, block_size=16, max_seqs=4)
    tokens, step_logits = run_runner(runner, ps)
    monkeypatch.setattr(qwen3_next, "torch_chunk_gated_delta_rule", gdn_float64)
    model64 = copy.deepcopy(model).double()
    for b, (p, (hf_tokens, hf_logits, _)) in enumerate(zip(ps, ref)):
        assert tokens[b] == hf_tokens, f"prompt {b} ({len(p)} tokens): ours {tokens[b]} vs transformers {hf_tokens}"
        logits64, _ = hf_generation.hf_forced(model64, p, hf_tokens)
        check_tolerance(f"logits of prompt {b}", step_logits[b], logits64, hf_logits)


def hf_loss_and_grads(model, seqs):
    model.zero_grad()
    loss = sum(model(torch.tensor([s]), labels=torch.tensor([s])).loss for s in seqs)
    loss.backward()
    return loss.detach(), {n: p.grad for n, p in model.named_parameters()}


def test_training_step_matches_transformers(monkeypatch):
    model = tiny_model()
    seqs = token_lists(TRAIN_LENS, 7)
    loss32, grads32 = hf_loss_and_grads(model, seqs)
    monkeypatch.setattr(qwen3_next, "torch_chunk_gated_delta_rule", gdn_float64)
    loss64, grads64 = hf_loss_and_grads(copy.deepcopy(model).double(), seqs)
    runner = Qwen3NextRunner(copy.deepcopy(model), num_blocks=4, block_size=16, max_seqs=2)
    loss = runner.lm_loss(seqs)
    loss.backward()
    check_tolerance("loss", loss.detach(), loss64, loss32)
    ours = {n.replace(".layer.hf.", "."): p.grad for n, p in runner.model.named_parameters()}
    assert set(ours) == set(grads32)
    for name, g in ours.items():
        check_tolerance(f"grad of {name}", g, grads64[name], grads32[name])
    assert runner.cache.allocator.num_free_blocks == 4  # training uses no cache


def test_every_layer_runs_on_the_ops(monkeypatch):
    calls = {}
    for fn_name in ("npu_fused_causal_conv1d", "npu_chunk_gated_delta_rule", "npu_recurrent_gated_delta_rule",
                    "rms_norm_gated", "npu_fused_infer_attention_score", "npu_rotary_mul"):
        fn = getattr(runner_module, fn_name)

        def wrapper(*args, _fn=fn, _name=fn_name, **kwargs):
            calls[_name] = calls.get(_name, 0) + 1
            return _fn(*args, **kwargs)
        monkeypatch.setattr(runner_module, fn_name, wrapper)
    runner = Qwen3NextRunner(tiny_model(), num_blocks=8, block_size=16, max_seqs=2)
    runner.generate(token_lists((5, 3), 1), 2)  # one prefill, one decode step
    assert calls == {"npu_fused_causal_conv1d": 6, "npu_chunk_gated_delta_rule": 3,
                     "npu_recurrent_gated_delta_rule": 3, "rms_norm_gated": 6, "npu_fused_infer_attention_score": 2,
                     "npu_rotary_mul": 4}


def test_bad_inputs():
    model = tiny_model()
    with pytest.raises(TypeError, match="Qwen3-Next model"):
        Qwen3NextRunner(transformers.AutoModelForCausalLM.from_config(transformers.LlamaConfig(
            vocab_size=32, hidden_size=16, intermediate_size=16, num_hidden_layers=1, num_attention_heads=2)),
            num_blocks=2)
    runner = Qwen3NextRunner(model, num_blocks=8, block_size=16, max_seqs=1)
    with pytest.raises(ValueError, match="already swapped"):
        Qwen3NextRunner(model, num_blocks=8)
    with pytest.raises(RuntimeError, match="out of state slots"):
        runner.prefill(token_lists((3, 3), 2))
    with pytest.raises(RuntimeError, match="run through it"):
        model(torch.tensor([[1, 2]]))
