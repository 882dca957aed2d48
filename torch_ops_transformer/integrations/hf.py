"""Hugging Face transformers drop-in: the attention implementation "npu_fa".

    import torch_ops_transformer as tot
    model = AutoModelForCausalLM.from_pretrained(path, attn_implementation="npu_fa")
    # or, for a model that is already built (a one-call helper):
    model = tot.replace_attention_with_flash(model)

and the MoE side (docs/moe.md): `experts_implementation="npu_moe"` runs the experts of any transformers MoE model
whose experts use `@use_experts_implementation` through our routing ops and grouped_matmul, and
`replace_moe_blocks(model)` swaps whole DeepSeek-V3 / Qwen3-MoE blocks (gating included) for ours.

transformers calls every attention layer through `AttentionInterface` with q/k/v in [B, H, S, D]. Our function
hands them to `integrations.sdpa.scaled_dot_product_attention`, which has PyTorch SDPA's semantics and
routes prefill to the FlashAttention kernel and one-token decode steps to the decode kernel. Because the router
speaks SDPA, "npu_fa" asks transformers for exactly the mask "sdpa" gets (`sdpa_mask`: a boolean [B, 1, Sq, Skv]
mask, True = attend, or None when a plain causal / unmasked pattern is enough).

transformers is an optional dependency: `import torch_ops_transformer` does not import it. "npu_fa" is registered
by `_hf_autoregister` as soon as transformers defines its attention interface (transformers.modeling_utils is
imported, before or after torch_ops_transformer) and by importing this module; `register_hf_attention()` does the
same by hand (idempotent).
Without transformers, importing this module raises an ImportError whose message is one line naming the package
and its install command.
"""
from typing import Optional, Tuple

import torch

from .._internal.optional import require

# else a one-line ImportError naming the package
require("transformers", "torch_ops_transformer.integrations.hf (attn_implementation='npu_fa')")
from transformers import AttentionInterface, AttentionMaskInterface  # noqa: E402
from transformers.masking_utils import sdpa_mask  # noqa: E402

from ..moe import blocks  # noqa: E402
from .sdpa import scaled_dot_product_attention  # noqa: E402

ATTN_IMPLEMENTATION = "npu_fa"


def npu_fa_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: Optional[torch.Tensor],
    dropout: float = 0.0,
    scaling: Optional[float] = None,
    is_causal: Optional[bool] = None,
    position_bias: Optional[torch.Tensor] = None,
    **kwargs,
) -> Tuple[torch.Tensor, None]:
    """transformers' attention-function contract: q/k/v [B, H, S, D] in, ([B, Sq, H, Dv], None) out.

    The model-specific keyword arguments transformers' attention layers pass are honoured: `s_aux` (gpt-oss's
    per-head attention sinks) becomes the kernel's `sink`, `softcap` (Gemma-2's attn_logit_softcapping) the
    kernel's soft-capping (plain-PyTorch math where this build's kernel lacks it), and `sliding_window` is already
    in the mask transformers builds for the layer; when a caller passes no mask, the window is applied here."""
    sink, softcap, window = kwargs.get("s_aux"), kwargs.get("softcap"), kwargs.get("sliding_window")
    q_len, kv_len = query.shape[2], key.shape[2]
    # The same causal decision as transformers' "sdpa": a decode step (q_len 1) sees the whole cache, and an
    # explicit mask already carries causality and padding.
    is_causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    causal_layer = bool(is_causal)
    is_causal = bool(q_len > 1 and attention_mask is None and is_causal)
    if is_causal and kv_len > q_len:
        # Prefill into an empty static cache: SDPA's causal mask is top-left aligned, so the unwritten cache tail
        # is never visible; dropping it saves the work.
        key, value = key[:, :, :q_len], value[:, :, :q_len]
        if position_bias is not None:
            position_bias = position_bias[..., :q_len]
    if attention_mask is None and window is not None and causal_layer and key.shape[2] > window:
        # No mask from the caller: apply transformers' window (query i sees keys i - window < j <= i) with the same
        # alignment as the causal decision above: a decode step is the last position, a prefill starts at 0.
        if q_len == 1:
            key, value = key[:, :, -window:], value[:, :, -window:]
            if position_bias is not None:
                position_bias = position_bias[..., -window:]
        elif is_causal:
            i = torch.arange(q_len, device=query.device)[:, None]
            j = torch.arange(key.shape[2], device=query.device)[None, :]
            attention_mask, is_causal = (j <= i) & (j > i - window), False
    if position_bias is not None:  # additive bias per layer (e.g. T5-style): fold it into a float mask
        from transformers.integrations.sdpa_attention import create_position_bias_mask  # lazy: rarely needed

        attention_mask = create_position_bias_mask(position_bias, attention_mask, is_causal, query, key)
        is_causal = False
    out = scaled_dot_product_attention(
        query, key, value, attn_mask=attention_mask, dropout_p=dropout, is_causal=is_causal, scale=scaling,
        enable_gqa=query.shape[1] != key.shape[1], sink=sink, softcap=softcap)
    return out.transpose(1, 2).contiguous(), None


def register_hf_attention() -> str:
    """Register "npu_fa" with transformers' attention and mask interfaces (idempotent); returns the name.

    Custom names without a mask registration get no mask at all from transformers (padding would be ignored), so
    the mask interface is registered too, with the boolean mask that "sdpa" uses.
    """
    AttentionInterface.register(ATTN_IMPLEMENTATION, npu_fa_attention_forward)
    AttentionMaskInterface.register(ATTN_IMPLEMENTATION, sdpa_mask)
    return ATTN_IMPLEMENTATION


