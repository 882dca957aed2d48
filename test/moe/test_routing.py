"""MoE gating and routing ops against the float64 references of moe_reference.py: ties, k = 1 and k = E, finished
rows, capacity overflow and underflow, empty experts, active_num, both pair orders of finalize_routing; gradients
(gradcheck in float64, which every differentiable op here accepts); a compiled routing pipeline; bad input."""
import re

import pytest
import torch

from test.common import moe_reference as ref
import torch_ops_transformer as tot
from test.common.reference import check_tolerance

OPS = torch.ops.npu_fa
LOW = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def expect(exc, *names):
    """pytest.raises for `exc` whose message contains every name."""
    return pytest.raises(exc, match="(?s)" + "".join(f"(?=.*{re.escape(n)})" for n in names))


def routing_inputs(n=12, k=2, e=5, h=8, dtype=torch.float32, seed=0):
    """x [n, h] and distinct experts per token ([n, k] int32; some experts left empty when k*n is small)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, h, generator=g).to(dtype)
    expert = torch.rand(n, e, generator=g).argsort(-1)[:, :k].int()
    return x, expert


# ---- gating: top-k softmax ------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", list(LOW) + ["fp64"])
@pytest.mark.parametrize("shape,k", [((7, 6), 1), ((2, 5, 8), 3), ((9, 4), 4)])
def test_gating_top_k_softmax(dtype, shape, k):
    dt = LOW.get(dtype, torch.float64)
    x = torch.randn(shape).to(dt)
    finished = torch.rand(shape[:-1]) < 0.3
    y, expert, row_idx = OPS.moe_gating_top_k_softmax(x, finished, k)
    y64, e64, r64, _ = ref.gating_softmax(x, k, finished)
    same = ref.gating_softmax(x, k, finished, dtype=dt)[0]
    assert y.dtype == dt and expert.dtype == torch.int32 and row_idx.dtype == torch.int32
    assert torch.equal(expert, e64) and torch.equal(row_idx, r64)
    assert (expert[finished] == shape[-1]).all()
    check_tolerance("y", y, y64, same)


def test_gating_ties_pick_lower_expert():
    x = torch.tensor([[1.0, 3.0, 3.0, 0.0, 3.0], [2.0, 2.0, 2.0, 2.0, 2.0]])
    _, expert, _ = OPS.moe_gating_top_k_softmax(x, None, 3)
    assert expert.tolist() == [[1, 2, 4], [0, 1, 2]]
    _, expert2, _ = OPS.moe_gating_top_k_softmax_v2(x, None, 2, 1, False)
    assert expert2.tolist() == [[1, 2], [0, 1]]


@pytest.mark.parametrize("renorm", [0, 1])
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_gating_v2(renorm, dtype):
    dt = LOW[dtype]
    x = torch.randn(10, 8).to(dt)
    y, expert, sm = OPS.moe_gating_top_k_softmax_v2(x, None, 3, renorm, True)
    y64, e64, _, p64 = ref.gating_softmax(x, 3, renorm=renorm)
    assert torch.equal(expert, e64)
    check_tolerance("y", y, y64, ref.gating_softmax(x, 3, renorm=renorm, dtype=dt)[0])
    if renorm == 0:
        assert sm.dtype == torch.float32 and sm.shape == x.shape
        torch.testing.assert_close(sm.double(), p64, atol=1e-6, rtol=1e-5)
    else:
        torch.testing.assert_close(y.double().sum(-1), torch.ones(10, dtype=torch.float64), atol=2e-2, rtol=0)
        assert sm.numel() == 0


@pytest.mark.parametrize("renorm", [0, 1])
def test_gating_gradcheck(renorm):
    x = torch.randn(2, 3, 6, dtype=torch.float64, requires_grad=True)
    fn = (lambda t: OPS.moe_gating_top_k_softmax(t, None, 3)[0]) if renorm == 0 else \
        (lambda t: OPS.moe_gating_top_k_softmax_v2(t, None, 3, 1, False)[0])
    assert torch.autograd.gradcheck(fn, (x,))


@pytest.mark.parametrize("renorm", [0, 1])
def test_gating_gradients_fp32_vs_reference(renorm):
    x = torch.randn(16, 8, requires_grad=True)
    dy = torch.randn(16, 3)
    OPS.moe_gating_top_k_softmax_v2(x, None, 3, renorm, False)[0].backward(dy)
    x64 = x.detach().double().requires_grad_()
    ref.gating_softmax(x64, 3, renorm=renorm)[0].backward(dy.double())
    torch.testing.assert_close(x.grad.double(), x64.grad, atol=1e-6, rtol=1e-5)


# ---- gating: DeepSeek-V3 group-limited ---------------------------------------------------------------------------
@pytest.mark.asan
@pytest.mark.parametrize("norm_type,mode,groups,k_group,k", [(1, 1, 4, 2, 4), (0, 0, 4, 1, 2), (1, 0, 1, 1, 16),
                                                             (0, 1, 8, 3, 1)])
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_gating_top_k_grouped(norm_type, mode, groups, k_group, k, dtype):
    dt = LOW[dtype]
    x = torch.randn(11, 16).to(dt)
    bias = torch.randn(16).to(dt) * 0.1
    kw = dict(k_group=k_group, group_count=groups, group_select_mode=mode, norm_type=norm_type,
              routed_scaling_factor=2.5, eps=1e-20)
    y, expert, out = OPS.moe_gating_top_k(x, k, bias, k_group, groups, mode, 0, norm_type, True, 2.5, 1e-20)
    y64, e64, s64 = ref.gating_group(x, k, bias, **kw)
    assert torch.equal(expert, e64)
    check_tolerance("y", y, y64, ref.gating_group(x, k, bias, dtype=dt, **kw)[0])
    torch.testing.assert_close(out.double(), s64, atol=1e-6, rtol=1e-5)
    if groups > 1:  # every chosen expert lies in one of at most k_group groups
        assert all(len(set((r // (16 // groups)).tolist())) <= k_group for r in expert)


def test_gating_top_k_bias_selects_but_does_not_weigh():
    x = torch.zeros(1, 4)
    bias = torch.tensor([0.0, 0.0, 0.0, 1.0])
    y, expert, _ = OPS.moe_gating_top_k(x, 2, bias, 1, 1, 0, 0, 1, False, 1.0, 1e-20)
    assert expert.tolist() == [[3, 0]]  # bias picks expert 3; the tie among the rest goes to expert 0
    torch.testing.assert_close(y, torch.tensor([[0.5, 0.5]]))  # equal sigmoid(0) weights, bias not included


# ---- init routing ---------------------------------------------------------------------------------------------
@pytest.mark.asan
@pytest.mark.parametrize("n,k,e,active", [(12, 2, 5, 12), (9, 1, 3, 4), (6, 4, 4, 6), (5, 3, 8, 0)])
def test_init_routing_v1(n, k, e, active):
    x, expert = routing_inputs(n, k, e)
    _, _, row_idx = OPS.moe_gating_top_k_softmax(torch.randn(n, e), None, k)
    got = OPS.moe_init_routing(x, row_idx, expert, active)
    want = ref.init_routing_v1(x, row_idx, expert, active)
    for g, w in zip(got, want):
        assert torch.equal(g, w)


V2_CASES = {
    "dropless": dict(expert_num=5, expert_tokens_num_flag=True, expert_tokens_num_type=1),
    "dropless_cumsum": dict(expert_num=5, expert_tokens_num_flag=True, expert_tokens_num_type=0),
    "active_num": dict(active_num=7, expert_num=5, expert_tokens_num_flag=True, expert_tokens_num_type=1),
    "no_expert_num": dict(),
    "expert_range": dict(active_expert_range=[1, 3], expert_tokens_num_flag=True, expert_tokens_num_type=1),
    "scatter_index": dict(row_idx_type=1, active_num=9),
    "capacity_overflow": dict(drop_pad_mode=1, expert_num=5, expert_capacity=2, expert_tokens_num_flag=True,
                              expert_tokens_num_type=1),
    "capacity_underflow": dict(drop_pad_mode=1, expert_num=5, expert_capacity=12),
}


@pytest.mark.asan
@pytest.mark.parametrize("case", list(V2_CASES))
@pytest.mark.parametrize("k", [1, 2, 5])
def test_init_routing_v2(case, k):
    kw = V2_CASES[case]
    x, expert = routing_inputs(12, k, 5)
    if k == 1 and case == "dropless":
        expert = expert.view(-1)  # 1-D expert_idx means k = 1
    scale = torch.rand(12)
    got = tot.npu_moe_init_routing_v2(x, expert, scale=scale, **kw)
    want = ref.init_routing_v2(x, expert, scale=scale, **kw)
    for name, g, w in zip(("expanded_x", "expanded_row_idx", "tokens", "expanded_scale"), got, want):
        assert g.shape == w.shape and torch.equal(g, w.to(g.dtype)), name


@pytest.mark.asan
def test_init_routing_v2_empty_experts_and_capacity_padding():
    x = torch.arange(8.0).view(4, 2)
    expert = torch.tensor([[3, 0], [3, 0], [3, 0], [0, 3]], dtype=torch.int32)  # experts 1, 2 empty
    ex, row, counts, _ = tot.npu_moe_init_routing_v2(x, expert, drop_pad_mode=1, expert_num=4, expert_capacity=3,
                                                      expert_tokens_num_flag=True, expert_tokens_num_type=1)
    assert counts.tolist() == [4, 0, 0, 4]                     # before dropping
    assert torch.equal(ex[1], torch.zeros(3, 2)) and torch.equal(ex[0], x[:3])  # empty expert: zero pad
    assert row.tolist() == [9, 0, 10, 1, 11, 2, -1, -1]        # token 3's pairs overflow both capacities
    ex, row, counts, _ = tot.npu_moe_init_routing_v2(x, expert, expert_num=4, expert_tokens_num_flag=True)
    assert counts.tolist() == [4, 4, 4, 8]                     # cumsum: empty experts repeat the end


@pytest.mark.asan
def test_compute_expert_tokens():
    sorted_experts = torch.tensor([0, 0, 2, 2, 2, 5], dtype=torch.int32)
    got = OPS.moe_compute_expert_tokens(sorted_experts, 7)
    want = torch.searchsorted(sorted_experts, torch.arange(7, dtype=torch.int32), right=True)
    assert got.dtype == torch.int32 and torch.equal(got, want.int())


# ---- finalize routing -----------------------------------------------------------------------------------------
def v1_routing(n=10, k=2, e=4, h=6, dtype=torch.float32):
    x, expert = routing_inputs(n, k, e, h, dtype)
    _, _, row_idx = OPS.moe_gating_top_k_softmax(torch.randn(n, e), None, k)
    ex, ex_row, _ = OPS.moe_init_routing(x, row_idx, expert, n)
    return x, expert, ex, ex_row


@pytest.mark.asan
@pytest.mark.parametrize("dtype", list(LOW) + ["fp64"])
@pytest.mark.parametrize("mode", [0, 1, 2, 3])
@pytest.mark.parametrize("optional", ["all", "none"])
def test_finalize_routing(dtype, mode, optional):
    dt = LOW.get(dtype, torch.float64)
    n, k, e, h = 10, 2, 4, 6
    if mode == 0:
        x, expert, rows, dst = v1_routing(n, k, e, h, dt)
    else:
        x, expert = routing_inputs(n, k, e, h, dt)
        kw = dict(drop_pad_mode=1, expert_num=e, expert_capacity=3) if mode in (1, 3) else dict(active_num=15)
        rows, dst = tot.npu_moe_init_routing_v2(x, expert, **kw)[:2]
        if mode == 1:  # column-major pair order: dst[j*N + i]
            dst = dst.view(n, k).t().contiguous().view(-1)
        rows = rows * 1.5
    skip1, skip2 = torch.randn(n, h).to(dt), torch.randn(n, h).to(dt)
    bias, scales = torch.randn(e, h).to(dt), torch.rand(n, k).to(dt)
    if optional == "none":
        skip2 = bias = None
    out = OPS.moe_finalize_routing(rows, skip1, skip2, bias, scales, dst, expert, mode)
    want = ref.finalize(rows, skip1, skip2, bias, scales, dst, expert, mode)
    same = ref.finalize(rows, skip1, skip2, bias, scales, dst, expert, mode, dtype=dt)
    assert out.dtype == dt
    check_tolerance("out", out, want, same)
    if mode == 0:  # v1 round trip: combine of the uncomputed routed rows with unit scales = k * x
        ones = torch.ones(n, k, dtype=dt)
        back = OPS.moe_finalize_routing(rows, None, None, None, ones, dst, expert, 0)
        torch.testing.assert_close(back.double(), k * x.double(), atol=1e-2, rtol=1e-2)


@pytest.mark.parametrize("mode", [0, 3])
def test_finalize_routing_gradcheck(mode):
    n, k, e, h = 5, 2, 3, 4
    x, expert = routing_inputs(n, k, e, h, torch.float64)
    if mode == 0:
        _, _, row_idx = OPS.moe_gating_top_k_softmax(torch.randn(n, e), None, k)
        rows, dst, _ = OPS.moe_init_routing(x, row_idx, expert, n)
    else:
        rows, dst = tot.npu_moe_init_routing_v2(x, expert, drop_pad_mode=1, expert_num=e, expert_capacity=2)[:2]
    leaves = [t.detach().clone().requires_grad_() for t in
              (rows, torch.randn(n, h, dtype=torch.float64), torch.randn(n, h, dtype=torch.float64),
               torch.randn(e, h, dtype=torch.float64), torch.rand(n, k, dtype=torch.float64))]
    fn = lambda r, s1, s2, b, sc: OPS.moe_finalize_routing(r, s1, s2, b, sc, dst, expert, mode)  # noqa: E731
    assert torch.autograd.gradcheck(fn, leaves)


@pytest.mark.asan
@pytest.mark.parametrize("dtype", ["fp32", "bf16", "fp64"])
@pytest.mark.parametrize("mode", [0, 1, 2, 3])
def test_finalize_routing_rows_read_by_several_pairs(dtype, mode):
    """expanded_src_to_dst_row only says which row each pair reads (in every drop_pad_mode), so two pairs may name
    the same row: each adds it. Against the float64 reference, with -1 entries mixed in."""
    dt = LOW.get(dtype, torch.float64)
    g = torch.Generator().manual_seed(mode)
    n, k, e, h = 9, 3, 4, 7
    rows = torch.randn(e, 5, h, generator=g).to(dt) if mode in (1, 3) else torch.randn(n * k, h, generator=g).to(dt)
    total = rows.numel() // h
    dst = torch.randint(-1, total, (n * k,), generator=g, dtype=torch.int32)
    dst[:4] = 2  # certainly repeated
    skip1, skip2 = torch.randn(n, h, generator=g).to(dt), torch.randn(n, h, generator=g).to(dt)
    bias, scales = torch.randn(e, h, generator=g).to(dt), torch.rand(n, k, generator=g).to(dt)
    expert = torch.randint(0, e, (n, k), generator=g, dtype=torch.int32)
    out = OPS.moe_finalize_routing(rows, skip1, skip2, bias, scales, dst, expert, mode)
    want = ref.finalize(rows, skip1, skip2, bias, scales, dst, expert, mode)
    same = ref.finalize(rows, skip1, skip2, bias, scales, dst, expert, mode, dtype=dt)
    check_tolerance("out", out, want, same)


@pytest.mark.parametrize("mode", [0, 3])
def test_finalize_routing_gradcheck_with_repeated_rows(mode):
    """The gradient of a row read by several pairs is the sum of theirs (the backward accumulates)."""
    g = torch.Generator().manual_seed(5)
    n, k, e, h = 4, 2, 3, 3
    rows = torch.randn(e, 2, h, dtype=torch.float64, generator=g) if mode == 3 else \
        torch.randn(n * k, h, dtype=torch.float64, generator=g)
    dst = torch.tensor([1, 1, 4, -1, 1, 0, 4, 5], dtype=torch.int32)
    expert = torch.randint(0, e, (n, k), generator=g, dtype=torch.int32)
    leaves = [t.detach().clone().requires_grad_() for t in
              (rows, torch.randn(n, h, dtype=torch.float64), torch.randn(e, h, dtype=torch.float64),
               torch.rand(n, k, dtype=torch.float64))]
    fn = lambda r, s1, b, sc: OPS.moe_finalize_routing(r, s1, None, b, sc, dst, expert, mode)  # noqa: E731
    assert torch.autograd.gradcheck(fn, leaves)
    # and against autograd through the plain-PyTorch reference (a gather: its backward sums the repeats)
    ref_leaves = [t.detach().clone().requires_grad_() for t in leaves]
    ref.finalize(ref_leaves[0], ref_leaves[1], None, ref_leaves[2], ref_leaves[3], dst, expert, mode).sum().backward()
    fn(*leaves).sum().backward()
    for ours, want in zip(leaves, ref_leaves):
        torch.testing.assert_close(ours.grad, want.grad)


@pytest.mark.parametrize("mode", [0, 1])
def test_finalize_routing_torch_npu_documented_examples(mode):
    """torch_npu's documented calls of npu_moe_finalize_routing: the index drawn with torch.randint, so rows repeat
    (dropless: [0, N*k); drop pad: [-1, E*C - 1) over [E, C, H] rows)."""
    expert_num, token_len, top_k, num_rows, capacity = 16, 10, 4, 50, 8
    g = torch.Generator().manual_seed(mode)
    if mode == 0:
        rows = torch.randn(num_rows * top_k, token_len, generator=g)
        dst = torch.randint(0, num_rows * top_k, (num_rows * top_k,), generator=g, dtype=torch.int32)
    else:
        rows = torch.randn(expert_num, capacity, token_len, generator=g)
        dst = torch.randint(-1, expert_num * capacity - 1, (num_rows * top_k,), generator=g, dtype=torch.int32)
    assert dst.unique().numel() < dst.numel()  # the example's index repeats rows
    skip1, skip2 = torch.randn(num_rows, token_len, generator=g), torch.randn(num_rows, token_len, generator=g)
    bias, scales = torch.randn(expert_num, token_len, generator=g), torch.randn(num_rows, top_k, generator=g)
    expert = torch.randint(0, expert_num, (num_rows, top_k), generator=g, dtype=torch.int32)
    out = tot.npu_moe_finalize_routing(rows, skip1, skip2, bias, scales, dst, expert, mode)
    assert out.shape == (num_rows, token_len) and out.dtype == torch.float32
    want = ref.finalize(rows, skip1, skip2, bias, scales, dst, expert, mode)
    same = ref.finalize(rows, skip1, skip2, bias, scales, dst, expert, mode, dtype=torch.float32)
    check_tolerance("out", out, want, same)


def test_init_routing_v2_gradcheck():
    x, expert = routing_inputs(6, 2, 4, 3, torch.float64)
    x.requires_grad_()
    # (the index lists pairs without a row: past active_num's rows, and outside active_expert_range)
    for kw in (dict(active_num=9), dict(drop_pad_mode=1, expert_num=4, expert_capacity=2),
               dict(row_idx_type=1), dict(row_idx_type=1, active_num=5), dict(active_expert_range=[1, 3]),
               dict(row_idx_type=1, active_expert_range=[1, 3]),
               dict(row_idx_type=1, active_expert_range=[1, 3], active_num=7)):
        assert torch.autograd.gradcheck(lambda t: tot.npu_moe_init_routing_v2(t, expert, **kw)[0], (x,))


def test_init_routing_v2_index_lists_what_the_npu_writes():
    """Worked example. Pairs f = i*k + j of experts [[3, 0], [5, 1], [0, 4], [2, 1]], range [1, 3): routed are
    f = 3 (expert 1), 7 (1), 6 (2) at sorted positions 0, 1, 2; then the others, above the range by expert (f = 0
    (3), 5 (4), 2 (5)), then below it in pair order (f = 1, 4: expert 0)."""
    x = torch.arange(8.0).view(4, 2)
    expert = torch.tensor([[3, 0], [5, 1], [0, 4], [2, 1]], dtype=torch.int32)
    rng = dict(active_expert_range=[1, 3])
    ex, scatter, _, _ = tot.npu_moe_init_routing_v2(x, expert, row_idx_type=1, **rng)
    assert scatter.tolist() == [3, 7, 6, 0, 5, 2, 1, 4]
    assert torch.equal(ex[:3], x[[1, 3, 3]]) and not ex[3:].any()  # rows past the routed pairs are zero
    _, gather, _, _ = tot.npu_moe_init_routing_v2(x, expert, **rng)
    assert gather.tolist() == [-1, -1, -1, 0, -1, -1, 2, 1]
    # active_num keeps 2 rows; the index still gives every routed pair its sorted position (as the NPU does)
    ex, gather, _, _ = tot.npu_moe_init_routing_v2(x, expert, active_num=2, **rng)
    assert ex.shape == (2, 2) and gather.tolist() == [-1, -1, -1, 0, -1, -1, 2, 1]
    _, scatter, _, _ = tot.npu_moe_init_routing_v2(x, expert, active_num=2, row_idx_type=1, **rng)
    assert scatter.tolist() == [3, 7, 6, 0, 5, 2, 1, 4]
    # capacity mode: a pair beyond its expert's capacity has no slot: -1
    _, slots, _, _ = tot.npu_moe_init_routing_v2(x, torch.tensor([[1, 0], [1, 0], [1, 1], [0, 1]]), drop_pad_mode=1,
                                                 expert_num=2, expert_capacity=2)
    assert slots.tolist() == [2, 0, 3, 1, -1, -1, -1, -1]


# ---- token permute / unpermute ----------------------------------------------------------------------------------
@pytest.mark.asan
@pytest.mark.parametrize("num_out", [None, 7, -5, 100])
@pytest.mark.parametrize("topk", [1, 3])
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_token_permute_unpermute(num_out, topk, dtype):
    dt = LOW[dtype]
    tokens, indices = routing_inputs(9, topk, 6, 5, dt)
    if topk == 1:
        indices = indices.view(-1)
    permuted, sorted_idx = OPS.moe_token_permute(tokens, indices, num_out, False)
    want_p, want_s = ref.token_permute(tokens, indices, num_out)
    assert torch.equal(permuted, want_p) and torch.equal(sorted_idx, want_s)
    probs = torch.rand(9, topk).to(dt)
    out = OPS.moe_token_unpermute(permuted, sorted_idx, probs, False, None)
    check_tolerance("unpermute", out, ref.token_unpermute(permuted, sorted_idx, probs),
                    ref.token_unpermute(permuted, sorted_idx, probs, dtype=dt))
    if num_out is None:  # without probs the round trip sums each token's topk copies
        back = OPS.moe_token_unpermute(permuted, sorted_idx, None, False, None)
        assert torch.equal(back, tokens.repeat_interleave(topk, 0))


@pytest.mark.asan
def test_token_permute_example_from_the_docs():
    indices = torch.tensor([[0, 4], [4, 3], [4, 2], [1, 1]])
    tokens = torch.arange(4.0)[:, None].repeat(1, 3)
    permuted, sorted_idx = tot.npu_moe_token_permute(tokens, indices)
    assert permuted[:, 0].tolist() == [0, 3, 3, 2, 1, 0, 1, 2]
    assert sorted_idx.tolist() == [0, 5, 6, 4, 7, 3, 1, 2]


@pytest.mark.parametrize("num_out", [None, -3])
def test_token_permute_unpermute_gradcheck(num_out):
    tokens, indices = routing_inputs(5, 2, 4, 3, torch.float64)
    tokens.requires_grad_()
    assert torch.autograd.gradcheck(lambda t: OPS.moe_token_permute(t, indices, num_out, False)[0], (tokens,))
    permuted, sorted_idx = OPS.moe_token_permute(tokens.detach(), indices, num_out, False)
    probs = torch.rand(5, 2, dtype=torch.float64, requires_grad=True)
    fn = lambda p, pr: OPS.moe_token_unpermute(p, sorted_idx, pr, False, None)  # noqa: E731
    assert torch.autograd.gradcheck(fn, (permuted.requires_grad_(), probs))


# ---- a compiled routing pipeline ------------------------------------------------------------------------------
def routing_pipeline(x, logits, w):
    """gate -> dispatch -> a per-row 'expert' -> combine, fully through the routing ops."""
    y, expert, _ = OPS.moe_gating_top_k_softmax_v2(logits, None, 2, 1, False)
    rows, dst, counts, _ = OPS.moe_init_routing_v2(x, expert, None, None, -1, -1, 4, 0, 1, True, -1, [], 0)
    out = torch.tanh(rows * w)
    combined = OPS.moe_finalize_routing(out, x, None, None, y, dst, expert, 2)
    permuted, sorted_idx = OPS.moe_token_permute(combined, expert, None, False)
    return OPS.moe_token_unpermute(permuted, sorted_idx, y, False, None) + counts.sum() * 0


@pytest.mark.usefixtures("dynamo_reset")
def test_compile_fullgraph_routing_pipeline():
    inputs = [torch.randn(8, 6), torch.randn(8, 4), torch.randn(6)]
    eager = [t.clone().requires_grad_() for t in inputs]
    comp = [t.clone().requires_grad_() for t in inputs]
    want = routing_pipeline(*eager)
    got = torch.compile(routing_pipeline, backend="aot_eager", fullgraph=True)(*comp)
    torch.testing.assert_close(got, want)
    want.square().sum().backward()
    got.square().sum().backward()
    for a, b in zip(comp, eager):
        torch.testing.assert_close(a.grad, b.grad)


# ---- bad input -------------------------------------------------------------------------------------------------
@pytest.mark.asan
def test_bad_gating_inputs():
    x = torch.randn(4, 6)
    with expect(ValueError, "'k'", "num_experts", "k=7"):
        OPS.moe_gating_top_k_softmax(x, None, 7)
    with expect(ValueError, "'k'", "1024"):
        OPS.moe_gating_top_k_softmax(torch.randn(2, 1100), None, 1025)
    with expect(TypeError, "'x'", "Int"):
        OPS.moe_gating_top_k_softmax(x.int(), None, 2)
    with expect(TypeError, "'finished'", "bool"):
        OPS.moe_gating_top_k_softmax(x, torch.zeros(4), 2)
    with expect(ValueError, "'finished'", "shape"):
        OPS.moe_gating_top_k_softmax(x, torch.zeros(3, dtype=torch.bool), 2)
    with expect(ValueError, "'x'", "2-D"):
        OPS.moe_gating_top_k_softmax(torch.randn(6), None, 2)
    with expect(ValueError, "'renorm'"):
        OPS.moe_gating_top_k_softmax_v2(x, None, 2, 2, False)
    x16 = torch.randn(3, 16)
    with expect(ValueError, "'group_count'", "16"):
        OPS.moe_gating_top_k(x16, 2, None, 1, 3, 0, 0, 0, False, 1.0, 1e-20)
    with expect(ValueError, "'k_group'"):
        OPS.moe_gating_top_k(x16, 2, None, 5, 4, 0, 0, 0, False, 1.0, 1e-20)
    with expect(ValueError, "'k'", "k_group"):
        OPS.moe_gating_top_k(x16, 9, None, 2, 4, 0, 0, 0, False, 1.0, 1e-20)
    with expect(ValueError, "'bias'", "[E]"):
        OPS.moe_gating_top_k(x16, 2, torch.randn(15), 1, 1, 0, 0, 0, False, 1.0, 1e-20)
    with expect(ValueError, "'norm_type'"):
        OPS.moe_gating_top_k(x16, 2, None, 1, 1, 0, 0, 2, False, 1.0, 1e-20)
    with expect(ValueError, "'renorm'"):
        OPS.moe_gating_top_k(x16, 2, None, 1, 1, 0, 1, 0, False, 1.0, 1e-20)


@pytest.mark.asan
def test_bad_routing_inputs():
    x, expert = routing_inputs(6, 2, 4)
    with expect(ValueError, "'expert_idx'", "out of range", "[0, 4)"):
        tot.npu_moe_init_routing_v2(x, expert + 1, expert_num=4)
    with expect(ValueError, "'expert_idx'", ">= 0"):
        tot.npu_moe_init_routing_v2(x, expert - 1)
    with expect(TypeError, "'expert_idx'", "int32 or int64"):
        tot.npu_moe_init_routing_v2(x, expert.float())
    with expect(ValueError, "'expert_capacity'", "> 0"):
        tot.npu_moe_init_routing_v2(x, expert, drop_pad_mode=1, expert_num=4, expert_capacity=0)
    with expect(ValueError, "'expert_num'", "> 0"):
        tot.npu_moe_init_routing_v2(x, expert, drop_pad_mode=1, expert_capacity=2)
    with expect(ValueError, "'drop_pad_mode'"):
        tot.npu_moe_init_routing_v2(x, expert, drop_pad_mode=2)
    with expect(NotImplementedError, "'quant_mode'"):  # a quantised mode other than int8 (0, 1)
        tot.npu_moe_init_routing_v2(x, expert, quant_mode=2)
    with expect(ValueError, "'quant_mode'"):  # no mode at all
        tot.npu_moe_init_routing_v2(x, expert, quant_mode=10)
    with expect(ValueError, "'expert_idx'", "[N, k]"):
        tot.npu_moe_init_routing_v2(x, expert[:5])
    with expect(ValueError, "'x'", "2-D"):
        tot.npu_moe_init_routing_v2(x[None], expert)
    with expect(ValueError, "'row_idx'", "more than once"):
        OPS.moe_init_routing(x, torch.zeros(6, 2, dtype=torch.int32), expert, 6)
    with expect(ValueError, "'active_num'"):
        OPS.moe_init_routing(x, torch.arange(12, dtype=torch.int32).view(6, 2), expert, -1)
    with expect(ValueError, "'sorted_expert_for_source_row'", "out of range"):
        OPS.moe_compute_expert_tokens(torch.tensor([-1, 1, 2]), 4)
    # indices >= num_expert (finished rows' index E) end the list and count for no expert
    assert OPS.moe_compute_expert_tokens(torch.tensor([0, 1, 4, 5]), 4).tolist() == [1, 2, 2, 2]
    with expect(ValueError, "'num_expert'"):
        OPS.moe_compute_expert_tokens(torch.tensor([0]), 0)


@pytest.mark.asan
def test_init_routing_v2_rejects_huge_sizes_before_allocating():
    # A span of experts or a capacity that no memory holds is a ValueError naming the argument, raised before the
    # per-expert counters or the [expert_num, expert_capacity, H] output are allocated.
    x, expert = routing_inputs(6, 2, 4)
    for hi in (2**40, 2**42):
        with expect(ValueError, "'active_expert_range'", "bytes"):
            tot.npu_moe_init_routing_v2(x, expert, active_expert_range=[0, hi])
    with expect(ValueError, "'active_expert_range'", "overflows int64"):
        tot.npu_moe_init_routing_v2(x, expert, active_expert_range=[0, 2**63 - 1])
    with expect(ValueError, "'expert_num'", "bytes"):
        tot.npu_moe_init_routing_v2(x, expert, expert_num=2**42)
    with expect(ValueError, "expert_capacity", "bytes"):
        tot.npu_moe_init_routing_v2(x, expert, drop_pad_mode=1, expert_num=4, expert_capacity=2**40)
    with expect(ValueError, "expert_num", "expected at most"):
        tot.npu_moe_init_routing_v2(x, expert, drop_pad_mode=1, expert_num=2**40, expert_capacity=2**40)
    with expect(ValueError, "'expert_num' * 'expert_capacity'", "overflows int64"):
        tot.npu_moe_init_routing_v2(x, expert, drop_pad_mode=1, expert_num=2**20, expert_capacity=2**62)


@pytest.mark.asan
def test_init_routing_v2_grad_rejects_bad_scatter_indices():
    # row_idx_type 1: expanded_row_idx[r] is the (token, slot) pair copied to row r, a permutation of the pairs.
    x, expert = routing_inputs(3, 2, 4)
    grad = torch.randn(6, x.shape[1])
    good = torch.tensor([5, 0, 3, 1, 4, 2], dtype=torch.int32)
    OPS.moe_init_routing_v2_grad(grad, good, x, expert, row_idx_type=1)
    for bad in ([5, 0, 3, 1, 4, 6], [5, 0, 3, 1, 4, -2]):
        with expect(ValueError, "'expanded_row_idx'", "out of range", "[0, N*k = 6)"):
            OPS.moe_init_routing_v2_grad(grad, torch.tensor(bad, dtype=torch.int32), x, expert, row_idx_type=1)
    with expect(ValueError, "'expanded_row_idx'", "pair 3", "at most once"):
        OPS.moe_init_routing_v2_grad(grad, torch.tensor([5, 0, 3, 1, 3, 2], dtype=torch.int32), x, expert,
                                     row_idx_type=1)
    # positions past the rows of grad_expanded_x (the forward lists every pair; active_num keeps fewer rows) carry
    # no gradient: pairs 4 and 2 (tokens 2 and 1) get nothing
    got = OPS.moe_init_routing_v2_grad(grad[:4], good, x, expert, row_idx_type=1)
    want = torch.stack([grad[1] + grad[3], grad[2], grad[0]])
    torch.testing.assert_close(got, want)
    with expect(ValueError, "'active_expert_range'", "[start, end)"):
        OPS.moe_init_routing_v2_grad(grad, good, x, expert, row_idx_type=1, active_expert_range=[3, 1])
    # row_idx_type 0: sorted positions past the rows are accepted (no gradient), repeats are not
    dest = torch.tensor([0, 5, 1, 4, 2, 3], dtype=torch.int32)
    got = OPS.moe_init_routing_v2_grad(grad[:4], dest, x, expert, row_idx_type=0)
    torch.testing.assert_close(got, torch.stack([grad[0], grad[1], grad[2] + grad[3]]))
    with expect(ValueError, "'expanded_row_idx'", "more than once"):
        OPS.moe_init_routing_v2_grad(grad, torch.tensor([0, 1, 1, 2, 3, 4], dtype=torch.int32), x, expert)
    with expect(ValueError, "'expanded_row_idx'", "out of range"):
        OPS.moe_init_routing_v2_grad(grad[:4], torch.tensor([0, 1, 2, 3, 6, -1], dtype=torch.int32), x, expert)


@pytest.mark.asan
def test_bad_finalize_and_permute_inputs():
    x, expert, rows, dst = v1_routing()
    skip = torch.randn(10, 6)
    with expect(ValueError, "'expanded_src_to_dst_row'", "out of range"):
        OPS.moe_finalize_routing(rows, skip, None, None, None, dst + 100, expert, 0)
    with expect(ValueError, "'expanded_src_to_dst_row'", "out of range", "-1 (dropped)"):
        OPS.moe_finalize_routing(rows, skip, None, None, None, torch.full_like(dst, -2), expert, 0)
    with expect(TypeError, "'skip1'", "dtype"):
        OPS.moe_finalize_routing(rows, skip.double(), None, None, None, dst, expert, 0)
    with expect(ValueError, "'scales'", "[N, k]"):
        OPS.moe_finalize_routing(rows, skip, None, None, torch.rand(10, 3), dst, expert, 0)
    with expect(ValueError, "'export_for_source_row'", "required"):
        OPS.moe_finalize_routing(rows, skip, None, torch.randn(4, 6), None, dst, None, 0)
    with expect(ValueError, "'export_for_source_row'", "out of range"):
        OPS.moe_finalize_routing(rows, skip, None, torch.randn(1, 6), None, dst, expert, 0)
    with expect(ValueError, "'drop_pad_mode'"):
        OPS.moe_finalize_routing(rows, skip, None, None, None, dst, expert, 4)
    with expect(ValueError, "'padded_mode'"):
        OPS.moe_token_permute(x, expert, None, True)
    with expect(ValueError, "'indices'", ">= 0"):
        OPS.moe_token_permute(x, expert - 1, None, False)
    with expect(ValueError, "'sorted_indices'", "more than once"):
        OPS.moe_token_unpermute(x, torch.zeros(10, dtype=torch.int32), None, False, None)
    with expect(ValueError, "'probs'", "[N, topk]"):
        OPS.moe_token_unpermute(x, torch.arange(10, dtype=torch.int32), torch.rand(4, 2), False, None)


def test_fake_kernel_reports_bad_k_under_compile(dynamo_reset):
    fn = torch.compile(lambda t: OPS.moe_gating_top_k_softmax(t, None, 9)[0], backend="aot_eager", fullgraph=True)
    with pytest.raises(Exception, match="'k'"):
        fn(torch.randn(3, 4))


# ---- the ops together: a routed MoE equals the dense formula ----------------------------------------------------
@pytest.mark.parametrize("mode", ["dropless", "capacity", "permute"])
def test_routed_moe_matches_dense_mixture(mode):
    """gate -> dispatch -> per-expert matmul -> combine equals sum_j y_ij * (x_i W_e) with e = expert_idx[i, j],
    forward and gradients (x, W and the gate logits), with a capacity large enough to drop nothing."""
    n, h, e, k = 10, 4, 5, 2
    x = torch.randn(n, h, dtype=torch.float64, requires_grad=True)
    w = torch.randn(e, h, h, dtype=torch.float64, requires_grad=True)
    logits = torch.randn(n, e, dtype=torch.float64, requires_grad=True)

    def routed(x, w, logits):
        y, expert, _ = tot.npu_moe_gating_top_k_softmax_v2(logits, k=k, renorm=1)
        if mode == "permute":
            rows, sorted_idx = tot.npu_moe_token_permute(x, expert)
            counts = torch.bincount(expert.flatten().long(), minlength=e)
        elif mode == "dropless":
            rows, dst, counts, _ = tot.npu_moe_init_routing_v2(x, expert, expert_num=e, expert_tokens_num_flag=True,
                                                                expert_tokens_num_type=1)
        else:
            rows, dst, counts, _ = tot.npu_moe_init_routing_v2(x, expert, drop_pad_mode=1, expert_num=e,
                                                                expert_capacity=n)
        if mode == "capacity":  # [E, C, H]: one batched matmul, the zero padding stays zero
            out = torch.bmm(rows, w).view(-1, h)
        else:  # groups of consecutive rows per expert (a test-side loop; grouped_matmul does this in the layer)
            out = torch.cat([blk @ w[i] for i, blk in enumerate(rows.split(counts.tolist()))])
        if mode == "permute":
            return tot.npu_moe_token_unpermute(out, sorted_idx, y)
        return tot.npu_moe_finalize_routing(out, None, None, None, y, dst, expert, 3 if mode == "capacity" else 2)

    def dense(x, w, logits):
        y, expert, _, _ = ref.gating_softmax(logits, k, renorm=1)
        return sum(y[:, j, None] * torch.einsum("nh,nhd->nd", x, w[expert[:, j].long()]) for j in range(k))

    got = routed(x, w, logits)
    want = dense(x, w, logits)
    torch.testing.assert_close(got, want)
    dy = torch.randn(n, h, dtype=torch.float64)
    g_got = torch.autograd.grad(got, (x, w, logits), dy)
    g_want = torch.autograd.grad(want, (x, w, logits), dy)
    for name, a, b in zip(("x", "w", "logits"), g_got, g_want):
        torch.testing.assert_close(a, b, msg=lambda m: f"d{name}: {m}")


@pytest.mark.asan
def test_empty_inputs():
    x, expert = torch.randn(0, 4), torch.zeros(0, 2, dtype=torch.int32)
    ex, row, counts, _ = tot.npu_moe_init_routing_v2(x, expert, expert_num=3, expert_tokens_num_flag=True)
    assert ex.shape == (0, 4) and row.shape == (0,) and counts.tolist() == [0, 0, 0]
    permuted, sorted_idx = tot.npu_moe_token_permute(x, expert)
    assert permuted.shape == (0, 4) and sorted_idx.shape == (0,)
    y, idx, row_idx = tot.npu_moe_gating_top_k_softmax(torch.randn(0, 5), k=2)
    assert y.shape == idx.shape == row_idx.shape == (0, 2)


def test_wrapper_keywords():
    x = torch.randn(6, 16)
    y, expert, out = tot.npu_moe_gating_top_k(x, 4, bias=torch.zeros(16), k_group=2, group_count=4, norm_type=1,
                                              out_flag=True, routed_scaling_factor=2.0)
    torch.testing.assert_close(y.sum(-1), torch.full((6,), 2.0))
    assert out.shape == (6, 16)
    ends = tot.npu_moe_compute_expert_tokens(torch.sort(expert.flatten()).values, 16)
    assert ends[-1] == 24


@pytest.mark.asan
def test_counting_sort_multi_chunk_path_is_stable():
    """Enough pairs (> 2 * 16384) that the counting sort splits them into per-thread chunks: still stable."""
    tokens, indices = routing_inputs(20000, 2, 16, 2)
    permuted, sorted_idx = OPS.moe_token_permute(tokens, indices, None, False)
    want_p, want_s = ref.token_permute(tokens, indices)
    assert torch.equal(sorted_idx, want_s) and torch.equal(permuted, want_p)
    got = tot.npu_moe_init_routing_v2(tokens, indices, expert_num=16, expert_tokens_num_flag=True)
    for g, w in zip(got, ref.init_routing_v2(tokens, indices, expert_num=16, expert_tokens_num_flag=True)):
        assert torch.equal(g, w.to(g.dtype))


# ---- torch_npu's argument surface (the schema lines of compat/torch_npu_functions.yaml) -------------------------
def test_gating_v2_keyword_only_and_none_defaults():
    x = torch.randn(5, 8)
    with pytest.raises(TypeError):
        tot.npu_moe_gating_top_k_softmax_v2(x, None, 2)  # k, finished, renorm, output_softmax are keyword-only
    got = tot.npu_moe_gating_top_k_softmax_v2(x, k=2, renorm=None, output_softmax=None)
    for g, w in zip(got, OPS.moe_gating_top_k_softmax_v2(x, None, 2, 0, False)):
        assert torch.equal(g, w)
    assert tot.npu_moe_gating_top_k_softmax_v2(x, k=2, output_softmax=True)[2].shape == x.shape


def test_gating_top_k_softmax_scores_are_not_renormalised():
    x = torch.randn(4, 8)
    y, idx, _ = tot.npu_moe_gating_top_k(x, 3, routed_scaling_factor=2.0)
    want = torch.softmax(x.double(), -1).gather(1, idx.long()) * 2
    torch.testing.assert_close(y.double(), want, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("norm_type", [0, 1])
def test_gating_top_k_hash_routing(norm_type):
    x = torch.randn(6, 16)
    tid2eid = torch.randint(0, 16, (10, 3), dtype=torch.int32)
    ids = torch.randint(0, 10, (6,))
    y, expert, out = tot.npu_moe_gating_top_k(x, 3, bias=torch.randn(16), input_ids=ids, tid2eid=tid2eid,
                                              norm_type=norm_type, out_flag=True, routed_scaling_factor=1.5)
    s = torch.softmax(x.double(), -1) if norm_type == 0 else torch.sigmoid(x.double())
    want = s.gather(1, tid2eid[ids].long())
    if norm_type == 1:
        want = want / (want.sum(-1, keepdim=True) + 1e-20)
    assert torch.equal(expert, tid2eid[ids]) and expert.dtype == torch.int32
    torch.testing.assert_close(y.double(), want * 1.5, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(out.double(), s, atol=1e-6, rtol=1e-5)


def test_gating_top_k_hash_routing_bad_input():
    x, ids, table = torch.randn(4, 16), torch.tensor([0, 1, 2, 3]), torch.randint(0, 16, (5, 2))
    with expect(ValueError, "'input_ids'", "'tid2eid'", "together"):
        tot.npu_moe_gating_top_k(x, 2, input_ids=ids)
    with expect(ValueError, "'tid2eid'", "k = 3"):
        tot.npu_moe_gating_top_k(x, 3, input_ids=ids, tid2eid=table)
    with expect(ValueError, "'input_ids'", "[0, 5)"):
        tot.npu_moe_gating_top_k(x, 2, input_ids=torch.tensor([0, 1, 2, 5]), tid2eid=table)
    with expect(ValueError, "'tid2eid'", "experts outside"):
        tot.npu_moe_gating_top_k(x, 2, input_ids=ids, tid2eid=torch.full((5, 2), 16))
    with expect(ValueError, "'k_group'", "'group_count'"):
        tot.npu_moe_gating_top_k(x, 2, input_ids=ids, tid2eid=table, k_group=1, group_count=4)
    with expect(TypeError, "'input_ids'", "int32 or int64"):
        tot.npu_moe_gating_top_k(x, 2, input_ids=ids.float(), tid2eid=table)
    with expect(TypeError, "'bias'", "dtype"):
        tot.npu_moe_gating_top_k(x, 2, bias=torch.zeros(16, dtype=torch.float64))


def test_finalize_routing_k_and_skip2_rules():
    n, k, h = 6, 3, 4
    x, expert = routing_inputs(n, k, 5, h)
    rows, dst, _, _ = tot.npu_moe_init_routing_v2(x, expert, expert_num=5)
    # without scales the token count is the pairs / k: every token sums its k copies
    torch.testing.assert_close(tot.npu_moe_finalize_routing(rows, None, None, None, None, dst, None, 2, k=k), x * k)
    skip = torch.randn(n, h)
    torch.testing.assert_close(tot.npu_moe_finalize_routing(rows, skip, None, None, None, dst, expert, 2, k),
                               skip + x * k)
    with expect(ValueError, "'skip1'", "k"):  # k = 1 (the default) would mean n * k tokens
        tot.npu_moe_finalize_routing(rows, skip, None, None, None, dst, None, 2)
    with expect(ValueError, "'skip2'", "'skip1'"):
        tot.npu_moe_finalize_routing(rows, None, skip, None, torch.ones(n, k), dst, None, 2)
    with expect(ValueError, "'k'"):
        tot.npu_moe_finalize_routing(rows, None, None, None, None, dst, None, 2, k=0)
    ones = torch.ones(n, k)  # None for the int? arguments means their defaults (drop_pad_mode 0, k 1)
    assert torch.equal(tot.npu_moe_finalize_routing(rows, None, None, None, ones, dst, None, None, None),
                       tot.npu_moe_finalize_routing(rows, None, None, None, ones, dst, None))


def test_init_routing_v2_key_value_token_numbers():
    x, expert = routing_inputs(12, 2, 5)
    for expert_range, lo, hi in (((), 0, 8), ((1, 4), 1, 4)):
        _, _, kv, _ = tot.npu_moe_init_routing_v2(x, expert, expert_num=8, expert_tokens_num_type=2,
                                                  expert_tokens_num_flag=True, active_expert_range=expert_range)
        counts = torch.bincount(expert.flatten().long(), minlength=8)[lo:hi]
        ids = torch.nonzero(counts).flatten()
        assert kv.shape == (8, 2) and kv.dtype == torch.int64
        assert torch.equal(kv[:ids.numel()], torch.stack([ids + lo, counts[ids]], 1))
        assert not kv[ids.numel():].any()
    with expect(ValueError, "'expert_tokens_num_type' 2", "'expert_num'"):
        tot.npu_moe_init_routing_v2(x, expert, expert_tokens_num_type=2, expert_tokens_num_flag=True,
                                    active_expert_range=[0, 5])


def test_init_routing_v2_x_dtype_quant_mode_and_full_range_in_capacity_mode():
    x, expert = routing_inputs(8, 2, 4)
    base = tot.npu_moe_init_routing_v2(x, expert, expert_num=4)
    for x_dtype in (None, torch.float32, 6):  # 6: torch_npu's code of float32
        assert torch.equal(tot.npu_moe_init_routing_v2(x, expert, expert_num=4, x_dtype=x_dtype)[0], base[0])
    with expect(NotImplementedError, "'x_dtype'"):
        tot.npu_moe_init_routing_v2(x, expert, expert_num=4, x_dtype=torch.float16)
    with expect(NotImplementedError, "'quant_mode'"):
        tot.npu_moe_init_routing_v2(x, expert, expert_num=4, quant_mode=3)
    capacity = dict(drop_pad_mode=1, expert_num=4, expert_capacity=3)
    with_range = tot.npu_moe_init_routing_v2(x, expert, active_expert_range=[0, 4], **capacity)
    for g, w in zip(with_range, tot.npu_moe_init_routing_v2(x, expert, **capacity)):
        assert torch.equal(g, w)
    with expect(ValueError, "'active_expert_range'", "capacity"):
        tot.npu_moe_init_routing_v2(x, expert, active_expert_range=[1, 4], **capacity)


@pytest.mark.parametrize("norm_type,out_flag", [(1, False), (1, True), (0, False), (0, True)])
def test_gating_top_k_gradients_vs_reference(norm_type, out_flag):
    """moe_gating_top_k is differentiable in x through y (the scores of the selected experts; selection and bias get
    no gradient): fp32 against float64 autograd of the reference with the same selection."""
    x = torch.randn(9, 16, requires_grad=True)
    bias = torch.randn(16) * 0.1
    kw = dict(k_group=2, group_count=4, group_select_mode=1, norm_type=norm_type, routed_scaling_factor=2.5, eps=1e-20)
    y, expert, _ = tot.npu_moe_gating_top_k(x, 4, bias=bias, out_flag=out_flag, **kw)
    dy = torch.randn(9, 4)
    y.backward(dy)
    x64 = x.detach().double().requires_grad_()
    y64, e64, _ = ref.gating_group(x64, 4, bias, **kw)
    assert torch.equal(expert, e64)
    y64.backward(dy.double())
    torch.testing.assert_close(x.grad.double(), x64.grad, atol=1e-6, rtol=1e-5)
    # torch_npu's npu_moe_gating_top_k_backward from the scores gives the same gradient
    scores = torch.softmax(x.detach(), -1) if norm_type == 0 else torch.sigmoid(x.detach())
    direct = tot.npu_moe_gating_top_k_backward(scores, dy, expert, norm_type=norm_type, routed_scaling_factor=2.5)
    torch.testing.assert_close(direct, x.grad, atol=1e-6, rtol=1e-5)
