"""`python -m torch_ops_transformer.bench moe`: grouped_matmul vs a Python loop of torch.mm per expert and vs
torch.nn.functional.grouped_mm on the same groups; MOELayer forward+backward vs a per-expert-loop MoE; then the
quantised grouped matmul, routing and expert-parallel dispatch/combine tables.

Speed-up = peer time / our time (same process, alternating contenders, median of --reps)."""
import torch
import torch.nn.functional as F

from ..moe.layer import MOELayer
from . import moe_distribute, moe_quant, moe_routing
from .common import format_table, gemm_gflops, time_alternating


def _counts(kind: str, experts: int, rows: int):
    if kind == "uniform":
        return [rows // experts] * experts
    # skewed: halves down to small groups, one empty group, the remainder on expert 0
    c = [rows // 2 ** (i + 1) for i in range(experts - 1)] + [0]
    c[0] += rows - sum(c)
    return c


def _loop_mm(x, w, counts):
    # Allocates its output per call, as grouped_matmul and F.grouped_mm must (a reused buffer would also skip the
    # page faults of a fresh output: ~8% of the time at M=8192, N=1024 fp32 on a 2-core AMD EPYC).
    out = x.new_empty(x.shape[0], w.shape[-1])
    r0 = 0
    for e, c in enumerate(counts):
        if c:
            torch.mm(x[r0:r0 + c], w[e], out=out[r0:r0 + c])
        r0 += c
    return out


def grouped_matmul_table(quick: bool, reps: int):
    cases = [("uniform", 8, 8192, 1024, 1024), ("skewed", 8, 8192, 1024, 1024), ("uniform", 64, 4096, 512, 512)]
    if quick:
        cases = [("uniform", 4, 64, 32, 32), ("skewed", 4, 64, 32, 32)]
    rows = []
    for dtype in (torch.float32, torch.bfloat16):
        for kind, e, m, k, n in cases:
            counts = _counts(kind, e, m)
            x = torch.randn(m, k, dtype=dtype)
            w = (torch.randn(e, k, n) / k ** 0.5).to(dtype)
            gl = torch.tensor(counts)
            offs = torch.cumsum(gl, 0).to(torch.int32)
            fns = {
                "ours": lambda: torch.ops.npu_fa.grouped_matmul([x], [w], [], gl, 0, 1, 0),
                "loop": lambda: _loop_mm(x, w, counts),
                "grouped_mm": lambda: F.grouped_mm(x, w, offs=offs),
            }
            ours = torch.ops.npu_fa.grouped_matmul([x], [w], [], gl, 0, 1, 0)[0][0]
            diff = (ours.float() - F.grouped_mm(x, w, offs=offs).float()).abs().max().item()
            t = time_alternating(fns, reps=reps)
            flops = 2 * m * k * n
            rows.append([kind, f"E={e} M={m} K={k} N={n}", str(dtype).replace("torch.", ""),
                         f"{t['ours'] * 1e3:.2f}", f"{t['loop'] * 1e3:.2f}", f"{t['grouped_mm'] * 1e3:.2f}",
                         f"{t['loop'] / t['ours']:.2f}x", f"{t['grouped_mm'] / t['ours']:.2f}x",
                         f"{flops / t['ours'] / 1e9:.0f}", f"{diff:.1e}"])
    head = f"grouped_matmul (group_type 0) vs per-expert torch.mm loop and F.grouped_mm, {torch.get_num_threads()} " \
           f"threads, median of {reps}, same-run GEMM fp32 {gemm_gflops(torch.float32):.0f} GFLOP/s, " \
           f"bf16 {gemm_gflops(torch.bfloat16):.0f} GFLOP/s"
    print(head + "\n")
    print(format_table(["groups", "shape", "dtype", "ours ms", "loop ms", "grouped_mm ms", "vs loop",
                        "vs grouped_mm", "ours GFLOP/s", "max|ours-grouped_mm|"], rows))
    print()


class LoopMoE(torch.nn.Module):
    """The straightforward MoE: router, then for each expert gather its tokens, run its FFN, scatter back."""

    def __init__(self, layer: MOELayer):
        super().__init__()
        self.layer = layer

    def forward(self, x):
        m = self.layer
        x2 = x.reshape(-1, m.input_dim)
        # The layer's own gating, so both contenders route identically (torch.topk orders bf16 ties arbitrarily).
        top_w, top_e, _ = m.gating(x2)
        top_e = top_e.long()
        out = torch.zeros_like(x2)
        for e in range(m.num_experts):
            tok, slot = (top_e == e).nonzero(as_tuple=True)
            if tok.numel() == 0:
                continue
            h = F.gelu(x2[tok] @ m.w1[e] + m.b1[e], approximate="tanh")
            y = h @ m.w2[e] + m.b2[e]
            out.index_add_(0, tok, y * top_w[tok, slot].unsqueeze(1).to(y.dtype))
        return out.reshape(x.shape)


def moe_layer_table(quick: bool, reps: int):
    tokens, hidden, experts, k = (64, 32, 4, 2) if quick else (4096, 1024, 8, 2)
    rows = []
    for dtype in (torch.float32, torch.bfloat16):
        torch.manual_seed(0)
        layer = MOELayer(input_dim=hidden, num_experts=experts, top_k=k, dtype=dtype)
        loop = LoopMoE(layer)
        x = torch.randn(tokens, hidden, dtype=dtype, requires_grad=True)
        dy = torch.randn(tokens, hidden, dtype=dtype)

        def step(model):
            def run():
                for p in layer.parameters():
                    p.grad = None
                x.grad = None
                model(x).backward(dy)
            return run

        diff = (layer(x) - loop(x)).abs().max().item()
        t = time_alternating({"ours": step(layer), "loop": step(loop)}, reps=reps)
        rows.append([f"T={tokens} H={hidden} F={layer.hidden_dim} E={experts} top-{k}", str(dtype).replace("torch.", ""),
                     f"{t['ours'] * 1e3:.1f}", f"{t['loop'] * 1e3:.1f}", f"{t['loop'] / t['ours']:.2f}x",
                     f"{diff:.1e}"])
    print(f"MOELayer forward+backward (dropless) vs per-expert-loop MoE, {torch.get_num_threads()} threads, "
          f"median of {reps}\n")
    print(format_table(["shape", "dtype", "ours ms", "loop ms", "speed-up", "max|ours-loop| fwd"], rows))
    print()


def main(quick: bool = False, reps: int = 5,
         tables=("grouped_matmul", "quant", "moe_layer", "routing", "distribute")):
    if "grouped_matmul" in tables:
        grouped_matmul_table(quick, reps)
    if "quant" in tables:  # W8A8 / weight-only grouped matmul (also `bench moe_quant`)
        moe_quant.main(quick=quick, reps=reps)
    if "moe_layer" in tables:
        moe_layer_table(quick, reps)
    if "routing" in tables:  # the routing ops' table (also `bench moe_routing`)
        moe_routing.main(quick=quick, reps=reps)
    if "distribute" in tables:  # expert-parallel dispatch/combine on 2 gloo ranks (also `bench moe-distribute`)
        moe_distribute.main(quick=quick, reps=reps)
