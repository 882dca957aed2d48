"""The transformers drop-in (attn_implementation="npu_fa") on a tiny GQA Llama: greedy generation identical to
"sdpa" (incl. a left-padded batch), logits and training gradients within the tolerance rule against the float64
eager model, prefill and decode steps routed to our kernels, replace_attention_with_flash, optional import."""
import copy
import subprocess
import sys

import pytest
import torch

transformers = pytest.importorskip("transformers")

import torch_ops_transformer as tot  # noqa: E402
from torch_ops_transformer.integrations import hf  # noqa: E402
from torch_ops_transformer.integrations import sdpa

from test.common.checkout import ROOT  # noqa: E402
from test.common.reference import check_tolerance  # noqa: E402


def tiny_config(**overrides):
    cfg = dict(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, max_position_embeddings=128, pad_token_id=0)
    cfg.update(overrides)
    return transformers.LlamaConfig(**cfg)


def tiny_llama(impl="npu_fa", **overrides):
    tot.register_hf_attention()
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(tiny_config(**overrides), attn_implementation=impl).eval()


def left_padded_batch():
    """Three prompts of 12, 9 and 5 tokens, left-padded to 12 (the batched-generation layout)."""
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(1, 128, (3, 12), generator=g)
    mask = torch.ones_like(ids)
    for row, pad in ((1, 3), (2, 7)):
        mask[row, :pad] = 0
        ids[row, :pad] = 0
    return ids, mask


def greedy(model, ids, mask, new_tokens=8):
    with torch.no_grad():
        return model.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=new_tokens,
                              min_new_tokens=new_tokens, pad_token_id=0)


@pytest.fixture
def routes():
    sdpa.route_counts.clear()
    return sdpa.route_counts


def test_from_config_selects_npu_fa():
    model = tiny_llama()
    assert model.config._attn_implementation == "npu_fa"
    assert model.config.num_key_value_heads < model.config.num_attention_heads  # GQA


def test_greedy_generation_identical_to_sdpa_left_padded(routes):
    model = tiny_llama()
    ids, mask = left_padded_batch()
    ours = greedy(model, ids, mask)
    assert routes["prefill"] == 2 and routes["decode"] == 2 * 7, dict(routes)  # 2 layers; 7 decode steps
    assert not [r for r in routes if r.startswith("fallback")], dict(routes)
    model.set_attn_implementation("sdpa")
    assert torch.equal(ours, greedy(model, ids, mask))


def test_greedy_generation_identical_to_sdpa_unpadded_batch(routes):
    model = tiny_llama()
    ids = torch.randint(1, 128, (2, 16), generator=torch.Generator().manual_seed(5))
    mask = torch.ones_like(ids)
    ours = greedy(model, ids, mask, new_tokens=6)
    assert routes["prefill"] == 2 and routes["decode"] == 2 * 5, dict(routes)
    model.set_attn_implementation("sdpa")
    assert torch.equal(ours, greedy(model, ids, mask, new_tokens=6))


def _logits(model, ids, mask, impl):
    model.set_attn_implementation(impl)
    with torch.no_grad():
        return model(input_ids=ids, attention_mask=mask).logits


def test_prefill_logits_tolerance_vs_float64():
    model = tiny_llama()
    ids, mask = left_padded_batch()
    ref64 = _logits(copy.deepcopy(model).double(), ids, mask, "eager")
    real = mask.bool()  # padded query rows are garbage by definition (eager and SDPA disagree there)
    ours, same = _logits(model, ids, mask, "npu_fa"), _logits(model, ids, mask, "sdpa")
    check_tolerance("prefill logits fp32", ours[real], ref64[real], same[real])


