"""npu_fused_causal_conv1d and npu_fused_causal_conv1d_v2 against the token-by-token reference
(causal_conv1d_reference.py) under the project's tolerance rule, the cache update compared exactly: variable-length
prefill with and without cached state, decode and speculative decode (num_accepted_tokens), mixed batches, prefix
caching, pangu mode, residual, bias and SiLU, padded entries, seeded random calls; agreement with transformers'
Qwen3-Next conv; the in-place v2; torch.compile; thread-count independence; zero sizes; one test per bad-input
rule."""
import pytest
import torch

import torch_ops_transformer as tot
from test.common.reference import check_tolerance
from test.common.tiers import pairwise
from test.linear_attention import causal_conv1d_reference as ref

I32 = torch.int32
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def _qsl(lens):
    out = [0]
    for n in lens:
        out.append(out[-1] + n)
    return torch.tensor(out, dtype=I32)


def _inputs(lens, dim=40, K=3, state_len=None, slots=8, dtype=torch.float32, seed=0, three_d=False):
    g = torch.Generator().manual_seed(seed)
    state_len = K - 1 if state_len is None else state_len
    x = torch.randn(len(lens), lens[0], dim, generator=g) if three_d else torch.randn(sum(lens), dim, generator=g)
    weight = torch.randn(K, dim, generator=g) * 0.5
    states = torch.randn(slots, state_len, dim, generator=g)
    return x.to(dtype), weight.to(dtype), states.to(dtype)


def _check(name, x, weight, states, kw, untouched=0.0):
    """Runs the op on a copy of states; checks y by the tolerance rule and the new states exactly."""
    ours_states = states.clone()
    y = tot.npu_fused_causal_conv1d(x, weight, ours_states, **kw)
    rkw = {k: v for k, v in kw.items() if k not in ("max_query_len", "run_mode")}
    y64, s64 = ref.fused_causal_conv1d(x.double(), weight.double(), states.double(), untouched=untouched, **rkw)
    same = ref.fused_causal_conv1d(x, weight, states, untouched=untouched, **rkw)[0]
    check_tolerance(name, y, y64, same)
    assert torch.equal(ours_states, s64.to(states.dtype)), f"{name}: conv_states differ from the reference"
    return y, ours_states


@pytest.mark.parametrize("dtype,residual,cached", pairwise(dtype=DTYPES, residual=[0, 1], cached=[False, True]))
def test_varlen_prefill(dtype, residual, cached):
    lens = [5, 3, 7, 4]
    x, w, st = _inputs(lens, dtype=dtype)
    kw = dict(query_start_loc=_qsl(lens), cache_indices=torch.tensor([0, 3, 1, 5], dtype=I32),
              residual_connection=residual)
    if not cached:  # the first chunk of every prompt: no cached state
        kw["num_computed_tokens"] = torch.zeros(4, dtype=I32)
    else:  # later chunks of some prompts (cached rows), the first of others
        kw["num_computed_tokens"] = torch.tensor([10, 0, 20, 8], dtype=I32)
    _check(f"prefill_{dtype}", x, w, st, kw)


@pytest.mark.parametrize("dtype", list(DTYPES))
def test_speculative_decode_3d(dtype):
    m = 2  # draft tokens: state_len K-1+m, num_accepted_tokens picks where the window starts
    x, w, st = _inputs([m + 1] * 4, state_len=2 + m, dtype=DTYPES[dtype], three_d=True)
    kw = dict(cache_indices=torch.tensor([0, 2, 4, 6], dtype=I32),
              num_accepted_tokens=torch.tensor([1, 2, 1, 3], dtype=I32),
              num_computed_tokens=torch.tensor([5, 3, 7, 4], dtype=I32))
    y, _ = _check(f"spec_decode_{dtype}", x, w, st, kw)
    assert y.shape == x.shape


def test_mixed_prefill_and_decode():
    lens = [12, 9, 2, 1]
    x, w, st = _inputs(lens, state_len=4)
    kw = dict(query_start_loc=_qsl(lens), cache_indices=torch.tensor([0, 3, 1, 5], dtype=I32),
              num_computed_tokens=torch.tensor([0, 20, 50, 30], dtype=I32),
              num_accepted_tokens=torch.tensor([1, 1, 2, 1], dtype=I32), max_query_len=12)
    _check("mixed", x, w, st, kw)


def test_default_offset_reads_the_whole_line():
    """Without num_accepted_tokens the window starts state_len-(K-1) rows into the line (transformers' layout keeps
    K rows), and a line longer than the sequence keeps its older rows shifted."""
    lens = [1, 2]
    x, w, st = _inputs(lens, state_len=5, K=4)
    _check("offset", x, w, st, dict(query_start_loc=_qsl(lens)))


