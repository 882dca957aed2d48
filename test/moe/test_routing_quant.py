"""moe_init_routing_v2's quantised modes (quant_mode 0 static, 1 dynamic per row, with and without smooth scales;
dropless, active_num, active_expert_range and capacity), int8 x routed unquantised, moe_token_unpermute's -1
indices, and vLLM-Ascend's call sequences (all-gather and all-to-all dispatchers) against float64 references."""
import re

import pytest
import torch

from test.common import moe_reference as ref
import torch_ops_transformer as tot
from test.common.reference import check_tolerance

OPS = torch.ops.npu_fa
LOW = [torch.float32, torch.bfloat16, torch.float16]


def expect(exc, *names):
    return pytest.raises(exc, match="(?s)" + "".join(f"(?=.*{re.escape(n)})" for n in names))


def inputs(n=16, k=4, e=8, h=24, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(n, h, generator=g) * 2).to(dtype)
    expert = torch.rand(n, e, generator=g).argsort(-1)[:, :k].int()
    return x, expert


def row_experts(expert_idx, lo, hi, rows, capacity=None):
    """The expert of each row of expanded_x (-1 for an empty row), found independently of the op: dropless rows hold
    the in-range pairs in stable expert order; capacity row p belongs to expert p // capacity."""
    flat = expert_idx.flatten().long()
    if capacity is not None:
        counts = torch.bincount(flat, minlength=hi)
        out = torch.full((rows,), -1, dtype=torch.long)
        for e in range(hi):
            out[e * capacity: e * capacity + min(int(counts[e]), capacity)] = e
        return out
    inside = flat[(flat >= lo) & (flat < hi)].sort(stable=True).values
    out = torch.full((rows,), -1, dtype=torch.long)
    m = min(rows, inside.numel())
    out[:m] = inside[:m]
    return out


def quant_reference(rows, experts, lo, mode, scale=None, offset=None, dtype=torch.float64):
    """(int8-valued rows, expanded_scale) of quant_mode 0/1 from the unquantised rows, computed in `dtype`."""
    v = rows.to(dtype)
    empty = (experts < 0)[:, None]
    if mode == 0:
        y = (v * scale.to(dtype) + offset.to(dtype)).round().clamp(-128, 127)
        return torch.where(empty, torch.zeros((), dtype=dtype), y), None
    if scale is not None:
        smooth = scale.to(dtype)
        v = v * (smooth[0] if smooth.shape[0] == 1 else smooth[(experts - lo).clamp(min=0)])
    s = v.abs().amax(-1) / 127
    y = torch.where(s[:, None] > 0, v / s[:, None], torch.zeros((), dtype=dtype)).round()
    return torch.where(empty, torch.zeros((), dtype=dtype), y), torch.where(experts < 0, torch.zeros((), dtype=dtype), s)


def run_case(x, expert, mode, scale, offset, capacity=None, expert_range=(), active_num=-1, expert_num=8, **kw):
    n, k = expert.shape
    lo, hi = (expert_range if expert_range else (0, expert_num))
    args = dict(scale=scale, offset=offset, active_num=active_num, expert_num=expert_num, quant_mode=mode,
                active_expert_range=list(expert_range), **kw)
    if capacity is not None:
        args.update(drop_pad_mode=1, expert_capacity=capacity)
    ex, row_idx, tokens, ex_scale = tot.npu_moe_init_routing_v2(x, expert, **args)
    assert ex.dtype == torch.int8
    # The unquantised routing of the same call: the same indices and token numbers, the rows to quantise.
    plain = tot.npu_moe_init_routing_v2(x, expert, **{**args, "quant_mode": -1, "scale": None, "offset": None})
    assert torch.equal(row_idx, plain[1]) and torch.equal(tokens, plain[2])
    rows = plain[0].reshape(-1, x.shape[1])
    experts = row_experts(expert, lo, hi, rows.shape[0], capacity)
    y64, s64 = quant_reference(rows, experts, lo, mode, scale, offset)
    y32, s32 = quant_reference(rows, experts, lo, mode, scale, offset, torch.float32)
    check_tolerance("expanded_x", ex.reshape(-1, x.shape[1]), y64, y32)
    if mode == 1:
        assert ex_scale.shape == (rows.shape[0],) and ex_scale.dtype == torch.float32
        check_tolerance("expanded_scale", ex_scale, s64, s32)
        assert torch.equal(ex.reshape(-1, x.shape[1]), y32.to(torch.int8)) and torch.equal(ex_scale, s32.float())
    else:
        assert ex_scale.numel() == 0
    return ex, row_idx, tokens, ex_scale


