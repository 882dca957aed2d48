"""`python -m torch_ops_transformer.bench gdn`: Gated DeltaNet (Qwen3-Next's linear attention) against transformers'
own PyTorch implementation (models/qwen3_next: torch_chunk_gated_delta_rule, torch_recurrent_gated_delta_rule) in the
same process, contenders alternating, median.

Sizes: a tensor-parallel shard of Qwen3-Next's linear attention, 2 key heads and 4 value heads of dim 128 (the model
has 16 / 32 over 8 devices), bf16 inputs (both contenders accumulate in fp32), one sequence, q/k L2-normalised, g in
log space (<= 0), beta in (0, 1), scale 1/sqrt(128).
- prefill: `npu_chunk_gated_delta_rule` over T tokens with an initial state, vs transformers' chunked form (chunk 64);
  the GFLOP/s column counts the products of our kernel's chunked algorithm (`chunk_flops` with its 32-token
  chunks), and "GEMM share" divides that rate by
  a same-run fp32 matmul's.
- training: forward + backward of the same call (gradients of q, k, v, beta, g and the initial state) vs autograd
  through transformers' chunked form.
- decode: one token per sequence for B sequences, `npu_recurrent_gated_delta_rule` updating a state cache in place
  (ssm_state_indices) vs transformers' recurrent form; run after prefills of two context lengths to show the step
  cost does not depend on the context (the state is [Nv, Dv, Dk] whatever the length).
Checks (a failure ends the command after the tables): each of our results agrees with transformers' within the bf16
tolerance of the comparison.
"""
import dataclasses
import importlib
from typing import Callable, List, Optional, Tuple

import torch
import torch.nn.functional as F

from ..linear_attention import npu_chunk_gated_delta_rule, npu_recurrent_gated_delta_rule
from .common import format_table, gemm_gflops, machine_line, time_alternating

NK, NV, D = 2, 4, 128
CHUNK = 64         # transformers' chunk (its default, the model's)
KERNEL_CHUNK = 32  # our CPU kernel's (kGdnChunk in aten_ops/cpu/linear_attention/chunk_gated_delta_rule_kernels.h)


def _transformers_gdn() -> Tuple[Callable, Callable]:
    """transformers' (chunked, recurrent) gated delta rule functions; ImportError when transformers lacks them
    (imported on use: transformers is an optional dependency)."""
    mod = importlib.import_module("transformers.models.qwen3_next.modeling_qwen3_next")
    return mod.torch_chunk_gated_delta_rule, mod.torch_recurrent_gated_delta_rule


def chunk_flops(T: int, nv: int = NV, dk: int = D, dv: int = D, c: int = KERNEL_CHUNK) -> float:
    """Flops of the chunked forward's products for T tokens. Multiply-adds per chunk of C tokens and value head:
    K·Kᵀ and Q·Kᵀ (C²·Dk each), the triangular solve applied to β·K and β·V (C²·(Dk + Dv)), the masked
    (Q·Kᵀ)·U (C²·Dv), W·S and Q·S (C·Dk·Dv each) and the state update Kᵀ·U (C·Dk·Dv); two flops each."""
    chunks = (T + c - 1) // c
    return 2.0 * nv * chunks * (c * c * (3 * dk + 2 * dv) + 3 * c * dk * dv)


@dataclasses.dataclass
class Inputs:
    q: torch.Tensor      # [T, NK, D], L2-normalised
    k: torch.Tensor
    v: torch.Tensor      # [T, NV, D]
    beta: torch.Tensor   # [T, NV]
    g: torch.Tensor      # [T, NV] fp32, <= 0
    state: torch.Tensor  # [1, NV, D(v), D(k)] fp32


