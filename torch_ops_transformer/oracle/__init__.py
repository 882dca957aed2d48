"""A differential oracle: every call of a mirrored op on a device (Ascend NPU, or the simulated "npu") is also
computed by our CPU kernels on CPU copies of its inputs, and the device result is judged under the op's tolerance
rule (oracle/compare.py). PyTorch's SDPA hook on the device (whose kernel is ours) is judged against PyTorch's SDPA
semantics in plain math — to find the one op call behind a silent model-accuracy problem (docs/oracle.md).

    from torch_ops_transformer import oracle
    with oracle.check(mode="raise"):          # or "warn", or "sample" (one call in `every`)
        model(batch)

or, for a whole program, `TOT_ORACLE=warn python serve.py` (see `from_env`). Checked: the `torch.ops.npu_fa.*` ops
(whatever reaches them: our Python API, the torch_npu shim, the SDPA and Hugging Face drop-ins, autograd's backward
ops) and, with a real torch_npu, its `torch.ops.npu.*` ops that this package mirrors (the reference is then the
shim's function of the same name). The interception is a TorchDispatchMode that torch.compile ignores while
tracing (compiled artifacts' calls of our ops are checked when they run); every op of the program pays one Python
dispatch hop while the oracle is on.

Not re-run: ops that talk to a process group (their `group*` argument: a second collective would deadlock) and
dropout drawn from the generator (keep_prob < 1 without an explicit seed). A call that raises on the device is not
checked (the error is the user's to see); a call the device accepts and the CPU kernel rejects is reported.
"""
import atexit
import logging
import os
import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map

from .compare import Mismatch, compare, least_precise
from .evidence import cpu_chain, gather
from .references import per_kv_head, sdpa_probabilities as _sdpa_probabilities

__all__ = ["check", "from_env", "OracleMismatch", "Report", "Stats", "reports", "stats"]

log = logging.getLogger("torch_ops_transformer.oracle")
MODES = ("warn", "raise", "sample")
OUR_NAMESPACE = "npu_fa"
TORCH_NPU_NAMESPACE = "npu"


class OracleMismatch(RuntimeError):
    """Raised in mode "raise": a device result the CPU kernels do not confirm. `.report` has the details."""

    def __init__(self, report: "Report"):
        super().__init__(report.text())
        self.report = report


@dataclass
class Report:
    op: str                   # "npu_fa::flash_attention_score" or "npu::npu_fused_infer_attention_score"
    arguments: str            # shapes, dtypes, devices, modes — not the data
    mismatch: Mismatch
    saved: Optional[str] = None  # the replay file, when inputs are saved

    def text(self) -> str:
        m = self.mismatch
        lines = [f"oracle: {self.op} disagrees with the CPU kernel: output {m.output}: {m.what}"] + m.details()
        lines.append(f"  arguments: {self.arguments}")
        if self.saved:
            lines.append(f"  inputs saved: {self.saved}  (python -m torch_ops_transformer oracle replay {self.saved})")
        return "\n".join(lines)


@dataclass
class Stats:
    calls_seen: int = 0        # calls of mirrored ops on a device
    checked: int = 0
    sampled_out: int = 0
    not_rerun: int = 0         # collectives, generator-drawn dropout
    mismatches: int = 0
    seconds: float = 0.0       # spent in the CPU reference runs and the comparison

    def text(self) -> str:
        return (f"oracle: {self.checked} calls checked ({self.mismatches} mismatches), {self.sampled_out} skipped "
                f"by sampling, {self.not_rerun} not re-run, of {self.calls_seen} device calls; {self.seconds:.3f} s "
                f"spent checking")


_lock = threading.Lock()
_stats = Stats()
_reports: List[Report] = []


def stats() -> Stats:
    """Counters of every oracle since the process started."""
    return _stats


def reports() -> List[Report]:
    """Every mismatch reported since the process started (also in modes warn and sample)."""
    return list(_reports)


# ---- which calls -------------------------------------------------------------------------------------------------
def _op_name(func) -> str:
    return func._schema.name  # "npu_fa::flash_attention_score"


def _short(name: str) -> str:
    return name.split("::", 1)[1]


def _on_device(flat: Iterable[Any]) -> bool:
    return any(isinstance(t, torch.Tensor) and t.device.type not in ("cpu", "meta") for t in flat)


def _schema_args(func, args, kwargs) -> Dict[str, Any]:
    values = {}
    for i, a in enumerate(func._schema.arguments):
        if i < len(args):
            values[a.name] = args[i]
        elif a.name in kwargs:
            values[a.name] = kwargs[a.name]
        elif a.has_default_value():
            values[a.name] = a.default_value
    return values


