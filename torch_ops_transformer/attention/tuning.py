"""Block-size tuning of the CPU FlashAttention kernels (docs/attention.md, "Block-size tuning").

The op entry points (flash_attention_score and its grad, prompt_flash_attention / fused_infer_attention_score
prefill) pick the tile sizes (block_q query rows x block_kv keys) of each call from its *shape class*: op family,
head dims, dtype, mask kind, power-of-two buckets of the query and key lengths, and the thread count. The environment
variable TORCH_OPS_TRANSFORMER_TUNE chooses the mode (read at every call):

- unset: the winner cached for this machine when there is one, else the built-in defaults; never measures;
- ``"0"``: the built-in defaults (the cache is ignored);
- ``"1"``: like unset, and a class without an entry is tuned on its first call (a few candidate tile sizes are timed
  on that call's own inputs; the fastest is kept and its outputs returned);
- ``"BQxBKV"`` (e.g. ``"128x512"``): these tiles for every call.

An explicit `attention_tiles` / `attention_tile_config` override wins over all of these, and nothing is tuned then.
Measuring happens in C++ when the real kernel runs, so torch.compile traces and fake-tensor runs never measure.

The winners live in an in-process table; this module keeps them in a per-machine JSON file under
$TORCH_OPS_TRANSFORMER_CACHE_DIR, else $XDG_CACHE_HOME/torch_ops_transformer, else ~/.cache/torch_ops_transformer
(`cache_path()`): loaded when the package is imported, written at exit when the process tuned new classes (and by
`save()` and ``python -m torch_ops_transformer tune``). The file name and its "machine" record hold the CPU model,
its ISA flags (AMX included), the torch and package versions: a file of another machine, or a corrupt one, is
ignored with a warning.
"""
from __future__ import annotations

import argparse
import atexit
import hashlib
import json
import os
import platform
import tempfile
import warnings
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

import torch

from .._internal.version import __version__
from .tiles import attention_tiles

ENV = "TORCH_OPS_TRANSFORMER_TUNE"
CACHE_DIR_ENV = "TORCH_OPS_TRANSFORMER_CACHE_DIR"
FORMAT = 1
MAX_BLOCK_Q, MAX_BLOCK_KV = 4096, 8192
FAMILIES = ("fwd", "bwd", "prefill")
MASKS = ("none", "causal", "band", "explicit")
_ISA_FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "avx512_fp16", "amx_tile", "amx_bf16", "amx_int8")
_DTYPES = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16", torch.int8: "int8"}

__all__ = ["TunedEntry", "tune_mode", "machine_info", "cache_dir", "cache_path", "class_key", "tuned_tiles", "table",
           "load", "save", "clear_cache", "stats", "pretune", "format_table", "format_summary"]


def _ops():
    return torch.ops.npu_fa


@dataclass(frozen=True)
class TunedEntry:
    """A shape class's winner: (block_q, block_kv), (0, 0) when the built-in choice won; `measured` holds every
    candidate as (block_q, block_kv, ms), the built-in choice first (as the tiles it stands for)."""
    block_q: int
    block_kv: int
    measured: Tuple[Tuple[int, int, float], ...] = field(default_factory=tuple)

    @property
    def builtin(self) -> bool:
        return self.block_q == 0


def tune_mode(value: Optional[str] = None):
    """The mode of TORCH_OPS_TRANSFORMER_TUNE (or of `value`): "cache", "off", "tune", or ("forced", (bq, bkv)).
    A bad value raises ValueError naming the variable (the ops raise the same error at their next call)."""
    v = os.environ.get(ENV, "") if value is None else value
    if v == "":
        return "cache"
    if v == "0":
        return "off"
    if v == "1":
        return "tune"
    parts = v.lower().split("x")
    if len(parts) == 2 and all(p.isascii() and p.isdigit() and 0 < len(p) <= 5 for p in parts):
        q, kv = int(parts[0]), int(parts[1])
        if 1 <= q <= MAX_BLOCK_Q and 1 <= kv <= MAX_BLOCK_KV:
            return ("forced", (q, kv))
    raise ValueError(f"environment variable {ENV} must be unset (use the tuned tile sizes cached for this machine), "
                     f'"0" (built-in tile sizes), "1" (also tune each new shape class on its first call) or "BQxBKV" '
                     f"forcing the tiles, block_q in [1, {MAX_BLOCK_Q}] and block_kv in [1, {MAX_BLOCK_KV}] "
                     f'(e.g. "128x512"); got {v!r}')


