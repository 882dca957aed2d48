"""torch.compile(fullgraph=True) over the linear-attention family: forward and backward of the differentiable ops
(chunk_gated_delta_rule, masked_causal_conv1d, rms_norm_gated) equal to eager; sequence lengths, token counts and
varlen cuts that change between calls compile once (dynamic shapes, no per-length recompilation); and the in-place
cache ops (recurrent_gated_delta_rule's state cache, fused_causal_conv1d's conv_states and _v2's x) whose writes are
visible after the compiled call, also when the cache is one layer's view of a larger tensor.

aot_eager runs the same kernels as eager, so results are compared bit for bit; the Inductor case (a Gated DeltaNet
layer's training ops in one graph) within rounding. A single fixed-shape compile of fused_causal_conv1d and of
masked_causal_conv1d lives in their own files; this file adds the dynamic and in-place forms."""
import pytest
import torch
from torch._dynamo.testing import CompileCounterWithBackend

import torch_ops_transformer as tot
from test.common.tiers import FULL
from test.linear_attention.chunk_gated_delta_rule_reference import make_inputs as chunk_inputs
from test.linear_attention.test_recurrent_gated_delta_rule import make_inputs as recurrent_inputs

pytestmark = pytest.mark.usefixtures("dynamo_reset")
I32 = torch.int32

# Sizes chosen so that no dynamic size equals another one of the first call: under dynamic=True, equal sizes are
# "duck-sized" into one symbol, and a later call where they differ would recompile for a reason unrelated to the op.
CHUNK_HEADS = dict(Nk=2, Nv=4, Dk=16, Dv=8)
CHUNK_LENGTHS = ([30, 41, 7], [5, 9, 1], [70, 3, 66, 12, 9])   # T = 78, 15, 160 (across chunk boundaries), B = 3, 3, 5


def _assert_same(got, want, what):
    for i, (a, b) in enumerate(zip(got, want)):
        assert torch.equal(a, b), f"{what}: output {i} differs from eager (max {float((a - b).abs().max())})"


def _compiles_once(counter, calls):
    """Dynamo may restart the analysis of the first call (which calls the backend once more); what must not happen is
    a new compilation for a new length."""
    assert calls[0] >= 1 and calls[1:] == [calls[0]] * (len(calls) - 1), f"backend calls after each shape: {calls}"
    assert counter.frame_count == calls[0]


def _graph_calls(counter, op):
    return any(f"npu_fa.{op}" in g.code for g in counter.graphs)


# ---- chunk_gated_delta_rule: forward + backward ---------------------------------------------------------------------
CHUNK_LEAVES = ("query", "key", "value", "beta", "initial_state", "g")


def _chunk_leaves(lens, seed=0, dtype=torch.float32):
    inp = chunk_inputs(lens, dtype=dtype, seed=seed, **CHUNK_HEADS)
    return [inp[n].requires_grad_() for n in CHUNK_LEAVES], inp["actual_seq_lengths"], inp["scale"]


def _chunk_loss(q, k, v, beta, s0, g, lens, scale):
    out, final = tot.npu_chunk_gated_delta_rule(q, k, v, beta=beta, initial_state=s0, actual_seq_lengths=lens,
                                                scale=scale, g=g)
    # a gradient that differs per element (a plain sum would hide a permutation), built from the outputs so that
    # it has no size of its own to specialise on
    return (out * out.cos()).sum() + (final * final).sum()


def _value_and_grads(fn, leaves, *rest):
    xs = [x.detach().clone().requires_grad_() for x in leaves]
    loss = fn(*xs, *rest)
    return [loss.detach()] + list(torch.autograd.grad(loss, xs))


def test_chunk_gated_delta_rule_forward_backward_compiles_once_for_every_length():
    counter = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(_chunk_loss, backend=counter, fullgraph=True, dynamic=True)
    calls = []
    for i, lens in enumerate(CHUNK_LENGTHS):
        leaves, lengths, scale = _chunk_leaves(lens, seed=i)
        want = _value_and_grads(_chunk_loss, leaves, lengths, scale)
        got = _value_and_grads(compiled, leaves, lengths, scale)
        _assert_same(got, want, f"lengths {lens}")
        calls.append(counter.frame_count)
    _compiles_once(counter, calls)
    assert _graph_calls(counter, "chunk_gated_delta_rule")


