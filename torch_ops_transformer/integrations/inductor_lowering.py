"""Inductor passes that lower attention in `torch.compile`d graphs to our ops, without touching user code.

Two custom passes (installed by `enable_compile_lowering()` / `compile_lowering()`):

1. pre-grad (`torch._inductor.config.pre_grad_custom_pass`): every `F.scaled_dot_product_attention` node of the
   Dynamo graph is retargeted to `lowered_sdpa`, our router. AOT autograd then traces through it, so in training the
   forward *and* backward graphs hold npu_fa::flash_attention_score / flash_attention_score_grad (our op's autograd
   formula), and in inference a one-token decode becomes npu_fa::incre_flash_attention. Unsupported calls trace
   into PyTorch's SDPA as before.
2. post-grad, inference graphs only (`post_grad_custom_post_pass`, a CustomInferenceAwareGraphPass): Inductor's own
   `fuse_attention` pattern pass turns hand-written softmax(Q·Kᵀ·scale [+ mask])·V into
   aten._scaled_dot_product_flash_attention_for_cpu; a pattern_matcher pattern replaces each such node whose
   logsumexp is unused by our router (traced with `replace_by_example`). In training graphs the logsumexp feeds the
   backward, so those are left to PyTorch.

Both passes implement `uuid()` (a hash of this file and sdpa.py), so Inductor's FX graph cache keys include them.
"""
import contextlib
import operator

import torch
from torch._inductor import config as inductor_config
from torch._inductor.custom_graph_pass import (
    CustomGraphPass,
    CustomInferenceAwareGraphPass,
    get_hash_for_files,
)
from torch._inductor.pattern_matcher import (
    CallFunction,
    CallFunctionVarArgs,
    Match,
    PatternMatcherPass,
    register_graph_pattern,
)

from . import sdpa

_aten = torch.ops.aten
_SDPA_TARGETS = (torch._C._nn.scaled_dot_product_attention, _aten.scaled_dot_product_attention.default)
_FLASH_CPU = _aten._scaled_dot_product_flash_attention_for_cpu.default


def _uuid() -> bytes:
    return get_hash_for_files((__file__, sdpa.__file__))


def lowered_sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    """The call an SDPA node is retargeted to: our router (its name shows up in the pre-grad graph)."""
    return sdpa.scaled_dot_product_attention(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)


class PreGradSdpaPass(CustomGraphPass):
    """Retargets F.scaled_dot_product_attention nodes of the pre-grad (Dynamo) graph to `lowered_sdpa`."""

    def __call__(self, graph: torch.fx.Graph) -> None:
        for node in graph.nodes:
            if node.op == "call_function" and node.target in _SDPA_TARGETS:
                node.target = lowered_sdpa

    def uuid(self) -> bytes:
        return _uuid()


# ---- inference: aten._scaled_dot_product_flash_attention_for_cpu (from fuse_attention) -> our router ----------
_flash_patterns = PatternMatcherPass(pass_name="npu_fa_flash_for_cpu")


def _flash_args(node: torch.fx.Node):
    """(query, key, value, attn_mask, dropout_p, is_causal, scale) of a flash_for_cpu node."""
    # schema: (query, key, value, float dropout_p=0., bool is_causal=False, *, Tensor? attn_mask, float? scale)
    a = list(node.args) + [None] * (5 - len(node.args))
    dropout_p = a[3] if a[3] is not None else node.kwargs.get("dropout_p", 0.0)
    is_causal = a[4] if a[4] is not None else node.kwargs.get("is_causal", False)
    return a[0], a[1], a[2], node.kwargs.get("attn_mask"), dropout_p, is_causal, node.kwargs.get("scale")


def _val(x):
    return x.meta.get("val") if isinstance(x, torch.fx.Node) else x


@register_graph_pattern(CallFunction(operator.getitem, CallFunctionVarArgs(_FLASH_CPU), 0),
                        pass_dict=_flash_patterns)
def _replace_flash_cpu(match: Match, *args, **kwargs) -> None:
    flash = next(n for n in match.nodes if n.target is _FLASH_CPU)
    q, k, v, mask, dropout_p, is_causal, scale = _flash_args(flash)
    vals = [_val(x) for x in (q, k, v, mask)]
    if any(x is None for x in vals[:3]) or (mask is not None and vals[3] is None):
        return
    if sdpa.unsupported_reason(*vals[:3], vals[3], dropout_p, is_causal, scale, True) is not None:
        return

    def with_mask(q, k, v, mask):  # replace_by_example traces every parameter: one function per arity
        return sdpa.scaled_dot_product_attention(q, k, v, mask, dropout_p, is_causal, scale, True)

    def without_mask(q, k, v):
        return sdpa.scaled_dot_product_attention(q, k, v, None, dropout_p, is_causal, scale, True)

    if mask is None:
        match.replace_by_example(without_mask, [q, k, v])
    else:
        match.replace_by_example(with_mask, [q, k, v, mask])


class PostGradInferencePass(CustomInferenceAwareGraphPass):
    """Replaces flash_for_cpu nodes in inference graphs (where only the attention output is used)."""

    def __call__(self, graph: torch.fx.Graph, is_inference: bool) -> None:
        if is_inference:
            _flash_patterns.apply(graph)

    def uuid(self) -> bytes:
        return _uuid()


_PRE_GRAD = PreGradSdpaPass()
_POST_GRAD = PostGradInferencePass()


def _as_list(p) -> list:
    return [] if p is None else list(p) if isinstance(p, (list, tuple)) else [p]


def enable_compile_lowering() -> None:
    """Installs both passes in torch._inductor.config (next to any custom passes already set). Idempotent."""
    for name, p in (("pre_grad_custom_pass", _PRE_GRAD), ("post_grad_custom_post_pass", _POST_GRAD)):
        passes = _as_list(getattr(inductor_config, name))
        if p not in passes:
            setattr(inductor_config, name, passes + [p])


def disable_compile_lowering() -> None:
    """Removes our passes again (other custom passes stay)."""
    for name, p in (("pre_grad_custom_pass", _PRE_GRAD), ("post_grad_custom_post_pass", _POST_GRAD)):
        passes = [x for x in _as_list(getattr(inductor_config, name)) if x is not p]
        setattr(inductor_config, name, passes or None)


def compile_lowering_enabled() -> bool:
    return _PRE_GRAD in _as_list(inductor_config.pre_grad_custom_pass)


@contextlib.contextmanager
def compile_lowering():
    """Within the block, graphs compiled by Inductor get our attention ops. Compilation happens on the first call
    of a compiled function, so that call must be inside the block."""
    was = compile_lowering_enabled()
    enable_compile_lowering()
    try:
        yield
    finally:
        if not was:
            disable_compile_lowering()