def _cpu_model_and_flags() -> Tuple[str, List[str]]:
    model, flags = "", set()
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                key, _, val = line.partition(":")
                key = key.strip()
                if key == "model name" and not model:
                    model = val.strip()
                elif key == "flags" and not flags:
                    flags = set(val.split())
                if model and flags:
                    break
    except OSError:
        pass
    return model or platform.processor() or platform.machine(), sorted(f for f in _ISA_FLAGS if f in flags)


def machine_info() -> Dict[str, object]:
    """What a cache file is valid for: CPU model, ISA flags (AMX included), torch's CPU capability, torch and
    package versions."""
    model, flags = _cpu_model_and_flags()
    return {"cpu": model, "isa": flags, "capability": torch.backends.cpu.get_cpu_capability(),
            "torch": torch.__version__, "torch_ops_transformer": __version__}


def _machine_id(info: Dict[str, object]) -> str:
    return hashlib.sha256(json.dumps(info, sort_keys=True).encode()).hexdigest()[:16]


def cache_dir() -> str:
    """$TORCH_OPS_TRANSFORMER_CACHE_DIR, else $XDG_CACHE_HOME/torch_ops_transformer, else
    ~/.cache/torch_ops_transformer."""
    d = os.environ.get(CACHE_DIR_ENV)
    if d:
        return d
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "torch_ops_transformer")


def cache_path() -> str:
    """This machine's cache file (the name holds a hash of `machine_info()`)."""
    return os.path.join(cache_dir(), f"attention_tiles-{_machine_id(machine_info())}.json")


def _pow2(n: int) -> int:
    b = 1
    while b < n:
        b *= 2
    return b


def class_key(family: str = "fwd", head_dim: int = 128, dtype: torch.dtype = torch.bfloat16, mask: str = "causal",
              seq_len: int = 2048, kv_len: Optional[int] = None, *, v_head_dim: Optional[int] = None,
              kv_dtype: Optional[torch.dtype] = None, threads: Optional[int] = None) -> str:
    """The key of a shape class, as the ops build it: e.g. "fwd|d128|bf16|causal|sq2048|skv2048|t2". family: "fwd",
    "bwd" (flash_attention_score_grad) or "prefill" (prompt_flash_attention / fused_infer_attention_score); mask:
    "none", "causal", "band" (sliding window) or "explicit" (an element-wise atten_mask); seq_len / kv_len: the
    longest query / key sequence (kv_len defaults to seq_len); threads defaults to torch.get_num_threads()."""
    if family not in FAMILIES:
        raise ValueError(f"class_key: argument 'family' must be one of {FAMILIES}; got {family!r}")
    if mask not in MASKS:
        raise ValueError(f"class_key: argument 'mask' must be one of {MASKS}; got {mask!r}")
    for name, d in (("dtype", dtype), ("kv_dtype", kv_dtype)):
        if d is not None and d not in _DTYPES:
            raise ValueError(f"class_key: argument {name!r} must be one of {list(_DTYPES)}; got {d}")
    vd = head_dim if v_head_dim is None else v_head_dim
    kv = seq_len if kv_len is None else kv_len
    dims = f"d{head_dim}" + ("" if vd == head_dim else f"v{vd}")
    dt = _DTYPES[dtype] + ("" if kv_dtype in (None, dtype) else f"+{_DTYPES[kv_dtype]}kv")
    t = torch.get_num_threads() if threads is None else threads
    return f"{family}|{dims}|{dt}|{mask}|sq{_pow2(seq_len)}|skv{_pow2(kv)}|t{t}"


def _parse_lines(text: str) -> Dict[str, TunedEntry]:
    out = {}
    for line in text.splitlines():
        parts = line.split()
        if not parts:
            continue
        measured = []
        for tok in parts[3:]:
            q, kv, ms = tok.split(":")
            measured.append((int(q), int(kv), float(ms)))
        out[parts[0]] = TunedEntry(int(parts[1]), int(parts[2]), tuple(measured))
    return out


def _format_lines(entries: Dict[str, TunedEntry]) -> str:
    return "".join(f"{k} {e.block_q} {e.block_kv}" + "".join(f" {q}:{kv}:{ms!r}" for q, kv, ms in e.measured) + "\n"
                   for k, e in entries.items())


