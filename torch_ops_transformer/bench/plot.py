"""`python -m torch_ops_transformer.bench <table> --plot out.png`: time and memory vs sequence length, as a PNG.

A sweep over sequence lengths of causal attention, B=1 N=8 D=128: our `flash_attention_score` vs
`F.scaled_dot_product_attention` (same process, alternating, median — bench/common.py), forward and
forward+backward, fp32 and bf16; and the peak resident-memory growth of one fp32 forward of ours, torch SDPA and
the math path softmax(QKᵀ)V, each in a fresh process. matplotlib is an optional dependency, needed only here.
"""
from typing import Dict, List, Sequence

import torch

from .._internal.optional import require
from . import attention
from .common import format_table

SEQS = (512, 1024, 2048, 4096)
QUICK_SEQS = (128, 256)
HEADS, HEAD_DIM = 8, 128
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def _pyplot():
    matplotlib = require("matplotlib", "torch_ops_transformer bench --plot")  # the tables run without it
    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt  # lazy: matplotlib (optional, and the backend must be chosen first)

    return plt


def measure(seqs: Sequence[int], reps: int, heads: int = HEADS, head_dim: int = HEAD_DIM) -> Dict[str, object]:
    """Seconds per call {(dtype, pass, contender): [per seq]} and peak-memory MiB {contender: [per seq]}."""
    times: Dict[tuple, List[float]] = {}
    for dt_name, dtype in DTYPES.items():
        for seq in seqs:
            fwd, both = attention.run_case(attention.Case("dense", 1, heads, heads, seq, head_dim, dtype, True), reps)
            for who in ("ours", "torch"):
                times.setdefault((dt_name, "forward", who), []).append(fwd[who])
                times.setdefault((dt_name, "fwd+bwd", who), []).append(both[who])
            print(f"  plot sweep: {dt_name} S={seq} timed", flush=True)
    memory = {name: [attention.memory_growth_fresh_process(name, seq, heads, head_dim) / 2**20 for seq in seqs]
              for name in attention.MEMORY_CONTENDERS}
    print("  plot sweep: memory measured", flush=True)
    return {"seqs": list(seqs), "times": times, "memory": memory, "heads": heads, "head_dim": head_dim}


def sweep_table(data) -> str:
    rows = []
    for i, seq in enumerate(data["seqs"]):
        for dt_name in DTYPES:
            t = {(p, w): data["times"][(dt_name, p, w)][i] * 1e3
                 for p in ("forward", "fwd+bwd") for w in ("ours", "torch")}
            rows.append([seq, dt_name, f"{t['forward', 'ours']:.1f}", f"{t['forward', 'torch']:.1f}",
                         f"{t['forward', 'torch'] / t['forward', 'ours']:.2f}x", f"{t['fwd+bwd', 'ours']:.1f}",
                         f"{t['fwd+bwd', 'torch']:.1f}", f"{t['fwd+bwd', 'torch'] / t['fwd+bwd', 'ours']:.2f}x"]
                        + [f"{data['memory'][m][i]:.0f}" for m in attention.MEMORY_CONTENDERS])
    return format_table(["S", "dtype", "fwd ours ms", "fwd torch ms", "fwd speed-up", "fwd+bwd ours ms",
                         "fwd+bwd torch ms", "fwd+bwd speed-up"]
                        + [f"fp32 fwd peak MiB {m}" for m in attention.MEMORY_CONTENDERS], rows)


def draw(data, path: str) -> None:
    plt = _pyplot()
    seqs = data["seqs"]
    colors = {"fp32": "tab:blue", "bf16": "tab:orange"}
    fig, axes = plt.subplots(2, 2, figsize=(12, 9))
    for ax, pass_name in zip(axes[0], ("forward", "fwd+bwd")):
        for dt_name in DTYPES:
            for who, style, label in (("ours", "-o", "ours"), ("torch", "--s", "torch SDPA")):
                ax.plot(seqs, [t * 1e3 for t in data["times"][(dt_name, pass_name, who)]], style,
                        color=colors[dt_name], label=f"{label} {dt_name}")
        ax.set_title(f"{pass_name} time (lower is better)")
        ax.set_ylabel("ms per call (median)")
    ax = axes[1][0]
    for dt_name in DTYPES:
        for pass_name, style in (("forward", "-o"), ("fwd+bwd", "--s")):
            theirs, ours = data["times"][(dt_name, pass_name, "torch")], data["times"][(dt_name, pass_name, "ours")]
            ax.plot(seqs, [th / to for th, to in zip(theirs, ours)], style, color=colors[dt_name],
                    label=f"{pass_name} {dt_name}")
    ax.axhline(1.0, color="gray", lw=1)
    ax.set_title("speed-up = torch SDPA time / our time (higher is better)")
    ax.set_ylabel("speed-up (x)")
    ax = axes[1][1]
    for name, style in zip(attention.MEMORY_CONTENDERS, ("-o", "--s", ":^")):
        ax.plot(seqs, [max(m, 0.1) for m in data["memory"][name]], style, label=name)
    ax.set_yscale("log")
    ax.set_title("peak RSS growth of one fp32 forward (fresh process)")
    ax.set_ylabel("MiB (log scale)")
    for ax in axes.flat:
        ax.set_xscale("log", base=2)
        ax.set_xticks(seqs, [str(s) for s in seqs])
        ax.set_xlabel("sequence length S")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    for ax in axes[0]:
        ax.set_yscale("log")
    plain = plt.FuncFormatter(lambda v, _: f"{v:g}")  # 20 rather than 2×10¹ on the log axes
    for ax in (*axes[0], axes[1][1]):
        ax.yaxis.set_major_formatter(plain)
    fig.suptitle(f"causal attention, B=1 N={data['heads']} D={data['head_dim']}, "
                 f"{torch.get_num_threads()} threads: torch_ops_transformer vs PyTorch SDPA (CPU)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(path: str, quick: bool = False, reps: int = 3) -> None:
    _pyplot()  # fail before the sweep, not after it
    print(f"# plot sweep: causal attention B=1 N={HEADS} D={HEAD_DIM}, ours vs torch SDPA, median of {reps}")
    data = measure(QUICK_SEQS if quick else SEQS, reps)
    print(sweep_table(data))
    draw(data, path)
    print(f"plot saved to {path}")