@pytest.mark.asan
@pytest.mark.parametrize("decode", [False, True])
def test_prefix_caching(decode):
    B, block = 4, 4
    if decode:
        lens, computed, state_len = [3] * B, [5, 3, 7, 4], 4
        first, last = [1, 0, 1, 1], [1, 1, 2, 1]
    else:
        lens, computed, state_len = [9, 3, 7, 4], [0, 2, 0, 1], 2
        first, last = [0, 0, 0, 0], [2, 1, 1, 1]
    max_blocks = 3
    x, w, st = _inputs(lens, state_len=state_len, slots=B * max_blocks, three_d=decode)
    ci = torch.arange(B * max_blocks, dtype=I32).view(B, max_blocks)
    kw = dict(cache_indices=ci, num_computed_tokens=torch.tensor(computed, dtype=I32),
              block_idx_first_scheduled_token=torch.tensor(first, dtype=I32),
              block_idx_last_scheduled_token=torch.tensor(last, dtype=I32),
              initial_state_idx=torch.tensor(first, dtype=I32), block_size=block, residual_connection=1)
    if decode:
        kw["num_accepted_tokens"] = torch.tensor([1, 2, 1, 3], dtype=I32)
    else:
        kw["query_start_loc"] = _qsl(lens)
    _check(f"apc_{'decode' if decode else 'prefill'}", x, w, st, kw)


def _random_call(seed):
    """A seeded random call: widths, line lengths, sequence lengths, draft tokens, computed counts, a padded entry,
    cache lines in any order, the optional epilogue."""
    g = torch.Generator().manual_seed(seed)

    def rint(lo, hi):
        return int(torch.randint(lo, hi + 1, (1,), generator=g))

    K, m, B = rint(1, 4), rint(0, 3), rint(1, 4)
    lens = [rint(1, 6) for _ in range(B)]
    x, w, st = _inputs(lens, dim=rint(1, 20), K=K, state_len=K - 1 + m, slots=B + 2, seed=seed)
    lines = torch.randperm(B + 2, generator=g)[:B].to(I32)
    if B > 1 and rint(0, 1):
        lines[rint(0, B - 1)] = -1
    kw = dict(query_start_loc=_qsl(lens), cache_indices=lines, residual_connection=rint(0, 1),
              num_computed_tokens=torch.tensor([rint(0, 3) for _ in range(B)], dtype=I32),
              conv_mode=("default", "pangu")[rint(0, 1)], activation=("None", "silu")[rint(0, 1)])
    if rint(0, 1):
        kw["num_accepted_tokens"] = torch.tensor([rint(1, min(n, m + 1)) for n in lens], dtype=I32)
    if rint(0, 1):
        kw["bias"] = torch.randn(x.shape[1], generator=g)
    return x, w, st, kw


@pytest.mark.parametrize("seed", range(12))
def test_random_calls_match_the_reference(seed):
    x, w, st, kw = _random_call(seed)
    _check(f"random_{seed}", x, w, st, kw)

def test_pangu_mode_resets_the_first_outputs():
    lens = [5, 3, 4]
    x, w, st = _inputs(lens)
    kw = dict(query_start_loc=_qsl(lens), num_computed_tokens=torch.tensor([0, 1, 6], dtype=I32),
              conv_mode="pangu", residual_connection=1)
    y, _ = _check("pangu", x, w, st, kw)
    assert torch.equal(y[0:2], x[0:2]) and torch.equal(y[5:6], x[5:6])  # conv zeroed: the residual alone


def test_bias_silu_and_initial_state_mode():
    lens = [4, 6]
    x, w, st = _inputs(lens)
    bias = torch.randn(x.shape[1])
    kw = dict(query_start_loc=_qsl(lens), bias=bias, activation="silu",
              initial_state_mode=torch.tensor([0, 1], dtype=I32))
    _check("bias_silu", x, w, st, kw)


def test_pad_slot_entries_are_skipped():
    lens = [3, 2, 4]
    x, w, st = _inputs(lens)
    kw = dict(query_start_loc=_qsl(lens), cache_indices=torch.tensor([2, -1, 0], dtype=I32))
    y, new = _check("pad", x, w, st, kw)
    assert torch.equal(y[3:5], torch.zeros(2, x.shape[1]))
    assert torch.equal(new[1], st[1]) and torch.equal(new[3:], st[3:])


