"""`F.scaled_dot_product_attention` as a drop-in: a router with PyTorch's exact semantics that runs our ops, a
TorchFunctionMode that sends every `F.scaled_dot_product_attention` call of a thread to it (`sdpa_override()`,
thread-local), and a process-wide switch for all threads (`enable_sdpa_override()`, a flag read by a wrapper
installed as `torch.nn.functional.scaled_dot_product_attention`).

Routing (see docs/sdpa_and_compile.md):
  - prefill / training  -> npu_fa::flash_attention_score (BNSD, differentiable, Philox dropout);
  - one-token decode without autograd (Sq == 1, no causal, no dropout, Ev == E) -> npu_fa::incre_flash_attention;
  - anything else -> PyTorch's own SDPA (one `logging` debug message per reason), never a different answer.
  - keyword-only extensions of the router (the Hugging Face backend's): `sink` (per-head attention sinks) and
    `softcap` (logit soft-capping) run flash_attention_score, or `math_attention` where the kernels cannot.

Semantics reproduced: bool attn_mask True = *keep* (ours: True = masked out, so it is inverted); a float attn_mask is
added to the scaled scores (our pse with pse_type 0); masks broadcast from any shape PyTorch accepts; `is_causal` is
aligned to the top-left corner (sparse_mode 2) when Sq != Skv; scale defaults to 1/sqrt(E); enable_gqa; Ev <= E;
rows whose keys are all masked give 0, as PyTorch 2.13's CPU SDPA does. NaN and infinities follow the attention ops'
policy (docs/attention.md, "NaN and infinities"), which is PyTorch's math: values are never inspected, in eager mode
or under torch.compile.
"""
import collections
import contextlib
import logging
import math
import threading
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.overrides import TorchFunctionMode

from .._internal.args import dropout_seed as _draw_seed

_OPS = torch.ops.npu_fa
# F.scaled_dot_product_attention is this builtin; keep a handle so a fallback never re-enters our router.
PYTORCH_SDPA = torch._C._nn.scaled_dot_product_attention
_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_FP32_MAX = torch.finfo(torch.float32).max  # `abs(scale) <= _FP32_MAX` is also False for NaN and inf

log = logging.getLogger(__name__)
# How often each route ran in eager mode ("prefill", "decode", "fallback: <reason>"); tests and users read it.
route_counts: collections.Counter = collections.Counter()
_logged_reasons: set = set()


# ---------------------------------------------------------------------------------------------------------------
# what we support
# ---------------------------------------------------------------------------------------------------------------
def _tensor_reason(query, key, value, device_type) -> Optional[str]:
    if not all(isinstance(t, Tensor) for t in (query, key, value)):
        return "query/key/value are not all tensors"
    if any(t.is_nested for t in (query, key, value)):
        return "nested tensors"
    if any(t.device.type != device_type for t in (query, key, value)):
        return f"device {query.device.type} (this route runs our kernels on {device_type} tensors)"
    if query.dtype not in _DTYPES:
        return f"dtype {query.dtype} (kernels take float32/float16/bfloat16)"
    if key.dtype != query.dtype or value.dtype != query.dtype:
        return "query/key/value dtypes differ"
    if query.dim() not in (3, 4) or key.dim() != query.dim() or value.dim() != query.dim():
        return f"{query.dim()}-D query (only 3-D [B,S,E] and 4-D [B,N,S,E] are routed)"
    return None


def _shape_reason(query, key, value, enable_gqa) -> Optional[str]:
    if key.shape[:-2] != value.shape[:-2] or key.shape[-2] != value.shape[-2]:
        return "key/value batch, heads or length differ"
    if query.shape[0] != key.shape[0]:
        return "query and key batch sizes differ (broadcast batch)"
    if query.dim() == 4 and query.shape[1] != key.shape[1]:
        if not enable_gqa or query.shape[1] % key.shape[1] != 0:
            return "query and key head counts differ without enable_gqa (PyTorch raises)"
    e, ev = query.shape[-1], value.shape[-1]
    if key.shape[-1] != e:
        return "query and key head dims differ"
    if e == 0 or ev == 0 or ev > e:
        return "value head dim must satisfy 0 < Ev <= E"
    if query.shape[-2] == 0 or key.shape[-2] == 0:
        return "empty query or key sequence"
    return None


