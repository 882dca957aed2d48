"""How the oracle judges one device result against the CPU kernels' (torch_ops_transformer.oracle).

Floating outputs follow FlashAttention's rule against a float64 reference where the op has one,

    max|device - ref64| <= 2 * max|cpu - ref64| + eps(dtype) * max|ref64| + 1e-5,

with `cpu` our CPU kernel at the call's dtype (the rule of the test suite, plus one unit in the last place of the
output's largest value: the device and the CPU kernel may round a value to opposite neighbours). Without a float64
reference (an op that takes no float64 inputs: the inference ops, an int8 cache) the device result is held to the
CPU kernel's within a dtype tolerance (atol = rtol = 8 * eps). eps is that of the output's dtype or of the call's
least precise floating input, whichever is larger: an fp32 lse computed from bf16 inputs carries bf16 error. Infinities must match exactly, NaN where the reference has
NaN; integer and bool outputs (indices, counts, masks) must be equal.
"""
from dataclasses import dataclass
from typing import Optional, Sequence, Tuple

import torch
from torch import Tensor


@dataclass
class Mismatch:
    """The first output that failed, with the numbers a report prints."""

    output: int                      # index among the op's outputs (mutated arguments follow them)
    what: str                        # one line: the rule that failed
    error: float = 0.0               # max|device - ref|
    allowed: float = 0.0             # the bound it exceeded
    where: Optional[Tuple[int, ...]] = None   # the worst element
    device: Optional[float] = None   # its values
    cpu: Optional[float] = None
    ref64: Optional[float] = None


def _eps(dtype: torch.dtype) -> float:
    return torch.finfo(dtype).eps if dtype.is_floating_point else 0.0


def least_precise(tensors) -> Optional[torch.dtype]:
    """The floating dtype with the largest eps among `tensors` (None without floating tensors)."""
    dtypes = [t.dtype for t in tensors if isinstance(t, Tensor) and t.is_floating_point()]
    return max(dtypes, key=_eps) if dtypes else None


def _worst(diff: Tensor) -> Tuple[int, ...]:
    flat = int(torch.argmax(diff.reshape(-1)))
    return tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), diff.shape))


def _value(t: Optional[Tensor], where: Tuple[int, ...]) -> Optional[float]:
    return None if t is None else float(t[where])


def compare_one(index: int, dev: Tensor, cpu: Tensor, ref: Optional[Tensor],
                precision: Optional[torch.dtype] = None) -> Optional[Mismatch]:
    """None when the device output `dev` passes against `cpu` (same dtype) and `ref` (float64 or None); `precision`:
    the call's least precise floating input dtype."""
    if dev.shape != cpu.shape or dev.dtype != cpu.dtype:
        return Mismatch(index, f"shape/dtype {tuple(dev.shape)} {dev.dtype} != the CPU kernel's "
                               f"{tuple(cpu.shape)} {cpu.dtype}")
    if dev.numel() == 0:
        return None
    if not dev.dtype.is_floating_point:
        if torch.equal(dev, cpu):
            return None
        diff = (dev != cpu)
        where = _worst(diff.to(torch.uint8))
        return Mismatch(index, f"{int(diff.sum())} of {dev.numel()} {dev.dtype} values differ (must be equal)",
                        where=where, device=_value(dev, where), cpu=_value(cpu, where))
    base = ref if ref is not None else cpu.double()
    d, c = dev.double(), cpu.double()
    # Infinities and NaN where the reference has them must be reproduced exactly.
    special = ~torch.isfinite(base)
    same_special = (d == base) | (torch.isnan(d) & torch.isnan(base))
    bad_special = special & ~same_special
    bad_finite = torch.isfinite(base) & ~torch.isfinite(d)
    if bool(bad_special.any()) or bool(bad_finite.any()):
        where = _worst((bad_special | bad_finite).to(torch.uint8))
        return Mismatch(index, "non-finite values differ from the reference (inf/NaN must match)", where=where,
                        device=_value(d, where), cpu=_value(c, where), ref64=_value(ref, where))
    finite = torch.isfinite(base)
    err = torch.where(finite, (d - base).abs(), torch.zeros((), dtype=torch.float64))
    scale = float(base[finite].abs().max()) if bool(finite.any()) else 0.0
    eps = max(_eps(dev.dtype), _eps(precision) if precision is not None else 0.0)
    if ref is not None:
        cpu_err = float(torch.where(finite, (c - base).abs(), torch.zeros((), dtype=torch.float64)).max())
        allowed = 2 * cpu_err + eps * scale + 1e-5
        rule = "FA2 rule vs float64"
    else:
        tol = 8 * eps
        allowed = tol + tol * scale
        rule = "dtype tolerance vs the CPU kernel"
    worst_err = float(err.max())
    if worst_err <= allowed:
        return None
    where = _worst(err)
    return Mismatch(index, rule, worst_err, allowed, where, _value(d, where), _value(c, where), _value(ref, where))


def compare(devs: Sequence[Tensor], cpus: Sequence[Tensor], refs: Optional[Sequence[Tensor]],
            precision: Optional[torch.dtype] = None) -> Optional[Mismatch]:
    """The first output of the call that fails (outputs in order; `refs` None without a float64 reference;
    `precision` the call's least precise floating input dtype)."""
    if len(devs) != len(cpus):
        return Mismatch(0, f"{len(devs)} outputs on the device, {len(cpus)} from the CPU kernel")
    for i, (d, c) in enumerate(zip(devs, cpus)):
        r = refs[i] if refs is not None and i < len(refs) else None
        bad = compare_one(i, d, c, r if r is not None and r.dtype == torch.float64 else None, precision)
        if bad is not None:
            return bad
    return None
