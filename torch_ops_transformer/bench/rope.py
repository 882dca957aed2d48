"""`python -m torch_ops_transformer.bench rope`: rotary position embedding, the op every attention layer calls
before attention, against the same formula in eager PyTorch.

Shapes of a prefill chunk of 4096 tokens, 32 query heads (and 8 key heads) of 128. Contenders, alternating in one
process (median):
- `npu_rotary_mul` (half and interleave modes) vs transformers' `x * cos + rotate_half(x) * sin` (and the GPT-J
  pair form), in the input dtype as the models compute it;
- `rope_with_sin_cos_cache` (vLLM's RotaryEmbedding: a cos/sin cache indexed by positions) and `npu_mrope` with
  Qwen2-VL's sections [16, 24, 24] vs vLLM's `forward_native` formulas (index the cache, split the sections, rotate).
Ratios are peer / ours; GB/s counts the bytes of x read and written once. A row whose result differs from a float64
reference by more than 2% of its largest value fails the command after the table is printed.
"""
from typing import Callable, Dict, List, Tuple

import torch

from .. import npu_mrope, npu_rotary_mul, rope_with_sin_cos_cache
from .common import format_table, machine_line, time_alternating

TOL = 2e-2  # of max|reference|: bf16 outputs


def _rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def _rotate_pairs(x):
    return torch.stack((-x[..., 1::2], x[..., 0::2]), dim=-1).flatten(-2)


def _rotate_cached(x, cos, sin, heads, hs, neox):
    """vLLM's forward_native rotation of [T, heads * hs] by per-token cos/sin [T, hs / 2] in x's dtype."""
    t = x.shape[0]
    x = x.view(t, heads, hs)
    cos, sin = cos[:, None].to(x.dtype), sin[:, None].to(x.dtype)
    if neox:
        x1, x2 = x.chunk(2, dim=-1)
        return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).view(t, -1)
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.stack((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).flatten(-2).view(t, -1)


def _cache(max_pos: int, rot: int, dtype) -> torch.Tensor:
    inv = 1.0 / (10000 ** (torch.arange(0, rot, 2, dtype=torch.float64) / rot))
    freqs = torch.arange(max_pos, dtype=torch.float64)[:, None] * inv[None]
    return torch.cat((freqs.cos(), freqs.sin()), dim=-1).to(dtype)


Row = Tuple[str, Callable[[], torch.Tensor], Callable[[], torch.Tensor], Callable[[], torch.Tensor], int]


def _rows(dtype, t: int, nq: int, nk: int, hs: int) -> List[Row]:
    """(name, ours, peer, float64 reference, bytes of x touched) per row."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1, t, nq, hs, generator=g).to(dtype)
    ang = torch.randn(1, t, 1, hs // 2, generator=g, dtype=torch.float64)
    cos_h = torch.cat((ang.cos(), ang.cos()), -1)
    sin_h = torch.cat((ang.sin(), ang.sin()), -1)
    cos_p, sin_p = ang.cos().repeat_interleave(2, -1), ang.sin().repeat_interleave(2, -1)
    xbytes = 2 * x.numel() * x.element_size()
    rows: List[Row] = []
    for mode, name, cos, sin, rot in ((0, "rotary_mul half", cos_h, sin_h, _rotate_half),
                                      (1, "rotary_mul interleave", cos_p, sin_p, _rotate_pairs)):
        c, s = cos.to(dtype), sin.to(dtype)
        rows.append((name, lambda c=c, s=s, m=mode: npu_rotary_mul(x, c, s, rotary_mode="half" if m == 0 else
                                                                    "interleave"),
                     lambda c=c, s=s, r=rot: x * c + r(x) * s,
                     lambda cos=cos, sin=sin, r=rot: x.double() * cos + r(x.double()) * sin, xbytes))
    q = torch.randn(t, nq * hs, generator=g).to(dtype)
    k = torch.randn(t, nk * hs, generator=g).to(dtype)
    qk_bytes = 2 * (q.numel() + k.numel()) * q.element_size()
    cache = _cache(32768, hs, dtype)  # in the query's dtype, as vLLM keeps it
    pos = torch.randint(0, 32768, (t,), generator=g)

    def cached(dt, positions, section=None):
        table = cache if dt is None else cache.to(dt)  # index_select: far cheaper than advanced indexing on CPU
        cos, sin = table.index_select(0, positions.reshape(-1)).view(*positions.shape, -1).chunk(2, dim=-1)
        if section is not None:  # [3, T, hs / 2] -> each column from its section's position row
            cos = torch.cat([m[i] for i, m in enumerate(cos.split(section, dim=-1))], dim=-1)
            sin = torch.cat([m[i] for i, m in enumerate(sin.split(section, dim=-1))], dim=-1)
        return cos, sin

    for neox in (True, False):
        rows.append((f"sin_cos_cache {'neox' if neox else 'gptj'}",
                     lambda n=neox: rope_with_sin_cos_cache(pos, q, k, cache, hs, n)[0],
                     lambda n=neox: (_rotate_cached(q, *cached(None, pos), nq, hs, n),
                                     _rotate_cached(k, *cached(None, pos), nk, hs, n))[0],
                     lambda n=neox: _rotate_cached(q.double(), *cached(torch.float64, pos), nq, hs, n), qk_bytes))
    section = [16, 24, 24] if hs == 128 else [8, 12, 12]  # Qwen2-VL's split of the 64 (32) rotary columns
    mpos = torch.randint(0, 32768, (3, t), generator=g)
    rows.append(("mrope qwen2vl", lambda: npu_mrope(mpos, q, k, cache, hs, mrope_section=section)[0],
                 lambda: (_rotate_cached(q, *cached(None, mpos, section), nq, hs, True),
                          _rotate_cached(k, *cached(None, mpos, section), nk, hs, True))[0],
                 lambda: _rotate_cached(q.double(), *cached(torch.float64, mpos, section), nq, hs, True), qk_bytes))
    return rows


def run(quick: bool = False, reps: int = 5):
    """Measures, prints the header and table, returns the rows; raises RuntimeError (after printing) when a result is
    off."""
    t, nq, nk, hs = (64, 4, 2, 64) if quick else (4096, 32, 8, 128)
    table, bad = [], []
    for dtype in (torch.bfloat16, torch.float32):
        for name, ours, peer, ref, nbytes in _rows(dtype, t, nq, nk, hs):
            times: Dict[str, float] = time_alternating({"ours": ours, "peer": peer}, reps=reps)
            r = ref()
            err = float((ours().double() - r).abs().max() / r.abs().max().clamp(min=1e-30))
            if not err <= TOL:
                bad.append(f"{name} {dtype}: max|ours - float64| = {err:.3g} of max|ref| > {TOL}")
            table.append([name, str(dtype).replace("torch.", ""), f"{times['ours'] * 1e3:.3f}",
                          f"{times['peer'] * 1e3:.3f}", f"{times['peer'] / times['ours']:.2f}x",
                          f"{nbytes / times['ours'] / 1e9:.1f}", f"{err:.1e}"])
    print(f"# rope: rotary embedding, {t} tokens, {nq} query / {nk} key heads of {hs}, vs eager PyTorch formulas; "
          f"one process, contenders alternating, median of {reps}")
    print(f"# {machine_line(torch.get_num_threads())}")
    print(format_table(["op", "dtype", "ours ms", "peer ms", "peer/ours", "ours GB/s", "max err"], table))
    if bad:
        raise RuntimeError("rope benchmark: " + "; ".join(bad))
    return table


def main(quick: bool = False, reps: int = 5) -> None:
    run(quick, reps)
