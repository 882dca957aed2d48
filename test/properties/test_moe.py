"""The MoE ops on random valid calls, against the float64 references of test.common.moe_reference and
test.moe.test_grouped_matmul under the tolerance rule, and routing round trips:

- moe_gating_top_k_softmax (v1, v2 with renorm and the softmax output) and moe_gating_top_k: selections exactly,
  weights under the tolerance rule;
- dispatch -> per-expert computation -> combine: moe_init_routing (v1) or moe_init_routing_v2 (dropless with
  active_num / active_expert_range, or capacity with drops) followed by moe_finalize_routing in both pair orders
  equals the float64 weighted combination sum_j scales[i, j] * (f_e(x_i) + bias[e]) over the kept pairs (f_e: a
  per-expert scale by a power of two, exact in every dtype, so the rows show which expert they went to); the
  routing outputs equal the reference's exactly;
- moe_token_permute -> per-expert computation -> moe_token_unpermute (num_out_tokens keeping all, some or none);
- grouped_matmul with random group lists (cumulative ends or counts, empty groups), all three group types, bias,
  bias and activations (fp32), stacked or listed weights, forward and (on a subset) gradients."""
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from test.common import moe_reference as ref
from test.common.reference import check_tolerance
from test.moe.test_grouped_matmul import split_m_ref
from test.properties.strategies import DTYPES, dtype_names, examples, generator, permutation, randn, seeds

OPS = torch.ops.npu_fa
ACTS = (0, 1, 2, 4, 5)


def _expert_scale(e: torch.Tensor) -> torch.Tensor:
    """f_e = x * 2^(e % 3 - 1): exact in every dtype, different for neighbouring experts."""
    return torch.pow(2.0, (e.long() % 3 - 1).double())


# ---- gating -----------------------------------------------------------------------------------------------------
@st.composite
def gating_calls(draw):
    e = draw(st.integers(1, 12))
    lead = tuple(draw(st.lists(st.integers(0, 6), min_size=1, max_size=2)))
    return dict(shape=lead + (e,), k=draw(st.integers(1, e)), finished=draw(st.booleans()),
                version=draw(st.sampled_from(("v1", "v2"))), renorm=draw(st.integers(0, 1)),
                softmax_flag=draw(st.booleans()), dtype=draw(st.sampled_from(sorted(DTYPES) + ["fp64"])),
                seed=draw(seeds))


@settings(max_examples=examples(90))
@given(c=gating_calls())
def test_gating_top_k_softmax_matches_reference(c):
    dt = DTYPES.get(c["dtype"], torch.float64)
    gen = generator(c["seed"])
    x = randn(gen, c["shape"], dt, std=2.0)
    finished = torch.rand(c["shape"][:-1], generator=gen) < 0.3 if c["finished"] else None
    k = c["k"]
    renorm = c["renorm"] if c["version"] == "v2" else 0
    y64, e64, r64, p64 = ref.gating_softmax(x, k, finished, renorm=renorm)
    same = ref.gating_softmax(x, k, finished, renorm=renorm, dtype=dt)[0]
    if c["version"] == "v1":
        y, expert, row_idx = OPS.moe_gating_top_k_softmax(x, finished, k)
        assert row_idx.dtype == torch.int32 and torch.equal(row_idx, r64)
    else:
        y, expert, sm = OPS.moe_gating_top_k_softmax_v2(x, finished, k, renorm, c["softmax_flag"])
        if c["softmax_flag"] and renorm == 0:
            assert sm.shape == x.shape
            check_tolerance("softmax_result", sm, p64, torch.softmax(x.float() if dt != torch.float64 else x, -1))
        else:
            assert sm.numel() == 0
    assert y.dtype == dt and expert.dtype == torch.int32 and torch.equal(expert, e64)
    check_tolerance("y", y, y64, same)


