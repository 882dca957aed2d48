"""attn_implementation="npu_fa" honours the model-specific arguments transformers' attention layers pass:
`s_aux` (gpt-oss's attention sinks), `softcap` (Gemma-2's attn_logit_softcapping) and `sliding_window`. Acceptance:
tiny random gpt-oss-like and Gemma-2 models (2 layers, hidden 64, sliding window 4, prompts longer than it) generate
the same greedy tokens as "eager" and their logits agree; the attention function itself against a float64
reference written here; the router's `sink` / `softcap` against the same reference, with gradients."""
import math

import pytest
import torch

transformers = pytest.importorskip("transformers")

import torch_ops_transformer as tot  # noqa: E402
from torch_ops_transformer.integrations import hf  # noqa: E402
from torch_ops_transformer.integrations import sdpa

WINDOW = 4


def _prompts(vocab=96, lengths=(11, 7)):
    """Left-padded batch of prompts longer than the window."""
    g = torch.Generator().manual_seed(5)
    s = max(lengths)
    ids = torch.randint(3, vocab, (len(lengths), s), generator=g)
    mask = torch.ones_like(ids)
    for row, n in enumerate(lengths):
        mask[row, :s - n] = 0
        ids[row, :s - n] = 0
    return ids, mask


def _gpt_oss(impl):
    cfg = transformers.GptOssConfig(
        vocab_size=96, hidden_size=64, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, num_local_experts=4, num_experts_per_tok=2, sliding_window=WINDOW,
        layer_types=["sliding_attention", "full_attention"], max_position_embeddings=64, pad_token_id=0,
        eos_token_id=1, bos_token_id=2)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation=impl).eval()
    with torch.no_grad():                         # random sinks of both signs, large enough to matter
        for layer in model.model.layers:
            layer.self_attn.sinks.copy_(torch.randn(4) * 2)
    return model


def _gemma2(impl):
    cfg = transformers.Gemma2Config(
        vocab_size=96, hidden_size=64, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, sliding_window=WINDOW, attn_logit_softcapping=5.0,
        final_logit_softcapping=30.0, max_position_embeddings=64, pad_token_id=0, eos_token_id=1, bos_token_id=2,
        layer_types=["sliding_attention", "full_attention"])
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation=impl).eval()


MODELS = {"gpt_oss": _gpt_oss, "gemma2": _gemma2}


def _twins(name):
    tot.register_hf_attention()
    eager = MODELS[name]("eager")
    ours = MODELS[name]("npu_fa")
    ours.load_state_dict(eager.state_dict())
    return eager, ours


@pytest.mark.parametrize("name", list(MODELS))
def test_greedy_generation_identical_to_eager(name):
    eager, ours = _twins(name)
    ids, mask = _prompts()
    kw = dict(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=10, min_new_tokens=10,
              pad_token_id=0)
    with torch.no_grad():
        want = eager.generate(**kw)
        sdpa.route_counts.clear()
        got = ours.generate(**kw)
    assert torch.equal(got, want)
    # both run on the kernels (gpt-oss's sinks and Gemma-2's softcap are kernel arguments)
    assert sdpa.route_counts["math"] == 0 and sdpa.route_counts["prefill"] > 0


@pytest.mark.parametrize("name", list(MODELS))
def test_logits_close_to_eager(name):
    eager, ours = _twins(name)
    ids, mask = _prompts()
    with torch.no_grad():
        want = eager(input_ids=ids, attention_mask=mask).logits
        got = ours(input_ids=ids, attention_mask=mask).logits
    valid = mask.bool()
    torch.testing.assert_close(got[valid], want[valid], atol=2e-4, rtol=2e-4)


def test_sinks_change_the_answer():
    """Guards against the sinks being dropped: zeroed sinks give different logits."""
    eager, ours = _twins("gpt_oss")
    ids, mask = _prompts()
    with torch.no_grad():
        got = ours(input_ids=ids, attention_mask=mask).logits
        for layer in ours.model.layers:
            layer.self_attn.sinks.zero_()
        without = ours(input_ids=ids, attention_mask=mask).logits
    assert (got - without).abs().max() > 1e-3