def table() -> Dict[str, TunedEntry]:
    """The in-process table: shape class key -> TunedEntry (loaded from the cache file or measured here)."""
    return _parse_lines(_ops().attention_tuning_table("", False))


def tuned_tiles(family: str = "fwd", head_dim: int = 128, dtype: torch.dtype = torch.bfloat16, mask: str = "causal",
                seq_len: int = 2048, kv_len: Optional[int] = None, **kw) -> Optional[Tuple[int, int]]:
    """The tiles the ops use for this shape class (arguments as `class_key`): None when the class has no entry (the
    built-in defaults apply), (0, 0) when the built-in choice won its measurement, else (block_q, block_kv)."""
    e = table().get(class_key(family, head_dim, dtype, mask, seq_len, kv_len, **kw))
    return None if e is None else (e.block_q, e.block_kv)


def stats() -> Tuple[int, int]:
    """(shape classes measured, kernel runs timed) by this process so far."""
    classes, runs = _ops().attention_tuning_stats()
    return int(classes), int(runs)


# What the file held at the last load/save: entries beyond it are what this process tuned (saved at exit).
_known: Dict[str, TunedEntry] = {}


def _valid_entry(key, value) -> TunedEntry:
    if not isinstance(key, str) or not key or any(c.isspace() for c in key) or key.split("|")[0] not in FAMILIES:
        raise ValueError(f"bad shape class key {key!r}")
    if not isinstance(value, dict):
        raise ValueError(f"entry {key!r} is not an object")
    q, kv = value.get("block_q"), value.get("block_kv")

    def tiles_ok(a, b):
        return (isinstance(a, int) and isinstance(b, int) and not isinstance(a, bool) and not isinstance(b, bool)
                and ((a == 0 and b == 0) or (1 <= a <= MAX_BLOCK_Q and 1 <= b <= MAX_BLOCK_KV)))

    if not tiles_ok(q, kv):
        raise ValueError(f"entry {key!r} has bad tiles {q!r} x {kv!r}")
    measured = value.get("measured", [])
    if not isinstance(measured, list):
        raise ValueError(f"entry {key!r}: 'measured' is not a list")
    rows = []
    for m in measured:
        if not (isinstance(m, list) and len(m) == 3 and tiles_ok(m[0], m[1]) and isinstance(m[2], (int, float))
                and m[2] >= 0):
            raise ValueError(f"entry {key!r}: bad measurement {m!r}")
        rows.append((m[0], m[1], float(m[2])))
    return TunedEntry(q, kv, tuple(rows))


