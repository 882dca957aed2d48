"""The torch_npu-compatible API of the training attention ops: npu_fusion_attention(_v2) and its gradient,
_npu_dropout_gen_mask. They call torch.ops.npu_fa.flash_attention_score(_grad). The FlashAttention-2 API is in
`fa2`, the nn.Module in `module`, the CPU tile sizes in `tiles` and their tuning in `tuning`.

Mask polarity: `atten_mask` follows CANN — True / 1 means *masked out* (the opposite of SDPA's boolean mask).
"""
import contextlib
import math
import operator
from typing import Optional, Sequence, Tuple, Union

import torch
from torch import Tensor, nn

from .._internal import args as _args
from .._internal.args import MAX_TOKENS, SeqLens, dropout_seed as _draw_seed
from .._internal.layout import attention_dims

_OPS = torch.ops.npu_fa


def _as_int(t: Tensor):
    """torch_npu returns seed/offset as Python ints; inside torch.compile they stay 0-d tensors (no graph break)."""
    return t if torch.compiler.is_compiling() else int(t.item())


def _check_fusion_args(op: str, padding_mask, prefix, sparse_mode) -> None:
    _args.reserved(op, padding_mask=padding_mask)  # torch_npu reserves it: masks go through atten_mask
    if sparse_mode not in (5, 6) and prefix not in (None, [], ()):
        raise ValueError(f"{op}: argument 'prefix' is only used by sparse_mode 5 and 6 (prefix); got prefix={prefix!r} "
                         f"with sparse_mode={sparse_mode}")


# sparse_mode 6's compressed mask (upstream's documented form): rows [0, 2048) the 2048 x 2048 causal mask (1 strictly
# above the diagonal), rows [2048, 3072) zeros in columns [0, 1024) and ones in [1024, 2048).
_PREFIX_MASK_ROWS, _PREFIX_MASK_COLS = 3072, 2048