def _mask_reason(query, key, attn_mask, is_causal, device_type) -> Optional[str]:
    if attn_mask is None:
        return None
    if is_causal:
        return "attn_mask together with is_causal (PyTorch's CPU kernels disagree: flash combines, math raises)"
    if not isinstance(attn_mask, Tensor) or attn_mask.is_nested or attn_mask.device.type != device_type:
        return f"attn_mask is not a {device_type} tensor"
    if attn_mask.dtype not in (torch.bool, torch.float32, query.dtype):
        return f"attn_mask dtype {attn_mask.dtype} is not bool, float32 or the query dtype (PyTorch raises)"
    if attn_mask.dim() < 2 or attn_mask.dim() > query.dim():
        return f"{attn_mask.dim()}-D attn_mask (PyTorch takes 2-D up to the query's rank)"
    full = tuple(query.shape[:-1]) + (key.shape[-2],)
    pad = (1,) * (len(full) - attn_mask.dim()) + tuple(attn_mask.shape)
    if any(m != 1 and m != f for m, f in zip(pad, full)):
        return "attn_mask does not broadcast to [..., Sq, Skv]"
    return None


def unsupported_reason(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                       enable_gqa=False, device_type: str = "cpu") -> Optional[str]:
    """Why our ops cannot take this call (None: they can). Shape checks only; never reads tensor data.
    `device_type`: where the tensors must live ("npu" for the PrivateUse1 route of torch_ops_transformer.npu_sim.sdpa)."""
    reason = _tensor_reason(query, key, value, device_type)
    if reason is None:
        reason = _shape_reason(query, key, value, enable_gqa)
    if reason is None:
        reason = _mask_reason(query, key, attn_mask, is_causal, device_type)
    if reason is None and not (isinstance(dropout_p, (int, float)) and 0.0 <= dropout_p < 1.0):
        reason = f"dropout_p={dropout_p!r} outside [0, 1)"
    if reason is None and scale is not None and not (isinstance(scale, (int, float)) and abs(scale) <= _FP32_MAX):
        reason = f"scale={scale!r} is not a finite float32 number (the kernels compute in float32)"
    return reason


def supported(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
              enable_gqa=False) -> bool:
    """True when `scaled_dot_product_attention` runs this call on our ops (False: PyTorch's SDPA)."""
    return unsupported_reason(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa) is None


# ---------------------------------------------------------------------------------------------------------------
# running our ops
# ---------------------------------------------------------------------------------------------------------------
def _count(route: str) -> None:
    if not torch.compiler.is_compiling():
        route_counts[route] += 1


def _fallback_note(reason: str) -> None:
    """One debug message per distinct reason (eager only: logging inside a traced region would break the graph)."""
    if torch.compiler.is_compiling():
        return
    route_counts["fallback: " + reason] += 1
    if reason not in _logged_reasons:
        _logged_reasons.add(reason)
        log.debug("scaled_dot_product_attention falls back to PyTorch: %s", reason)


def _mask_4d(attn_mask: Tensor, query: Tensor) -> Tensor:
    """The mask as 4-D [b, n, sq, skv] (each dim full-size or 1) for a 4-D BNSD problem (3-D inputs get n = 1)."""
    m = attn_mask.reshape((1,) * (query.dim() - attn_mask.dim()) + tuple(attn_mask.shape))
    return m.unsqueeze(1) if query.dim() == 3 else m


def _needs_grad(*tensors) -> bool:
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


def _decode(q, k, v, mask, scale) -> Optional[Tensor]:
    """Sq == 1 through incre_flash_attention (BNSD), or None when its mask forms do not fit."""
    n1 = q.shape[1]
    skv = k.shape[2]
    atten_mask = pse_shift = None
    if mask is not None and mask.dtype == torch.bool:
        if mask.shape[1] != 1:
            return None  # IFA masks are per batch, not per head: use the prefill kernel
        atten_mask = torch.logical_not(mask).expand(mask.shape[0], 1, 1, skv)
    elif mask is not None:
        pse_shift = mask.expand(mask.shape[0], n1, 1, skv)
    _count("decode")
    return _OPS.incre_flash_attention(q, k, v, atten_mask=atten_mask, pse_shift=pse_shift, num_heads=n1,
                                      scale_value=scale, input_layout="BNSD", num_key_value_heads=k.shape[1])