# ---- the attention function and the router against a float64 reference ----

def ref_attention(q, k, v, keep=None, scale=None, sink=None, softcap=None, window=None, causal=False):
    """float64; q [B, N, Sq, D], k/v [B, N2, Skv, D]; keep bool broadcastable to [B, N, Sq, Skv] (True = attend);
    causal/window with the queries at the last Sq positions."""
    q, k, v = q.double(), k.double(), v.double()
    g = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
    s = q @ k.transpose(-1, -2) * (scale if scale is not None else q.shape[-1] ** -0.5)
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    sq, skv = s.shape[-2:]
    i = torch.arange(sq)[:, None] + (skv - sq)
    j = torch.arange(skv)[None, :]
    vis = torch.ones(sq, skv, dtype=torch.bool)
    if causal:
        vis &= j <= i
    if window is not None:
        vis &= j > i - window
    if keep is not None:
        vis = vis & keep
    s = s.masked_fill(~vis, -math.inf)
    if sink is not None:
        s = torch.cat([s, sink.double().view(1, -1, 1, 1).expand(*s.shape[:-1], 1)], -1)
    p = torch.softmax(s, -1).nan_to_num(0.0)
    if sink is not None:
        p = p[..., :-1]
    return p @ v


class _Layer(torch.nn.Module):
    is_causal = True
    num_key_value_groups = 2


def _qkv(sq, skv, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(2, 4, sq, 16, generator=g).to(dtype), torch.randn(2, 2, skv, 16, generator=g).to(dtype),
            torch.randn(2, 2, skv, 16, generator=g).to(dtype))


SINK = torch.tensor([-1.0, 0.5, 2.0, 4.0])


@pytest.mark.parametrize("sq,skv", [(6, 6), (1, 9)], ids=["prefill", "decode"])
@pytest.mark.parametrize("extra", ["sink", "softcap", "window", "all"])
def test_attention_function_without_mask(sq, skv, extra):
    """No mask from the caller (custom models): causal prefill / full decode as transformers' sdpa decides, plus
    the window, sink and softcap."""
    q, k, v = _qkv(sq, skv)
    kw = dict(s_aux=SINK if extra in ("sink", "all") else None, softcap=3.0 if extra in ("softcap", "all") else None,
              sliding_window=WINDOW if extra in ("window", "all") else None)
    out, _ = hf.npu_fa_attention_forward(_Layer(), q, k, v, None, scaling=0.3, **kw)
    want = ref_attention(q, k, v, scale=0.3, sink=kw["s_aux"], softcap=kw["softcap"], window=kw["sliding_window"],
                         causal=sq > 1)
    torch.testing.assert_close(out.double(), want.transpose(1, 2), atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize("sq,skv", [(6, 6), (1, 9), (3, 9)])
def test_attention_function_with_mask_and_sink(sq, skv):
    q, k, v = _qkv(sq, skv, seed=1)
    keep = torch.rand(2, 1, sq, skv, generator=torch.Generator().manual_seed(2)) < 0.7
    keep[..., -1] = True
    sdpa.route_counts.clear()
    out, _ = hf.npu_fa_attention_forward(_Layer(), q, k, v, keep, scaling=0.3, s_aux=SINK)
    torch.testing.assert_close(out.double(), ref_attention(q, k, v, keep, 0.3, SINK).transpose(1, 2),
                               atol=2e-5, rtol=2e-5)
    assert sdpa.route_counts["prefill"] == 1           # the kernel, not the math fallback


def test_router_sink_gradients():
    q, k, v = (t.double().requires_grad_() for t in _qkv(5, 7, seed=3))
    sink = SINK.double().requires_grad_()
    keep = torch.ones(5, 7, dtype=torch.bool).tril(2)
    qf, kf, vf = (t.detach().float().requires_grad_() for t in (q, k, v))
    sf = sink.detach().float().requires_grad_()
    out = sdpa.scaled_dot_product_attention(qf, kf, vf, attn_mask=keep, enable_gqa=True, sink=sf)
    ref = ref_attention(q, k, v, keep, sink=sink)
    torch.testing.assert_close(out.double(), ref.detach(), atol=2e-5, rtol=2e-5)
    g = torch.randn_like(ref)
    (out.double() * g).sum().backward()
    (ref * g).sum().backward()
    for name, a, b in (("q", qf, q), ("k", kf, k), ("v", vf, v), ("sink", sf, sink)):
        torch.testing.assert_close(a.grad.double(), b.grad, atol=1e-4, rtol=1e-4, msg=name)


def test_router_softcap_runs_on_the_kernel():
    q, k, v = _qkv(6, 6, seed=4)
    sdpa.route_counts.clear()
    out = sdpa.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True, softcap=2.0)
    torch.testing.assert_close(out.double(), ref_attention(q, k, v, softcap=2.0, causal=True), atol=2e-5, rtol=2e-5)
    assert sdpa.route_counts["prefill"] == 1


