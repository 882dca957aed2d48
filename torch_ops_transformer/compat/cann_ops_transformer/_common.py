"""Argument helpers shared by the cann_ops_transformer stand-in: upstream's integer tensors (cumulative lengths,
per-batch lengths) read on the host, its mode checks, and the geometry of query rows (which sequence a row belongs
to, its position in it) that the layouts BSND and TND imply."""
from dataclasses import dataclass
from typing import List, Optional, Sequence

import torch
from torch import Tensor

LAYOUTS_Q = ("BSND", "TND")
STAND_IN = "torch_ops_transformer's cann_ops_transformer stand-in"


def not_supported(op: str, name: str, value, why: str) -> NotImplementedError:
    """The error for an argument value upstream accepts and the stand-in cannot honour."""
    return NotImplementedError(f"{op}: argument '{name}'={value!r} is not implemented by {STAND_IN}: {why}")


def choice(op: str, name: str, value, allowed: Sequence) -> None:
    if isinstance(value, bool) != isinstance(allowed[0], bool) or value not in allowed:
        raise ValueError(f"{op}: argument '{name}' must be one of {list(allowed)}; got {value!r}")


def int_in(op: str, name: str, value, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ValueError(f"{op}: argument '{name}' must be an int in [{low}, {high}]; got {value!r}")
    return value


def tensor(op: str, name: str, value, optional: bool = False) -> None:
    if value is None and optional:
        return
    if not isinstance(value, Tensor):
        raise TypeError(f"{op}: argument '{name}' must be a Tensor{' or None' if optional else ''}; "
                        f"got {type(value).__name__}")


def host_ints(op: str, name: str, value, count: Optional[int] = None) -> Optional[List[int]]:
    """A 1-D integer tensor (or list) of upstream's as a list of Python ints, read on the host as the kernels do;
    `count` checks its length."""
    if value is None:
        return None
    if isinstance(value, Tensor):
        if value.dim() != 1 or value.dtype.is_floating_point or value.dtype == torch.bool:
            raise ValueError(f"{op}: argument '{name}' must be a 1-D integer tensor; got {value.dtype} of shape "
                             f"{tuple(value.shape)}")
        value = value.cpu().tolist()
    elif not isinstance(value, (list, tuple)) or not all(isinstance(v, int) for v in value):
        raise TypeError(f"{op}: argument '{name}' must be an int32 Tensor; got {type(value).__name__}")
    if count is not None and len(value) != count:
        raise ValueError(f"{op}: argument '{name}' must have {count} entries (one per sequence); got {len(value)}")
    return list(value)


def cumulative(op: str, name: str, value, required_why: Optional[str]) -> Optional[List[int]]:
    """Upstream's cu_seqlens ([B + 1], starting at 0, non-decreasing) as the list of cumulative ends [B] that our
    ops take. `required_why` (the layout that needs it) makes None an error."""
    values = host_ints(op, name, value)
    if values is None:
        if required_why is not None:
            raise ValueError(f"{op}: argument '{name}' is required {required_why}")
        return None
    if len(values) < 2 or values[0] != 0 or any(b < a for a, b in zip(values, values[1:])):
        raise ValueError(f"{op}: argument '{name}' must be cumulative lengths [B + 1]: 0 first, then "
                         f"non-decreasing; got {values}")
    return values[1:]


def lengths_from(ends: List[int]) -> List[int]:
    return [b - a for a, b in zip([0] + ends[:-1], ends)]


@dataclass
class Rows:
    """The query rows of a BSND query flattened to [B * S1] (or a TND query's T1 rows): the sequence of each row,
    its position in the sequence, that sequence's query length, whether the row is a real query token (not
    padding), and the cumulative query ends our TND ops take."""
    batch: Tensor
    local: Tensor
    q_len: Tensor
    valid: Tensor
    ends: List[int]

    @property
    def batch_size(self) -> int:
        return len(self.ends)


def query_rows(op: str, q: Tensor, layout_q: str, cu_seqlens_q, seqused_q, q_name: str = "q") -> Rows:
    """Rows of `q` for layout_q BSND ([B, S1, N, D]) or TND ([T1, N, D], with cu_seqlens_q); seqused_q [B] marks the
    first seqused_q[b] tokens of each sequence as real (the rest are padding and give no output)."""
    if layout_q == "BSND":
        if q.dim() != 4:
            raise ValueError(f"{op}: argument '{q_name}' must be 4-D [B, S1, N1, D] for layout_q 'BSND'; got "
                             f"shape {tuple(q.shape)}")
        b, s1 = q.shape[0], q.shape[1]
        used = host_ints(op, "seqused_q", seqused_q, b)
        batch = torch.arange(b).repeat_interleave(s1)
        local = torch.arange(s1).repeat(b)
        q_len = torch.tensor(used if used is not None else [s1] * b, dtype=torch.long)[batch] if b else local
        return Rows(batch, local, q_len, local < q_len, [s1 * (i + 1) for i in range(b)])
    if q.dim() != 3:
        raise ValueError(f"{op}: argument '{q_name}' must be 3-D [T1, N1, D] for layout_q 'TND'; got shape "
                         f"{tuple(q.shape)}")
    ends = cumulative(op, "cu_seqlens_q", cu_seqlens_q, "for layout_q 'TND'")
    if ends[-1] > q.shape[0]:
        raise ValueError(f"{op}: argument 'cu_seqlens_q' ends at {ends[-1]}, past the {q.shape[0]} tokens of "
                         f"'{q_name}'")
    t = torch.arange(q.shape[0])
    ends_t = torch.tensor(ends, dtype=torch.long)
    batch = torch.searchsorted(ends_t, t, right=True).clamp(max=len(ends) - 1)
    starts = ends_t - torch.tensor(lengths_from(ends), dtype=torch.long)
    local = t - starts[batch]
    q_len = (ends_t - starts)[batch]
    valid = t < ends[-1]
    used = host_ints(op, "seqused_q", seqused_q, len(ends))
    if used is not None:
        # upstream's TND padding: tokens past seqused_q[b] of a sequence give no output; the sequence keeps its
        # cu_seqlens_q length for the causal alignment (as our ops, which see only the cumulative lengths)
        valid &= local < torch.tensor(used, dtype=torch.long)[batch]
    return Rows(batch, local, q_len, valid, ends)


def compressed_visible(k_len: Tensor, rows: Rows, cmp_ratio: int, residual: Optional[Tensor]) -> Tensor:
    """Right-down causal over a compressed key (upstream's mask_mode 3 with cmp_ratio): the sequence had
    k_len * cmp_ratio + residual keys before compression; query token i of q_len sits at position
    pre - q_len + i and sees the compressed keys whose cmp_ratio-token group ends at or before it:
    floor((pre - q_len + i + 1) / cmp_ratio) of them, within [0, k_len]. k_len and residual are per row."""
    pre = k_len * cmp_ratio + (residual if residual is not None else 0)
    seen = torch.div(pre - rows.q_len + rows.local + 1, cmp_ratio, rounding_mode="floor")
    return torch.minimum(seen.clamp(min=0), k_len)


def residuals(op: str, name: str, value, batch_size: int, cmp_ratio: int) -> Tensor:
    """cmp_residual (per sequence, in [0, cmp_ratio)) as a long tensor; required where the caller needs it."""
    values = host_ints(op, name, value, batch_size)
    if values is None:
        raise ValueError(f"{op}: argument '{name}' is required with a causal mask over a compressed key "
                         f"(cmp_ratio {cmp_ratio} > 1)")
    if any(not 0 <= v < cmp_ratio for v in values):
        raise ValueError(f"{op}: argument '{name}' entries must be in [0, cmp_ratio={cmp_ratio}); got {values}")
    return torch.tensor(values, dtype=torch.long)