def flash_mask_args(q: Tensor, k: Tensor, mask: Optional[Tensor], is_causal: bool) -> dict:
    """SDPA's masking for npu_fa.flash_attention_score on BNSD q/k: a 4-D mask ([b, n, sq, skv], each dim full or
    1; bool True = keep, float = added to the scaled scores) and top-left is_causal, as the op's keyword arguments
    (atten_mask True = masked out, pse with pse_type 0, sparse_mode 2 = top-left causal)."""
    n1, sq = q.shape[1], q.shape[2]
    skv = k.shape[2]
    atten_mask = pse = None
    if mask is not None and mask.dtype == torch.bool:
        atten_mask = torch.logical_not(mask).expand(mask.shape[0], mask.shape[1], sq, skv)
    elif mask is not None:
        # pse accepts [B,N,Sq,Skv], [B,N,1,Skv], [1,N,Sq,Skv]; expand() keeps the broadcast dims stride 0.
        rows = 1 if mask.shape[0] != 1 and mask.shape[2] == 1 else sq
        pse = mask.expand(mask.shape[0], n1, rows, skv)
    return dict(pse=pse, atten_mask=atten_mask, sparse_mode=2 if is_causal else 0, pse_type=0)


def _prefill(q, k, v, mask, dropout_p, is_causal, scale, sink=None, softcap=0.0) -> Tensor:
    keep = 1.0 - dropout_p
    seed, offset = _draw_seed(keep, q.device)
    _count("prefill")
    return _OPS.flash_attention_score(q, k, v, q.shape[1], "BNSD", scale=scale, keep_prob=keep, seed=seed,
                                      offset=offset, sink=sink, softcap=softcap,
                                      **flash_mask_args(q, k, mask, is_causal))[0]


def _run(query, key, value, attn_mask, dropout_p, is_causal, scale, sink=None, softcap=0.0) -> Tensor:
    three_d = query.dim() == 3
    q, k, v = (t.unsqueeze(1) for t in (query, key, value)) if three_d else (query, key, value)
    mask = None if attn_mask is None else _mask_4d(attn_mask, query)
    scale = 1.0 / math.sqrt(query.shape[-1]) if scale is None else float(scale)
    out = None
    if (q.shape[2] == 1 and not is_causal and dropout_p == 0.0 and v.shape[-1] == q.shape[-1] and sink is None
            and not softcap and not _needs_grad(query, key, value, attn_mask)):
        out = _decode(q, k, v, mask, scale)   # the decode kernel has neither sinks nor soft-capping
    if out is None:
        out = _prefill(q, k, v, mask, dropout_p, is_causal, scale, sink, softcap)
    return out.squeeze(1) if three_d else out


def _check_sink(query, sink) -> None:
    """The kernels take any finite or infinite per-head sink; a wrongly shaped one is an error (never a fallback)."""
    if sink is not None:
        heads = query.shape[1] if query.dim() == 4 else 1
        if not (isinstance(sink, Tensor) and sink.dim() == 1 and sink.shape[0] == heads and sink.is_floating_point()
                and sink.device == query.device):
            got = (f"{sink.dtype} of shape {list(sink.shape)} on {sink.device}" if isinstance(sink, Tensor)
                   else type(sink).__name__)
            raise ValueError(f"scaled_dot_product_attention: argument 'sink' must be a floating-point tensor of shape "
                             f"(num_query_heads,) = ({heads},) on {query.device}; got {got}")