def test_router_softcap_with_a_float_mask_runs_on_the_kernel():
    """A float mask is added after the cap (the op's pse_type 0 bias), as Hugging Face's eager attention does."""
    q, k, v = _qkv(5, 7, seed=6)
    bias = torch.randn(1, 1, 5, 7)
    capped = 2.0 * torch.tanh(q.double() @ k.double().repeat_interleave(q.shape[1] // k.shape[1], 1).transpose(-1, -2)
                              * q.shape[-1] ** -0.5 / 2.0)
    want = torch.softmax(capped + bias.double(), -1) @ v.double().repeat_interleave(q.shape[1] // v.shape[1], 1)
    sdpa.route_counts.clear()
    out = sdpa.scaled_dot_product_attention(q, k, v, attn_mask=bias, enable_gqa=True, softcap=2.0)
    torch.testing.assert_close(out.double(), want, atol=2e-5, rtol=2e-5)
    assert sdpa.route_counts["prefill"] == 1 and sdpa.route_counts["math"] == 0


def test_softcap_runs_on_the_kernel():
    q, k, v = _qkv(1, 9, seed=5)
    sdpa.route_counts.clear()
    out, _ = hf.npu_fa_attention_forward(_Layer(), q, k, v, None, softcap=3.0)
    torch.testing.assert_close(out.double(), ref_attention(q, k, v, softcap=3.0).transpose(1, 2), atol=2e-5,
                               rtol=2e-5)
    assert sdpa.route_counts["prefill"] == 1 and sdpa.route_counts["math"] == 0


def test_bad_sink_and_softcap_are_named():
    q, k, v = _qkv(3, 3)
    with pytest.raises(ValueError, match=r"argument 'sink' must be .*\(num_query_heads,\) = \(4,\).*got .*\[3\]"):
        sdpa.scaled_dot_product_attention(q, k, v, enable_gqa=True, sink=torch.zeros(3))
    with pytest.raises(ValueError, match="argument 'softcap' must be a finite number >= 0.*got -1.0"):
        sdpa.scaled_dot_product_attention(q, k, v, enable_gqa=True, softcap=-1.0)


def test_router_extensions_compile_fullgraph():
    q, k, v = _qkv(6, 6, seed=6)
    for kw in (dict(sink=SINK), dict(softcap=2.0)):
        fn = torch.compile(lambda q, k, v: sdpa.scaled_dot_product_attention(q, k, v, is_causal=True,
                                                                             enable_gqa=True, **kw), fullgraph=True)
        want = ref_attention(q, k, v, sink=kw.get("sink"), softcap=kw.get("softcap"), causal=True)
        torch.testing.assert_close(fn(q, k, v).double(), want, atol=2e-5, rtol=2e-5)
