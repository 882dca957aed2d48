"""What the oracle judges a device output against, besides the CPU kernel at the call's dtype (compare.py's rules).

For each floating output, the first of these that exists:
  1. the op's float64 chain from its primary inputs (references.py: the attention training ops, whose backward
     would otherwise inherit the device forward's statistics);
  2. the CPU kernel run with the call's floating inputs in float64 (ops whose kernels take float64), or, for a call
     in fp16 / bf16, in float32;
  3. the CPU kernel's rounding noise: the largest change of its output when its floating inputs move by about one
     ulp (a few seeded perturbations).
"""
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch
from torch.utils._pytree import tree_flatten, tree_map

from .compare import Evidence
from .references import CHAINS, CPU_CHAINS, MAGNITUDES

PERTURBATIONS = 2        # runs of rule 3; their largest change is the noise estimate
HALF = (torch.float16, torch.bfloat16)


def _floating(t: Any) -> bool:
    return isinstance(t, torch.Tensor) and t.is_floating_point()


def _cast(x: Any, target: torch.dtype, which: Optional[Sequence[torch.dtype]]) -> Any:
    """`x` in `target` if it is floating (and of a dtype in `which`, when given); a copy otherwise (a run may write
    its arguments)."""
    if _floating(x) and (which is None or x.dtype in which):
        return x.to(target, copy=True)
    return x.clone() if isinstance(x, torch.Tensor) else x


def _main_float_dtype(flat: Sequence[Any]) -> Optional[torch.dtype]:
    return next((t.dtype for t in flat if _floating(t)), None)


def _precise_runs(flat: Sequence[Any]) -> List[Tuple[torch.dtype, Optional[Tuple[torch.dtype, ...]], str]]:
    """The higher-precision runs worth trying for a call, most precise first."""
    main = _main_float_dtype(flat)
    runs = [(torch.float64, None, "the CPU kernel in float64")]
    if main is not None and main != torch.float64:
        runs.append((torch.float64, (main,), "the CPU kernel in float64"))
    if any(_floating(t) and t.dtype in HALF for t in flat):
        runs.append((torch.float32, HALF, "the CPU kernel in float32"))
    return runs


def _perturbed(x: Any, gen: torch.Generator) -> Any:
    """A floating tensor moved by about one ulp per element (relative eps · (±0.5..1.5)); others copied."""
    if not _floating(x) or x.dtype == torch.float64 or x.numel() == 0:
        return x.clone() if isinstance(x, torch.Tensor) else x
    u = torch.rand(x.shape, generator=gen, dtype=torch.float64) + 0.5
    sign = torch.randint(0, 2, x.shape, generator=gen).to(torch.float64) * 2 - 1
    moved = x.double() * (1 + sign * u * torch.finfo(x.dtype).eps)
    return torch.where(torch.isfinite(x), moved.to(x.dtype), x)


def gather(name: str, run: Callable[..., List[torch.Tensor]], inputs: Tuple[tuple, dict], cpus: List[torch.Tensor],
           schema_values: Optional[Callable[[tuple, dict], Dict[str, Any]]] = None) -> List[Evidence]:
    """Evidence for each of `cpus` (the CPU kernel's judged outputs at the call's dtype). `run(*args, **kwargs)`
    returns the judged outputs of a CPU run (it may raise); `inputs` are the call's CPU inputs (not modified);
    `schema_values` names the arguments (for the float64 chains)."""
    evidence = [Evidence() for _ in cpus]
    need = {i for i, c in enumerate(cpus) if c.is_floating_point() and c.numel()}

    def take(outs, kind):
        for i in sorted(need):
            if i < len(outs) and outs[i] is not None and outs[i].shape == cpus[i].shape and _floating(outs[i]):
                evidence[i] = Evidence(ref=outs[i], ref_kind=kind)
                need.discard(i)

    chain = CHAINS.get(name)
    if chain is not None and schema_values is not None and need:
        try:
            outs = chain(schema_values(*inputs))
        except Exception:  # a form the chain does not model: the next rules decide
            outs = None
        take(outs or [], "a float64 chain from the primary inputs")
    flat, _ = tree_flatten(inputs)
    for target, which, kind in _precise_runs(flat):
        if not need:
            break
        args, kwargs = tree_map(lambda x: _cast(x, target, which), inputs)
        try:
            outs = run(*args, **kwargs)
        except Exception:
            continue
        take([o if o.dtype == target else None for o in outs[:len(cpus)]], kind)  # outputs left in a lower dtype: no
    if need:
        for i, noise in rounding_noise(run, inputs, cpus, need).items():
            evidence[i] = Evidence(noise=noise)
    magnitudes = MAGNITUDES.get(name)
    if magnitudes is not None:
        args, kwargs = inputs
        try:
            sizes = magnitudes(*args, **kwargs)
        except Exception:  # a form the magnitude does not model: the rules without it
            sizes = []
        for i, m in enumerate(sizes[:len(evidence)]):
            evidence[i].magnitude = m
    return evidence


def cpu_chain(name: str, inputs: Tuple[tuple, dict], schema_values) -> Optional[List[torch.Tensor]]:
    """For an op whose inputs include earlier outputs (the attention backward's saved statistics): the CPU kernels'
    whole chain from the primary inputs at the call's dtype, the `cpu` side of the rules; None for other ops."""
    chain = CPU_CHAINS.get(name)
    if chain is None or schema_values is None:
        return None
    args, kwargs = tree_map(lambda x: x.clone() if isinstance(x, torch.Tensor) else x, inputs)
    try:
        return [t for t in chain(schema_values(args, kwargs)) if isinstance(t, torch.Tensor)]
    except Exception:  # the CPU forward rejects what the backward took: judge the backward as given
        return None


def rounding_noise(run, inputs, cpus, which) -> Dict[int, float]:
    """max|cpu(perturbed inputs) - cpu| of each output in `which` over PERTURBATIONS seeded runs (outputs whose
    perturbed runs fail or change shape get none)."""
    gen = torch.Generator().manual_seed(0x5EED)
    noise: Dict[int, float] = {}
    for _ in range(PERTURBATIONS):
        args, kwargs = tree_map(lambda x: _perturbed(x, gen), inputs)
        try:
            outs = run(*args, **kwargs)
        except Exception:
            return noise
        for i in which:
            if i < len(outs) and outs[i].shape == cpus[i].shape:
                d = (outs[i].double() - cpus[i].double()).abs()
                d = d[torch.isfinite(d)]
                noise[i] = max(noise.get(i, 0.0), float(d.max()) if d.numel() else 0.0)
    return noise