def test_chunk_gated_delta_rule_mark_dynamic_token_count():
    """mark_dynamic on the token dimension instead of dynamic=True, defaults (no beta, g, state, lengths): one
    sequence of a new length reuses the graph."""
    counter = CompileCounterWithBackend("aot_eager")

    def fn(q, k, v):
        out, final = tot.npu_chunk_gated_delta_rule(q, k, v, scale=0.25)
        return out, final

    compiled = torch.compile(fn, backend=counter, fullgraph=True)
    calls = []
    for i, T in enumerate((20, 67, 130)):
        inp = chunk_inputs([T], seed=i, **CHUNK_HEADS)
        q, k, v = inp["query"], inp["key"], inp["value"]
        for t in (q, k, v):
            torch._dynamo.mark_dynamic(t, 0)
        _assert_same(compiled(q, k, v), fn(q, k, v), f"T={T}")
        calls.append(counter.frame_count)
    _compiles_once(counter, calls)


@pytest.mark.slow
def test_gated_deltanet_training_ops_inductor():
    """A Gated DeltaNet layer's training path in one Inductor graph — masked conv + SiLU, L2-normalised q / k,
    the chunked rule, the gated RMSNorm — forward and backward, against eager within rounding (Inductor fuses the
    pointwise ops around our kernels, which stay extern calls)."""
    torch.manual_seed(0)
    S, B, Nk, Nv, Dk, Dv = 37, 2, 2, 4, 16, 8
    conv_dim = 2 * Nk * Dk + Nv * Dv
    x = torch.randn(S, B, conv_dim).requires_grad_()
    conv_w = (0.5 * torch.randn(4, conv_dim)).requires_grad_()
    mask = torch.ones(B, S, dtype=torch.bool)
    mask[1, 30:] = False                                  # the second sequence has 30 tokens
    b_logits, a_logits = torch.randn(S, B, Nv), torch.randn(S, B, Nv)
    z = torch.randn(B * S, Nv, Dv)
    norm_w = (1 + 0.1 * torch.randn(Dv)).requires_grad_()
    lengths = torch.tensor([S, S], dtype=I32)

    def layer(x, conv_w, norm_w):
        mixed = torch.nn.functional.silu(tot.npu_masked_causal_conv1d(x, conv_w, mask=mask))
        mixed = mixed.transpose(0, 1).reshape(B * S, conv_dim)           # [S, B, C] -> the packed TND tokens
        q, k, v = mixed.split([Nk * Dk, Nk * Dk, Nv * Dv], dim=-1)
        q = torch.nn.functional.normalize(q.reshape(-1, Nk, Dk), dim=-1)
        k = torch.nn.functional.normalize(k.reshape(-1, Nk, Dk), dim=-1)
        beta = b_logits.transpose(0, 1).reshape(B * S, Nv).sigmoid()
        g = -torch.nn.functional.softplus(a_logits.transpose(0, 1).reshape(B * S, Nv))
        out, _ = tot.npu_chunk_gated_delta_rule(q, k, v.reshape(-1, Nv, Dv).contiguous(), beta=beta,
                                                actual_seq_lengths=lengths, scale=Dk ** -0.5, g=g)
        y = tot.rms_norm_gated(out, norm_w, z, 1e-6)
        return (y * y.cos()).sum()

    want = _value_and_grads(layer, [x, conv_w, norm_w])
    got = _value_and_grads(torch.compile(layer, backend="inductor", fullgraph=True), [x, conv_w, norm_w])
    for i, (a, b) in enumerate(zip(got, want)):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5, msg=lambda m: f"output {i}: {m}")


# ---- masked_causal_conv1d and rms_norm_gated: forward + backward, dynamic lengths -----------------------------------
def _masked_loss(x, w, mask):
    out = tot.npu_masked_causal_conv1d(x, w, mask=mask)
    return (out * out).sum()