def _why_not_rerun(func, args, kwargs) -> Optional[str]:
    values = _schema_args(func, args, kwargs)
    if any(name.startswith("group") and isinstance(v, str) for name, v in values.items()):
        return "collective (talks to a process group)"
    keep = values.get("keep_prob")
    if isinstance(keep, float) and keep < 1.0 and values.get("seed") is None and values.get("dropout_mask") is None:
        return "dropout drawn from the generator"
    if isinstance(values.get("dropout_p"), float) and values["dropout_p"] > 0.0:
        return "dropout drawn from the generator"
    return None


@dataclass
class _Reference:
    """How to recompute a call on CPU: the same overload (our ops), the torch_npu shim's function, or plain PyTorch
    (the SDPA hook); `outputs`: which of the op's outputs are judged (all by default)."""

    run: Callable[..., Any]
    outputs: Optional[slice] = None

    def pick(self, outs: List[torch.Tensor]) -> List[torch.Tensor]:
        return outs if self.outputs is None else outs[self.outputs]


def _sdpa_forward(query, key, value, attn_bias=None, dropout_p=0.0, is_causal=False, return_debug_mask=False, *,
                  scale=None):
    """The overrideable SDPA hook's out and logsumexp, by PyTorch's SDPA semantics in plain math."""
    p, lse, group = _sdpa_probabilities(query, key, attn_bias, is_causal, scale)
    out = p @ value.repeat_interleave(group, -3)
    lse = lse.reshape(-1, lse.shape[-2], lse.shape[-1])  # [B, H, L] (B = 1 for 3-D inputs), as the hook returns
    return out.to(query.dtype), lse.float() if query.dtype != torch.float64 else lse


def _sdpa_backward(grad_out, query, key, value, attn_bias, grad_input_mask, out, logsumexp, cum_seq_q, cum_seq_k,
                   max_q, max_k, dropout_p, is_causal, philox_seed, philox_offset, *, scale=None):
    """dq, dk, dv of the same math: dV = Pᵀ dO, dS = P ∘ (dO Vᵀ − rowsum(dO ∘ O)), dQ = c dS K, dK = c dSᵀ Q."""
    p, _, group = _sdpa_probabilities(query, key, attn_bias, is_causal, scale)
    c = scale if scale is not None else query.shape[-1] ** -0.5
    v = value.repeat_interleave(group, -3)
    o = p @ v
    dv = p.transpose(-1, -2) @ grad_out
    ds = p * (grad_out @ v.transpose(-1, -2) - (grad_out * o).sum(-1, keepdim=True))
    dq = c * ds @ key.repeat_interleave(group, -3)
    dk = c * ds.transpose(-1, -2) @ query
    return dq.to(query.dtype), per_kv_head(dk, group).to(key.dtype), per_kv_head(dv, group).to(value.dtype)


_SDPA_HOOK_OPS = ("_scaled_dot_product_fused_attention_overrideable.default",
                  "_scaled_dot_product_fused_attention_overrideable_backward.default")
_SDPA_HOOK = {"aten::_scaled_dot_product_fused_attention_overrideable": _Reference(_sdpa_forward, slice(0, 2)),
              "aten::_scaled_dot_product_fused_attention_overrideable_backward": _Reference(_sdpa_backward,
                                                                                             slice(0, 3))}


def _reference_for(func) -> Optional[_Reference]:
    return reference_for_name(_op_name(func), func)


def reference_for_name(name: str, func=None) -> Optional[_Reference]:
    """The CPU reference of an op by its qualified name ("npu_fa::...", "npu::...", or the SDPA hook's aten ops)."""
    ns, short = name.split("::", 1)
    if ns == "aten":
        return _SDPA_HOOK.get(name)
    if ns == OUR_NAMESPACE:
        op = func if func is not None else getattr(torch.ops.npu_fa, short).default
        return _Reference(lambda *a, **k: op(*a, **k))
    if ns == TORCH_NPU_NAMESPACE:
        from .. import compat  # lazy: the shim imports torch.testing's test utilities (heavy); torch_npu refs only

        fn = getattr(compat.module(), short, None)
        if fn is None or getattr(fn, "__name__", "") == short and "not implemented" in (fn.__doc__ or ""):
            return None
        return _Reference(fn)
    return None


# ---- argument summary and copies ---------------------------------------------------------------------------------
def _describe(v: Any) -> str:
    if isinstance(v, torch.Tensor):
        dt = str(v.dtype).replace("torch.", "")
        return f"{dt}{list(v.shape)}@{v.device.type}" + ("" if v.is_contiguous() else " strided")
    if isinstance(v, (list, tuple)):
        if len(v) > 8 and not any(isinstance(x, torch.Tensor) for x in v):
            return f"[{len(v)} values]"
        return "[" + ", ".join(_describe(x) for x in v) + "]"
    return repr(v)


