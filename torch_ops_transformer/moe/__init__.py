"""Mixture of Experts (docs/moe.md): gating and routing ops, grouped matmul, and MOELayer.

- `routing` — `npu_moe_gating_top_k_softmax(_v2)`, `npu_moe_gating_top_k` (+`_backward`),
  `npu_moe_init_routing(_v2)`, `npu_moe_compute_expert_tokens`, `npu_moe_finalize_routing`,
  `npu_moe_token_permute` / `_unpermute`.
- `grouped_matmul` — `npu_grouped_matmul`, `grouped_matmul`: per-expert matmul with fused bias and activation
  (also W8A8 and int8/int4 weight-only); `npu_grouped_matmul_swiglu_quant` (+ _v2); `npu_grouped_matmul_add(_)`
  (MindSpeed's grouped weight-gradient accumulation).
- `fused_ffn` — `moe_ffn`, `moe_ffn_prepack`, `MoeFfnWeights`: the fused expert FFN for inference.
- `layer` — `MOELayer`, single-process or expert-parallel.
- `blocks` — `DeepseekV3MoEBlock`, `Qwen3MoeBlock` (transformers' blocks on these ops, `from_hf`), `routed_experts`.
- `distribute` — `npu_moe_distribute_dispatch(_v2)` / `npu_moe_distribute_combine(_v2)`: expert-parallel token
  exchange on a torch.distributed group.
"""
from .grouped_matmul import (grouped_matmul, npu_grouped_matmul, npu_grouped_matmul_add, npu_grouped_matmul_add_,
                             npu_grouped_matmul_swiglu_quant, npu_grouped_matmul_swiglu_quant_v2)
from .blocks import DeepseekV3MoEBlock, Qwen3MoeBlock, routed_experts
from .fused_ffn import MoeFfnWeights, moe_ffn, moe_ffn_prepack
from .layer import MOELayer
from .routing import (
    npu_moe_compute_expert_tokens,
    npu_moe_finalize_routing,
    npu_moe_gating_top_k,
    npu_moe_gating_top_k_backward,
    npu_moe_gating_top_k_softmax,
    npu_moe_gating_top_k_softmax_v2,
    npu_moe_init_routing,
    npu_moe_init_routing_v2,
    npu_moe_token_permute,
    npu_moe_token_unpermute,
)

__all__ = ["DeepseekV3MoEBlock", "MOELayer", "MoeFfnWeights", "Qwen3MoeBlock", "moe_ffn", "moe_ffn_prepack",
           "routed_experts", "grouped_matmul", "npu_grouped_matmul", "npu_grouped_matmul_add", "npu_grouped_matmul_add_",
           "npu_grouped_matmul_swiglu_quant", "npu_grouped_matmul_swiglu_quant_v2", "npu_moe_compute_expert_tokens",
           "npu_moe_finalize_routing", "npu_moe_gating_top_k", "npu_moe_gating_top_k_backward",
           "npu_moe_gating_top_k_softmax",
           "npu_moe_gating_top_k_softmax_v2", "npu_moe_init_routing", "npu_moe_init_routing_v2",
           "npu_moe_token_permute", "npu_moe_token_unpermute"]

from .distribute import (  # noqa: E402
    npu_moe_distribute_combine,
    npu_moe_distribute_combine_v2,
    npu_moe_distribute_dispatch,
    npu_moe_distribute_dispatch_v2,
)

__all__ += ["npu_moe_distribute_combine", "npu_moe_distribute_combine_v2", "npu_moe_distribute_dispatch",
            "npu_moe_distribute_dispatch_v2"]