@pytest.mark.parametrize("dtype", LOW)
@pytest.mark.parametrize("smooth", [None, "one", "per_expert"])
@pytest.mark.parametrize("layout", ["dropless", "active_num", "range", "capacity"])
def test_dynamic_quant_routing(dtype, smooth, layout):
    x, expert = inputs(dtype=dtype)
    kw = {"dropless": {}, "active_num": {"active_num": 40}, "range": {"expert_range": (2, 6)},
          "capacity": {"capacity": 5}}[layout]
    lo, hi = kw.get("expert_range", (0, 8))
    scale = None
    if smooth == "one":
        scale = torch.rand(1, 24) + 0.5
    elif smooth == "per_expert":
        scale = torch.rand(hi - lo, 24) + 0.5
    run_case(x, expert, 1, scale, None, expert_tokens_num_flag=True, expert_tokens_num_type=1, **kw)


@pytest.mark.parametrize("dtype", LOW)
# row_idx_type 1 is dropless only (capacity mode's row index is always type 0)
@pytest.mark.parametrize("layout, row_idx_type", [("dropless", 0), ("dropless", 1), ("range", 0), ("range", 1),
                                                  ("capacity", 0)])
def test_static_quant_routing(dtype, layout, row_idx_type):
    x, expert = inputs(dtype=dtype, seed=1)
    kw = {"dropless": {}, "range": {"expert_range": (0, 4)}, "capacity": {"capacity": 3}}[layout]
    run_case(x, expert, 0, torch.tensor([25.0]), torch.tensor([-3.5]), row_idx_type=row_idx_type, **kw)


def test_static_quant_saturates_and_rounds_half_to_even():
    x = torch.tensor([[0.5, 1.5, 2.5, -0.5, 1000.0, -1000.0]])
    ex, *_ = tot.npu_moe_init_routing_v2(x, torch.tensor([[0]], dtype=torch.int32), expert_num=1, quant_mode=0,
                                         scale=torch.tensor([1.0]), offset=torch.tensor([0.0]))
    assert ex.tolist() == [[0, 2, 2, 0, 127, -128]]


@pytest.mark.parametrize("tokens_type", [0, 1, 2])
def test_quant_routing_token_numbers(tokens_type):
    x, expert = inputs(seed=2)
    got = tot.npu_moe_init_routing_v2(x, expert, expert_num=8, quant_mode=1, expert_tokens_num_flag=True,
                                      expert_tokens_num_type=tokens_type, active_expert_range=[1, 7])[2]
    counts = torch.bincount(expert.flatten().long(), minlength=8)[1:7]
    if tokens_type == 2:
        ids = torch.nonzero(counts).flatten()
        assert torch.equal(got[:ids.numel()], torch.stack([ids + 1, counts[ids]], 1)) and not got[ids.numel():].any()
    else:
        assert torch.equal(got, counts if tokens_type == 1 else counts.cumsum(0))


def test_dynamic_quant_routing_matches_npu_dynamic_quant():
    """Without smooth scales every copy of a token is npu_dynamic_quant of that token."""
    x, expert = inputs(dtype=torch.bfloat16, seed=3)
    ex, row_idx, _, ex_scale = tot.npu_moe_init_routing_v2(x, expert, expert_num=8, quant_mode=1)
    y, s = tot.npu_dynamic_quant(x)
    tok = torch.arange(expert.numel()) // expert.shape[1]
    assert torch.equal(ex[row_idx.long()], y[tok]) and torch.equal(ex_scale[row_idx.long()], s[tok])


def test_quant_routing_empty_batch_and_autograd():
    x = torch.empty(0, 8, dtype=torch.bfloat16)
    ex, row_idx, tokens, ex_scale = tot.npu_moe_init_routing_v2(
        x, torch.empty(0, 4, dtype=torch.int32), expert_num=8, quant_mode=1, expert_tokens_num_flag=True,
        active_expert_range=[0, 4])
    assert ex.shape == (0, 8) and ex.dtype == torch.int8 and ex_scale.numel() == 0 and not tokens.any()
    # torch_npu accepts an empty scale with an empty batch (its own test passes scale of shape [0]).
    ex = tot.npu_moe_init_routing_v2(x, torch.empty(0, 4, dtype=torch.int32), scale=torch.empty(0), expert_num=8,
                                     quant_mode=1, active_expert_range=[0, 4])[0]
    assert ex.shape == (0, 8)
    # An x that requires grad: the int8 output carries no gradient.
    xg, expert = inputs()
    ex = tot.npu_moe_init_routing_v2(xg.requires_grad_(), expert, expert_num=8, quant_mode=1)[0]
    assert not ex.requires_grad


