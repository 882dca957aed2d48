"""torch.compile(fullgraph=True) through the Python API, forward and backward, against eager; and dynamic sequence
lengths compiled once (no recompilation, no graph break)."""
import pytest
import torch
from torch._dynamo.testing import CompileCounterWithBackend

from torch_ops_transformer import FlashAttention, flash_attn_func, flash_attn_varlen_func, npu_fusion_attention

pytestmark = pytest.mark.usefixtures("dynamo_reset")


def _leaves(*shapes, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(s, generator=g, dtype=dtype).requires_grad_() for s in shapes]


def _run(fn, inputs):
    """Output(s) and input gradients of sum(out * fixed weights)."""
    xs = [x.detach().clone().requires_grad_() for x in inputs]
    out = fn(*xs)
    out = out[0] if isinstance(out, tuple) else out
    w = torch.randn(out.shape, generator=torch.Generator().manual_seed(9))
    grads = torch.autograd.grad((out * w).sum(), xs)
    return out.detach(), grads


def assert_matches_eager(fn, inputs, backend, **compile_kw):
    compiled = torch.compile(fn, backend=backend, fullgraph=True, **compile_kw)
    want, want_grads = _run(fn, inputs)
    got, got_grads = _run(compiled, inputs)
    torch.testing.assert_close(got, want)
    for i, (g, w) in enumerate(zip(got_grads, want_grads)):
        torch.testing.assert_close(g, w, msg=lambda m: f"gradient {i}: {m}")


@pytest.mark.slow
def test_flash_attn_func_inductor():
    q, k, v = _leaves((2, 11, 4, 16), (2, 15, 2, 16), (2, 15, 2, 16))
    assert_matches_eager(lambda q, k, v: flash_attn_func(q, k, v, causal=True) * 2, [q, k, v], "inductor")


@pytest.mark.parametrize("layout", ["BSND", "TND"])
def test_npu_fusion_attention_aot_eager(layout):
    if layout == "BSND":
        q, k, v = _leaves((2, 9, 4, 8), (2, 12, 1, 8), (2, 12, 1, 8))
        kw = {}
    else:
        q, k, v = _leaves((10, 4, 8), (12, 2, 8), (12, 2, 8))
        kw = dict(actual_seq_qlen=[3, 10], actual_seq_kvlen=[5, 12])

    def fn(q, k, v):
        out, smax, ssum, _, seed, offset, numels = npu_fusion_attention(
            q, k, v, 4, layout, scale=0.35, sparse_mode=3, **kw)
        return out + 0 * smax.sum() + 0 * ssum.sum()

    assert_matches_eager(fn, [q, k, v], "aot_eager")


@pytest.mark.parametrize("variant", ["sink_seed", "tnd_softmax_layout_sink", "dropout_mask"])
def test_npu_fusion_attention_newer_arguments_aot_eager(variant):
    """sink (a differentiable input), softmax_layout, a fixed seed and an explicit dropout_mask trace in one graph and
    match eager, gradients of sink included."""
    from torch_ops_transformer.attention import _npu_dropout_gen_mask

    if variant == "tnd_softmax_layout_sink":
        q, k, v, sink = _leaves((10, 4, 8), (12, 2, 8), (12, 2, 8), (4,))
        kw = dict(input_layout="TND", actual_seq_qlen=[3, 10], actual_seq_kvlen=[5, 12], softmax_layout="TND")
    else:
        q, k, v, sink = _leaves((2, 9, 4, 8), (2, 12, 2, 8), (2, 12, 2, 8), (4,))
        kw = dict(input_layout="BSND", keep_prob=0.8, seed=7, offset=4)
    if variant == "dropout_mask":
        kw["dropout_mask"] = _npu_dropout_gen_mask(q, [2, 4, 9, 12], 0.2, 7, 4)

    def fn(q, k, v, sink):
        res = npu_fusion_attention(q, k, v, 4, scale=0.35, sink=None if variant == "dropout_mask" else sink, **kw)
        return res[0] + 0 * res[1].sum() + 0 * sink.sum()

    assert_matches_eager(fn, [q, k, v, sink], "aot_eager")


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["BSND", "BSH"])
def test_flash_attention_module_inductor(layout):
    module = FlashAttention(head_dim=8, num_heads=4, causal=True).eval()
    shapes = {"BSND": [(2, 10, 4, 8), (2, 14, 2, 8), (2, 14, 2, 8)], "BSH": [(2, 10, 32), (2, 14, 16), (2, 14, 16)]}
    assert_matches_eager(module, _leaves(*shapes[layout]), "inductor")


def test_flash_attn_varlen_func_aot_eager():
    q, k, v = _leaves((12, 2, 8), (9, 2, 8), (9, 2, 8))
    cu_q = torch.tensor([0, 5, 5, 12], dtype=torch.int32)
    cu_k = torch.tensor([0, 4, 6, 9], dtype=torch.int32)
    fn = lambda q, k, v: flash_attn_varlen_func(q, k, v, cu_q, cu_k, 7, 4, causal=True)  # noqa: E731
    assert_matches_eager(fn, [q, k, v], "aot_eager")


def test_dropout_under_compile_returns_tensor_seed():
    q, k, v = _leaves((1, 6, 2, 8), (1, 6, 2, 8), (1, 6, 2, 8))
    fn = torch.compile(lambda q, k, v: npu_fusion_attention(q, k, v, 2, "BSND", keep_prob=0.5), fullgraph=True,
                       backend="aot_eager")
    torch.manual_seed(3)
    first = fn(q, k, v)
    torch.manual_seed(3)
    second = fn(q, k, v)
    assert isinstance(first[4], torch.Tensor) and first[4].shape == ()  # ints of the wrapper are 0-d tensors
    assert torch.equal(first[0], second[0]) and torch.equal(first[4], second[4])
    assert first[6] == 1 * 2 * 6 * 6


@pytest.mark.parametrize("api", ["flash_attn_func", "npu_fusion_attention_BSH", "module"])
def test_dynamic_sequence_length_compiles_once(api):
    counter = CompileCounterWithBackend("aot_eager")

    def fn(q, k, v):
        if api == "flash_attn_func":
            return flash_attn_func(q, k, v, causal=True)
        if api == "module":
            return FlashAttention(8, 4)(q, k, v)
        b, s, _, d = q.shape
        return npu_fusion_attention(q.reshape(b, s, -1), k.reshape(b, k.shape[1], -1), v.reshape(b, v.shape[1], -1),
                                    4, "BSH", scale=0.3, sparse_mode=2)[0]

    compiled = torch.compile(fn, backend=counter, fullgraph=True, dynamic=True)
    compiles = []
    for sq, skv in ((7, 9), (13, 20), (30, 31)):
        inputs = _leaves((2, sq, 4, 8), (2, skv, 2, 8), (2, skv, 2, 8), seed=sq)
        want, want_grads = _run(fn, inputs)
        got, got_grads = _run(compiled, inputs)
        torch.testing.assert_close(got, want)
        for g, w in zip(got_grads, want_grads):
            torch.testing.assert_close(g, w)
        compiles.append(counter.frame_count)
    # Dynamo may restart the analysis of the first call (e.g. to tensorify a float argument), which calls the
    # backend once more; what must not happen is a new compilation for a new length.
    assert compiles[0] >= 1 and compiles[1:] == [compiles[0]] * 2, f"backend calls after each length: {compiles}"
    assert torch._dynamo.utils.counters["recompiles"] == {} or not any(
        torch._dynamo.utils.counters["recompiles"].values()), "dynamo recorded a recompilation"
    assert any("npu_fa.flash_attention_score" in g.code for g in counter.graphs)
