"""torch_npu's MLA prolog functions on top of `torch.ops.npu_fa.mla_prolog` (docs/mla_prolog.md).

- `npu_mla_prolog_v3(token_x, ..., kv_cache, kr_cache, *, cache_index=None, ...)` — the current API: writes the
  latent caches in place and returns (query, query_rope, dequant_scale_q_nope, query_norm, dequant_scale_q_norm);
- `npu_mla_prolog_v3_functional(...)` — the same on copies of the caches, returned as two more results;
- `npu_mla_prolog(...)` / `npu_mla_prolog_v2(...)` — the older APIs (cache_index positional, cache modes PA_BSND and
  PA_NZ, the quantised scenario read from the dtypes): they return the caches themselves (written in place, as
  upstream) and, for v2, dequant_scale_q_nope.

Results the call does not produce are empty tensors (upstream's current shape [0]; v2's unquantised
dequant_scale_q_nope is [1], as upstream). NPU-only formats (mxfp8, fp8, hifloat8, the per-token-per-group cache
tiles) raise NotImplementedError naming the argument.
"""
from typing import Optional, Tuple

import torch
from torch import Tensor

from .._internal import args as _args
from ..kv_cache.api import nz_write_view

_OPS = torch.ops.npu_fa
_V1_CACHE_MODES = ("PA_BSND", "PA_NZ")
_HIF8 = "the hifloat8 format (an NPU dtype)"


def _tensor(op: str, name: str, value, optional: bool = False) -> None:
    if value is None and optional:
        return
    if not isinstance(value, Tensor):
        raise TypeError(f"{op}: argument '{name}' must be a Tensor{' or None' if optional else ''}; got "
                        f"{type(value).__name__}")