def test_tokens_past_the_last_sequence_are_zero():
    lens = [3, 2]
    x, w, st = _inputs([3, 2, 2])
    y, _ = _check("tail", x, w, st, dict(query_start_loc=_qsl(lens)))
    assert torch.equal(y[5:], torch.zeros(2, x.shape[1]))


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_v2_writes_x_in_place(dtype):
    lens = [5, 2, 4]
    x, w, st = _inputs(lens, dtype=DTYPES[dtype], state_len=3)
    kw = dict(query_start_loc=_qsl(lens), cache_indices=torch.tensor([1, -1, 4], dtype=I32),
              residual_connection=1, num_computed_tokens=torch.tensor([3, 0, 0], dtype=I32))
    s1, s2 = st.clone(), st.clone()
    y = tot.npu_fused_causal_conv1d(x, w, s1, **kw)
    x2 = x.clone()
    assert tot.npu_fused_causal_conv1d_v2(x2, w, s2, **kw) is None
    assert torch.equal(x2[:5], y[:5]) and torch.equal(x2[7:], y[7:])
    assert torch.equal(x2[5:7], x[5:7])  # the skipped sequence keeps its input
    assert torch.equal(s1, s2)


def test_v2_strided_x_and_conv_states():
    lens = [4, 3]
    x, w, st = _inputs(lens, dim=24)
    big = torch.randn(7, 48)
    xs = big[:, ::2]
    xs.copy_(x)
    sbig = torch.randn(8, 2, 48)
    ss = sbig[:, :, ::2]
    ss.copy_(st)
    kw = dict(query_start_loc=_qsl(lens))
    s_ref = st.clone()
    y = tot.npu_fused_causal_conv1d(x, w, s_ref, **kw)
    tot.npu_fused_causal_conv1d_v2(xs, w, ss, **kw)
    assert torch.equal(xs, y) and torch.equal(ss, s_ref)


@pytest.mark.parametrize("seq_len", [1, 2])
def test_matches_transformers_qwen3_next_update(seq_len):
    """transformers keeps conv_state [B, dim, K] (K rows, not K-1) and applies bias and SiLU: our [B, K, dim] cache
    with the default offset is the same computation."""
    qwen = pytest.importorskip("transformers.models.qwen3_next.modeling_qwen3_next")
    B, dim, K = 3, 32, 4
    g = torch.Generator().manual_seed(1)
    hidden = torch.randn(B, dim, seq_len, generator=g)
    conv_state = torch.randn(B, dim, K, generator=g)
    weight, bias = torch.randn(dim, K, generator=g), torch.randn(dim, generator=g)
    theirs_state = conv_state.clone()
    theirs = qwen.causal_conv1d_update.__wrapped__(hidden, theirs_state, weight, bias, "silu") \
        if hasattr(qwen.causal_conv1d_update, "__wrapped__") else \
        qwen.causal_conv1d_update(hidden, theirs_state, weight, bias, "silu")
    ours_state = conv_state.transpose(1, 2).contiguous()
    ours = tot.npu_fused_causal_conv1d(hidden.transpose(1, 2).contiguous(), weight.t().contiguous(), ours_state,
                                       bias=bias, activation="silu")
    torch.testing.assert_close(ours, theirs.transpose(1, 2), rtol=1e-5, atol=1e-5)
    assert torch.equal(ours_state, theirs_state.transpose(1, 2))


def test_matches_transformers_qwen3_next_prefill():
    """A first prompt chunk (no cached state) is transformers' causal_conv1d_fn: zero left padding."""
    qwen = pytest.importorskip("transformers.models.qwen3_next.modeling_qwen3_next")
    B, dim, K, L = 2, 32, 4, 9
    g = torch.Generator().manual_seed(2)
    hidden = torch.randn(B, dim, L, generator=g)
    weight, bias = torch.randn(dim, K, generator=g), torch.randn(dim, generator=g)
    fn = getattr(qwen.causal_conv1d_fn, "__wrapped__", qwen.causal_conv1d_fn)
    theirs = fn(hidden, weight, bias, activation="silu")
    states = torch.zeros(B, K, dim)
    ours = tot.npu_fused_causal_conv1d(hidden.transpose(1, 2).contiguous(), weight.t().contiguous(), states,
                                       bias=bias, activation="silu",
                                       num_computed_tokens=torch.zeros(B, dtype=I32))
    torch.testing.assert_close(ours, theirs.transpose(1, 2), rtol=1e-5, atol=1e-5)
    # the cache now holds the last K tokens of each prompt, transformers' conv_state after prefill
    assert torch.equal(states, hidden[:, :, -K:].transpose(1, 2))