def test_masked_causal_conv1d_forward_backward_compiles_once_for_every_length():
    counter = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(_masked_loss, backend=counter, fullgraph=True, dynamic=True)
    calls = []
    for S, B in ((9, 3), (26, 5), (57, 6)):
        g = torch.Generator().manual_seed(S)
        x, w = torch.randn(S, B, 40, generator=g), torch.randn(4, 40, generator=g)
        mask = torch.rand(B, S, generator=g) > 0.3
        _assert_same(_value_and_grads(compiled, [x, w], mask), _value_and_grads(_masked_loss, [x, w], mask),
                     f"S={S} B={B}")
        calls.append(counter.frame_count)
    _compiles_once(counter, calls)
    assert _graph_calls(counter, "masked_causal_conv1d")


def test_rms_norm_gated_forward_backward_compiles_once_for_every_row_count():
    counter = CompileCounterWithBackend("aot_eager")

    def fn(x, w, gate):
        return (tot.rms_norm_gated(x, w, gate) ** 2).sum()

    compiled = torch.compile(fn, backend=counter, fullgraph=True, dynamic=True)
    calls = []
    for rows in (5, 23, 70):
        g = torch.Generator().manual_seed(rows)
        x, gate = torch.randn(rows, 3, 32, generator=g), torch.randn(rows, 3, 32, generator=g)
        w = 1 + 0.1 * torch.randn(32, generator=g)
        _assert_same(_value_and_grads(compiled, [x, w, gate]), _value_and_grads(fn, [x, w, gate]), f"rows={rows}")
        calls.append(counter.frame_count)
    _compiles_once(counter, calls)


# ---- the in-place cache ops -----------------------------------------------------------------------------------------
# steps of 3, 4 and 5 sequences, the last speculative: token counts 5, 7, 11 over a cache of 40 slots
RECURRENT_STEPS = (dict(lens=(1, 2, 2)), dict(lens=(2, 3, 1, 1)),
                   dict(lens=(3, 1, 2, 4, 1), accepted=(2, 1, 1, 3, 1)))


@pytest.mark.parametrize("form", ["in_place", "functional"])
def test_recurrent_gated_delta_rule_state_cache_under_compile(form):
    """The state cache written by the compiled call equals eager's after every step (in place: the argument itself;
    functional: the returned copy, the argument untouched), with one compilation for steps of different token and
    sequence counts."""
    counter = CompileCounterWithBackend("aot_eager")
    op = tot.npu_recurrent_gated_delta_rule if form == "in_place" else tot.npu_recurrent_gated_delta_rule_functional

    def step(q, k, v, state, beta, g, lens, slots, accepted):
        return op(q, k, v, state, beta=beta, g=g, actual_seq_lengths=lens, ssm_state_indices=slots,
                  num_accepted_tokens=accepted)

    compiled = torch.compile(step, backend=counter, fullgraph=True, dynamic=True)
    calls = []
    for i, variant in enumerate(RECURRENT_STEPS):
        lens = variant["lens"]
        (q, k, v, state), kw = recurrent_inputs(slots=40, seed=i, Dk=24, Dv=16, **variant)
        rest = (kw["beta"], kw["g"], kw["actual_seq_lengths"], kw["ssm_state_indices"],
                kw.get("num_accepted_tokens", torch.ones(len(lens), dtype=I32)))
        eager_state, compiled_state = state.clone(), state.clone()
        want = step(q, k, v, eager_state, *rest)
        got = compiled(q, k, v, compiled_state, *rest)
        want, got = (want if isinstance(want, tuple) else (want,)), (got if isinstance(got, tuple) else (got,))
        _assert_same(got, want, f"step {variant}")
        if form == "in_place":
            assert not torch.equal(compiled_state, state), "the compiled call did not write the cache"
            assert torch.equal(compiled_state, eager_state), "the cache after the compiled call differs from eager's"
        else:
            assert torch.equal(compiled_state, state), "the functional form wrote its argument"
        calls.append(counter.frame_count)
    _compiles_once(counter, calls)