def make_inputs(T: int, dtype=torch.bfloat16, seed: int = 0) -> Inputs:
    gen = torch.Generator().manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=gen)

    q = F.normalize(randn(T, NK, D), dim=-1).to(dtype)
    k = F.normalize(randn(T, NK, D), dim=-1).to(dtype)
    v = (randn(T, NV, D) * 0.5).to(dtype)
    beta = torch.rand(T, NV, generator=gen).to(dtype)
    g = -torch.rand(T, NV, generator=gen) * 0.1
    state = randn(1, NV, D, D) * 0.05
    return Inputs(q, k, v, beta, g, state)


def _ours_prefill(x: Inputs, requires_grad: bool = False):
    lens = torch.tensor([x.q.shape[0]], dtype=torch.int32)
    return npu_chunk_gated_delta_rule(x.q, x.k, x.v, beta=x.beta, initial_state=x.state, actual_seq_lengths=lens,
                                      scale=D ** -0.5, g=x.g)


def _hf_layout(x: Inputs):
    """transformers' arguments: [B=1, T, H, D] tensors and the state as [B, Nv, Dk, Dv]."""
    return (x.q.unsqueeze(0), x.k.unsqueeze(0), x.v.unsqueeze(0), x.g.unsqueeze(0), x.beta.unsqueeze(0),
            x.state.transpose(-1, -2).contiguous())


def _theirs_prefill(fn: Callable, x: Inputs):
    q, k, v, g, beta, s0 = _hf_layout(x)
    # transformers repeats q/k over the value heads inside (num_v_heads // num_k_heads, interleaved)
    out, state = fn(q, k, v, g=g, beta=beta, chunk_size=CHUNK, initial_state=s0, output_final_state=True,
                    use_qk_l2norm_in_kernel=False)
    return out[0], state.transpose(-1, -2)


def _max_rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.float(), b.float()
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-6))


def prefill_rows(cases: List[int], reps: int, mm_rate: float, bad: List[str]) -> List[List[str]]:
    chunk_fn, _ = _transformers_gdn()
    rows = []
    for T in cases:
        x = make_inputs(T)
        times = time_alternating({"ours": lambda: _ours_prefill(x), "hf": lambda: _theirs_prefill(chunk_fn, x)},
                                 reps=reps)
        ours, theirs = _ours_prefill(x), _theirs_prefill(chunk_fn, x)
        for name, a, b in (("out", ours[0], theirs[0]), ("final_state", ours[1], theirs[1])):
            if not _max_rel(a, b) <= 2e-2:
                bad.append(f"prefill T={T}: {name} differs from transformers by {_max_rel(a, b):.3g} (relative)")
        rate = chunk_flops(T) / times["ours"] / 1e9
        rows.append([f"prefill T={T}", f"{times['hf'] * 1e3:.1f}", f"{times['ours'] * 1e3:.1f}",
                     f"{times['hf'] / times['ours']:.2f}x", f"{rate:.1f}", f"{100 * rate / mm_rate:.0f}%"])
    return rows


def _leaves(x: Inputs) -> Inputs:
    return Inputs(*(t.detach().clone().requires_grad_(True) for t in dataclasses.astuple(x)))


def training_rows(cases: List[int], reps: int, bad: List[str]) -> List[List[str]]:
    chunk_fn, _ = _transformers_gdn()
    rows = []
    for T in cases:
        x = make_inputs(T, seed=1)
        gen = torch.Generator().manual_seed(2)
        d_out = torch.randn(T, NV, D, generator=gen).to(x.v.dtype)
        d_state = torch.randn(1, NV, D, D, generator=gen)

        def step(ours: bool):
            leaves = _leaves(x)
            out, state = _ours_prefill(leaves) if ours else _theirs_prefill(chunk_fn, leaves)
            torch.autograd.backward([out, state], [d_out, d_state])
            return [t.grad for t in dataclasses.astuple(leaves)]

        times = time_alternating({"ours": lambda: step(True), "hf": lambda: step(False)}, reps=reps)
        for name, a, b in zip(("q", "k", "v", "beta", "g", "state"), step(True), step(False)):
            if not _max_rel(a, b) <= 3e-2:
                bad.append(f"training T={T}: d{name} differs from transformers by {_max_rel(a, b):.3g} (relative)")
        rows.append([f"train fwd+bwd T={T}", f"{times['hf'] * 1e3:.1f}", f"{times['ours'] * 1e3:.1f}",
                     f"{times['hf'] / times['ours']:.2f}x", "-", "-"])
    return rows