def _int(op: str, name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{op}: argument '{name}' must be an int; got {value!r}")
    return value


def _caller_tensor(o, given, views):
    """The caller's 5-D NZ cache when output o is the 4-D view it was written through, else o."""
    for g, v in zip(given, views):
        if v is not None and o is v:
            return g
    return o


def _call(op: str, token_x, weight_dq, weight_uq_qr, weight_uk, weight_dkv_kr, rmsnorm_gamma_cq, rmsnorm_gamma_ckv,
          rope_sin, rope_cos, kv_cache, kr_cache, **kw):
    for name, t in (("token_x", token_x), ("weight_dq", weight_dq), ("weight_uq_qr", weight_uq_qr),
                    ("weight_uk", weight_uk), ("weight_dkv_kr", weight_dkv_kr), ("rmsnorm_gamma_cq", rmsnorm_gamma_cq),
                    ("rmsnorm_gamma_ckv", rmsnorm_gamma_ckv), ("rope_sin", rope_sin), ("rope_cos", rope_cos),
                    ("kv_cache", kv_cache), ("kr_cache", kr_cache)):
        _tensor(op, name, t)
    for name in ("cache_index", "actual_seq_len", "dequant_scale_x", "dequant_scale_w_dq", "dequant_scale_w_uq_qr",
                 "dequant_scale_w_dkv_kr", "quant_scale_ckv", "quant_scale_ckr", "smooth_scales_cq"):
        _tensor(op, name, kw.get(name), optional=True)
    if kw.get("actual_seq_len") is not None:
        kw["actual_seq_len"] = _args.host_int_tensor(op, "actual_seq_len", kw["actual_seq_len"], token_x.device)
    # 5-D NZ caches: written through their 4-D view (same memory, NZ order); the caller gets its own tensors back.
    views = [nz_write_view(op, n, c, kw.get("cache_mode")) for n, c in (("kv_cache", kv_cache), ("kr_cache", kr_cache))]
    given = (kv_cache, kr_cache)
    kv_cache, kr_cache = (c if v is None else v for c, v in zip(given, views))
    try:
        out = _OPS.mla_prolog(token_x, weight_dq, weight_uq_qr, weight_uk, weight_dkv_kr, rmsnorm_gamma_cq,
                              rmsnorm_gamma_ckv, rope_sin, rope_cos, kv_cache, kr_cache, **kw)
        return tuple(_caller_tensor(o, given, views) for o in out)
    except (ValueError, TypeError, NotImplementedError) as e:
        # The op's messages start with its own name; name the torch_npu function the caller used.
        msg = str(e)
        if msg.startswith("mla_prolog:"):
            msg = f"{op}:{msg[len('mla_prolog:'):]}"
        raise type(e)(msg.split("\nException raised from")[0]) from None


def _v3_modes(op: str, k_nope_clip_alpha, weight_quant_mode, kv_cache_quant_mode, query_quant_mode, ckvkr_repo_mode,
              quant_scale_repo_mode, tile_size, token_x, weight_dq, weight_uq_qr, weight_dkv_kr, kv_cache, dtypes):
    for name, v in (("weight_quant_mode", weight_quant_mode), ("kv_cache_quant_mode", kv_cache_quant_mode),
                    ("query_quant_mode", query_quant_mode), ("ckvkr_repo_mode", ckvkr_repo_mode),
                    ("quant_scale_repo_mode", quant_scale_repo_mode), ("tile_size", tile_size)):
        _int(op, name, v)
    if weight_quant_mode in (3, 4, 5):
        fmt = {3: "mxfp8", 4: "fp8", 5: "hifloat8"}[weight_quant_mode]
        raise NotImplementedError(f"{op}: the {fmt} weights of weight_quant_mode={weight_quant_mode} are an NPU "
                                  f"format and not implemented; argument 'weight_quant_mode' must be 0, 1 or 2")
    if kv_cache_quant_mode == 3:
        raise NotImplementedError(f"{op}: the per-token-per-group int8 cache tiles of kv_cache_quant_mode=3 are not "
                                  f"implemented; argument 'kv_cache_quant_mode' must be 0, 1 or 2")
    _args.not_implemented(op, "the clipped per-token-per-group cache (kv_cache_quant_mode 3)",
                          k_nope_clip_alpha=k_nope_clip_alpha)
    _args.not_implemented_unless_zero(op, "the combined cache / scale storage of kv_cache_quant_mode 3",
                                      ckvkr_repo_mode=ckvkr_repo_mode, quant_scale_repo_mode=quant_scale_repo_mode)
    if tile_size <= 0:
        raise ValueError(f"{op}: argument 'tile_size' must be > 0; got {tile_size}")
    for (name, value), t in zip(dtypes, (token_x, weight_dq, weight_uq_qr, weight_dkv_kr, kv_cache)):
        _args.same_dtype_or_none(op, name, value, t.dtype, _HIF8)


def _v3(op, token_x, weight_dq, weight_uq_qr, weight_uk, weight_dkv_kr, rmsnorm_gamma_cq, rmsnorm_gamma_ckv,
        rope_sin, rope_cos, kv_cache, kr_cache, cache_index, dequant_scale_x, dequant_scale_w_dq,
        dequant_scale_w_uq_qr, dequant_scale_w_dkv_kr, quant_scale_ckv, quant_scale_ckr, smooth_scales_cq,
        actual_seq_len, k_nope_clip_alpha, rmsnorm_epsilon_cq, rmsnorm_epsilon_ckv, cache_mode, query_norm_flag,
        weight_quant_mode, kv_cache_quant_mode, query_quant_mode, ckvkr_repo_mode, quant_scale_repo_mode,
        tile_size, qc_qr_scale, kc_scale, dtypes):
    for name, t in (("token_x", token_x), ("weight_dq", weight_dq), ("weight_uq_qr", weight_uq_qr),
                    ("weight_dkv_kr", weight_dkv_kr), ("kv_cache", kv_cache)):
        _tensor(op, name, t)
    _v3_modes(op, k_nope_clip_alpha, weight_quant_mode, kv_cache_quant_mode, query_quant_mode, ckvkr_repo_mode,
              quant_scale_repo_mode, tile_size, token_x, weight_dq, weight_uq_qr, weight_dkv_kr, kv_cache, dtypes)
    if not isinstance(cache_mode, str):
        raise TypeError(f"{op}: argument 'cache_mode' must be a str; got {cache_mode!r}")
    return _call(op, token_x, weight_dq, weight_uq_qr, weight_uk, weight_dkv_kr, rmsnorm_gamma_cq, rmsnorm_gamma_ckv,
                 rope_sin, rope_cos, kv_cache, kr_cache, cache_index=cache_index, actual_seq_len=actual_seq_len,
                 dequant_scale_x=dequant_scale_x, dequant_scale_w_dq=dequant_scale_w_dq,
                 dequant_scale_w_uq_qr=dequant_scale_w_uq_qr, dequant_scale_w_dkv_kr=dequant_scale_w_dkv_kr,
                 quant_scale_ckv=quant_scale_ckv, quant_scale_ckr=quant_scale_ckr, smooth_scales_cq=smooth_scales_cq,
                 rmsnorm_epsilon_cq=float(rmsnorm_epsilon_cq), rmsnorm_epsilon_ckv=float(rmsnorm_epsilon_ckv),
                 cache_mode=cache_mode, query_norm_flag=bool(query_norm_flag), weight_quant_mode=weight_quant_mode,
                 kv_cache_quant_mode=kv_cache_quant_mode, query_quant_mode=query_quant_mode,
                 qc_qr_scale=float(qc_qr_scale), kc_scale=float(kc_scale))


@_args.torch_npu_api
def npu_mla_prolog_v3(token_x: Tensor, weight_dq: Tensor, weight_uq_qr: Tensor, weight_uk: Tensor,
                      weight_dkv_kr: Tensor, rmsnorm_gamma_cq: Tensor, rmsnorm_gamma_ckv: Tensor, rope_sin: Tensor,
                      rope_cos: Tensor, kv_cache: Tensor, kr_cache: Tensor, *, cache_index: Optional[Tensor] = None,
                      dequant_scale_x: Optional[Tensor] = None, dequant_scale_w_dq: Optional[Tensor] = None,
                      dequant_scale_w_uq_qr: Optional[Tensor] = None, dequant_scale_w_dkv_kr: Optional[Tensor] = None,
                      quant_scale_ckv: Optional[Tensor] = None, quant_scale_ckr: Optional[Tensor] = None,
                      smooth_scales_cq: Optional[Tensor] = None, actual_seq_len: Optional[Tensor] = None,
                      k_nope_clip_alpha: Optional[Tensor] = None, rmsnorm_epsilon_cq: float = 1e-05,
                      rmsnorm_epsilon_ckv: float = 1e-05, cache_mode: str = "PA_BSND", query_norm_flag: bool = False,
                      weight_quant_mode: int = 0, kv_cache_quant_mode: int = 0, query_quant_mode: int = 0,
                      ckvkr_repo_mode: int = 0, quant_scale_repo_mode: int = 0, tile_size: int = 128,
                      qc_qr_scale: float = 1.0, kc_scale: float = 1.0, token_x_dtype: Optional[int] = None,
                      weight_dq_dtype: Optional[int] = None, weight_uq_qr_dtype: Optional[int] = None,
                      weight_dkv_kr_dtype: Optional[int] = None, kv_cache_dtype: Optional[int] = None
                      ) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """torch_npu.npu_mla_prolog_v3: the MLA prolog (query absorption through weight_uk, interleaved rope, latent
    RMSNorm) writing kv_cache / kr_cache in place; see torch.ops.npu_fa.mla_prolog for the semantics.

    Returns (query, query_rope, dequant_scale_q_nope, query_norm, dequant_scale_q_norm); the results a call does
    not produce are empty tensors. Float inputs in any of fp32/bf16/fp16 and any sizes (upstream's fixed sizes
    are those of its NPU kernels). weight_quant_mode 0-2, kv_cache_quant_mode 0-2 and query_quant_mode 0-1 are
    implemented with upstream's int8 formulas; the NPU formats (modes 3-5, kv_cache_quant_mode 3 with
    k_nope_clip_alpha / ckvkr_repo_mode / quant_scale_repo_mode, hifloat8 dtype codes) raise NotImplementedError.
    tile_size is validated and only matters for kv_cache_quant_mode 3."""
    op = "npu_mla_prolog_v3"
    return _v3(op, token_x, weight_dq, weight_uq_qr, weight_uk, weight_dkv_kr, rmsnorm_gamma_cq, rmsnorm_gamma_ckv,
               rope_sin, rope_cos, kv_cache, kr_cache, cache_index, dequant_scale_x, dequant_scale_w_dq,
               dequant_scale_w_uq_qr, dequant_scale_w_dkv_kr, quant_scale_ckv, quant_scale_ckr, smooth_scales_cq,
               actual_seq_len, k_nope_clip_alpha, rmsnorm_epsilon_cq, rmsnorm_epsilon_ckv, cache_mode,
               query_norm_flag, weight_quant_mode, kv_cache_quant_mode, query_quant_mode, ckvkr_repo_mode,
               quant_scale_repo_mode, tile_size, qc_qr_scale, kc_scale,
               (("token_x_dtype", token_x_dtype), ("weight_dq_dtype", weight_dq_dtype),
                ("weight_uq_qr_dtype", weight_uq_qr_dtype), ("weight_dkv_kr_dtype", weight_dkv_kr_dtype),
                ("kv_cache_dtype", kv_cache_dtype)))


@_args.torch_npu_api
def npu_mla_prolog_v3_functional(token_x: Tensor, weight_dq: Tensor, weight_uq_qr: Tensor, weight_uk: Tensor,
                                 weight_dkv_kr: Tensor, rmsnorm_gamma_cq: Tensor, rmsnorm_gamma_ckv: Tensor,
                                 rope_sin: Tensor, rope_cos: Tensor, kv_cache: Tensor, kr_cache: Tensor, *,
                                 cache_index: Optional[Tensor] = None, dequant_scale_x: Optional[Tensor] = None,
                                 dequant_scale_w_dq: Optional[Tensor] = None,
                                 dequant_scale_w_uq_qr: Optional[Tensor] = None,
                                 dequant_scale_w_dkv_kr: Optional[Tensor] = None,
                                 quant_scale_ckv: Optional[Tensor] = None, quant_scale_ckr: Optional[Tensor] = None,
                                 smooth_scales_cq: Optional[Tensor] = None, actual_seq_len: Optional[Tensor] = None,
                                 k_nope_clip_alpha: Optional[Tensor] = None, rmsnorm_epsilon_cq: float = 1e-05,
                                 rmsnorm_epsilon_ckv: float = 1e-05, cache_mode: str = "PA_BSND",
                                 query_norm_flag: bool = False, weight_quant_mode: int = 0,
                                 kv_cache_quant_mode: int = 0, query_quant_mode: int = 0, ckvkr_repo_mode: int = 0,
                                 quant_scale_repo_mode: int = 0, tile_size: int = 128, qc_qr_scale: float = 1.0,
                                 kc_scale: float = 1.0, token_x_dtype: Optional[int] = None,
                                 weight_dq_dtype: Optional[int] = None, weight_uq_qr_dtype: Optional[int] = None,
                                 weight_dkv_kr_dtype: Optional[int] = None, kv_cache_dtype: Optional[int] = None
                                 ) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """torch_npu.npu_mla_prolog_v3_functional: npu_mla_prolog_v3 on copies of kv_cache and kr_cache (the arguments
    are not modified); returns v3's five results followed by the updated copies."""
    op = "npu_mla_prolog_v3_functional"
    _tensor(op, "kv_cache", kv_cache)
    _tensor(op, "kr_cache", kr_cache)
    kv_out, kr_out = kv_cache.clone(), kr_cache.clone()
    out = _v3(op, token_x, weight_dq, weight_uq_qr, weight_uk, weight_dkv_kr, rmsnorm_gamma_cq, rmsnorm_gamma_ckv,
              rope_sin, rope_cos, kv_out, kr_out, cache_index, dequant_scale_x, dequant_scale_w_dq,
              dequant_scale_w_uq_qr, dequant_scale_w_dkv_kr, quant_scale_ckv, quant_scale_ckr, smooth_scales_cq,
              actual_seq_len, k_nope_clip_alpha, rmsnorm_epsilon_cq, rmsnorm_epsilon_ckv, cache_mode,
              query_norm_flag, weight_quant_mode, kv_cache_quant_mode, query_quant_mode, ckvkr_repo_mode,
              quant_scale_repo_mode, tile_size, qc_qr_scale, kc_scale,
              (("token_x_dtype", token_x_dtype), ("weight_dq_dtype", weight_dq_dtype),
               ("weight_uq_qr_dtype", weight_uq_qr_dtype), ("weight_dkv_kr_dtype", weight_dkv_kr_dtype),
               ("kv_cache_dtype", kv_cache_dtype)))
    return (*out, kv_out, kr_out)


def _legacy(op, token_x, weight_dq, weight_uq_qr, weight_uk, weight_dkv_kr, rmsnorm_gamma_cq, rmsnorm_gamma_ckv,
            rope_sin, rope_cos, cache_index, kv_cache, kr_cache, dequant_scale_x, dequant_scale_w_dq,
            dequant_scale_w_uq_qr, dequant_scale_w_dkv_kr, quant_scale_ckv, quant_scale_ckr, smooth_scales_cq,
            rmsnorm_epsilon_cq, rmsnorm_epsilon_ckv, cache_mode):
    """v1/v2: upstream reads the scenario from the dtypes — int8 token_x: int8 GEMMs (weight_quant_mode 2), with an
    int8 kv_cache a per-tensor int8 cache (quant_scale_ckv's first value, as upstream's reference) and an int8
    query; int8 weight_uq_qr alone: weight_quant_mode 1, with int8 caches per-channel (quant_scale_ckv/ckr)."""
    for name, t in (("token_x", token_x), ("weight_uq_qr", weight_uq_qr), ("kv_cache", kv_cache),
                    ("cache_index", cache_index)):
        _tensor(op, name, t)
    if cache_mode not in _V1_CACHE_MODES:
        raise ValueError(f"{op}: argument 'cache_mode' must be 'PA_BSND' or 'PA_NZ'; got {cache_mode!r}")
    wq = 2 if token_x.dtype == torch.int8 else (1 if weight_uq_qr.dtype == torch.int8 else 0)
    kvq = qq = 0
    if kv_cache.dtype == torch.int8:
        if wq == 0:
            raise ValueError(f"{op}: an int8 'kv_cache' needs quantised weights (int8 weight_uq_qr, or int8 token_x "
                             f"and weights); got float weights")
        kvq, qq = (1, 1) if wq == 2 else (2, 0)
        if kvq == 1 and isinstance(quant_scale_ckv, Tensor) and quant_scale_ckv.numel() > 1:
            quant_scale_ckv = quant_scale_ckv.reshape(-1)[:1]
    return _call(op, token_x, weight_dq, weight_uq_qr, weight_uk, weight_dkv_kr, rmsnorm_gamma_cq, rmsnorm_gamma_ckv,
                 rope_sin, rope_cos, kv_cache, kr_cache, cache_index=cache_index, dequant_scale_x=dequant_scale_x,
                 dequant_scale_w_dq=dequant_scale_w_dq, dequant_scale_w_uq_qr=dequant_scale_w_uq_qr,
                 dequant_scale_w_dkv_kr=dequant_scale_w_dkv_kr, quant_scale_ckv=quant_scale_ckv,
                 quant_scale_ckr=quant_scale_ckr, smooth_scales_cq=smooth_scales_cq,
                 rmsnorm_epsilon_cq=float(rmsnorm_epsilon_cq), rmsnorm_epsilon_ckv=float(rmsnorm_epsilon_ckv),
                 cache_mode=cache_mode, weight_quant_mode=wq, kv_cache_quant_mode=kvq, query_quant_mode=qq)


@_args.torch_npu_api
def npu_mla_prolog(token_x: Tensor, weight_dq: Tensor, weight_uq_qr: Tensor, weight_uk: Tensor,
                   weight_dkv_kr: Tensor, rmsnorm_gamma_cq: Tensor, rmsnorm_gamma_ckv: Tensor, rope_sin: Tensor,
                   rope_cos: Tensor, cache_index: Tensor, kv_cache: Tensor, kr_cache: Tensor, *,
                   dequant_scale_x: Optional[Tensor] = None, dequant_scale_w_dq: Optional[Tensor] = None,
                   dequant_scale_w_uq_qr: Optional[Tensor] = None, dequant_scale_w_dkv_kr: Optional[Tensor] = None,
                   quant_scale_ckv: Optional[Tensor] = None, quant_scale_ckr: Optional[Tensor] = None,
                   smooth_scales_cq: Optional[Tensor] = None, rmsnorm_epsilon_cq: float = 1e-05,
                   rmsnorm_epsilon_ckv: float = 1e-05, cache_mode: str = "PA_BSND"
                   ) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """torch_npu.npu_mla_prolog (superseded upstream by npu_mla_prolog_v3): writes kv_cache / kr_cache in place
    (cache_index: slot per token, [T] or [B, S]; cache_mode PA_BSND or PA_NZ) and returns (query, query_rope,
    kv_cache, kr_cache) — the caches are the argument tensors themselves."""
    op = "npu_mla_prolog"
    query, query_rope, _, _, _ = _legacy(
        op, token_x, weight_dq, weight_uq_qr, weight_uk, weight_dkv_kr, rmsnorm_gamma_cq, rmsnorm_gamma_ckv,
        rope_sin, rope_cos, cache_index, kv_cache, kr_cache, dequant_scale_x, dequant_scale_w_dq,
        dequant_scale_w_uq_qr, dequant_scale_w_dkv_kr, quant_scale_ckv, quant_scale_ckr, smooth_scales_cq,
        rmsnorm_epsilon_cq, rmsnorm_epsilon_ckv, cache_mode)
    return query, query_rope, kv_cache, kr_cache


@_args.torch_npu_api
def npu_mla_prolog_v2(token_x: Tensor, weight_dq: Tensor, weight_uq_qr: Tensor, weight_uk: Tensor,
                      weight_dkv_kr: Tensor, rmsnorm_gamma_cq: Tensor, rmsnorm_gamma_ckv: Tensor, rope_sin: Tensor,
                      rope_cos: Tensor, cache_index: Tensor, kv_cache: Tensor, kr_cache: Tensor, *,
                      dequant_scale_x: Optional[Tensor] = None, dequant_scale_w_dq: Optional[Tensor] = None,
                      dequant_scale_w_uq_qr: Optional[Tensor] = None, dequant_scale_w_dkv_kr: Optional[Tensor] = None,
                      quant_scale_ckv: Optional[Tensor] = None, quant_scale_ckr: Optional[Tensor] = None,
                      smooth_scales_cq: Optional[Tensor] = None, rmsnorm_epsilon_cq: float = 1e-05,
                      rmsnorm_epsilon_ckv: float = 1e-05, cache_mode: str = "PA_BSND"
                      ) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """torch_npu.npu_mla_prolog_v2: npu_mla_prolog plus dequant_scale_q_nope, the per-token-and-head scale of the
    int8 query ([T, N, 1]) when token_x and kv_cache are int8, else a [1] tensor holding 1 (upstream's shape; its
    value is not defined there)."""
    op = "npu_mla_prolog_v2"
    query, query_rope, scale, _, _ = _legacy(
        op, token_x, weight_dq, weight_uq_qr, weight_uk, weight_dkv_kr, rmsnorm_gamma_cq, rmsnorm_gamma_ckv,
        rope_sin, rope_cos, cache_index, kv_cache, kr_cache, dequant_scale_x, dequant_scale_w_dq,
        dequant_scale_w_uq_qr, dequant_scale_w_dkv_kr, quant_scale_ckv, quant_scale_ckr, smooth_scales_cq,
        rmsnorm_epsilon_cq, rmsnorm_epsilon_ckv, cache_mode)
    if scale.numel() == 0 and scale.dim() == 1:
        scale = torch.ones(1, dtype=torch.float32, device=query.device)
    return query, query_rope, kv_cache, kr_cache, scale