def test_decode_step_logits_tolerance_vs_float64():
    """One prefill, then two cached one-token steps (the decode kernel) against the float64 eager model."""
    model = tiny_llama()
    model64 = copy.deepcopy(model).double()
    ids, mask = left_padded_batch()
    nxt = torch.randint(1, 128, (3, 2), generator=torch.Generator().manual_seed(9))

    def decode_logits(m, impl):
        m.set_attn_implementation(impl)
        with torch.no_grad():
            out = m(input_ids=ids, attention_mask=mask, use_cache=True)
            cache, am, logits = out.past_key_values, mask, []
            for step in range(2):
                am = torch.cat([am, torch.ones(3, 1, dtype=am.dtype)], 1)
                out = m(input_ids=nxt[:, step:step + 1], attention_mask=am, cache=cache, use_cache=True)
                cache = out.past_key_values
                logits.append(out.logits)
        return torch.cat(logits, 1)

    ref64 = decode_logits(model64, "eager")
    sdpa.route_counts.clear()
    ours = decode_logits(model, "npu_fa")
    assert sdpa.route_counts["decode"] == 2 * 2, dict(sdpa.route_counts)
    check_tolerance("decode logits fp32", ours, ref64, decode_logits(model, "sdpa"))


def test_bf16_prefill_logits_tolerance_vs_float64():
    model = tiny_llama()
    ids, mask = left_padded_batch()
    ref64 = _logits(copy.deepcopy(model).double(), ids, mask, "eager")
    bf = copy.deepcopy(model).to(torch.bfloat16)
    real = mask.bool()
    ours, same = _logits(bf, ids, mask, "npu_fa"), _logits(bf, ids, mask, "sdpa")
    check_tolerance("prefill logits bf16", ours[real], ref64[real], same[real])


def _train_grads(model, ids, mask, impl, seed=0):
    model.set_attn_implementation(impl)
    model.train()
    model.zero_grad()
    torch.manual_seed(seed)
    loss = model(input_ids=ids, attention_mask=mask, labels=ids.masked_fill(mask == 0, -100)).loss
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


def test_training_step_gradients_tolerance_vs_float64(routes):
    model = tiny_llama()
    ids, mask = left_padded_batch()
    loss64, ref64 = _train_grads(copy.deepcopy(model).double(), ids, mask, "eager")
    routes.clear()
    loss, ours = _train_grads(model, ids, mask, "npu_fa")
    assert routes["prefill"] == 2 and routes["decode"] == 0, dict(routes)
    loss_same, same = _train_grads(model, ids, mask, "sdpa")
    check_tolerance("training loss", loss, loss64, loss_same)
    for name in ref64:
        check_tolerance(f"grad {name}", ours[name], ref64[name], same[name])


def test_training_with_attention_dropout():
    """attention_dropout is applied in training only: seeded runs repeat, differ from no dropout, and backprop."""
    model = tiny_llama(attention_dropout=0.3)
    ids, mask = left_padded_batch()
    loss_a, grads_a = _train_grads(model, ids, mask, "npu_fa", seed=1)
    loss_b, grads_b = _train_grads(model, ids, mask, "npu_fa", seed=1)
    loss_c, _ = _train_grads(model, ids, mask, "npu_fa", seed=2)
    assert torch.equal(loss_a, loss_b) and all(torch.equal(grads_a[n], grads_b[n]) for n in grads_a)
    assert not torch.equal(loss_a, loss_c)
    model.config.attention_dropout = 0.0
    for layer in model.model.layers:
        layer.self_attn.attention_dropout = 0.0
    loss_plain, _ = _train_grads(model, ids, mask, "npu_fa", seed=1)
    assert not torch.equal(loss_a, loss_plain)
    assert all(torch.isfinite(g).all() for g in grads_a.values())
    model.eval()  # eval mode: transformers passes dropout=0.0, so the result matches sdpa
    ours = greedy(model, ids, mask, 3)
    model.set_attn_implementation("sdpa")
    assert torch.equal(ours, greedy(model, ids, mask, 3))


def test_replace_attention_with_flash(routes):
    model = tiny_llama("sdpa")
    ids, mask = left_padded_batch()
    before = greedy(model, ids, mask, 4)
    assert routes["prefill"] == 0
    assert tot.replace_attention_with_flash(model) is model
    assert model.config._attn_implementation == "npu_fa"
    assert torch.equal(greedy(model, ids, mask, 4), before)
    assert routes["prefill"] == 2 and routes["decode"] == 2 * 3, dict(routes)


