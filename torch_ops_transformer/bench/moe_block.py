"""`python -m torch_ops_transformer.bench moe_block`: our DeepSeek-V3 / Qwen3-MoE blocks (moe.blocks) vs transformers'
own blocks with the same weights — its eager experts (a loop over the hit experts) and its grouped_mm experts (the
default it picks on CPU) — forward (serving) and forward+backward (training); then the W8A8 DeepSeek-V3 block
(`quantize_experts`) against our bf16 block, forward.

Speed-up = transformers' time / ours (same process, alternating contenders, median of --reps). Needs transformers."""
import copy
import sys

import torch

from ..moe.blocks import DeepseekV3MoEBlock, Qwen3MoeBlock
from .common import format_table, time_alternating


def _blocks(kind: str, quick: bool, dtype: torch.dtype):
    # lazy: transformers (optional: main() skips the table without it)
    import transformers
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3MoE
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock

    h, i, e, k = (64, 32, 16, 4) if quick else (512, 128, 64, 8)
    if kind == "DeepSeek-V3":
        cfg = transformers.DeepseekV3Config(hidden_size=h, moe_intermediate_size=i, n_routed_experts=e,
                                            num_experts_per_tok=k, n_group=8 if not quick else 4,
                                            topk_group=4 if not quick else 2, n_shared_experts=1,
                                            routed_scaling_factor=2.5, norm_topk_prob=True)
        make, ours_cls, shape = DeepseekV3MoE, DeepseekV3MoEBlock, f"H={h} I={i} E={e} k={k} groups 4/8 +shared"
    else:
        cfg = transformers.Qwen3MoeConfig(hidden_size=h, moe_intermediate_size=i, num_experts=e, num_experts_per_tok=k,
                                          norm_topk_prob=True)
        make, ours_cls, shape = Qwen3MoeSparseMoeBlock, Qwen3MoeBlock, f"H={h} I={i} E={e} k={k}"
    torch.manual_seed(0)
    base = make(cfg)
    with torch.no_grad():
        for p in base.parameters():
            p.normal_(0, 0.05)
    base = base.to(dtype)
    eager, grouped = base, copy.deepcopy(base)  # a deep copy has its own config object
    eager.experts.config._experts_implementation = "eager"
    grouped.experts.config._experts_implementation = "grouped_mm"
    return {"ours": ours_cls.from_hf(copy.deepcopy(base)), "eager": eager, "grouped_mm": grouped}, shape, h


def main(quick: bool = False, reps: int = 5):
    try:
        import transformers  # lazy: transformers (optional: without it this table is skipped)
    except ImportError:
        print("moe_block: transformers is not installed; skipped")
        return
    rows = []
    token_counts = (16,) if quick else (8, 256)
    for kind in ("DeepSeek-V3", "Qwen3-MoE"):
        for dtype in (torch.float32, torch.bfloat16):
            blocks, shape, hidden = _blocks(kind, quick, dtype)
            for tokens in token_counts:
                x = torch.randn(1, tokens, hidden, dtype=dtype)
                dy = torch.randn_like(x)
                for mode in ("fwd", "fwd+bwd"):
                    def step(block, mode=mode):
                        if mode == "fwd":
                            def run():
                                with torch.no_grad():
                                    block(x)
                        else:
                            xg = x.clone().requires_grad_()

                            def run():
                                block.zero_grad(set_to_none=True)
                                block(xg).backward(dy)
                        return run

                    with torch.no_grad():
                        ref = blocks["eager"](x)
                        diff = (blocks["ours"](x).float() - ref.float()).abs().max().item()
                    t = time_alternating({n: step(b) for n, b in blocks.items()}, reps=reps)
                    rows.append([kind, shape, str(dtype).replace("torch.", ""), str(tokens), mode,
                                 f"{t['ours'] * 1e3:.2f}", f"{t['eager'] * 1e3:.2f}", f"{t['grouped_mm'] * 1e3:.2f}",
                                 f"{t['eager'] / t['ours']:.2f}x", f"{t['grouped_mm'] / t['ours']:.2f}x",
                                 f"{diff:.1e}"])
                    print(" ".join(rows[-1]), file=sys.stderr, flush=True)  # progress: the table comes at the end
    print(f"MoE blocks: ours vs transformers {transformers.__version__} (eager and grouped_mm experts), same weights, "
          f"{torch.get_num_threads()} threads, median of {reps}\n")
    print(format_table(["block", "shape", "dtype", "tokens", "pass", "ours ms", "hf eager ms", "hf grouped_mm ms",
                        "vs eager", "vs grouped_mm", "max|ours-eager| fwd"], rows))
    print()
    w8a8_table(quick, reps)


def w8a8_table(quick: bool, reps: int):
    """Forward of the DeepSeek-V3 block with W8A8 experts vs the same block in bf16 (same weights; the gate and the
    shared expert are bf16 in both); errors relative to the block in float32."""
    # lazy: transformers (optional: main() skips the table without it)
    import transformers
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3MoE

    shapes = [(64, 32, 16, 4, 4, 2)] if quick else [(512, 128, 64, 8, 8, 4), (2048, 512, 16, 4, 4, 2)]
    rows = []
    for h, i, e, k, groups, kept in shapes:
        cfg = transformers.DeepseekV3Config(hidden_size=h, moe_intermediate_size=i, n_routed_experts=e,
                                            num_experts_per_tok=k, n_group=groups, topk_group=kept,
                                            n_shared_experts=1, routed_scaling_factor=2.5, norm_topk_prob=True)
        torch.manual_seed(0)
        base = DeepseekV3MoE(cfg)
        with torch.no_grad():
            for p in base.parameters():
                p.normal_(0, 0.05)
        # the reference: the same bf16-rounded weights in float32 (the router too, so the routing agrees)
        fp32 = DeepseekV3MoEBlock.from_hf(copy.deepcopy(base).to(torch.bfloat16).float())
        bf16 = DeepseekV3MoEBlock.from_hf(copy.deepcopy(base).to(torch.bfloat16))
        w8a8 = DeepseekV3MoEBlock.from_hf(copy.deepcopy(base).to(torch.bfloat16)).quantize_experts()
        for tokens in ((16,) if quick else (8, 256)):
            x = torch.randn(tokens, h, dtype=torch.bfloat16)
            with torch.no_grad():
                ref = fp32(x.float())
                rel = {n: ((b(x).float() - ref).abs().max() / ref.abs().max()).item()
                       for n, b in (("bf16", bf16), ("w8a8", w8a8))}

            def fwd(block):
                def run():
                    with torch.no_grad():
                        block(x)
                return run

            t = time_alternating({"w8a8": fwd(w8a8), "bf16": fwd(bf16)}, reps=reps)
            rows.append([f"H={h} I={i} E={e} k={k} +shared", str(tokens), f"{t['w8a8'] * 1e3:.2f}",
                         f"{t['bf16'] * 1e3:.2f}", f"{t['bf16'] / t['w8a8']:.2f}x", f"{rel['w8a8']:.1e}",
                         f"{rel['bf16']:.1e}"])
    print(f"DeepSeek-V3 block forward, W8A8 experts (quantize_experts) vs bf16, same weights, "
          f"{torch.get_num_threads()} threads, median of {reps}; errors: max|block - fp32 block| / max|fp32 block|\n")
    print(format_table(["block", "tokens", "w8a8 ms", "bf16 ms", "bf16/w8a8", "w8a8 rel err", "bf16 rel err"], rows))
    print()