def _is_compressed_prefix_mask(mask: Tensor) -> bool:
    m = mask.reshape(_PREFIX_MASK_ROWS, _PREFIX_MASK_COLS).bool().cpu()
    causal = torch.ones(_PREFIX_MASK_COLS, _PREFIX_MASK_COLS, dtype=torch.bool).triu(1)
    rect = torch.zeros(_PREFIX_MASK_ROWS - _PREFIX_MASK_COLS, _PREFIX_MASK_COLS, dtype=torch.bool)
    rect[:, _PREFIX_MASK_COLS // 2:] = True
    return bool(torch.equal(m[:_PREFIX_MASK_COLS], causal) and torch.equal(m[_PREFIX_MASK_COLS:], rect))


def _prefix_as_mask(op: str, sparse_mode: int, prefix, atten_mask: Optional[Tensor], d, layout: str,
                    query_device) -> Tensor:
    """sparse_mode 5 / 6 (prefix) as an explicit mask for mode 1: key j is visible to query row i of batch b when
    j <= i + Skv - Sq (bottom-right causal) or j < prefix[b] (the first prefix[b] keys, visible to every row).
    Mode 5 also applies the caller's full mask ([B, N, Sq, Skv] or [B, 1, Sq, Skv], True = masked out), as the NPU
    does; mode 6's mask is the compressed 3072 x 2048 one, which is checked and then replaced by the pattern. Without
    a mask the pattern alone applies (as modes 2-4 generate theirs). pre_tokens / next_tokens are ignored, as
    upstream."""
    if layout == "TND":
        raise NotImplementedError(f"{op}: argument 'sparse_mode' = {sparse_mode} (prefix) with input_layout TND is "
                                  f"not implemented (dense layouts only)")
    B, Sq, Skv = d.batch, d.q_len, d.kv_len
    if prefix is None or isinstance(prefix, (str, bytes)) or len(prefix) != B:
        raise ValueError(f"{op}: sparse_mode {sparse_mode} needs argument 'prefix', a list of B={B} ints (visible "
                         f"leading keys per batch); got {prefix!r}")
    values = [_int64(op, "prefix", v) for v in prefix]
    if any(v < 0 or v > Skv for v in values):
        raise ValueError(f"{op}: argument 'prefix' entries must be in [0, Skv={Skv}]; got {values}")
    device = query_device if atten_mask is None else atten_mask.device
    i = torch.arange(Sq, device=device)[:, None]
    j = torch.arange(Skv, device=device)[None, :]
    lead = torch.tensor(values, device=device).view(B, 1, 1, 1)
    pattern = (j > i + (Skv - Sq)) & (j >= lead)  # [B, 1, Sq, Skv], True = masked out
    if atten_mask is None:
        return pattern
    if sparse_mode == 6:
        if atten_mask.numel() != _PREFIX_MASK_ROWS * _PREFIX_MASK_COLS or not _is_compressed_prefix_mask(atten_mask):
            raise ValueError(f"{op}: sparse_mode 6 needs the compressed prefix mask [3072, 2048] (a 2048 x 2048 "
                             f"causal mask over a 1024 x 2048 block of zeros then ones); got shape "
                             f"{list(atten_mask.shape)}")
        return pattern
    if atten_mask.dim() != 4 or atten_mask.shape[0] != B or atten_mask.shape[1] not in (1, d.q_heads) \
            or tuple(atten_mask.shape[2:]) != (Sq, Skv):
        raise ValueError(f"{op}: sparse_mode 5 needs 'atten_mask' of shape [B={B}, N={d.q_heads} or 1, Sq={Sq}, "
                         f"Skv={Skv}]; got {list(atten_mask.shape)}")
    return atten_mask.bool() | pattern


def _layout(op: str, input_layout) -> str:
    """torch_npu compares input_layout case-insensitively."""
    if not isinstance(input_layout, str):
        raise TypeError(f"{op}: argument 'input_layout' must be a str; got {input_layout!r}")
    return input_layout.upper()


def _check_sparse_mode(op: str, sparse_mode, layout: str) -> None:
    """torch_npu's ranges ([0, 6] dense, [0, 5) or (5, 8] for TND); modes 7 and 8 (context parallel) are not
    implemented here, 5 and 6 (prefix) become mode 1 with the prefix pattern as a mask (_prefix_as_mask)."""
    if not isinstance(sparse_mode, int) or isinstance(sparse_mode, bool):
        raise TypeError(f"{op}: argument 'sparse_mode' must be an int; got {sparse_mode!r}")
    tnd = layout == "TND"
    valid = (0 <= sparse_mode <= 8 and sparse_mode != 5) if tnd else 0 <= sparse_mode <= 6
    if not valid:
        allowed = "in [0, 5) or (5, 8] for input_layout TND" if tnd else "in [0, 6]"
        raise ValueError(f"{op}: argument 'sparse_mode' must be {allowed}; got {sparse_mode}")
    if sparse_mode >= 7:
        raise NotImplementedError(f"{op}: sparse_mode {sparse_mode} (context-parallel) is not implemented; "
                                  f"argument 'sparse_mode' must be 0-6")


def _check_flags(op: str, **flags) -> None:
    """Hardware hints of torch_npu (dropout mask generation on a side stream): bools, no effect here."""
    for name, value in flags.items():
        if not isinstance(value, bool):
            raise TypeError(f"{op}: argument '{name}' must be a bool; got {value!r}")


def _int64(op: str, name: str, value) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{op}: argument '{name}' must be an int; got {value!r}")
    if not _args.INT64_MIN <= value <= _args.INT64_MAX:
        raise ValueError(f"{op}: argument '{name}' must hold an int64 value; got {value}")
    return value


def _int_list(op: str, name: str, values) -> list:
    """An int[] argument as torch's bindings parse it: ints, or anything with __index__ (0-d integer tensors, numpy
    integers), not bools or floats."""
    if not isinstance(values, (list, tuple, torch.Size)):
        raise TypeError(f"{op}: argument '{name}' must be a list of ints; got {values!r}")
    out = []
    for v in values:
        not_int_tensor = isinstance(v, Tensor) and (v.dim() != 0 or v.is_floating_point() or v.dtype == torch.bool)
        if isinstance(v, bool) or not_int_tensor:
            raise TypeError(f"{op}: argument '{name}' must be a list of ints; got {values!r}")
        try:
            out.append(operator.index(v))
        except TypeError:
            raise TypeError(f"{op}: argument '{name}' must be a list of ints; got {values!r}") from None
    return out


def _host_long(value: int) -> Tensor:
    # seed/offset are host tensors of the op (read on the CPU whatever the device of q/k/v).
    return torch.tensor(value, dtype=torch.int64)


def _seed_args(op: str, keep_prob: float, seed, offset, dropout_mask, device):
    """The op's seed/offset tensors: a seed of 0 draws one from torch's default generator when the op generates the
    dropout mask itself; any other seed (or a dropout_mask) uses the given seed/offset, which are returned as given."""
    seed, offset = _int64(op, "seed", seed), _int64(op, "offset", offset)
    if seed == 0 and dropout_mask is None and keep_prob < 1.0:
        drawn, _ = _draw_seed(keep_prob, device)
        return drawn, _host_long(offset)
    return _host_long(seed), _host_long(offset)


def _dropout_numels(d, layout: str, head_num: int, q_lens, kv_lens):
    """Elements of the dropout mask, as torch_npu returns `numels`: B*N1*Sq*Skv, or N1 * sum(Sq_b * Skv_b) for TND.
    A Python int, or a 0-d tensor inside torch.compile when the lengths are tensors."""
    if layout != "TND":
        return d.batch * head_num * d.q_len * d.kv_len
    if isinstance(q_lens, Tensor) or isinstance(kv_lens, Tensor):
        def lengths(ends):
            ends = torch.as_tensor(ends).to(device="cpu", dtype=torch.int64)
            return torch.diff(ends, prepend=ends.new_zeros(1))
        return _as_int(head_num * (lengths(q_lens) * lengths(kv_lens)).sum())
    q = [b - a for a, b in zip([0] + list(q_lens), q_lens)]
    kv = [b - a for a, b in zip([0] + list(kv_lens), kv_lens)]
    return head_num * sum(x * y for x, y in zip(q, kv))


@_args.torch_npu_api
def npu_fusion_attention(query: Tensor, key: Tensor, value: Tensor, head_num: int, input_layout: str,
                         pse: Optional[Tensor] = None, padding_mask: Optional[Tensor] = None,
                         atten_mask: Optional[Tensor] = None, scale: float = 1., keep_prob: float = 1.,
                         pre_tockens: int = MAX_TOKENS, next_tockens: int = MAX_TOKENS, inner_precise: int = 0,
                         prefix=None, actual_seq_qlen: SeqLens = None, actual_seq_kvlen: SeqLens = None,
                         sparse_mode: int = 0, gen_mask_parallel: bool = True, sync: bool = False,
                         softmax_layout: str = "", sink: Optional[Tensor] = None,
                         dropout_mask: Optional[Tensor] = None, seed: int = 0, offset: int = 0):
    """torch_npu.npu_fusion_attention with its exact signature and return tuple.

    Shapes by `input_layout` (case-insensitive): BSH [B,S,N*D], SBH [S,B,N*D], BSND [B,S,N,D], BNSD [B,N,S,D], TND
    [T,N,D] (then `actual_seq_qlen`/`actual_seq_kvlen` are *cumulative* ends, e.g. lengths 3,5,2 -> [3, 8, 10]; lists
    or host int tensors). dtypes fp32/fp16/bf16 (q, k, v and pse alike); GQA when key has fewer heads; value may have
    a smaller head dim.
    `atten_mask`: bool/uint8, True = masked out, shapes [B,N,Sq,Skv], [B,1,Sq,Skv], [1,1,Sq,Skv], [Sq,Skv].
    `sparse_mode`: 0 mask + pre/next band, 1 all-mask, 2 top-left causal, 3 bottom-right causal, 4 band from the
    bottom-right; modes 2-4 need no mask (the compressed 2048x2048 CANN mask is accepted too).
    `scale` multiplies Q·Kᵀ (default 1.0 as in torch_npu — pass 1/sqrt(D) yourself).
    `sink`: float32 [head_num], one extra logit per head in every softmax row (compared with the scaled scores),
    whose value row is 0: the row's weights sum to less than 1. Differentiable.
    `softmax_layout`: TND only; "" gives softmax_max/sum as a [T, N, 8] tensor holding the rows in NTD order (the
    memory of [N, T, 8], torch_npu's default), "TND" in TND order.
    Dropout: `dropout_mask` (uint8, from `_npu_dropout_gen_mask` over [B, N, Sq, Skv]) replaces the generated mask;
    otherwise the mask is drawn from `seed`/`offset` (seed 0: a seed drawn from torch's default generator).

    Returns (attention_out, softmax_max, softmax_sum, softmax_out, seed, offset, numels): softmax_max/sum are fp32
    [B,N,Sq,8] ([T,N,8] for TND); seed/offset the ones used and numels the dropout mask's element count, as ints
    (0-d tensors under torch.compile). `gen_mask_parallel` and `sync` are accepted for compatibility (no effect).
    """
    return _fusion_forward("npu_fusion_attention", query, key, value, head_num, input_layout, pse=pse,
                           padding_mask=padding_mask, atten_mask=atten_mask, scale=scale, keep_prob=keep_prob,
                           pre_tokens=pre_tockens, next_tokens=next_tockens, inner_precise=inner_precise,
                           prefix=prefix, actual_seq_qlen=actual_seq_qlen, actual_seq_kvlen=actual_seq_kvlen,
                           sparse_mode=sparse_mode, gen_mask_parallel=gen_mask_parallel, sync=sync,
                           softmax_layout=softmax_layout, sink=sink, dropout_mask=dropout_mask, seed=seed,
                           offset=offset)


def _fusion_forward(op: str, query: Tensor, key: Tensor, value: Tensor, head_num: int, input_layout: str, *, pse,
                    padding_mask, atten_mask, scale, keep_prob, pre_tokens, next_tokens, inner_precise, prefix,
                    actual_seq_qlen, actual_seq_kvlen, sparse_mode, gen_mask_parallel, sync, softmax_layout, sink,
                    dropout_mask, seed, offset, pse_type: int = 1, q_start_idx=None, kv_start_idx=None):
    """npu_fusion_attention(_v2) after their own arguments: the op call and torch_npu's return tuple."""
    _check_fusion_args(op, padding_mask, prefix, sparse_mode)
    layout = _layout(op, input_layout)
    _check_sparse_mode(op, sparse_mode, layout)
    _check_flags(op, gen_mask_parallel=gen_mask_parallel, sync=sync)
    if sparse_mode in (5, 6):
        d = attention_dims(op, query, key, value, head_num, layout)
        atten_mask, sparse_mode = _prefix_as_mask(op, sparse_mode, prefix, atten_mask, d, layout, query.device), 1
    if pse is not None and pse_type < 2 and pse.dtype != query.dtype:
        raise TypeError(f"{op}: argument 'pse' must have query's dtype {query.dtype} (torch_npu requires q, k, v and "
                        f"pse alike); got {pse.dtype}")
    seed_t, offset_t = _seed_args(op, keep_prob, seed, offset, dropout_mask, query.device)
    q_lens = _args.int_tensor(op, "actual_seq_qlen", actual_seq_qlen, "cpu")
    kv_lens = _args.int_tensor(op, "actual_seq_kvlen", actual_seq_kvlen, "cpu")
    out, smax, ssum, sout, seed_t, offset_t = _OPS.flash_attention_score(
        query, key, value, head_num, layout, pse=pse, atten_mask=atten_mask, actual_seq_qlen=q_lens,
        actual_seq_kvlen=kv_lens, scale=scale, keep_prob=keep_prob, pre_tokens=pre_tokens, next_tokens=next_tokens,
        inner_precise=inner_precise, sparse_mode=sparse_mode, pse_type=pse_type, seed=seed_t, offset=offset_t,
        softmax_layout=softmax_layout, sink=sink, dropout_mask=dropout_mask,
        q_start_idx=_start_idx(op, "q_start_idx", q_start_idx), kv_start_idx=_start_idx(op, "kv_start_idx", kv_start_idx))
    d = attention_dims(op, query, key, value, head_num, layout)
    # Lengths given as lists stay Python ints (no tensor under torch.compile); tensors are counted as tensors.
    q_count = q_lens if isinstance(actual_seq_qlen, Tensor) else actual_seq_qlen
    kv_count = kv_lens if isinstance(actual_seq_kvlen, Tensor) else actual_seq_kvlen
    numels = _dropout_numels(d, layout, head_num, q_count, kv_count)
    return out, smax, ssum, sout, _as_int(seed_t), _as_int(offset_t), numels


@_args.torch_npu_api
def npu_fusion_attention_grad(query: Tensor, key: Tensor, value: Tensor, dy: Tensor, head_num: int,
                              input_layout: str, *, pse: Optional[Tensor] = None,
                              padding_mask: Optional[Tensor] = None, atten_mask: Optional[Tensor] = None,
                              softmax_max: Optional[Tensor] = None, softmax_sum: Optional[Tensor] = None,
                              softmax_in: Optional[Tensor] = None, attention_in: Optional[Tensor] = None,
                              scale_value: float = 1., keep_prob: float = 1., pre_tockens: int = MAX_TOKENS,
                              next_tockens: int = MAX_TOKENS, inner_precise: int = 0, seed: int = 0, offset: int = 0,
                              numels: int = 0, prefix=None, actual_seq_qlen: SeqLens = None,
                              actual_seq_kvlen: SeqLens = None, sparse_mode: int = 0,
                              gen_mask_parallel: bool = True, sync: bool = False, softmax_layout: str = "",
                              sink: Optional[Tensor] = None):
    """torch_npu.npu_fusion_attention_grad with its exact signature. Returns (dq, dk, dv, dpse, dsink): dpse is None
    without pse and dsink an empty float32 tensor without sink, as in torch_npu.

    softmax_max, softmax_sum and attention_in are the forward's outputs and are required (softmax_layout as in the
    forward); seed/offset are the ints npu_fusion_attention returned (or those a dropout_mask was made with): they
    regenerate the identical dropout mask. `numels`, `softmax_in`, `gen_mask_parallel` and `sync` are accepted for
    compatibility.
    """
    return _fusion_backward("npu_fusion_attention_grad", query, key, value, dy, head_num, input_layout, pse=pse,
                            padding_mask=padding_mask, atten_mask=atten_mask, softmax_max=softmax_max,
                            softmax_sum=softmax_sum, attention_in=attention_in, scale_value=scale_value,
                            keep_prob=keep_prob, pre_tokens=pre_tockens, next_tokens=next_tockens,
                            inner_precise=inner_precise, seed=seed, offset=offset, numels=numels, prefix=prefix,
                            actual_seq_qlen=actual_seq_qlen, actual_seq_kvlen=actual_seq_kvlen,
                            sparse_mode=sparse_mode, gen_mask_parallel=gen_mask_parallel, sync=sync,
                            softmax_layout=softmax_layout, sink=sink)


def _fusion_backward(op: str, query: Tensor, key: Tensor, value: Tensor, dy: Tensor, head_num: int,
                     input_layout: str, *, pse, padding_mask, atten_mask, softmax_max, softmax_sum, attention_in,
                     scale_value, keep_prob, pre_tokens, next_tokens, inner_precise, seed, offset, numels, prefix,
                     actual_seq_qlen, actual_seq_kvlen, sparse_mode, gen_mask_parallel, sync, softmax_layout, sink,
                     pse_type: int = 1, q_start_idx=None, kv_start_idx=None):
    """npu_fusion_attention_grad(_v2) after their own arguments: (dq, dk, dv, dpse or None, dsink)."""
    _check_fusion_args(op, padding_mask, prefix, sparse_mode)
    layout = _layout(op, input_layout)
    _check_sparse_mode(op, sparse_mode, layout)
    _check_flags(op, gen_mask_parallel=gen_mask_parallel, sync=sync)
    if sparse_mode in (5, 6):
        d = attention_dims(op, query, key, value, head_num, layout)
        atten_mask, sparse_mode = _prefix_as_mask(op, sparse_mode, prefix, atten_mask, d, layout, query.device), 1
    _int64(op, "numels", numels)
    for name, t in (("softmax_max", softmax_max), ("softmax_sum", softmax_sum), ("attention_in", attention_in)):
        if t is None:
            raise ValueError(f"{op}: argument '{name}' is required (pass the forward's output)")
    dq, dk, dv, dpse, dsink = _OPS.flash_attention_score_grad(
        query, key, value, dy, head_num, layout, pse=pse, atten_mask=atten_mask, softmax_max=softmax_max,
        softmax_sum=softmax_sum, attention_in=attention_in,
        actual_seq_qlen=_args.int_tensor(op, "actual_seq_qlen", actual_seq_qlen, "cpu"),
        actual_seq_kvlen=_args.int_tensor(op, "actual_seq_kvlen", actual_seq_kvlen, "cpu"),
        scale=scale_value, keep_prob=keep_prob, pre_tokens=pre_tokens, next_tokens=next_tokens,
        inner_precise=inner_precise, sparse_mode=sparse_mode, pse_type=pse_type,
        seed=_host_long(_int64(op, "seed", seed)), offset=_host_long(_int64(op, "offset", offset)),
        softmax_layout=softmax_layout, sink=sink, q_start_idx=_start_idx(op, "q_start_idx", q_start_idx),
        kv_start_idx=_start_idx(op, "kv_start_idx", kv_start_idx))
    # pse_type 2/3: pse holds ALiBi slopes, which have no gradient here (as upstream: dpse only for a bias tensor)
    return dq, dk, dv, (dpse if pse is not None and pse_type < 2 else None), dsink


def _start_idx(op: str, name: str, values) -> Optional[list]:
    return None if values is None else _int_list(op, name, values)


def _with_rope(op: str, name: str, x: Tensor, rope: Optional[Tensor], layout: str, heads: int) -> Tensor:
    """x with the rope part of each head appended to its head dim (query_rope / key_rope of the v2 functions): the
    scores become (q·k + q_rope·k_rope)·scale, which CANN computes with the rope parts apart. BSH/SBH pack the heads
    in the last dim, so each head's rope values go after that head's values."""
    if rope is None:
        return x
    if not isinstance(rope, Tensor) or rope.dtype != x.dtype or rope.device != x.device:
        raise TypeError(f"{op}: argument '{name}' must be a tensor of its input's dtype {x.dtype} on {x.device}; got "
                        f"{rope.dtype if isinstance(rope, Tensor) else type(rope).__name__}")
    packed = layout in ("BSH", "SBH")
    if rope.dim() != x.dim() or rope.shape[:-1] != x.shape[:-1] or (packed and rope.shape[-1] % heads):
        raise ValueError(f"{op}: argument '{name}' must match its input's shape {list(x.shape)} except in the last "
                         f"dim{f' (a multiple of the {heads} heads)' if packed else ''}; got {list(rope.shape)}")
    if not packed:
        return torch.cat([x, rope], -1)
    return torch.cat([x.unflatten(-1, (heads, -1)), rope.unflatten(-1, (heads, -1))], -1).flatten(-2)


def _split_rope(grad: Tensor, width: int, layout: str, heads: int) -> Tuple[Tensor, Tensor]:
    """The inverse of _with_rope for a gradient: (the input's part, the rope part of `width` per head)."""
    if layout not in ("BSH", "SBH"):
        return grad[..., :-width].contiguous(), grad[..., -width:].contiguous()
    g = grad.unflatten(-1, (heads, -1))
    return g[..., :-width].flatten(-2), g[..., -width:].flatten(-2)


def _rope_heads(query: Tensor, key: Tensor, head_num: int, layout: str) -> Tuple[int, int]:
    """Query and key heads as the packed layouts need them (any value for the others)."""
    if layout not in ("BSH", "SBH") or query.dim() != 3 or key.dim() != 3 or head_num <= 0:
        return max(head_num, 1), max(head_num, 1)
    d = query.shape[-1] // head_num
    return head_num, max(key.shape[-1] // d, 1) if d else 1


@_args.torch_npu_api
def npu_fusion_attention_v2(query: Tensor, key: Tensor, value: Tensor, head_num: int, input_layout: str, *,
                            pse: Optional[Tensor] = None, padding_mask: Optional[Tensor] = None,
                            atten_mask: Optional[Tensor] = None, query_rope: Optional[Tensor] = None,
                            key_rope: Optional[Tensor] = None, scale: float = 1., keep_prob: float = 1.,
                            pre_tokens: int = MAX_TOKENS, next_tokens: int = MAX_TOKENS, inner_precise: int = 0,
                            prefix=None, actual_seq_qlen: SeqLens = None, actual_seq_kvlen: SeqLens = None,
                            sparse_mode: int = 0, gen_mask_parallel: bool = True, sync: bool = False,
                            pse_type: int = 1, q_start_idx=None, kv_start_idx=None, softmax_layout: str = "",
                            sink: Optional[Tensor] = None, dropout_mask: Optional[Tensor] = None, seed: int = 0,
                            offset: int = 0):
    """torch_npu.npu_fusion_attention_v2 with its exact signature and return tuple: npu_fusion_attention (see there)
    with keyword-only arguments spelled pre_tokens/next_tokens, plus
    `pse_type`: 0 adds pse after scaling, 1 (default) before; 2/3 generate ALiBi in the kernel from float32 slopes in
    `pse` ([N] or [B, N]): `-slope·|d|` (2) or `-slope·sqrt(|d|)` (3), d = (j + kv_start_idx) - (i + q_start_idx);
    `q_start_idx` / `kv_start_idx`: int lists (one value, or one per sequence) placing a context-parallel block;
    `query_rope` / `key_rope`: the rope parts of each head (same layout, last dim the rope width; BSH/SBH: heads x
    rope width), scores (q·k + q_rope·k_rope)·scale. Differentiable (through the rope parts too)."""
    op = "npu_fusion_attention_v2"
    layout = _layout(op, input_layout)
    if (query_rope is None) != (key_rope is None):
        raise ValueError(f"{op}: arguments 'query_rope' and 'key_rope' must be given together")
    qh, kh = _rope_heads(query, key, head_num, layout)
    query = _with_rope(op, "query_rope", query, query_rope, layout, qh)
    key = _with_rope(op, "key_rope", key, key_rope, layout, kh)
    return _fusion_forward(op, query, key, value, head_num, input_layout, pse=pse, padding_mask=padding_mask,
                           atten_mask=atten_mask, scale=scale, keep_prob=keep_prob, pre_tokens=pre_tokens,
                           next_tokens=next_tokens, inner_precise=inner_precise, prefix=prefix,
                           actual_seq_qlen=actual_seq_qlen, actual_seq_kvlen=actual_seq_kvlen,
                           sparse_mode=sparse_mode, gen_mask_parallel=gen_mask_parallel, sync=sync,
                           softmax_layout=softmax_layout, sink=sink, dropout_mask=dropout_mask, seed=seed,
                           offset=offset, pse_type=pse_type, q_start_idx=q_start_idx, kv_start_idx=kv_start_idx)


@_args.torch_npu_api
def npu_fusion_attention_grad_v2(query: Tensor, key: Tensor, value: Tensor, dy: Tensor, head_num: int,
                                 input_layout: str, *, pse: Optional[Tensor] = None,
                                 padding_mask: Optional[Tensor] = None, atten_mask: Optional[Tensor] = None,
                                 softmax_max: Optional[Tensor] = None, softmax_sum: Optional[Tensor] = None,
                                 softmax_in: Optional[Tensor] = None, attention_in: Optional[Tensor] = None,
                                 query_rope: Optional[Tensor] = None, key_rope: Optional[Tensor] = None,
                                 scale_value: float = 1., keep_prob: float = 1., pre_tokens: int = MAX_TOKENS,
                                 next_tokens: int = MAX_TOKENS, inner_precise: int = 0, seed: int = 0,
                                 offset: int = 0, numels: int = 0, prefix=None, actual_seq_qlen: SeqLens = None,
                                 actual_seq_kvlen: SeqLens = None, sparse_mode: int = 0,
                                 gen_mask_parallel: bool = True, sync: bool = False, pse_type: int = 1,
                                 q_start_idx=None, kv_start_idx=None, softmax_layout: str = "",
                                 sink: Optional[Tensor] = None):
    """torch_npu.npu_fusion_attention_grad_v2 with its exact signature: npu_fusion_attention_grad with the v2
    arguments (see npu_fusion_attention_v2). Returns (dq, dk, dv, dpse, dq_rope, dk_rope, dsink) as torch_npu: dpse
    None without a pse bias tensor (also for pse_type 2/3 slopes), dq_rope / dk_rope None without rope parts."""
    op = "npu_fusion_attention_grad_v2"
    layout = _layout(op, input_layout)
    if (query_rope is None) != (key_rope is None):
        raise ValueError(f"{op}: arguments 'query_rope' and 'key_rope' must be given together")
    qh, kh = _rope_heads(query, key, head_num, layout)
    dq, dk, dv, dpse, dsink = _fusion_backward(
        op, _with_rope(op, "query_rope", query, query_rope, layout, qh),
        _with_rope(op, "key_rope", key, key_rope, layout, kh), value, dy, head_num, input_layout, pse=pse,
        padding_mask=padding_mask, atten_mask=atten_mask, softmax_max=softmax_max, softmax_sum=softmax_sum,
        attention_in=attention_in, scale_value=scale_value, keep_prob=keep_prob, pre_tokens=pre_tokens,
        next_tokens=next_tokens, inner_precise=inner_precise, seed=seed, offset=offset, numels=numels,
        prefix=prefix, actual_seq_qlen=actual_seq_qlen, actual_seq_kvlen=actual_seq_kvlen, sparse_mode=sparse_mode,
        gen_mask_parallel=gen_mask_parallel, sync=sync, softmax_layout=softmax_layout, sink=sink,
        pse_type=pse_type, q_start_idx=q_start_idx, kv_start_idx=kv_start_idx)
    dq_rope = dk_rope = None
    if query_rope is not None:
        dq, dq_rope = _split_rope(dq, query_rope.shape[-1] // (qh if layout in ("BSH", "SBH") else 1), layout, qh)
        dk, dk_rope = _split_rope(dk, key_rope.shape[-1] // (kh if layout in ("BSH", "SBH") else 1), layout, kh)
    return dq, dk, dv, dpse, dq_rope, dk_rope, dsink


@_args.torch_npu_api
def _npu_dropout_gen_mask(input: Tensor, size: Sequence[int], p: float, seed: int, offset: int, *,  # noqa: A002
                          parallel: Optional[bool] = True, sync: Optional[bool] = None) -> Tensor:
    """torch_npu._npu_dropout_gen_mask: the bit-packed keep mask (uint8, bit e of byte e // 8, LSB first, 1 = kept)
    of prod(size) elements with drop probability p, padded to a multiple of 128 bits, on input's device (`input` is
    torch's Python name of upstream's `self`).

    It is exactly the mask npu_fusion_attention draws for the same seed/offset and keep_prob = 1 - p (the
    flattened [B, N, Sq, Skv] mask; for TND the [N, Sq_b, Skv_b] blocks of the sequences one after the other), so
    it can be passed as npu_fusion_attention(dropout_mask=...), and npu_fusion_attention_grad(seed, offset)
    regenerates it. `parallel` and `sync` are accepted for compatibility (no effect).
    """
    op = "_npu_dropout_gen_mask"
    if not isinstance(input, Tensor):
        raise TypeError(f"{op}: argument 'input' must be a tensor; got {type(input).__name__}")
    size = _int_list(op, "size", size)
    if any(x < 0 for x in size):
        raise ValueError(f"{op}: argument 'size' must hold sizes >= 0; got {list(size)}")
    if not isinstance(p, (int, float)) or isinstance(p, bool) or not 0.0 <= p <= 1.0:
        raise ValueError(f"{op}: argument 'p' (the drop probability) must be in [0, 1]; got {p!r}")
    seed, offset = _int64(op, "seed", seed), _int64(op, "offset", offset)
    for name, flag in (("parallel", parallel), ("sync", sync)):
        if flag is not None and not isinstance(flag, bool):
            raise TypeError(f"{op}: argument '{name}' must be a bool or None; got {flag!r}")
    numel = math.prod(size)
    nbytes = (numel + 127) // 128 * 16
    if p >= 1.0:
        return torch.zeros(nbytes, dtype=torch.uint8, device=input.device)
    keep = _OPS.dropout_gen_mask(_host_long(seed), _host_long(offset), 1, numel, 1.0 - p).reshape(-1)
    bits = torch.zeros(nbytes * 8, dtype=torch.uint8)
    bits[:numel] = keep
    weights = torch.tensor([1, 2, 4, 8, 16, 32, 64, 128], dtype=torch.uint8)
    packed = (bits.view(-1, 8) * weights).sum(dim=1, dtype=torch.uint8)
    return packed.to(input.device)


# ================================================================================================================
# torch_npu.npu_ring_attention_update
# ================================================================================================================

@_args.torch_npu_api
def npu_ring_attention_update(prev_attn_out: Tensor, prev_softmax_max: Tensor, prev_softmax_sum: Tensor,
                              cur_attn_out: Tensor, cur_softmax_max: Tensor, cur_softmax_sum: Tensor, *,
                              actual_seq_qlen: Optional[SeqLens] = None, input_layout: str = "SBH",
                              input_softmax_layout: str = "") -> Tuple[Tensor, Tensor, Tensor]:
    """torch_npu.npu_ring_attention_update (ring context parallelism): merges the attention outputs of the same
    queries over two key blocks by their softmax max/sum, as npu_fusion_attention returns them. input_layout "SBH":
    attention [S, B, N*D], statistics float32 [B, N, S, 8]; "TND": attention [T, N, D], statistics [T, N, 8], and
    actual_seq_qlen (cumulative query lengths ending at T, a list or an integer tensor) is required; the statistics
    hold their rows in N-major order with input_softmax_layout "" (npu_fusion_attention's default TND statistics),
    in TND order with "TND". Returns (attn_out, softmax_max, softmax_sum): the merged output in
    the attention dtype and the merged statistics (8 equal copies per value)."""
    op = "npu_ring_attention_update"
    if input_layout == "SBH" and input_softmax_layout == "SBH":
        raise NotImplementedError(f"{op}: input_softmax_layout='SBH' (statistics in an order upstream does not "
                                  f"document) is not implemented; argument 'input_softmax_layout' must be ''")
    qlen = None
    if actual_seq_qlen is not None:
        qlen = actual_seq_qlen if isinstance(actual_seq_qlen, Tensor) else torch.tensor(
            _int_list(op, "actual_seq_qlen", actual_seq_qlen), dtype=torch.int64)
    return _OPS.ring_attention_update(prev_attn_out, prev_softmax_max, prev_softmax_sum, cur_attn_out,
                                      cur_softmax_max, cur_softmax_sum, qlen, input_layout, input_softmax_layout)