def test_thread_count_does_not_change_the_result():
    lens = [40, 3, 17, 1]
    x, w, st = _inputs(lens, dim=300, dtype=torch.bfloat16, state_len=4)
    kw = dict(query_start_loc=_qsl(lens), cache_indices=torch.tensor([3, 0, 6, 2], dtype=I32),
              num_accepted_tokens=torch.tensor([1, 2, 3, 1], dtype=I32), residual_connection=1)
    before = torch.get_num_threads()
    results = []
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            s = st.clone()
            results.append((tot.npu_fused_causal_conv1d(x, w, s, **kw), s))
    finally:
        torch.set_num_threads(before)
    assert torch.equal(results[0][0], results[1][0]) and torch.equal(results[0][1], results[1][1])


def test_torch_compile_fullgraph_updates_the_cache():
    lens = [4, 3]
    x, w, st = _inputs(lens, dim=16)
    q = _qsl(lens)

    def f(x, w, s, q):
        return tot.npu_fused_causal_conv1d(x, w, s, query_start_loc=q, residual_connection=1)

    s_eager, s_compiled = st.clone(), st.clone()
    y = f(x, w, s_eager, q)
    assert torch.equal(torch.compile(f, fullgraph=True, backend="aot_eager")(x, w, s_compiled, q), y)
    assert torch.equal(s_compiled, s_eager)

@pytest.mark.asan
def test_zero_sizes():
    x, w, st = _inputs([1], dim=8)
    # no sequence
    y = tot.npu_fused_causal_conv1d(x[:0], w, st.clone(), query_start_loc=torch.zeros(1, dtype=I32))
    assert y.shape == (0, 8)
    # empty sequences: the cache line keeps its rows (the padded sequence is the cached rows themselves)
    s = st.clone()
    y = tot.npu_fused_causal_conv1d(x[:0], w, s, query_start_loc=torch.zeros(3, dtype=I32))
    assert y.shape == (0, 8) and torch.equal(s, st)
    # zero channels
    y = tot.npu_fused_causal_conv1d(torch.zeros(3, 0), torch.zeros(3, 0), torch.zeros(2, 2, 0),
                                    query_start_loc=torch.tensor([0, 3], dtype=I32))
    assert y.shape == (3, 0)


# ---- bad input: one test per rule -------------------------------------------------------------------------------

def _bad(match, mutate=None, **kw):
    lens = [3, 2]
    x, w, st = _inputs(lens, dim=8, slots=4)
    args = dict(x=x, weight=w, conv_states=st, query_start_loc=_qsl(lens),
                cache_indices=torch.tensor([0, 1], dtype=I32))
    args.update(kw)
    if mutate:
        mutate(args)
    with pytest.raises((ValueError, TypeError), match=match):
        tot.npu_fused_causal_conv1d(args.pop("x"), args.pop("weight"), args.pop("conv_states"), **args)


def test_bad_x_rank():
    _bad("argument 'x' must be 2-D", x=torch.zeros(5))


def test_bad_x_dtype():
    _bad("argument 'x' must be float16", x=torch.zeros(5, 8, dtype=torch.int32))


def test_bad_weight_shape():
    _bad("argument 'weight' must be 2-D \\[K, dim\\]", weight=torch.zeros(3, 7))


def test_bad_weight_dtype():
    _bad("argument 'weight' must have the dtype of 'x'", weight=torch.zeros(3, 8, dtype=torch.float64))


def test_bad_conv_states_shape():
    _bad("argument 'conv_states' must be 3-D", conv_states=torch.zeros(4, 1, 8))


def test_bad_conv_states_dtype():
    _bad("argument 'conv_states' must have the dtype of 'x'", conv_states=torch.zeros(4, 2, 8, dtype=torch.bfloat16))


def test_bad_bias_dtype():
    _bad("argument 'bias' must have the dtype of 'x'", bias=torch.zeros(8, dtype=torch.float16))

def test_bad_bias_shape():
    _bad("argument 'bias' must be 1-D", bias=torch.zeros(7))


def test_query_start_loc_required_for_2d_x():
    _bad("argument 'query_start_loc' is required", query_start_loc=None)


def test_query_start_loc_must_not_decrease():
    _bad("argument 'query_start_loc' must be non-decreasing", query_start_loc=torch.tensor([0, 3, 2], dtype=I32))


def test_query_start_loc_within_tokens():
    _bad("argument 'query_start_loc' must lie in \\[0, tokens=5\\]", query_start_loc=torch.tensor([0, 3, 6], dtype=I32))


def test_query_start_loc_of_3d_x_must_be_uniform():
    _bad("argument 'query_start_loc' must be \\[0, L, 2L",
         x=torch.zeros(2, 3, 8), query_start_loc=torch.tensor([0, 2, 6], dtype=I32))


