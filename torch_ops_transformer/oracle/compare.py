"""How the oracle judges one device result against the CPU kernels' (torch_ops_transformer.oracle).

Every floating rule grows with what a correct kernel's rounding can do on *these* inputs — the reduction length,
the magnitudes, the conditioning — never a fixed number of ulps. In order of preference, per output:

1. A reference of higher precision (`Evidence.ref`): the op's float64 chain recomputed from the primary inputs
   (oracle/references.py), the CPU kernel run in float64, or, for a half-precision call, the CPU kernel run in
   float32. FlashAttention's rule against it:
       max|device - ref| <= 2 * max|cpu - ref| + (eps(output) + eps(ref)) * max|ref| + 1e-5,
   with `cpu` our CPU kernel at the call's dtype — for an op fed earlier outputs (the attention backward), the CPU
   kernels' whole chain from the primary inputs — (one ulp of the largest value: two correct kernels may round a
   value to opposite neighbours; eps(ref) covers a float32 reference's own rounding). The reference sees the same
   rounded inputs, so the inputs' precision adds nothing here: an fp32 statistic of bf16 inputs is held to fp32.
2. No higher precision anywhere (an fp32 call of an op whose kernels stop at fp32, e.g. an int8 KV cache): the CPU
   kernel's own rounding is estimated by re-running it on inputs perturbed by about one ulp (`Evidence.noise`:
   max|cpu(perturbed) - cpu| over a few perturbations, which scales with the length and conditioning of the
   computation as its rounding does), and
       max|device - cpu| <= 4 * noise + 2 * eps(dtype) * max|cpu| + 1e-5
   (device and CPU errors add: 2x the CPU kernel's error allowed to the device, plus the CPU kernel's own).
3. Neither (no floating input to perturb): atol = rtol = 8 * eps(dtype) against the CPU kernel.

Where a computation cancels (an output much smaller than the products it sums), rounding an intermediate to the
call's dtype costs eps times the size of those products, not of the output: an op may give the magnitude of the
intermediate its output inherits rounding from (`Evidence.magnitude`, oracle/references.py MAGNITUDES: for the
SDPA hook the rows of P·|V|, and in the backward the term of D = rowsum(dO∘O) computed from the rounded output, as
every FlashAttention backward does), and the eps terms above then use max(max|ref|, magnitude).

In rules 2 and 3, eps is that of the output's dtype or of the call's least precise floating input, whichever is
larger (there the CPU kernel is the only comparison, and a kernel may round an fp32 result's intermediates to the
inputs' precision). Infinities must match exactly, NaN where the reference has NaN;
integer and bool outputs (indices, counts, masks) must be equal.
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
    reference: Optional[float] = None  # the value of the reference the rule used (None: judged against the CPU)

    def details(self) -> list:
        """The report's lines of numbers: the error and its bound, the worst element."""
        lines = [f"  max error {self.error:.6g} > allowed {self.allowed:.6g}"] if self.allowed or self.error else []
        if self.where is not None:
            lines.append(f"  worst element {list(self.where)}: device {self.device!r}, cpu {self.cpu!r}, "
                         f"reference {self.reference!r}")
        return lines


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


NOISE_FACTOR = 4.0   # rule 2: device error + CPU error <= (2 + 1) x the CPU kernel's error, with a margin
FLOOR = 1e-5         # FlashAttention's absolute floor


@dataclass
class Evidence:
    """What one output is judged against besides the CPU kernel at the call's dtype."""

    ref: Optional[Tensor] = None     # float64 chain, CPU kernel in float64, or (half calls) in float32
    ref_kind: str = ""               # how `ref` was obtained (shown in a report)
    noise: Optional[float] = None    # max|cpu(perturbed inputs) - cpu|
    magnitude: Optional[float] = None  # the size of the intermediate a cancelling output inherits rounding from


def compare_one(index: int, dev: Tensor, cpu: Tensor, ref: Optional[Tensor],
                precision: Optional[torch.dtype] = None, noise: Optional[float] = None,
                ref_kind: str = "float64", magnitude: Optional[float] = None) -> Optional[Mismatch]:
    """None when the device output `dev` passes against `cpu` (same dtype), `ref` (a reference of higher precision,
    or None) and `noise` (rule 2, used without `ref`); `precision`: the call's least precise floating input."""
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
    if ref is not None and (ref.shape != dev.shape or not ref.dtype.is_floating_point):
        ref = None
    base = ref.double() if ref is not None else cpu.double()
    d, c = dev.double(), cpu.double()
    # Infinities and NaN where the reference has them must be reproduced exactly.
    special = ~torch.isfinite(base)
    same_special = (d == base) | (torch.isnan(d) & torch.isnan(base))
    bad_special = special & ~same_special
    bad_finite = torch.isfinite(base) & ~torch.isfinite(d)
    if bool(bad_special.any()) or bool(bad_finite.any()):
        where = _worst((bad_special | bad_finite).to(torch.uint8))
        return Mismatch(index, "non-finite values differ from the reference (inf/NaN must match)", where=where,
                        device=_value(d, where), cpu=_value(c, where), reference=_value(ref, where))
    finite = torch.isfinite(base)
    err = torch.where(finite, (d - base).abs(), torch.zeros((), dtype=torch.float64))
    scale = float(base[finite].abs().max()) if bool(finite.any()) else 0.0
    scale = max(scale, magnitude or 0.0)  # rounding an intermediate larger than the output (cancellation)
    eps = max(_eps(dev.dtype), _eps(precision) if precision is not None else 0.0)
    if ref is not None:
        # The reference saw the same (rounded) inputs: only the output's own rounding is added to twice the CPU
        # kernel's error (an fp32 statistic of bf16 inputs is held to fp32, not bf16, precision).
        cpu_err = float(torch.where(finite, (c - base).abs(), torch.zeros((), dtype=torch.float64)).max())
        allowed = 2 * cpu_err + (_eps(dev.dtype) + _eps(ref.dtype)) * scale + FLOOR
        rule = f"FA2 rule vs {ref_kind}"
    elif noise is not None:
        allowed = NOISE_FACTOR * noise + 2 * eps * scale + FLOOR
        rule = f"CPU kernel's rounding (perturbed-input noise {noise:.3g}) vs the CPU kernel"
    else:
        tol = 8 * eps
        allowed = tol + tol * scale
        rule = "dtype tolerance vs the CPU kernel"
    worst_err = float(err.max())
    if worst_err <= allowed:
        return None
    where = _worst(err)
    return Mismatch(index, rule, worst_err, allowed, where, _value(d, where), _value(c, where),
                    _value(base, where) if ref is not None else None)


def compare(devs: Sequence[Tensor], cpus: Sequence[Tensor], evidence: Optional[Sequence[Evidence]] = None,
            precision: Optional[torch.dtype] = None) -> Optional[Mismatch]:
    """The first output of the call that fails (outputs in order; `evidence` per output, or None: rule 3 only;
    `precision` the call's least precise floating input dtype)."""
    if len(devs) != len(cpus):
        return Mismatch(0, f"{len(devs)} outputs on the device, {len(cpus)} from the CPU kernel")
    for i, (d, c) in enumerate(zip(devs, cpus)):
        e = evidence[i] if evidence is not None and i < len(evidence) else Evidence()
        bad = compare_one(i, d, c, e.ref, precision, e.noise, e.ref_kind or "float64", e.magnitude)
        if bad is not None:
            return bad
    return None