def math_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                   enable_gqa=False, sink=None, softcap=0.0) -> Tensor:
    """Plain-PyTorch attention with a sink and soft-capping (what Hugging Face's eager attention computes), for the
    calls the kernels cannot take: scores = scale·QKᵀ, softcap·tanh(scores/softcap), then the mask (bool True =
    keep, float added; is_causal top-left), then a softmax whose denominator also has exp(sink[head]). Scores and
    softmax in float32 (float64 for float64 inputs); fully masked rows give 0."""
    acc = torch.float64 if query.dtype == torch.float64 else torch.float32
    q, k, v = query.to(acc), key.to(acc), value.to(acc)
    if enable_gqa and q.dim() == 4 and q.shape[1] != k.shape[1]:
        k = k.repeat_interleave(q.shape[1] // k.shape[1], 1)
        v = v.repeat_interleave(q.shape[1] // v.shape[1], 1)
    p, _ = math_probabilities(q, k, attn_mask, is_causal, scale, sink, softcap)
    if dropout_p > 0.0:
        p = F.dropout(p, dropout_p)
    _count("math")
    return (p @ v).to(query.dtype)


def math_probabilities(q: Tensor, k: Tensor, attn_mask: Optional[Tensor] = None, is_causal: bool = False,
                       scale: Optional[float] = None, sink: Optional[Tensor] = None, softcap: float = 0.0):
    """The attention probabilities of PyTorch's SDPA semantics (plus sink and soft-capping) and their logsumexp, in
    q's dtype, for k with q's heads: the package's one math implementation (math_attention, the oracle's SDPA
    reference). A row without any finite score has probabilities 0 and logsumexp -inf."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    s = (q @ k.transpose(-2, -1)) * scale
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    if is_causal:
        sq, skv = s.shape[-2], s.shape[-1]
        s = s.masked_fill(torch.ones(sq, skv, dtype=torch.bool, device=s.device).triu(1), -math.inf)
    if attn_mask is not None:
        s = s.masked_fill(~attn_mask, -math.inf) if attn_mask.dtype == torch.bool else s + attn_mask.to(s.dtype)
    if sink is not None:
        col = sink.to(s.dtype).view(-1, 1, 1) if s.dim() == 4 else sink.to(s.dtype).view(1, 1)
        s = torch.cat([s, col.expand(*s.shape[:-1], 1)], -1)
    lse = torch.logsumexp(s, -1, keepdim=True)
    p = torch.exp(s - lse).nan_to_num(0.0)  # a row without any finite score: 0
    if sink is not None:
        p = p[..., :-1]
    return p, lse.squeeze(-1)


def try_scaled_dot_product_attention(query: Tensor, key: Tensor, value: Tensor, attn_mask: Optional[Tensor] = None,
                                     dropout_p: float = 0.0, is_causal: bool = False, scale: Optional[float] = None,
                                     enable_gqa: bool = False) -> Optional[Tensor]:
    """Our result for an SDPA call, or None when its arguments are not supported (nothing is logged)."""
    if unsupported_reason(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa) is not None:
        return None
    return _run(query, key, value, attn_mask, dropout_p, is_causal, scale)


def scaled_dot_product_attention(query: Tensor, key: Tensor, value: Tensor, attn_mask: Optional[Tensor] = None,
                                 dropout_p: float = 0.0, is_causal: bool = False, scale: Optional[float] = None,
                                 enable_gqa: bool = False, *, sink: Optional[Tensor] = None,
                                 softcap: Optional[float] = None) -> Tensor:
    """`torch.nn.functional.scaled_dot_product_attention` with PyTorch's semantics, computed by our ops where
    supported and by PyTorch otherwise (see the module docstring).

    NaN and infinities (in query/key/value or a float attn_mask) run our kernels like any value: a row is NaN
    exactly when PyTorch's math gives NaN there (a NaN score, a NaN value it attends to, +inf in the mask), and a
    row whose keys are all masked (False or -inf) is 0 (docs/attention.md, "NaN and infinities").

    Two keyword-only extensions (not in PyTorch's SDPA; the Hugging Face backend passes them): `sink`, one logit
    per query head added to every softmax denominator (gpt-oss's attention sinks; differentiable), and `softcap`
    (> 0: scores become softcap·tanh(scores/softcap) before the mask, Gemma-2's attn_logit_softcapping). Calls
    with either that the kernels cannot take run `math_attention` (plain PyTorch), never PyTorch's SDPA, which has
    neither."""
    softcap = float(softcap) if softcap else 0.0
    if softcap < 0 or not math.isfinite(softcap):
        raise ValueError(f"scaled_dot_product_attention: argument 'softcap' must be a finite number >= 0 (0 or None = "
                         f"off); got {softcap!r}")
    extras = sink is not None or softcap > 0
    _check_sink(query, sink)
    reason = unsupported_reason(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)
    if reason is not None:
        _fallback_note(reason)
        if extras:
            return math_attention(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa, sink,
                                  softcap)
        return PYTORCH_SDPA(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal,
                            scale=scale, enable_gqa=enable_gqa)
    if sink is not None:
        sink = sink.float()                           # the kernel takes float32 sinks (autograd casts back)
    return _run(query, key, value, attn_mask, dropout_p, is_causal, scale, sink, softcap)


# ---------------------------------------------------------------------------------------------------------------
# the override: a TorchFunctionMode
# ---------------------------------------------------------------------------------------------------------------
class SdpaOverrideMode(TorchFunctionMode):
    """Sends `F.scaled_dot_product_attention` to our router; every other torch call passes through unchanged.
    While this handler runs the mode is off, so the router's own PyTorch fallback does not come back here."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is PYTORCH_SDPA:
            return scaled_dot_product_attention(*args, **kwargs)
        return func(*args, **kwargs)


@contextlib.contextmanager
def sdpa_override():
    """Within the block every `F.scaled_dot_product_attention` call **of this thread** runs on our ops (eager, and
    torch.compile when the block encloses the compiled call). Thread-local: a TorchFunctionMode lives on the
    calling thread's mode stack; other threads are not affected (use `enable_sdpa_override()` for all threads)."""
    with SdpaOverrideMode():
        yield


# The process-wide override: a flag read by a wrapper installed as `torch.nn.functional.scaled_dot_product_attention`.
# A TorchFunctionMode would not do: the mode stack is thread-local, so a mode entered in one thread never reaches
# another. The flag is a plain module global, so every thread sees it, and Dynamo guards on it (a function compiled
# with the override on recompiles when it is turned off, and vice versa).
_global_lock = threading.Lock()
_global_enabled = False
_installed_sdpa = None  # the F.scaled_dot_product_attention our wrapper replaced (None: wrapper not installed)


def _global_sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    """`F.scaled_dot_product_attention` while the process-wide override is installed: our router when it is on,
    PyTorch's SDPA otherwise (a thread that looked the wrapper up just before `disable_sdpa_override()`)."""
    if _global_enabled:
        return scaled_dot_product_attention(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p,
                                            is_causal=is_causal, scale=scale, enable_gqa=enable_gqa)
    return PYTORCH_SDPA(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal,
                        scale=scale, enable_gqa=enable_gqa)


def enable_sdpa_override() -> None:
    """Turns the override on for the whole process, every thread included (until `disable_sdpa_override`).

    Idempotent (not counted): enabling twice and disabling once turns it off. Thread-safe: enable and disable hold
    one lock, so concurrent calls from several threads leave the override either fully on or fully off. It installs
    a wrapper as `torch.nn.functional.scaled_dot_product_attention`, so it reaches calls that look the function up
    on the module (`F.scaled_dot_product_attention(...)`, as PyTorch's own modules and Hugging Face do), not a
    reference bound before enabling (`from torch.nn.functional import scaled_dot_product_attention`) nor direct
    `torch._C._nn` calls; `sdpa_override()` reaches those, in its own thread."""
    global _global_enabled, _installed_sdpa
    with _global_lock:
        if F.scaled_dot_product_attention is not _global_sdpa:
            _installed_sdpa = F.scaled_dot_product_attention
            F.scaled_dot_product_attention = _global_sdpa
        _global_enabled = True


def disable_sdpa_override() -> None:
    """Turns the process-wide override off, in every thread; may be called from any thread. Idempotent: a no-op
    when it is off. Restores the `F.scaled_dot_product_attention` it replaced (unless someone replaced ours since).
    Leaves `sdpa_override()` blocks alone (they are per thread)."""
    global _global_enabled, _installed_sdpa
    with _global_lock:
        _global_enabled = False
        if _installed_sdpa is not None and F.scaled_dot_product_attention is _global_sdpa:
            F.scaled_dot_product_attention = _installed_sdpa
        _installed_sdpa = None


def sdpa_override_enabled() -> bool:
    """True while the process-wide override is on (says nothing about this thread's `sdpa_override()` blocks)."""
    return _global_enabled