def test_query_start_loc_dtype():
    _bad("argument 'query_start_loc' must be int32 or int64", query_start_loc=torch.tensor([0.0, 3.0, 5.0]))


def test_query_start_loc_rank():
    _bad("argument 'query_start_loc' must be 1-D \\[batch\\+1\\]", query_start_loc=torch.zeros(1, 3, dtype=I32))


def test_initial_state_mode_length():
    _bad("argument 'initial_state_mode' must be 1-D \\[2\\]", initial_state_mode=torch.ones(3, dtype=I32))


@pytest.mark.asan
def test_cache_index_out_of_range():
    _bad("argument 'cache_indices' must lie in \\[0, slots=4\\)", cache_indices=torch.tensor([0, 4], dtype=I32))


def test_cache_indices_shape():
    _bad("argument 'cache_indices' must be \\[batch\\] = \\[2\\]", cache_indices=torch.tensor([0, 1, 2], dtype=I32))


def test_cache_indices_dtype():
    _bad("argument 'cache_indices' must be int32 or int64", cache_indices=torch.tensor([0.0, 1.0]))


@pytest.mark.asan
def test_cache_lines_must_be_distinct():
    _bad("line 1 is used by sequences 0 and 1", cache_indices=torch.tensor([1, 1], dtype=I32))


def test_too_few_lines_without_cache_indices():
    _bad("argument 'conv_states' must have at least batch = 2", cache_indices=None,
         conv_states=torch.zeros(1, 2, 8))


def test_num_accepted_tokens_range():
    _bad("argument 'num_accepted_tokens' must lie in \\[1, the sequence's length 3\\]",
         num_accepted_tokens=torch.tensor([4, 1], dtype=I32))


def test_num_accepted_tokens_within_the_line():
    _bad("argument 'num_accepted_tokens' reads rows up to 4", num_accepted_tokens=torch.tensor([3, 1], dtype=I32))


def test_num_accepted_tokens_length():
    _bad("argument 'num_accepted_tokens' must be 1-D \\[2\\]", num_accepted_tokens=torch.tensor([1], dtype=I32))


def test_num_computed_tokens_non_negative():
    _bad("argument 'num_computed_tokens' must be >= 0", num_computed_tokens=torch.tensor([-1, 0], dtype=I32))


def test_activation_value():
    _bad("argument 'activation' must be", activation="gelu")


def test_residual_connection_value():
    _bad("argument 'residual_connection' must be 0 or 1", residual_connection=2)


def test_conv_mode_value():
    _bad("argument 'conv_mode' must be", conv_mode="mamba")


def test_pangu_needs_num_computed_tokens():
    _bad("argument 'num_computed_tokens' is required with conv_mode=\"pangu\"", conv_mode="pangu")


def test_max_query_len_too_small():
    _bad("argument 'max_query_len' must be -1 or at least the longest sequence \\(3\\)", max_query_len=2)


def test_block_arguments_need_2d_cache_indices():
    _bad("argument 'initial_state_idx' is for prefix caching", initial_state_idx=torch.zeros(2, dtype=I32))


def _apc(**over):
    kw = dict(cache_indices=torch.tensor([[0, 1], [2, 3]], dtype=I32),
              num_computed_tokens=torch.zeros(2, dtype=I32),
              block_idx_first_scheduled_token=torch.zeros(2, dtype=I32),
              block_idx_last_scheduled_token=torch.zeros(2, dtype=I32),
              initial_state_idx=torch.zeros(2, dtype=I32), block_size=4)
    kw.update(over)
    return kw


def test_prefix_caching_needs_every_block_argument():
    _bad("requires block_idx_first_scheduled_token", **_apc(initial_state_idx=None))


def test_prefix_caching_block_size():
    _bad("argument 'block_size' must be at least 2", **_apc(block_size=1))


def test_prefix_caching_block_order():
    _bad("must satisfy 0 <= first <= last < max_blocks = 2",
         **_apc(block_idx_last_scheduled_token=torch.tensor([2, 0], dtype=I32)))


def test_prefix_caching_initial_state_idx():
    _bad("argument 'initial_state_idx' must lie in",
         **_apc(initial_state_idx=torch.tensor([0, 1], dtype=I32)))


def test_prefix_caching_more_blocks_than_completed():
    _bad("completed blocks", **_apc(block_idx_last_scheduled_token=torch.tensor([1, 0], dtype=I32)))


def test_wrapper_rejects_non_tensor():
    _bad("argument 'cache_indices' must be a Tensor or None", cache_indices=[0, 1])