def decode_rows(batch: int, contexts: List[int], reps: int, bad: List[str]) -> List[List[str]]:
    _, rec_fn = _transformers_gdn()
    rows = []
    for ctx in contexts:
        # the states a prefill of ctx tokens leaves (one per sequence), then one decode token per sequence
        x = make_inputs(ctx, seed=3)
        _, final = npu_chunk_gated_delta_rule(x.q, x.k, x.v, beta=x.beta, initial_state=x.state,
                                              actual_seq_lengths=torch.tensor([ctx], dtype=torch.int32),
                                              scale=D ** -0.5, g=x.g)
        cache = final.expand(batch, -1, -1, -1).to(torch.bfloat16).contiguous()  # [slots = B, Nv, Dv, Dk]
        step = make_inputs(batch, seed=4)  # one token for each of the B sequences
        ones = torch.ones(batch, dtype=torch.int32)
        slots = torch.arange(batch, dtype=torch.int32)
        work = cache.clone()

        def ours():
            work.copy_(cache)
            return npu_recurrent_gated_delta_rule(step.q, step.k, step.v, work, beta=step.beta, scale=D ** -0.5,
                                                  actual_seq_lengths=ones, ssm_state_indices=slots, g=step.g)

        def theirs():
            q, k, v = (t.unsqueeze(1) for t in (step.q, step.k, step.v))  # [B, 1, H, D]
            return rec_fn(q, k, v, g=step.g.unsqueeze(1), beta=step.beta.unsqueeze(1),
                          initial_state=cache.transpose(-1, -2).float(), output_final_state=True,
                          use_qk_l2norm_in_kernel=False)

        times = time_alternating({"ours": ours, "hf": theirs}, reps=reps, min_time=0.05)
        diff = _max_rel(ours(), theirs()[0][:, 0])
        if not diff <= 2e-2:
            bad.append(f"decode B={batch} ctx={ctx}: output differs from transformers by {diff:.3g} (relative)")
        rows.append([f"decode B={batch} after ctx={ctx}", f"{times['hf'] * 1e3:.3f}", f"{times['ours'] * 1e3:.3f}",
                     f"{times['hf'] / times['ours']:.2f}x", "-", "-"])
    return rows


def run(quick: bool = False, reps: int = 5, prefill: Optional[List[int]] = None,
        training: Optional[List[int]] = None) -> List[List[str]]:
    """Measures and prints the table; returns its rows; raises RuntimeError (after printing) when a check fails."""
    prefill = prefill or ([128] if quick else [4096, 8192, 16384, 32768])
    training = training or ([128] if quick else [4096, 8192])
    bad: List[str] = []
    mm_rate = gemm_gflops(torch.float32, n=512 if quick else 2048, reps=1 if quick else 3)
    rows = prefill_rows(prefill, reps, mm_rate, bad) + training_rows(training, reps, bad)
    rows += decode_rows(4 if quick else 16, [128, 256] if quick else [4096, 32768], reps, bad)
    print(f"# gdn: Gated DeltaNet (Qwen3-Next linear attention shard: {NK} key / {NV} value heads of dim {D}, bf16, "
          f"one sequence) vs transformers' PyTorch implementation, one process, contenders alternating, median of "
          f"{reps}; same-run fp32 matmul {mm_rate:.0f} GFLOP/s")
    print(f"# {machine_line(torch.get_num_threads())}")
    print(format_table(["case", "transformers ms", "ours ms", "speed-up", "ours GFLOP/s", "GEMM share"], rows))
    if bad:
        raise RuntimeError("gdn benchmark: " + "; ".join(bad))
    return rows


def main(quick: bool = False, reps: int = 5) -> None:
    run(quick, reps)
