"""torch_ops_transformer.integrations.inductor_lowering: Inductor passes rewrite attention in compiled graphs to our ops.
The generated code must call npu_fa ops, results must match eager (forward and backward), and a new sequence length
must not recompile."""
import math

import pytest
import torch
import torch.nn.functional as F
from torch._dynamo.testing import CompileCounterWithBackend
from torch._inductor import config as inductor_config
from torch._inductor.utils import run_and_get_code

from torch_ops_transformer.integrations import inductor_lowering as lowering

pytestmark = pytest.mark.usefixtures("dynamo_reset")
FA = "torch.ops.npu_fa.flash_attention_score.default("
FA_GRAD = "torch.ops.npu_fa.flash_attention_score_grad.default("
DECODE = "torch.ops.npu_fa.incre_flash_attention.default("


def randn(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def handwritten(q, k, v, mask):
    """Two hand-written attentions: div scale + additive mask, and mul scale without a mask."""
    s = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
    a = torch.matmul((s + mask).softmax(dim=-1), v)
    b = torch.matmul(torch.softmax(torch.matmul(q, k.transpose(-2, -1)) * 0.3, dim=-1), v)
    return a, b  # no pointwise epilogue: keeps the C++ compile (and this test) short


@pytest.mark.slow
def test_handwritten_attention_inference_becomes_our_op():
    q, k, v = randn(2, 4, 5, 16), randn(2, 4, 7, 16, seed=1), randn(2, 4, 7, 16, seed=2)
    mask = randn(2, 1, 5, 7, seed=3)
    with lowering.compile_lowering(), torch.no_grad():
        out, (code,) = run_and_get_code(torch.compile(handwritten, fullgraph=True), q, k, v, mask)
    assert code.count(FA) == 2, code
    for got, want in zip(out, handwritten(q, k, v, mask)):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def sdpa_block(q, k, v, mask):
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=0.2, enable_gqa=True)


def _outputs_and_grads(fn, leaves, w):
    xs = [x.detach().clone().requires_grad_() for x in leaves]
    out = fn(*xs)
    return out.detach(), torch.autograd.grad((out * w).sum(), xs)


@pytest.mark.slow
def test_training_sdpa_forward_and_backward_are_our_ops_and_lengths_do_not_recompile():
    """GQA, Ev < E, a float mask that gets a gradient; two sequence lengths, one compilation."""
    counter = CompileCounterWithBackend("inductor")
    compiled = torch.compile(sdpa_block, backend=counter, fullgraph=True, dynamic=True)
    for i, (sq, skv) in enumerate(((5, 7), (8, 12))):
        leaves = [randn(2, 4, sq, 16), randn(2, 2, skv, 16, seed=1), randn(2, 2, skv, 8, seed=2),
                  randn(1, 4, sq, skv, seed=3)]
        w = randn(2, 4, sq, 8, seed=4)
        with lowering.compile_lowering():
            if i == 0:  # run_and_get_code resets Dynamo: only around the first call
                (got, got_grads), code = run_and_get_code(_outputs_and_grads, compiled, leaves, w)
            else:
                got, got_grads = _outputs_and_grads(compiled, leaves, w)
        want, want_grads = _outputs_and_grads(sdpa_block, leaves, w)
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
        for name, g, e in zip(("dq", "dk", "dv", "dmask"), got_grads, want_grads):
            torch.testing.assert_close(g, e, atol=1e-5, rtol=1e-5, msg=lambda m: f"{name}: {m}")
        if i == 0:
            joined = "\n".join(code)
            assert FA in joined and FA_GRAD in joined, joined
            assert "aten._scaled_dot_product" not in joined
    assert counter.frame_count == 1, "the second sequence length recompiled"


@pytest.mark.slow
def test_decode_inference_becomes_incre_flash_attention():
    q, k, v = randn(2, 4, 1, 16), randn(2, 2, 9, 16, seed=1), randn(2, 2, 9, 16, seed=2)
    mask = randn(2, 4, 1, 9, seed=3)  # additive: pse_shift is a view, so no C++ kernel needs compiling here

    def decode(q, k, v, mask):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)

    with lowering.compile_lowering(), torch.no_grad():
        out, (code,) = run_and_get_code(torch.compile(decode, fullgraph=True), q, k, v, mask)
        want = decode(q, k, v, mask)
    assert DECODE in code and FA not in code, code
    torch.testing.assert_close(out, want, atol=1e-5, rtol=1e-5)


@pytest.mark.slow
def test_unsupported_sdpa_stays_pytorch_under_lowering():
    q, k, v = (randn(2, 4, 5, 16, seed=i).double() for i in range(3))
    with lowering.compile_lowering(), torch.no_grad():
        out, (code,) = run_and_get_code(torch.compile(sdpa_block, fullgraph=True), q, k, v, None)
    assert "npu_fa" not in code
    torch.testing.assert_close(out, sdpa_block(q, k, v, None))


def test_enable_disable_keeps_other_custom_passes():
    def other(graph):
        pass

    saved = inductor_config.pre_grad_custom_pass, inductor_config.post_grad_custom_post_pass
    try:
        inductor_config.pre_grad_custom_pass = other
        lowering.enable_compile_lowering()
        lowering.enable_compile_lowering()  # idempotent
        assert inductor_config.pre_grad_custom_pass == [other, lowering._PRE_GRAD]
        assert inductor_config.post_grad_custom_post_pass == [lowering._POST_GRAD]
        assert lowering.compile_lowering_enabled()
        lowering.disable_compile_lowering()
        assert inductor_config.pre_grad_custom_pass == [other]
        assert inductor_config.post_grad_custom_post_pass is None
        with lowering.compile_lowering():
            assert lowering.compile_lowering_enabled()
        assert not lowering.compile_lowering_enabled()
    finally:
        inductor_config.pre_grad_custom_pass, inductor_config.post_grad_custom_post_pass = saved


def test_passes_have_a_stable_uuid_for_the_fx_cache():
    a, b = lowering._PRE_GRAD.uuid(), lowering._POST_GRAD.uuid()
    assert a and a == b == lowering.PreGradSdpaPass().uuid()


def test_pre_grad_pass_retargets_sdpa_nodes():
    gm = torch.fx.symbolic_trace(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True))
    lowering.PreGradSdpaPass()(gm.graph)
    gm.recompile()
    assert [n.target for n in gm.graph.nodes if n.op == "call_function"] == [lowering.lowered_sdpa]
    q, k, v = (randn(1, 2, 4, 8, seed=i) for i in range(3))
    torch.testing.assert_close(gm(q, k, v), F.scaled_dot_product_attention(q, k, v, is_causal=True))


def test_package_level_entry_points():
    import torch_ops_transformer as tot

    saved = inductor_config.pre_grad_custom_pass, inductor_config.post_grad_custom_post_pass
    try:
        with tot.compile_lowering():
            assert lowering.compile_lowering_enabled()
        assert not lowering.compile_lowering_enabled()
        tot.enable_compile_lowering()
        assert lowering.compile_lowering_enabled()
        tot.disable_compile_lowering()
        assert not lowering.compile_lowering_enabled()
    finally:
        inductor_config.pre_grad_custom_pass, inductor_config.post_grad_custom_post_pass = saved