def _read(path: str) -> Dict[str, TunedEntry]:
    """The entries of a cache file; {} with a warning when it is unreadable, corrupt or of another machine."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise ValueError(f"not a format-{FORMAT} tile cache")
        if data.get("machine") != machine_info():
            raise ValueError(f"written for another machine or version ({data.get('machine')!r}; this one is "
                             f"{machine_info()!r})")
        entries = data.get("entries")
        if not isinstance(entries, dict):
            raise ValueError("no 'entries' object")
        return {k: _valid_entry(k, v) for k, v in entries.items()}
    except FileNotFoundError:
        return {}
    except (OSError, ValueError, TypeError, AttributeError) as e:  # json.JSONDecodeError is a ValueError
        warnings.warn(f"torch_ops_transformer.attention.tuning: ignoring the tile cache file {path}: {e}", stacklevel=3)
        return {}


def load(path: Optional[str] = None) -> int:
    """Adds the entries of the cache file (default `cache_path()`) to the in-process table (classes this process
    already has keep their entry). Returns how many the file held; a corrupt file or one of another machine is
    ignored with a warning."""
    entries = _read(path or cache_path())
    if entries:
        _ops().attention_tuning_table(_format_lines(entries), False)
    _known.update(entries)
    return len(entries)


def save(path: Optional[str] = None) -> str:
    """Writes the in-process table, merged with what the file holds (this process's entries win), to the cache file
    (default `cache_path()`) atomically. Returns the path."""
    path = path or cache_path()
    entries = _read(path) if os.path.exists(path) else {}
    entries.update(table())
    data = {"format": FORMAT, "machine": machine_info(),
            "entries": {k: {"block_q": e.block_q, "block_kv": e.block_kv, "measured": [list(m) for m in e.measured]}
                        for k, e in sorted(entries.items())}}
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".attention_tiles-", suffix=".tmp", dir=os.path.dirname(path) or ".")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(data, f, indent=1)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    _known.clear()
    _known.update(entries)
    return path


def clear_cache(file: bool = True) -> None:
    """Empties the in-process table; with file=True also deletes this machine's cache file (`cache_path()`)."""
    _ops().attention_tuning_table("", True)
    _known.clear()
    if file:
        try:
            os.unlink(cache_path())
        except FileNotFoundError:
            pass


def _autoload() -> None:
    """At import: load this machine's cache file unless tuning is off (a bad TORCH_OPS_TRANSFORMER_TUNE is left for
    the ops to report at their first call)."""
    try:
        if tune_mode() == "off":
            return
    except ValueError:
        return
    try:
        load()
    except Exception as e:  # never break the import over a cache
        warnings.warn(f"torch_ops_transformer.attention.tuning: the tile cache was not loaded: {e}", stacklevel=2)


@atexit.register
def _save_at_exit() -> None:
    try:
        current = table()
    except Exception:  # the library may already be unloaded
        return
    if any(k not in _known for k in current):
        try:
            save()
        except OSError as e:
            warnings.warn(f"torch_ops_transformer.attention.tuning: could not write the tile cache {cache_path()}: {e}")


# ---- pre-tuning the common shapes (python -m torch_ops_transformer tune) ----

@dataclass(frozen=True)
class Shape:
    family: str      # "fwd", "bwd" or "prefill" (prompt_flash_attention)
    dtype: torch.dtype
    mask: str        # "none" or "causal"
    seq_len: int
    head_dim: int
    heads: int = 8
    batch: int = 1


def common_shapes(quick: bool = False, dtypes: Sequence[torch.dtype] = (torch.bfloat16, torch.float32),
                  seq_lens: Optional[Sequence[int]] = None, head_dims: Optional[Sequence[int]] = None,
                  families: Sequence[str] = FAMILIES, masks: Sequence[str] = ("causal", "none")) -> List[Shape]:
    """The classes `pretune` covers: S 512..4096, D 64/128 by default; quick: tiny shapes for tests."""
    seq_lens = seq_lens or ((128, 256) if quick else (512, 1024, 2048, 4096))
    head_dims = head_dims or ((64,) if quick else (64, 128))
    heads = 2 if quick else 8
    return [Shape(f, dt, m, s, d, heads) for dt in dtypes for d in head_dims for s in seq_lens for m in masks
            for f in families]


def _run_shape(s: Shape) -> None:
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(s.batch, s.heads, s.seq_len, s.head_dim, generator=g).to(s.dtype) for _ in range(3))
    kw = dict(scale=s.head_dim ** -0.5, sparse_mode=3 if s.mask == "causal" else 0)
    ops = _ops()
    if s.family == "prefill":
        ops.prompt_flash_attention(q, k, v, num_heads=s.heads, scale_value=kw["scale"], input_layout="BNSD",
                                   sparse_mode=kw["sparse_mode"], next_tokens=2147483647)
        return
    out, smax, ssum = ops.flash_attention_score(q, k, v, s.heads, "BNSD", **kw)[:3]
    if s.family == "bwd":
        dy = torch.randn(out.shape, generator=g).to(s.dtype)
        ops.flash_attention_score_grad(q, k, v, dy, s.heads, "BNSD", softmax_max=smax, softmax_sum=ssum,
                                       attention_in=out, **kw)


def pretune(shapes: Sequence[Shape], retune: bool = False, progress=None) -> Dict[str, TunedEntry]:
    """Tunes each shape's class (a synthetic call with TORCH_OPS_TRANSFORMER_TUNE=1) unless the table already has it
    (retune=True measures again). Returns {key: entry} of the shapes, in order."""
    if attention_tiles() != (0, 0):
        raise RuntimeError("pretune: an explicit attention_tiles override is set (it disables tuning); reset it with "
                           "attention_tiles(-1, -1)")
    keys = [class_key(s.family, s.head_dim, s.dtype, s.mask, s.seq_len) for s in shapes]
    if retune:
        kept = {k: e for k, e in table().items() if k not in set(keys)}
        _ops().attention_tuning_table(_format_lines(kept), True)
    old = os.environ.get(ENV)
    os.environ[ENV] = "1"
    try:
        for s, key in zip(shapes, keys):
            if key not in table():
                # A grad call needs a forward first, which tunes the forward class of the shape too.
                _run_shape(s)
            if progress:
                progress(key)
    finally:
        if old is None:
            del os.environ[ENV]
        else:
            os.environ[ENV] = old
    tab = table()
    return {k: tab[k] for k in keys if k in tab}