def test_int8_x_routed_unquantised_with_scale():
    """vLLM-Ascend's all-to-all dispatcher routes already quantised rows (x_dtype int8) with their scales."""
    x, expert = inputs(seed=4)
    y, s = tot.npu_dynamic_quant(x)
    idx = expert[:, :1]
    ex, row_idx, tokens, ex_scale = tot.npu_moe_init_routing_v2(y, idx, scale=s, expert_num=8,
                                                                expert_tokens_num_flag=True,
                                                                active_expert_range=[0, 8], x_dtype=torch.int8)
    order = torch.sort(idx.flatten().long(), stable=True).indices
    assert ex.dtype == torch.int8 and torch.equal(ex, y[order]) and torch.equal(ex_scale, s[order])
    assert torch.equal(tokens, torch.bincount(idx.flatten().long(), minlength=8).cumsum(0))


@pytest.mark.asan
def test_quant_routing_bad_input():
    x, expert = inputs()
    with expect(NotImplementedError, "'quant_mode'", "2"):
        tot.npu_moe_init_routing_v2(x, expert, expert_num=8, quant_mode=2)
    with expect(ValueError, "'quant_mode'", "got 5"):
        OPS.moe_init_routing_v2(x, expert, None, None, -1, -1, 8, 0, 0, False, 5, [], 0)
    with expect(ValueError, "'scale'", "static"):
        tot.npu_moe_init_routing_v2(x, expert, expert_num=8, quant_mode=0, offset=torch.zeros(1))
    with expect(ValueError, "'offset'", "static"):
        tot.npu_moe_init_routing_v2(x, expert, expert_num=8, quant_mode=0, scale=torch.ones(1))
    with expect(ValueError, "'scale'", "[1]"):
        tot.npu_moe_init_routing_v2(x, expert, expert_num=8, quant_mode=0, scale=torch.ones(2), offset=torch.zeros(1))
    with expect(TypeError, "'offset'", "float32"):
        tot.npu_moe_init_routing_v2(x, expert, expert_num=8, quant_mode=0, scale=torch.ones(1),
                                    offset=torch.zeros(1, dtype=torch.float64))
    with expect(ValueError, "'offset'", "quant_mode 0"):
        tot.npu_moe_init_routing_v2(x, expert, expert_num=8, quant_mode=1, offset=torch.zeros(1))
    with expect(ValueError, "'scale'", "[expert_end - expert_start, H] = [4, 24]"):
        tot.npu_moe_init_routing_v2(x, expert, expert_num=8, quant_mode=1, scale=torch.ones(8, 24),
                                    active_expert_range=[2, 6])
    with expect(ValueError, "'scale'", "[1, H]"):
        tot.npu_moe_init_routing_v2(x, expert, expert_num=8, quant_mode=1, scale=torch.ones(24))
    with expect(ValueError, "'scale'", "expert_num or active_expert_range"):
        tot.npu_moe_init_routing_v2(x, expert, quant_mode=1, scale=torch.ones(8, 24))
    with expect(TypeError, "'scale'", "float32"):
        tot.npu_moe_init_routing_v2(x, expert, expert_num=8, quant_mode=1, scale=torch.ones(1, 24).half())
    with expect(TypeError, "'x'", "quant_mode is 1"):
        tot.npu_moe_init_routing_v2(x.to(torch.int8), expert, expert_num=8, quant_mode=1)


# ---- moe_token_unpermute: -1 indices ------------------------------------------------------------------------------
def test_unpermute_skips_minus_one_indices_and_their_gradients():
    x, expert = inputs(n=10, k=3, e=6, h=8, seed=5)
    rows, row_idx, _, _ = tot.npu_moe_init_routing_v2(x, expert, expert_num=6, active_expert_range=[2, 5])
    assert (row_idx == -1).any()
    probs = torch.rand(10, 3, dtype=torch.float64)
    rows64 = rows.double().requires_grad_()
    probs = probs.requires_grad_()
    out = tot.npu_moe_token_unpermute(rows64, row_idx, probs=probs)
    inside = ((expert >= 2) & (expert < 5)).double()
    want = (x.double()[:, None, :] * (probs * inside)[..., None]).sum(1)
    torch.testing.assert_close(out, want)
    torch.testing.assert_close(out, ref.token_unpermute(rows64.detach(), row_idx, probs.detach()))
    assert torch.autograd.gradcheck(lambda r, p: tot.npu_moe_token_unpermute(r, row_idx, probs=p), (rows64, probs))
    g = torch.randn(10, 8, dtype=torch.float64)
    out.backward(g)
    assert torch.equal(probs.grad * (1 - inside), torch.zeros_like(probs.grad))  # routed nowhere: no gradient
    with expect(ValueError, "'sorted_indices'", "-2"):
        tot.npu_moe_token_unpermute(rows, torch.full_like(row_idx, -2))