@st.composite
def group_gating_calls(draw):
    groups = draw(st.sampled_from((1, 2, 4)))
    e = groups * draw(st.integers(1, 4))
    k_group = draw(st.integers(1, groups))
    return dict(n=draw(st.integers(0, 8)), e=e, groups=groups, k_group=k_group,
                k=draw(st.integers(1, k_group * (e // groups))), mode=draw(st.integers(0, 1)),
                norm_type=draw(st.integers(0, 1)), bias=draw(st.booleans()), out_flag=draw(st.booleans()),
                scaling=draw(st.sampled_from((1.0, 2.5))), dtype=draw(dtype_names), seed=draw(seeds))


@settings(max_examples=examples(60))
@given(c=group_gating_calls())
def test_gating_top_k_grouped_matches_reference(c):
    dt, gen = DTYPES[c["dtype"]], generator(c["seed"])
    if c["mode"] == 1 and c["e"] // c["groups"] < 2:
        c["mode"] = 0  # scoring a group by its top two experts needs two per group
    x = randn(gen, (c["n"], c["e"]), dt, std=2.0)
    bias = randn(gen, (c["e"],), dt, std=0.1) if c["bias"] else None
    kw = dict(k_group=c["k_group"], group_count=c["groups"], group_select_mode=c["mode"], norm_type=c["norm_type"],
              routed_scaling_factor=c["scaling"], eps=1e-20)
    y, expert, out = OPS.moe_gating_top_k(x, c["k"], bias, c["k_group"], c["groups"], c["mode"], 0, c["norm_type"],
                                          c["out_flag"], c["scaling"], 1e-20)
    y64, e64, s64 = ref.gating_group(x, c["k"], bias, **kw)
    assert torch.equal(expert, e64)
    check_tolerance("y", y, y64, ref.gating_group(x, c["k"], bias, dtype=dt, **kw)[0])
    if c["out_flag"]:
        check_tolerance("out", out, s64, ref.gating_group(x, c["k"], bias, dtype=torch.float32, **kw)[2])


# ---- dispatch -> experts -> combine -----------------------------------------------------------------------------
@st.composite
def routing_calls(draw):
    n, k, e = draw(st.integers(0, 10)), draw(st.integers(1, 4)), draw(st.integers(1, 6))
    version = draw(st.sampled_from(("v1", "v2_dropless", "v2_capacity")))
    c = dict(n=n, k=k, e=e, h=draw(st.integers(1, 8)), version=version, dtype=draw(st.sampled_from(
        sorted(DTYPES) + ["fp64"])), column_major=draw(st.booleans()), skip1=draw(st.booleans()),
        skip2=draw(st.booleans()), bias=draw(st.booleans()), scales=draw(st.booleans()), seed=draw(seeds))
    kw = {}
    if version == "v2_dropless":
        if draw(st.booleans()):
            kw["active_num"] = draw(st.integers(1, n * k + 2))
        if draw(st.booleans()):
            lo = draw(st.integers(0, e - 1))
            kw["active_expert_range"] = [lo, draw(st.integers(lo + 1, e))]
        kw.update(expert_num=e, expert_tokens_num_flag=draw(st.booleans()),
                  expert_tokens_num_type=draw(st.integers(0, 1)))
    elif version == "v2_capacity":
        kw.update(drop_pad_mode=1, expert_num=e, expert_capacity=draw(st.integers(1, max(1, n * k))),
                  expert_tokens_num_flag=draw(st.booleans()), expert_tokens_num_type=1)
    c["kw"] = kw
    c["flat_k1"] = k == 1 and version != "v1" and draw(st.booleans())  # expert_idx [N] means k = 1
    c["with_scale"] = version != "v1" and n > 0 and draw(st.booleans())  # moe_reference gathers scale by row
    c["distinct"] = draw(st.booleans())  # distinct experts per token (as gating gives them), or repeats too
    return c


@settings(max_examples=examples(150))
@given(c=routing_calls())
def test_dispatch_experts_combine_round_trip(c):
    dt = DTYPES.get(c["dtype"], torch.float64)
    gen = generator(c["seed"])
    n, k, e, h = c["n"], c["k"], c["e"], c["h"]
    x = randn(gen, (n, h), dt)
    if c["distinct"] and k <= e and n:
        expert = torch.stack([permutation(gen, e)[:k] for _ in range(n)]).int()
    else:
        expert = torch.randint(0, e, (n, k), generator=gen).int()
    if c["version"] == "v1":
        row_idx = (torch.arange(k)[None] * n + torch.arange(n)[:, None]).int()  # j*N + i, as gating returns
        rows, dst, sorted_experts = OPS.moe_init_routing(x, row_idx, expert, n)
        want = ref.init_routing_v1(x, row_idx, expert, n)
        assert all(torch.equal(g, w) for g, w in zip((rows, dst, sorted_experts), want))
        dst_token_major = dst.view(k, n).t().reshape(-1)  # v1's expanded_row_idx is indexed by j*N + i
        capacity = False
    else:
        scale = torch.rand(n, generator=gen) if c["with_scale"] else None
        expert_arg = expert.view(-1) if c["flat_k1"] else expert
        kw = c["kw"]
        got = OPS.moe_init_routing_v2(x, expert_arg, scale, None, kw.get("active_num", -1),
                                      kw.get("expert_capacity", -1), kw.get("expert_num", -1),
                                      kw.get("drop_pad_mode", 0), kw.get("expert_tokens_num_type", 0),
                                      kw.get("expert_tokens_num_flag", False), -1, kw.get("active_expert_range", []),
                                      0)
        want = ref.init_routing_v2(x, expert_arg, scale=scale, **kw)
        for name, g, w in zip(("expanded_x", "expanded_row_idx", "expert_tokens", "expanded_scale"), got, want):
            assert g.shape == w.shape and torch.equal(g, w.to(g.dtype)), name
        rows, dst_token_major = got[0], got[1]
        capacity = c["version"] == "v2_capacity"
    # the experts: row r of pair f is scaled by f_e with e = expert_idx[f]; rows no pair reads stay as they are
    flat_rows = rows.reshape(-1, h)
    routed = flat_rows.clone()
    # Pairs the dispatch did not place: -1, or (dropless, active_num below the routed count) a sorted position past
    # the rows it returned, as the NPU writes it; combine reads nothing for either.
    kept = (dst_token_major.long() >= 0) & (dst_token_major.long() < flat_rows.shape[0])
    dest = dst_token_major.long()[kept]
    routed[dest] = (flat_rows[dest].double() * _expert_scale(expert.reshape(-1)[kept])[:, None]).to(dt)
    routed = routed.view(rows.shape)
    skip1 = randn(gen, (n, h), dt) if c["skip1"] else None
    skip2 = randn(gen, (n, h), dt) if c["skip2"] and skip1 is not None else None
    bias = randn(gen, (e, h), dt) if c["bias"] else None
    scales = randn(gen, (n, k), dt).abs() if c["scales"] else None
    if c["column_major"]:  # pair order j*N + i: drop_pad_mode 0 / 1
        dst_arg, mode = dst_token_major.view(n, k).t().reshape(-1), (1 if capacity else 0)
    else:  # pair order i*k + j: drop_pad_mode 2 / 3
        dst_arg, mode = dst_token_major, (3 if capacity else 2)
    out = OPS.moe_finalize_routing(routed, skip1, skip2, bias, scales, dst_arg.contiguous(), expert, mode)

    def combine(cd):
        y = torch.zeros(n, h, dtype=cd)
        for t in (skip1, skip2):
            if t is not None:
                y = y + t.to(cd)
        keep = kept.view(n, k)
        for j in range(k):
            term = x.to(cd) * _expert_scale(expert[:, j]).to(cd)[:, None]
            if bias is not None:
                term = term + bias.to(cd)[expert[:, j].long()]
            w = scales[:, j].to(cd)[:, None] if scales is not None else 1.0
            y = y + keep[:, j, None].to(cd) * w * term
        return y

    assert out.dtype == dt and out.shape == (n, h)
    check_tolerance(f"{c['version']} finalize mode {mode}", out, combine(torch.float64), combine(dt))


@st.composite
def permute_calls(draw):
    n, topk = draw(st.integers(0, 10)), draw(st.integers(1, 4))
    pairs = n * topk
    num_out = draw(st.one_of(st.none(), st.just(0), st.integers(1, pairs + 3), st.integers(-pairs - 2, -1)))
    return dict(n=n, topk=topk, e=draw(st.integers(1, 6)), h=draw(st.integers(1, 8)), num_out=num_out,
                flat=topk == 1 and draw(st.booleans()), int64=draw(st.booleans()), probs=draw(st.booleans()),
                dtype=draw(dtype_names), seed=draw(seeds))


@settings(max_examples=examples(90))
@given(c=permute_calls())
def test_token_permute_experts_unpermute_round_trip(c):
    dt, gen = DTYPES[c["dtype"]], generator(c["seed"])
    n, topk, h = c["n"], c["topk"], c["h"]
    tokens = randn(gen, (n, h), dt)
    indices = torch.randint(0, c["e"], (n, topk), generator=gen)
    indices = indices.view(-1) if c["flat"] else indices
    indices = indices if c["int64"] else indices.int()
    permuted, sorted_idx = OPS.moe_token_permute(tokens, indices, c["num_out"], False)
    want_p, want_s = ref.token_permute(tokens, indices, c["num_out"])
    assert torch.equal(permuted, want_p) and torch.equal(sorted_idx, want_s)
    dest = sorted_idx.long()
    kept = dest < permuted.shape[0]
    experts = indices.reshape(-1).long()
    routed = permuted.clone()
    routed[dest[kept]] = (permuted[dest[kept]].double() * _expert_scale(experts[kept])[:, None]).to(dt)
    probs = randn(gen, (n, topk), dt).abs() if c["probs"] else None
    out = OPS.moe_token_unpermute(routed, sorted_idx, probs, False, None)

    def combine(cd):
        f = tokens.to(cd).repeat_interleave(topk, 0) * _expert_scale(experts).to(cd)[:, None] * kept[:, None].to(cd)
        if probs is None:
            return f
        return (f.view(n, topk, h) * probs.to(cd)[..., None]).sum(1)

    assert out.dtype == dt
    check_tolerance("unpermute", out, combine(torch.float64), combine(dt))


# ---- grouped_matmul ---------------------------------------------------------------------------------------------
@st.composite
def grouped_matmul_calls(draw):
    group_type = draw(st.sampled_from((0, 0, 2, -1)))
    groups = draw(st.integers(1, 5))
    dtype = draw(dtype_names)
    # Bias and activations are checked in fp32: in fp16/bf16 the epilogue runs on the product already rounded to x's
    # dtype (act_input) and rounds again, up to about twice the error of one rounding of act(x.w + b), and on small
    # outputs more than the rule allows (bf16 fast_gelu, groups of 2 and 3 rows, K=3, N=4: 3.3e-3 against
    # 2 * 1.2e-3; fp16 with an fp32 bias, K=2, N=3: 3.2e-3 against 2 * 1.6e-3, one rounding would give 9.5e-4).
    epilogue = group_type != 2 and dtype == "fp32"
    act = draw(st.sampled_from(ACTS)) if epilogue else 0
    return dict(group_type=group_type, counts=tuple(draw(st.lists(st.integers(0, 6), min_size=groups,
                                                                  max_size=groups))),
                list_type=draw(st.integers(0, 1)), m=draw(st.integers(0, 7)), k=draw(st.integers(1, 16)),
                n=draw(st.integers(1, 16)), act=act, bias=epilogue and draw(st.booleans()),
                fp32_bias=draw(st.booleans()), weight_list=draw(st.booleans()), transposed=draw(st.booleans()),
                dtype=dtype, seed=draw(seeds))


def _gmm_leaves(c, gen, dt):
    counts, k, n = c["counts"], c["k"], c["n"]
    if c["group_type"] == 0:
        x = randn(gen, (sum(counts), k), dt)
        w = randn(gen, (len(counts), k, n), dt, std=k ** -0.5)
        b = randn(gen, (len(counts), n), torch.float32 if c["fp32_bias"] else dt) if c["bias"] else None
        return [x, w] + ([b] if b is not None else [])
    if c["group_type"] == 2:  # K split into groups; x [M, K] (often a transposed [K, M] view)
        kk = sum(counts)
        x = randn(gen, (kk, c["m"]), dt).t() if c["transposed"] else randn(gen, (c["m"], kk), dt)
        return [x, randn(gen, (kk, n), dt, std=max(kk, 1) ** -0.5)]
    # -1: independent products x[i] [.., K_i] @ w[i] [K_i, N_i], one per group
    leaves = []
    for i, rows in enumerate(counts):
        ki, ni = 1 + (k + i) % 9, 1 + (n + 2 * i) % 9
        leaves += [randn(gen, (rows, ki), dt), randn(gen, (ki, ni), dt, std=ki ** -0.5)]
        if c["bias"]:
            leaves.append(randn(gen, (ni,), dt))
    return leaves


def _gmm_call(c, gl, leaves):
    """Our op on the leaves -> one output tensor (flattened and concatenated for group type -1)."""
    gt, act = c["group_type"], c["act"]
    if gt == 0:
        x, w = leaves[:2]
        weights = list(w.unbind(0)) if c["weight_list"] else [w]
        outs, _ = OPS.grouped_matmul([x], weights, leaves[2:3], gl, 0, c["list_type"], act)
        return outs[0]
    if gt == 2:
        outs, _ = OPS.grouped_matmul([leaves[0]], [leaves[1]], [], gl, 2, c["list_type"], 0)
        return outs[0]
    step = 3 if c["bias"] else 2
    xs, ws, bs = leaves[0::step], leaves[1::step], (leaves[2::step] if c["bias"] else [])
    outs, _ = OPS.grouped_matmul(xs, ws, bs, None, -1, 0, act)
    return torch.cat([o.reshape(-1) for o in outs])


def _gmm_ref(c, leaves, cd):
    counts, act = c["counts"], c["act"]
    if c["group_type"] == 0:
        return split_m_ref(leaves[0], leaves[1], leaves[2] if c["bias"] else None, counts, act, cd)
    if c["group_type"] == 2:
        x, w = leaves
        outs, k0 = [], 0
        for cnt in counts:
            outs.append(x[:, k0:k0 + cnt].to(cd) @ w[k0:k0 + cnt].to(cd))
            k0 += cnt
        return torch.stack(outs)
    step = 3 if c["bias"] else 2
    outs = []
    for i in range(len(counts)):
        y = leaves[i * step].to(cd) @ leaves[i * step + 1].to(cd)
        if c["bias"]:
            y = y + leaves[i * step + 2].to(cd)
        outs.append(ref.act_ref(y, act).reshape(-1))
    return torch.cat(outs)


@settings(max_examples=examples(120))
@given(c=grouped_matmul_calls(), grads=st.booleans())
def test_grouped_matmul_matches_per_group_reference(c, grads):
    dt, gen = DTYPES[c["dtype"]], generator(c["seed"])
    counts = torch.tensor(c["counts"])
    gl = None if c["group_type"] == -1 else (counts if c["list_type"] == 1 else counts.cumsum(0))
    leaves = _gmm_leaves(c, gen, dt)
    if c["act"] == 1:  # keep relu's input away from its kink, where gradients of different roundings disagree
        leaves[0] = leaves[0] + torch.sign(leaves[0]) * 0.25
    ours_in = [t.detach().requires_grad_(grads) for t in leaves]
    out = _gmm_call(c, gl, ours_in)
    assert out.dtype == dt
    refs = {}
    for name, cd in (("ref64", torch.float64), ("same", dt)):
        r_in = [t.detach().requires_grad_(grads) for t in leaves]
        refs[name] = (_gmm_ref(c, r_in, cd), r_in)
    check_tolerance(f"group_type {c['group_type']} out", out, refs["ref64"][0], refs["same"][0])
    if grads and out.numel():
        dy = randn(gen, out.shape, dt)
        got = torch.autograd.grad(out, ours_in, dy, allow_unused=True)
        want = {name: torch.autograd.grad(r, r_in, dy.to(r.dtype), allow_unused=True)
                for name, (r, r_in) in refs.items()}
        for i, g in enumerate(got):
            g = torch.zeros_like(leaves[i]) if g is None else g
            w64, ws = (torch.zeros_like(leaves[i], dtype=torch.float64) if w[i] is None else w[i]
                       for w in (want["ref64"], want["same"]))
            assert g.shape == leaves[i].shape and g.dtype == leaves[i].dtype
            check_tolerance(f"group_type {c['group_type']} grad of input {i}", g, w64, ws)