def test_recurrent_gated_delta_rule_writes_a_layer_view_of_the_cache():
    """A model keeps one cache for all layers and passes layer l's view; the compiled decode step writes through the
    view into the whole cache (functionalization writes the view back into its base)."""
    (q, k, v, state), kw = recurrent_inputs(lens=(1, 1, 1), slots=6, seed=3)
    cache = torch.stack([state, state + 1, state - 1])          # [layers, slots, Nv, Dv, Dk]

    def step(q, k, v, cache, layer_index: int):
        outs = [tot.npu_recurrent_gated_delta_rule(q, k, v, cache[layer], **kw) for layer in range(layer_index + 1)]
        return torch.stack(outs)

    eager_cache, compiled_cache = cache.clone(), cache.clone()
    want = step(q, k, v, eager_cache, 1)
    got = torch.compile(step, backend="aot_eager", fullgraph=True)(q, k, v, compiled_cache, 1)
    assert torch.equal(got, want)
    assert torch.equal(compiled_cache, eager_cache) and not torch.equal(compiled_cache, cache)
    assert torch.equal(compiled_cache[2], cache[2])              # a layer the step did not run: untouched


def _qsl(lens):
    return torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=I32)


CONV_STEPS = ([5, 3], [17, 1, 9], [2, 40, 6, 11])   # varlen prefill chunks: T = 8, 27, 59, batch 2, 3, 4
# K = 4 taps, state_len 5 (> K-1: the cache may keep more rows than the conv reads), 9 lines


@pytest.mark.parametrize("form", ["y", "v2_in_place"])
def test_fused_causal_conv1d_conv_states_under_compile(form):
    """fused_causal_conv1d (returns y) and _v2 (y written into x): conv_states (and _v2's x) after the compiled call
    equal eager's, for varlen prefill steps of different lengths with one compilation."""
    counter = CompileCounterWithBackend("aot_eager")

    def step(x, w, states, qsl, lines):
        if form == "y":
            return tot.npu_fused_causal_conv1d(x, w, states, query_start_loc=qsl, cache_indices=lines,
                                               activation="silu", residual_connection=1)
        tot.npu_fused_causal_conv1d_v2(x, w, states, query_start_loc=qsl, cache_indices=lines, activation="silu")
        return x.sum()  # (a graph output, so the compiled function is not empty apart from the mutations)

    compiled = torch.compile(step, backend=counter, fullgraph=True, dynamic=True)
    calls = []
    for i, lens in enumerate(CONV_STEPS):
        g = torch.Generator().manual_seed(i)
        x, w = torch.randn(sum(lens), 48, generator=g), 0.5 * torch.randn(4, 48, generator=g)
        states = torch.randn(9, 5, 48, generator=g)
        lines = torch.randperm(9, generator=g)[:len(lens)].to(I32)
        eager = [x.clone(), states.clone()]
        ours = [x.clone(), states.clone()]
        want = step(eager[0], w, eager[1], _qsl(lens), lines)
        got = compiled(ours[0], w, ours[1], _qsl(lens), lines)
        assert torch.equal(got, want), f"lengths {lens}: the result differs from eager"
        assert not torch.equal(ours[1], states), "the compiled call did not write conv_states"
        assert torch.equal(ours[1], eager[1]), f"lengths {lens}: conv_states differ from eager's"
        assert torch.equal(ours[0], eager[0]), f"lengths {lens}: x differs from eager's"
        if form == "v2_in_place":
            assert not torch.equal(ours[0], x), "_v2 did not write x"
        calls.append(counter.frame_count)
    _compiles_once(counter, calls)


@FULL
@pytest.mark.parametrize("form", ["in_place", "functional"])
def test_recurrent_gated_delta_rule_inductor(form):
    """The decode step under Inductor: its output and the cache writes equal eager's."""
    op = tot.npu_recurrent_gated_delta_rule if form == "in_place" else tot.npu_recurrent_gated_delta_rule_functional
    (q, k, v, state), kw = recurrent_inputs(lens=(2, 1, 3), accepted=(2, 1, 1), slots=12, seed=5)

    def step(q, k, v, state):
        res = op(q, k, v, state, **kw)
        return res[0] * 2 if isinstance(res, tuple) else res * 2, res[1] if isinstance(res, tuple) else state

    eager_state, compiled_state = state.clone(), state.clone()
    want = step(q, k, v, eager_state)
    got = torch.compile(step, backend="inductor", fullgraph=True)(q, k, v, compiled_state)
    _assert_same(got, want, form)
    assert torch.equal(compiled_state, eager_state)