# ---- vLLM-Ascend's call sequences ----------------------------------------------------------------------------------
@pytest.mark.parametrize("rank", [0, 1])
def test_vllm_ascend_all_gather_dispatch_w8a8(rank):
    """The all-gather dispatcher of one rank of two (4 of 8 experts local): init_routing_v2 with quant_mode 1, the
    local expert range, counts (type 1), active_num N*k; per-expert W8A8 matmuls; unpermute with the expert-masked
    weights. Equal to the float64 sum over the local experts of w * dequant(quant(x)) @ W_e."""
    n, k, e, h, o = 12, 3, 8, 32, 16
    x, topk_ids = inputs(n, k, e, h, torch.bfloat16, seed=6 + rank)
    topk_w = torch.rand(n, k)
    lo, hi = 4 * rank, 4 * rank + 4
    weights = torch.randn(e, h, o) * 0.1
    masked = topk_w * ((topk_ids >= lo) & (topk_ids < hi))
    ex, row_idx, counts, ex_scale = tot.npu_moe_init_routing_v2(
        x, topk_ids, scale=None, active_num=n * k, expert_num=e, expert_tokens_num_type=1,
        expert_tokens_num_flag=True, active_expert_range=[lo, hi], quant_mode=1)
    assert counts.shape == (4,) and ex.shape == (n * k, h)
    outs, start = [], 0
    for j, c in enumerate(counts.tolist()):
        outs.append((ex[start:start + c].double() * ex_scale[start:start + c, None].double()) @ weights[lo + j].double())
        start += c
    expert_rows = torch.cat(outs + [torch.zeros(n * k - start, o, dtype=torch.float64)])
    got = tot.npu_moe_token_unpermute(expert_rows.to(torch.bfloat16), row_idx, probs=masked.to(torch.bfloat16))
    yq, sq = tot.npu_dynamic_quant(x)
    deq = yq.double() * sq.double()[:, None]
    want = sum(masked[:, j, None].double() * torch.einsum("nh,nho->no", deq, weights.double()[topk_ids[:, j].long()])
               for j in range(k))
    same = sum((masked[:, j, None] * torch.einsum("nh,nho->no", deq.float(), weights[topk_ids[:, j].long()])
                ).to(torch.bfloat16).float() for j in range(k)).to(torch.bfloat16)
    check_tolerance("all-gather combine", got, want, same, floor=1e-2)


def test_vllm_ascend_all_to_all_local_permutation():
    """The all-to-all dispatcher's local steps: token_permute with num_out_tokens = N*k, npu_dynamic_quant of the
    permuted rows, a second routing of the received int8 rows by local expert (x_dtype int8 with their scales), and
    the two unpermutes (without probs, then with) restoring the weighted token sum."""
    n, k, e, h = 10, 2, 4, 16
    x, topk_ids = inputs(n, k, e, h, torch.bfloat16, seed=8)
    probs = torch.rand(n, k).to(torch.bfloat16)
    permuted, mapping = tot.npu_moe_token_permute(tokens=x, indices=topk_ids, num_out_tokens=topk_ids.numel())
    y, s = tot.npu_dynamic_quant(permuted)
    local = torch.sort(topk_ids.flatten().long(), stable=True).values.int()  # received rows arrive grouped
    local = (local.flip(0) % 2).int()  # a different order for the second routing
    y2, mapping2, _, s2 = tot.npu_moe_init_routing_v2(y, local.unsqueeze(-1), scale=s, expert_num=e,
                                                      expert_tokens_num_flag=True, active_expert_range=[0, 2],
                                                      x_dtype=torch.int8)
    deq = (y2.float() * s2[:, None]).to(torch.bfloat16)
    back = tot.npu_moe_token_unpermute(deq, mapping2)  # undo the second routing
    out = tot.npu_moe_token_unpermute(permuted_tokens=back, sorted_indices=mapping, probs=probs)
    deq_tok = (tot.npu_dynamic_quant(x)[0].float() * tot.npu_dynamic_quant(x)[1][:, None])
    want = (deq_tok.double()[:, None, :] * probs.double()[..., None]).sum(1)
    same = (deq_tok.to(torch.bfloat16)[:, None, :] * probs[..., None]).sum(1)
    check_tolerance("all-to-all round trip", out, want, same, floor=1e-2)