def test_register_is_idempotent():
    assert tot.register_hf_attention() == tot.register_hf_attention() == "npu_fa"
    assert transformers.AttentionInterface._global_mapping["npu_fa"] is hf.npu_fa_attention_forward


def test_replace_attention_with_flash_rejects_non_transformers_model():
    with pytest.raises(TypeError, match="model must be a transformers PreTrainedModel, got Linear"):
        tot.replace_attention_with_flash(torch.nn.Linear(2, 2))


def test_bad_softcap_is_rejected_by_name():
    # softcap itself is supported (test_hf_model_kwargs.py); a negative one is an error naming it
    q = torch.randn(1, 2, 3, 8)
    with pytest.raises(ValueError, match="argument 'softcap' must be a finite number >= 0"):
        hf.npu_fa_attention_forward(torch.nn.Module(), q, q, q, None, softcap=-30.0)


def test_import_does_not_import_transformers():
    code = ("import sys, torch_ops_transformer as t; assert 'transformers' not in sys.modules; "
            "t.register_hf_attention; assert 'transformers' in sys.modules")
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True)


def _module(groups):
    m = torch.nn.Module()
    m.num_key_value_groups, m.is_causal = groups, True
    return m


@pytest.mark.parametrize("sq, skv, masked, bias", [
    (7, 7, False, False),    # causal prefill, no mask (is_causal route)
    (7, 7, True, False),     # padded prefill: boolean mask
    (1, 9, False, False),    # decode step, no mask
    (1, 9, True, False),     # decode step with a padding mask
    (5, 5, True, True),      # per-layer position_bias folded into a float mask
    (3, 8, False, False),    # prefill into an empty static-cache tail (dropped)
])
def test_attention_function_matches_transformers_sdpa(sq, skv, masked, bias, routes):
    """The function alone against transformers' own "sdpa" function, with the tolerance rule vs float64."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    g = torch.Generator().manual_seed(sq * 100 + skv)
    q, k, v = torch.randn(2, 4, sq, 16, generator=g), torch.randn(2, 2, skv, 16, generator=g), \
        torch.randn(2, 2, skv, 16, generator=g)
    mask = None
    if masked:
        keep = torch.ones(2, skv, dtype=torch.bool)
        keep[1, :2] = False  # left padding of sequence 1
        causal = torch.arange(skv)[None, :] <= torch.arange(skv - sq, skv)[:, None]
        mask = (keep[:, None, None, :] & causal).expand(2, 1, sq, skv)
    pb = torch.randn(1, 4, sq, skv, generator=g) if bias else None
    kw = dict(dropout=0.0, scaling=0.3, position_bias=pb)
    ours, none = hf.npu_fa_attention_forward(_module(2), q, k, v, mask, **kw)
    same = sdpa_attention_forward(_module(2), q, k, v, mask, **kw)[0]
    ref64 = sdpa_attention_forward(_module(2), q.double(), k.double(), v.double(), mask,
                                   dropout=0.0, scaling=0.3, position_bias=None if pb is None else pb.double())[0]
    assert none is None and ours.shape == (2, sq, 4, 16) and ours.is_contiguous()
    assert routes["decode" if sq == 1 else "prefill"] == 1 and len(routes) == 1, dict(routes)  # no fallback
    # fully masked (padding) query rows are included: PyTorch's CPU SDPA and ours both give zeros there
    check_tolerance(f"attention sq={sq} skv={skv} masked={masked} bias={bias}", ours, ref64, same)


def test_static_cache_generation_identical_to_sdpa():
    model = tiny_llama()
    ids, mask = left_padded_batch()
    kw = dict(do_sample=False, max_new_tokens=4, min_new_tokens=4, pad_token_id=0, cache_implementation="static")
    with torch.no_grad():
        ours = model.generate(input_ids=ids, attention_mask=mask, **kw)
        model.set_attn_implementation("sdpa")
        assert torch.equal(ours, model.generate(input_ids=ids, attention_mask=mask, **kw))