def describe_call(func, args, kwargs) -> str:
    values = _schema_args(func, args, kwargs)
    return ", ".join(f"{k}={_describe(v)}" for k, v in values.items()
                     if v is not None and not (isinstance(v, (list, tuple)) and len(v) == 0))


def _to_cpu(x: Any) -> Any:
    return x.detach().to("cpu", copy=True) if isinstance(x, torch.Tensor) else x


def _outputs(result: Any) -> List[torch.Tensor]:
    flat, _ = tree_flatten(result)
    return [t for t in flat if isinstance(t, torch.Tensor)]


def _mutated(func, args, kwargs) -> List[torch.Tensor]:
    """The tensor arguments the schema says the op writes (caches updated in place)."""
    out = []
    values = _schema_args(func, args, kwargs)
    for a in func._schema.arguments:
        if a.alias_info is not None and a.alias_info.is_write and isinstance(values.get(a.name), torch.Tensor):
            out.append(values[a.name])
    return out


# ---- the mode ----------------------------------------------------------------------------------------------------
class _OracleMode(TorchDispatchMode):
    @classmethod
    def ignore_compile_internals(cls) -> bool:
        # torch.compile traces as if the oracle were off (no fallback to eager, no graph breaks); the compiled
        # artifact runs with it on, so its calls of our ops as extern kernels are still checked.
        return True

    def __init__(self, mode: str, every: int, ops: Optional[Sequence[str]], skip: Optional[Sequence[str]],
                 save_dir: Optional[str]):
        super().__init__()
        if mode not in MODES:
            raise ValueError(f"oracle: mode must be one of {', '.join(MODES)}; got {mode!r}")
        if every < 1:
            raise ValueError(f"oracle: every must be >= 1; got {every}")
        self.mode, self.every, self.save_dir = mode, every if mode == "sample" else 1, save_dir
        self.ops = None if ops is None else {_normalise(o) for o in ops}
        self.skip = {_normalise(o) for o in (skip or ())}
        self.counts: Dict[str, int] = {}

    def _wanted(self, name: str) -> bool:
        short = _short(name)
        if short in self.skip or name in self.skip:
            return False
        return self.ops is None or short in self.ops or name in self.ops

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        ns = getattr(func, "namespace", "")
        if ns not in (OUR_NAMESPACE, TORCH_NPU_NAMESPACE) and getattr(func, "__name__", "") not in _SDPA_HOOK_OPS:
            return func(*args, **kwargs)
        flat, _ = tree_flatten((args, kwargs))
        name = _op_name(func)
        if not _on_device(flat) or not self._wanted(name):
            return func(*args, **kwargs)
        reference = _reference_for(func)
        if reference is None:  # a torch_npu op this package does not mirror
            return func(*args, **kwargs)
        with _lock:
            _stats.calls_seen += 1
            n = self.counts.get(name, 0)
            self.counts[name] = n + 1
        if _why_not_rerun(func, args, kwargs):
            with _lock:
                _stats.not_rerun += 1
            return func(*args, **kwargs)
        if n % self.every:
            with _lock:
                _stats.sampled_out += 1
            return func(*args, **kwargs)
        # CPU copies before the device call: an op may write its arguments (caches).
        cpu_args, cpu_kwargs = tree_map(_to_cpu, (args, kwargs))
        result = func(*args, **kwargs)
        start = time.perf_counter()
        try:
            self._check(func, reference, args, kwargs, cpu_args, cpu_kwargs, result)
        finally:
            with _lock:
                _stats.checked += 1
                _stats.seconds += time.perf_counter() - start
        return result

    def _check(self, func, reference, args, kwargs, cpu_args, cpu_kwargs, result):
        devs = [t.detach().cpu() for t in reference.pick(_outputs(result)) + _mutated(func, args, kwargs)]
        # The CPU run writes the arguments an op writes (caches): keep the inputs for the other runs and the file.
        writes = bool(_mutated(func, cpu_args, cpu_kwargs))
        saved_inputs = tree_map(lambda x: x.clone() if writes and isinstance(x, torch.Tensor) else x,
                                (cpu_args, cpu_kwargs))
        run = judged_run(reference, func)
        try:
            cpus = run(*cpu_args, **cpu_kwargs)
        except Exception as e:  # the device accepted what the CPU kernel rejects
            self._report(func, args, kwargs, saved_inputs, devs,
                         Mismatch(0, f"the CPU kernel raised {type(e).__name__}: {str(e).splitlines()[0]}"))
            return
        bad = judge(_op_name(func), func, run, saved_inputs, cpus, devs)
        if bad is not None:
            self._report(func, args, kwargs, saved_inputs, devs, bad)

    def _report(self, func, args, kwargs, saved_inputs, devs, mismatch: Mismatch):
        rep = Report(_op_name(func), describe_call(func, args, kwargs), mismatch)
        if self.save_dir:
            rep.saved = save_call(self.save_dir, rep, saved_inputs, devs)
        with _lock:
            _stats.mismatches += 1
            _reports.append(rep)
        if self.mode == "raise":
            raise OracleMismatch(rep)
        log.warning(rep.text())