def replace_attention_with_flash(model: torch.nn.Module) -> torch.nn.Module:
    """Switch a transformers model (all its attention layers) to "npu_fa", registering it if needed.

    A one-call helper: instead of swapping modules, it changes the attention function every layer
    dispatches to, so weights, RoPE, the KV cache and generation stay transformers' own.
    """
    if not hasattr(model, "set_attn_implementation") or not hasattr(model, "config"):
        raise TypeError(f"replace_attention_with_flash: model must be a transformers PreTrainedModel, "
                        f"got {type(model).__name__}")
    if not model._can_set_attn_implementation():
        raise ValueError(f"replace_attention_with_flash: {type(model).__name__} does not dispatch attention through "
                         f"transformers' AttentionInterface, so its attention cannot be switched to "
                         f"'{ATTN_IMPLEMENTATION}'")
    model.set_attn_implementation(register_hf_attention())
    return model


EXPERTS_IMPLEMENTATION = "npu_moe"


def npu_moe_experts_forward(module: torch.nn.Module, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                            top_k_weights: torch.Tensor) -> torch.Tensor:
    """transformers' experts-function contract (`ExpertsInterface`): the experts of a `@use_experts_implementation`
    module (hidden_states [N, H], top_k_index / top_k_weights [N, k]) -> [N, H], run as moe_init_routing_v2 ->
    grouped_matmul (gate/up) -> the module's own gate function -> grouped_matmul (down) -> moe_finalize_routing.
    The module's gate function (`_apply_gate`) keeps model-specific gating (interleaved gate/up, clamped SwiGLU)."""
    for flag, ok in (("has_gate", True), ("has_post_expert_norm", False)):
        if getattr(module, flag, ok) != ok:
            raise NotImplementedError(f"experts_implementation='{EXPERTS_IMPLEMENTATION}': experts with "
                                      f"{flag}={not ok} ({type(module).__name__}) are not supported")
    w_gate_up, w_down = module.gate_up_proj, module.down_proj
    if not getattr(module, "is_transposed", False):  # stored [E, N, K]: grouped_matmul takes [E, K, N] views
        w_gate_up, w_down = w_gate_up.transpose(1, 2), w_down.transpose(1, 2)
    has_bias = getattr(module, "has_bias", False)
    out = blocks.routed_experts(hidden_states, top_k_index, top_k_weights, w_gate_up, w_down, glu=module._apply_gate,
                         bias_gate_up=module.gate_up_proj_bias if has_bias else None,
                         bias_down=module.down_proj_bias if has_bias else None)
    return out.to(hidden_states.dtype)


def register_hf_experts() -> str:
    """Register "npu_moe" with transformers' experts interface (idempotent); returns the name. Then
    `from_pretrained(..., experts_implementation="npu_moe")` or `model.set_experts_implementation("npu_moe")`."""
    from transformers.integrations.moe import ExpertsInterface  # lazy: optional (not in every transformers release)

    ExpertsInterface.register(EXPERTS_IMPLEMENTATION, npu_moe_experts_forward)
    return EXPERTS_IMPLEMENTATION


# transformers' MoE block classes (by class name, so no model module is imported) -> our block's constructor.
def _moe_block_types():
    # GLM-4.5's block (Glm4MoeMoE) is DeepSeek-V3's: same router, experts and shared expert.
    return {"DeepseekV3MoE": blocks.DeepseekV3MoEBlock.from_hf, "Glm4MoeMoE": blocks.DeepseekV3MoEBlock.from_hf,
            "Qwen3MoeSparseMoeBlock": blocks.Qwen3MoeBlock.from_hf}


def replace_moe_blocks(model: torch.nn.Module, process_group=None) -> torch.nn.Module:
    """Swap every DeepSeek-V3 (`DeepseekV3MoE`; also GLM-4.5's identical `Glm4MoeMoE`) and Qwen3-MoE
    (`Qwen3MoeSparseMoeBlock`) block of a transformers model for ours (`DeepseekV3MoEBlock` / `Qwen3MoeBlock`):
    gating by moe_gating_top_k(_softmax_v2), experts by the routing ops and grouped_matmul. The new blocks share
    the old ones' parameters and names, so the state dict, saving and loading are unchanged. Returns the model
    (modified in place); a model without such blocks is a ValueError. With a torch.distributed `process_group`,
    each block keeps this rank's share of the routed experts and runs expert-parallel (`shard_experts`)."""
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"replace_moe_blocks: argument 'model' must be a torch.nn.Module; got {type(model).__name__}")
    convert = _moe_block_types()
    targets = [(name, m) for name, m in model.named_modules() if type(m).__name__ in convert]
    if not targets:
        raise ValueError(f"replace_moe_blocks: {type(model).__name__} has no block of a supported type "
                         f"({', '.join(convert)})")
    for name, m in targets:
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        block = convert[type(m).__name__](m)
        setattr(parent, child, block if process_group is None else block.shard_experts(process_group))
    return model


# Importing this module means using it; this also covers the case where importing transformers above is what
# loaded transformers.modeling_utils (then the import hook of _hf_autoregister defers to this line).
register_hf_attention()
register_hf_experts()