def format_table(entries: Dict[str, TunedEntry]) -> str:
    """One block per class: each candidate's tiles and best time, the winner marked, the ratio to the built-in
    choice (time of the built-in / time of the candidate: > 1 is faster)."""
    lines = [f"{'shape class':<44} {'block_q x block_kv':>18} {'ms':>9} {'speedup':>8}"]
    for key, e in entries.items():
        if not e.measured:
            lines.append(f"{key:<44} {'built-in (not measured: one candidate)':>38}")
            continue
        base = e.measured[0][2]
        for i, (q, kv, ms) in enumerate(e.measured):
            win = (i == 0) if e.builtin else (q, kv) == (e.block_q, e.block_kv) and i > 0
            label = f"{q}x{kv}" + (" (built-in)" if i == 0 else "")
            mark = " <- winner" if win else ""
            lines.append(f"{key if i == 0 else '':<44} {label:>18} {ms:9.3f} {base / ms if ms else 0:7.2f}x{mark}")
    return "\n".join(lines)


def _ms(x: float) -> str:
    return f"{x:.1f}" if x >= 10 else f"{x:.2f}" if x >= 1 else f"{x:.3f}"


def format_summary(entries: Dict[str, TunedEntry]) -> str:
    """One line per class: the built-in choice's time, the winner's tiles, time and speedup, and the range of the
    candidates' speedups."""
    lines = [f"{'shape class':<44} {'built-in':>16} {'winner':>16} {'speedup':>8} {'candidates':>12}"]
    for key, e in entries.items():
        if not e.measured:
            lines.append(f"{key:<44} {'(one candidate: built-in)':>30}")
            continue
        q0, kv0, base = e.measured[0]
        win = e.measured[0] if e.builtin else next(m for m in e.measured[1:] if m[:2] == (e.block_q, e.block_kv))
        ratios = [base / ms for _, _, ms in e.measured if ms > 0]
        lines.append(f"{key:<44} {f'{q0}x{kv0} {_ms(base)}':>16} {f'{win[0]}x{win[1]} {_ms(win[2])}':>16} "
                     f"{base / win[2]:7.2f}x {f'{min(ratios):.2f}-{max(ratios):.2f}x':>12}")
    return "\n".join(lines)


def main(argv=None) -> int:

    names = {"bf16": torch.bfloat16, "fp32": torch.float32, "fp16": torch.float16}
    ap = argparse.ArgumentParser(prog="python -m torch_ops_transformer tune",
                                 description="Tune the CPU FlashAttention tile sizes of the common shapes on this "
                                             "machine, print the measured table and write the cache file.")
    ap.add_argument("--quick", action="store_true", help="tiny shapes (seconds): checks the machinery")
    ap.add_argument("--dtype", action="append", choices=sorted(names), help="repeatable; default bf16 and fp32")
    ap.add_argument("--seq", type=int, action="append", help="sequence length (repeatable); default 512..4096")
    ap.add_argument("--head-dim", type=int, action="append", help="repeatable; default 64 and 128")
    ap.add_argument("--family", action="append", choices=list(FAMILIES), help="repeatable; default all three")
    ap.add_argument("--mask", action="append", choices=["causal", "none"], help="repeatable; default both")
    ap.add_argument("--retune", action="store_true", help="measure again the classes the cache already holds")
    ap.add_argument("--no-save", action="store_true", help="do not write the cache file")
    ap.add_argument("--summary", action="store_true", help="one line per class instead of every candidate")
    a = ap.parse_args(argv)
    tune_mode()  # a bad TORCH_OPS_TRANSFORMER_TUNE is reported before any work
    dtypes = [names[d] for d in (a.dtype or ["bf16", "fp32"])]
    shapes = common_shapes(a.quick, dtypes, a.seq, a.head_dim, a.family or FAMILIES, a.mask or ("causal", "none"))
    model, flags = _cpu_model_and_flags()
    print(f"# {model}; ISA {' '.join(flags) or '-'}; {torch.get_num_threads()} threads; torch {torch.__version__}")
    print(f"# {len(shapes)} shape classes (B{shapes[0].batch} N{shapes[0].heads}, BNSD)" if shapes else "# no shapes")
    entries = pretune(shapes, a.retune)
    print(format_summary(entries) if a.summary else format_table(entries))
    if not a.no_save:
        print(f"# cache: {save()}")
    return 0