def judged_run(reference: "_Reference", func=None) -> Callable[..., List[torch.Tensor]]:
    """A CPU run of the reference returning the judged outputs, then the arguments the op writes (with `func`)."""
    def run(*args, **kwargs):
        outs = reference.pick(_outputs(reference.run(*args, **kwargs)))
        return outs + (_mutated(func, args, kwargs) if func is not None else [])
    return run


def judge(name: str, func, run, inputs, cpus: List[torch.Tensor], devs: List[torch.Tensor]) -> Optional[Mismatch]:
    """The device outputs `devs` of a call judged against the CPU kernels' `cpus` (from `run` on `inputs`), with
    the evidence of oracle/evidence.py; `func` (our op's overload, or None) names the arguments for the chains."""
    names = (lambda a, k: _schema_args(func, a, k)) if func is not None else None
    cpus = cpu_chain(name, inputs, names) or cpus
    flat, _ = tree_flatten(inputs)
    return compare(devs, cpus, gather(name, run, inputs, cpus, names), least_precise(flat))


def _normalise(op: str) -> str:
    op = op.strip()
    if op.startswith("torch.ops."):
        op = op[len("torch.ops."):].replace(".", "::", 1)
    return op


def save_call(directory: str, rep: Report, inputs, device_outputs) -> str:
    """Writes what reproduces the call on CPU alone (replay.py reads it); returns the file name."""
    os.makedirs(directory, exist_ok=True)
    with _lock:
        index = len(_reports)
    path = os.path.join(directory, f"oracle_{os.getpid()}_{index:04d}_{_short(rep.op)}.pt")
    args, kwargs = inputs
    torch.save({"op": rep.op, "args": args, "kwargs": kwargs, "device_outputs": device_outputs,
                "report": rep.text(), "format": 1}, path)
    return path


# ---- activation --------------------------------------------------------------------------------------------------
@contextmanager
def check(mode: str = "warn", every: int = 100, ops: Optional[Sequence[str]] = None,
          skip: Optional[Sequence[str]] = None, save_dir: Optional[str] = None, summary: bool = False):
    """Check every device call of a mirrored op inside the block against our CPU kernels.

    mode: "warn" (log each mismatch and continue), "raise" (OracleMismatch at the first), "sample" (check one call
    in `every` per op, log mismatches). ops / skip: op names to check only / never ("flash_attention_score",
    "npu_fa::flash_attention_score", or torch_npu's "npu_fused_infer_attention_score"). save_dir: write each
    mismatching call's inputs there (replay: `python -m torch_ops_transformer oracle replay FILE`). summary: print
    the counters (calls checked, time spent) to stderr on exit.
    """
    m = _OracleMode(mode, every, ops, skip, save_dir)
    before = Stats(**vars(_stats))
    try:
        with m:
            yield m
    finally:
        if summary:
            now = _stats
            delta = Stats(*(getattr(now, f) - getattr(before, f) for f in vars(now)))
            print(delta.text(), file=sys.stderr)


_env_mode: Optional[_OracleMode] = None


def from_env(environ=None) -> bool:
    """Turns the oracle on for the whole process from the environment (called when torch_ops_transformer is
    imported): TOT_ORACLE = warn | raise | sample, TOT_ORACLE_EVERY = N (sample), TOT_ORACLE_OPS / TOT_ORACLE_SKIP
    = comma-separated op names, TOT_ORACLE_SAVE = a directory for the inputs of mismatching calls. The counters are
    printed to stderr when the process exits. Returns whether it was turned on."""
    global _env_mode
    env = os.environ if environ is None else environ
    mode = env.get("TOT_ORACLE", "").strip()
    if not mode or _env_mode is not None:
        return False
    split = (lambda v: [x for x in v.split(",") if x.strip()] if v else None)
    _env_mode = _OracleMode(mode, int(env.get("TOT_ORACLE_EVERY", "100")), split(env.get("TOT_ORACLE_OPS")),
                            split(env.get("TOT_ORACLE_SKIP")), env.get("TOT_ORACLE_SAVE") or None)
    _env_mode.__enter__()
    atexit.register(lambda: print(_stats.text(), file=sys.stderr))
    return True
