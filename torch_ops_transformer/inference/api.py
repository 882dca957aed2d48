"""Python API of the inference attention ops (torch_npu-compatible signatures).

Sections: prefill (`npu_prompt_flash_attention`, `npu_fused_infer_attention_score(_v2)`, `attention_update`,
`npu_attention_update`), then decode (`npu_incre_flash_attention`). Arguments are checked and converted by `_args`
(ValueError for a bad value, NotImplementedError for the variants that are not implemented). Quantised attention
(int8 output, full quantisation, the shared prefix) is composed around the float ops in `quant.py`.

Mask polarity: `atten_mask` follows CANN — True / 1 means *masked out* (the opposite of SDPA's boolean mask).
"""
import inspect
import weakref
from typing import Optional, Sequence, Tuple, Union

import torch
from torch import Tensor

from .._internal import args as _args
from .._internal.args import MAX_TOKENS, SeqLens
from . import quant as _quant

_OPS = torch.ops.npu_fa


# ================================================================================================================
# Prefill: prompt_flash_attention / fused_infer_attention_score / attention_update
# ================================================================================================================

def _lengths(op: str, name: str, value: SeqLens, device, batch: Optional[int] = None) -> Optional[Tensor]:
    """Per-batch lengths as a tensor the op accepts (list, CPU tensor or tensor on the inputs' device). torch_npu
    takes the first `batch` entries of a longer list for the dense layouts; so do we."""
    t = _args.host_int_tensor(op, name, value, device)
    if t is not None and batch is not None and t.dim() == 1 and t.shape[0] > batch:
        t = t[:batch]
    return t


_COMPRESSED_MASK_SHAPES = ((2048, 2048), (1, 2048, 2048), (1, 1, 2048, 2048))


def _optimised_mask(op: str, sparse_mode: int, atten_mask: Optional[Tensor]) -> Optional[Tensor]:
    """torch_npu's rule for sparse_mode 2-4 (prefill): the optimised 2048x2048 mask is required, as (2048, 2048),
    (1, 2048, 2048) or (1, 1, 2048, 2048); the op takes it 2-D."""
    if sparse_mode not in (2, 3, 4):
        return atten_mask
    if atten_mask is None or tuple(atten_mask.shape) not in _COMPRESSED_MASK_SHAPES:
        got = "None" if atten_mask is None else f"shape {list(atten_mask.shape)}"
        raise ValueError(f"{op}: sparse_mode={sparse_mode} needs argument 'atten_mask' to be the optimised causal mask "
                         f"of shape (2048, 2048), (1, 2048, 2048) or (1, 1, 2048, 2048) (True / 1 strictly above the "
                         f"diagonal), as torch_npu; got {got}")
    return None if _known_causal_mask(atten_mask) else atten_mask.reshape(2048, 2048)


_OPTIMISED_MASKS: dict = {}


def optimised_causal_mask(device=None) -> Tensor:
    """The optimised causal mask sparse modes 2-4 take (bool 2048 x 2048, True strictly above the diagonal), one
    tensor per device: a model runner passing it to every layer and step lets the wrappers recognise it
    (`_known_causal_mask`) instead of building and checking a new one each call."""
    key = str(torch.device("cpu") if device is None else torch.device(device))
    if key not in _OPTIMISED_MASKS:
        _OPTIMISED_MASKS[key] = torch.ones(2048, 2048, dtype=torch.bool, device=device).triu(1)
    return _OPTIMISED_MASKS[key]


# Masks already found to be the optimised causal mask: id -> (weak reference, version counter). Serving engines pass
# one such tensor to every layer and step; the ops verify its 4M entries on each call (~10 ms on a CPU, 20x a small
# decode step), so the wrapper verifies a tensor once and then passes None, which modes 2-4 treat identically.
_CAUSAL_MASKS: dict = {}


def _known_causal_mask(mask: Tensor) -> bool:
    """Whether `mask` (the caller's tensor, any of the three shapes) holds the optimised causal mask. A tensor is
    recognised again while it is alive and unmodified (same object, version counter, storage and strides)."""
    if (torch.compiler.is_compiling() or mask.device.type == "meta" or mask.is_floating_point()
            or isinstance(mask, torch._subclasses.FakeTensor)):
        return False                       # traced or not a mask dtype: the op checks the tensor when it runs
    key = (mask._version, mask.data_ptr(), mask.stride(), mask.dtype)
    entry = _CAUSAL_MASKS.get(id(mask))
    if entry is not None and entry[0]() is mask and entry[1] == key:
        return True
    if not torch.equal(mask.reshape(2048, 2048).cpu() != 0, torch.ones(2048, 2048, dtype=torch.bool).triu(1)):
        return False                       # the op raises its error about the content
    if len(_CAUSAL_MASKS) > 64:
        _CAUSAL_MASKS.clear()
    _CAUSAL_MASKS[id(mask)] = (weakref.ref(mask), key)
    return True


@_args.torch_npu_api
def npu_prompt_flash_attention(query: Tensor, key: Tensor, value: Tensor, *, padding_mask: Optional[Tensor] = None,
                               atten_mask: Optional[Tensor] = None, pse_shift: Optional[Tensor] = None,
                               actual_seq_lengths: SeqLens = None, deq_scale1: Optional[Tensor] = None,
                               quant_scale1: Optional[Tensor] = None, deq_scale2: Optional[Tensor] = None,
                               quant_scale2: Optional[Tensor] = None, quant_offset2: Optional[Tensor] = None,
                               num_heads: int = 1, scale_value: float = 1.0, pre_tokens: int = MAX_TOKENS,
                               next_tokens: int = 0, input_layout: str = "BSH", num_key_value_heads: int = 0,
                               actual_seq_lengths_kv: SeqLens = None, sparse_mode: int = 0) -> Tensor:
    """torch_npu.npu_prompt_flash_attention with its exact signature (prefill attention).

    out = Softmax(Mask(scale_value·QKᵀ + pse_shift))·V, fp32/fp16/bf16, accumulation in fp32.
    Layouts: BSH [B,S,N·D], BSND, BNSD, BNSD_BSND (BNSD in, BSND out), TND [T,N,D].
    `actual_seq_lengths` / `actual_seq_lengths_kv`: per-batch lengths for the dense layouts — a list of ints, a CPU
    int tensor or an int tensor on the inputs' device; one entry applies to every batch, a longer list is cut to B
    (as torch_npu); each ≤ the padded S. Query rows past a sequence's length come out as zeros, keys past it are
    ignored. Cumulative ends for TND. `num_key_value_heads` (0 = num_heads) for GQA/MQA.
    `sparse_mode` 0–4 as in CANN; modes 2–4 need the optimised 2048×2048 causal mask (2-D, 3-D or 4-D), as in
    torch_npu (ValueError without it). **next_tokens defaults to 0, as in torch_npu**: in sparse_mode 0 *with* an
    atten_mask the visible band is i − pre_tokens ≤ j ≤ i + next_tokens, i.e. the default is top-left causal on top
    of the mask (pass next_tokens=2147483647 for a mask-only call); *without* a mask CANN ignores pre/next_tokens in
    mode 0, so the default call is full (non-causal) attention — use sparse_mode 2/3 for causal without a mask.
    `scale_value` defaults to 1.0 as upstream: pass 1/sqrt(D) yourself. `padding_mask` is reserved upstream
    (ValueError unless None).
    Quantised attention (docs/inference.md, "Quantised attention"): `quant_scale2` (+ `quant_offset2`) give an int8
    result, saturate(round_half_even(out·quant_scale2 + quant_offset2)), per-tensor or per-channel (N·D); an int8
    query, key and value with `deq_scale1`, `quant_scale1`, `deq_scale2` (per-tensor; float32 or torch_npu's
    int64/uint64 packed form) run upstream's full-quantisation arithmetic (float16 result, or int8 with quant_scale2).
    """
    op = "npu_prompt_flash_attention"
    _args.reserved(op, padding_mask=padding_mask)
    full = _quant.full_quant_args(op, query, key, value, deq_scale1, quant_scale1, deq_scale2,
                                  names=("deq_scale1", "quant_scale1", "deq_scale2"))
    post = _int8_output_args(op, query, quant_scale2, quant_offset2, sparse_mode, pre_tokens, next_tokens)
    batch = None if input_layout == "TND" else (query.shape[0] if query.dim() else None)
    atten_mask = _optimised_mask(op, sparse_mode, atten_mask)
    q_lens = _lengths(op, "actual_seq_lengths", actual_seq_lengths, query.device, batch)
    kv_lens = _lengths(op, "actual_seq_lengths_kv", actual_seq_lengths_kv, query.device, batch)
    if full is not None:
        out, _ = _quant.full_quant_attention(
            op, query, key, value, full, layout=input_layout, num_heads=num_heads,
            num_key_value_heads=num_key_value_heads, scale=scale_value, pse_shift=pse_shift, atten_mask=atten_mask,
            actual_seq_lengths=q_lens, actual_seq_lengths_kv=kv_lens, sparse_mode=sparse_mode,
            pre_tokens=pre_tokens, next_tokens=next_tokens, softmax_lse_flag=False)
    else:
        out = _OPS.prompt_flash_attention(
            query, key, value, atten_mask=atten_mask, pse_shift=pse_shift, actual_seq_lengths=q_lens,
            actual_seq_lengths_kv=kv_lens, num_heads=num_heads, scale_value=scale_value, pre_tokens=pre_tokens,
            next_tokens=next_tokens, input_layout=input_layout, num_key_value_heads=num_key_value_heads,
            sparse_mode=sparse_mode, inner_precise=1)
    if post is None:
        return out
    return _quant.post_quantise(op, out, "BSND" if input_layout == "BNSD_BSND" else input_layout, post)


def _int8_output_args(op: str, query, scale, offset, sparse_mode: int, pre_tokens: int, next_tokens: int,
                      names: Tuple[str, str] = ("quant_scale2", "quant_offset2")):
    """The int8-output factors (quant_scale2 / quant_offset2, v2's quant_scale_out / quant_offset_out), checked as
    upstream documents them (docs/inference.md, "Quantised attention"), or None."""
    post = _quant.post_quant_args(op, getattr(query, "dtype", None), scale, offset, names)
    if post is not None and sparse_mode == 4 and (pre_tokens < 0 or next_tokens < 0):
        raise ValueError(f"{op}: int8 output ('{names[0]}') does not support sparse_mode=4 with a negative "
                         f"pre_tokens / next_tokens (as upstream); got pre_tokens={pre_tokens}, "
                         f"next_tokens={next_tokens}")
    return post


# input_layout of fused_infer_attention_score -> (the op's layout, how the query (and a non-paged key/value) reach it:
# "NTD" = transposed, "NSD" = without the batch axis, and the output's layout when it differs from the op's).
# The layouts with an underscore are "input_output" (torch_npu converts the output); all are plain transposes.
_FIA_LAYOUTS = {
    "BSH": ("BSH", None, None), "BSND": ("BSND", None, None), "BNSD": ("BNSD", None, None),
    "BNSD_BSND": ("BNSD_BSND", None, None), "TND": ("TND", None, None),
    "NTD": ("TND", "NTD", "NTD"), "NTD_TND": ("TND", "NTD", None), "TND_NTD": ("TND", None, "NTD"),
    "NSD": ("BNSD", "NSD", "NSD"),
    "BSH_BNSD": ("BSH", None, "BNSD"), "BSND_BNSD": ("BSND", None, "BNSD"),
    "BSH_NBSD": ("BSH", None, "NBSD"), "BSND_NBSD": ("BSND", None, "NBSD"), "BNSD_NBSD": ("BNSD", None, "NBSD"),
}
_THREE_D = ("BSH", "TND", "NTD", "NSD")


def _fia_input(t: Tensor, form: Optional[str]) -> Tensor:
    if form == "NTD":
        return t.transpose(0, 1).contiguous()
    if form == "NSD":
        return t.unsqueeze(0)
    return t


def _fia_output(out: Tensor, base: str, form: Optional[str], num_heads: int) -> Tensor:
    if form is None:
        return out
    if form == "NTD":                      # [T, N, D] -> [N, T, D]
        return out.transpose(0, 1).contiguous()
    if form == "NSD":                      # [1, N, S, D] -> [N, S, D]
        return out[0]
    if base == "BSH":                      # [B, S, N*D] -> [B, S, N, D]
        out = out.view(out.shape[0], out.shape[1], num_heads, -1)
    if base == "BNSD":                     # only to NBSD
        return out.permute(1, 0, 2, 3).contiguous()
    # out is [B, S, N, D]
    return (out.transpose(1, 2) if form == "BNSD" else out.permute(2, 0, 1, 3)).contiguous()


def _fused_infer(op: str, query: Tensor, key, value, *, pse_shift, atten_mask, actual_seq_lengths,
                 actual_seq_lengths_kv, block_table, num_heads: int, scale: float, pre_tokens: int, next_tokens: int,
                 input_layout: str, num_key_value_heads: int, sparse_mode: int, inner_precise: int, block_size: int,
                 softmax_lse_flag: bool, learnable_sink: Optional[Tensor] = None,
                 antiquant: Optional[dict] = None, query_rope: Optional[Tensor] = None,
                 key_rope: Optional[Tensor] = None, full_quant: Optional[dict] = None) -> Tuple[Tensor, Tensor]:
    """npu_fused_infer_attention_score(_v2) once their own arguments are checked: torch_npu's calling conventions
    (the layouts the op lacks, lengths as lists, the optimised mask, the rules of a one-token dense query, v2's
    learnable_sink) turned into one call of the op, which decides how to compute it (docs/inference.md, "Routes").
    `full_quant` (the factors of an int8 query, key and value) runs `quant.full_quant_attention` instead of the op."""
    key, value = _args.single_tensor(op, "key", key), _args.single_tensor(op, "value", value)
    if (query_rope is None) != (key_rope is None):
        raise ValueError(f"{op}: arguments 'query_rope' and 'key_rope' must be given together (MLA); got only "
                         f"'{'query_rope' if query_rope is not None else 'key_rope'}'")
    for name, t in (("query_rope", query_rope), ("key_rope", key_rope)):
        if t is not None and not isinstance(t, Tensor):
            raise TypeError(f"{op}: argument '{name}' must be a Tensor or None; got {type(t).__name__}")
    if input_layout not in _FIA_LAYOUTS:
        raise ValueError(f"{op}: argument 'input_layout' must be one of {', '.join(_FIA_LAYOUTS)}; "
                         f"got {input_layout!r}")
    base, in_form, out_form = _FIA_LAYOUTS[input_layout]
    want = 3 if input_layout.split("_")[0] in _THREE_D else 4
    if query.dim() != want:
        raise ValueError(f"{op}: argument 'query' must be a {want}-D tensor for input_layout {input_layout}; got "
                         f"shape {list(query.shape)}")
    paged = block_table is not None
    query = _fia_input(query, in_form)
    if query_rope is not None:
        query_rope = _fia_input(query_rope, in_form)
    if not paged:
        same = value is key   # keep the latent cache passed as both key and value one tensor
        key = _fia_input(key, in_form)
        value = key if same else _fia_input(value, in_form)
        if key_rope is not None:
            key_rope = _fia_input(key_rope, in_form)
    tnd = base == "TND"
    batch = None if tnd else query.shape[0]
    q_lens = _lengths(op, "actual_seq_lengths", actual_seq_lengths, query.device, batch)
    kv_lens = _lengths(op, "actual_seq_lengths_kv", actual_seq_lengths_kv, query.device, batch)
    if not tnd and query.shape[2 if base.startswith("BNSD") else 1] == 1:
        # torch_npu documents that a one-token query (the decode branch) ignores actual_seq_lengths, pre/next_tokens
        # and sparse_mode. We follow it except for sparse_mode 4: its band is aligned to the end of the keys, so the
        # caller's sliding window applies here as in prefill (dropping it would silently give full attention).
        # Modes 2/3 with one query row hide no key (3) or all but one (2: not a decode mask), so they become mode 0.
        q_lens = None
        if sparse_mode == 4:
            if atten_mask is not None:
                atten_mask = _optimised_mask(op, sparse_mode, atten_mask)
        else:
            pre_tokens, next_tokens = MAX_TOKENS, MAX_TOKENS
            if sparse_mode in (2, 3):
                sparse_mode, atten_mask = 0, None
    else:
        atten_mask = _optimised_mask(op, sparse_mode, atten_mask)
    if atten_mask is not None and atten_mask.dtype == torch.int8:
        # FIA takes int8 masks too (vLLM-Ascend's optimised causal mask is int8): same bits as uint8, nonzero = masked
        atten_mask = atten_mask.view(torch.uint8)
    if learnable_sink is not None:
        if input_layout not in ("TND", "NTD_TND"):
            raise ValueError(f"{op}: argument 'learnable_sink' needs input_layout TND or NTD_TND (as torch_npu); "
                             f"got {input_layout!r}")
        if pse_shift is not None:
            raise ValueError(f"{op}: argument 'learnable_sink' cannot be combined with 'pse_shift' (as torch_npu)")
        if learnable_sink.shape != (num_heads,) or not learnable_sink.is_floating_point():
            raise ValueError(f"{op}: argument 'learnable_sink' must be a floating-point tensor of shape "
                             f"(num_query_heads,) = ({num_heads},); got {learnable_sink.dtype} of shape "
                             f"{list(learnable_sink.shape)}")
        learnable_sink = learnable_sink.to(torch.float32)  # torch_npu takes any float dtype; the op float32
    if full_quant is not None:
        for name, t in (("block_table", block_table), ("query_rope", query_rope), ("learnable_sink", learnable_sink)):
            if t is not None:
                raise ValueError(f"{op}: an int8 query (full quantisation) cannot be combined with '{name}' "
                                 f"(upstream supports it only without)")
        if any(t is not None for t in (antiquant or {}).values() if isinstance(t, Tensor)):
            raise ValueError(f"{op}: an int8 query (full quantisation) takes no KV antiquant factors; got "
                             + ", ".join(f"'{n}'" for n, t in antiquant.items() if isinstance(t, Tensor)))
        out, lse = _quant.full_quant_attention(
            op, query, key, value, full_quant, layout=base, num_heads=num_heads,
            num_key_value_heads=num_key_value_heads, scale=scale, pse_shift=pse_shift, atten_mask=atten_mask,
            actual_seq_lengths=q_lens, actual_seq_lengths_kv=kv_lens, sparse_mode=sparse_mode,
            pre_tokens=pre_tokens, next_tokens=next_tokens, softmax_lse_flag=softmax_lse_flag)
        return _fia_output(out, base, out_form, num_heads), lse
    out, lse = _OPS.fused_infer_attention_score(
        query, key, value, pse_shift=pse_shift, atten_mask=atten_mask, actual_seq_lengths=q_lens,
        actual_seq_lengths_kv=kv_lens, block_table=block_table, num_heads=num_heads, scale=scale,
        pre_tokens=pre_tokens, next_tokens=next_tokens, input_layout=base, num_key_value_heads=num_key_value_heads,
        sparse_mode=sparse_mode, inner_precise=inner_precise, block_size=block_size,
        softmax_lse_flag=softmax_lse_flag, query_rope=query_rope, key_rope=key_rope, learnable_sink=learnable_sink,
        **(antiquant or {}))
    return _fia_output(out, base, out_form, num_heads), lse


def _fia_out_layout(input_layout: str) -> str:
    """The layout of FIA's result for `input_layout` (the names `quant.post_quantise` takes)."""
    base, _, out_form = _FIA_LAYOUTS[input_layout]
    return out_form or ("BSND" if base == "BNSD_BSND" else base)


_ANTIQUANT_TENSORS = ("antiquant_scale", "antiquant_offset", "key_antiquant_scale", "key_antiquant_offset",
                      "value_antiquant_scale", "value_antiquant_offset")


def _antiquant_args(op: str, **kw) -> dict:
    """The int8-cache (KV antiquant) arguments as the ops take them: tensors or None, modes as ints (torch_npu
    callers sometimes pass a mode as a one-element tensor; None means the default 0)."""
    out = {}
    for name, value in kw.items():
        if name in _ANTIQUANT_TENSORS:
            if value is not None and not isinstance(value, Tensor):
                raise TypeError(f"{op}: argument '{name}' must be a Tensor or None; got {type(value).__name__}")
            out[name] = value
        else:
            if isinstance(value, Tensor) and value.numel() == 1 and float(value.item()).is_integer():
                value = int(value.item())
            if value is None:
                value = 0
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"{op}: argument '{name}' must be an int; got {value!r}")
            out[name] = value
    return out


# v2's KV-dequantisation arguments and the v1 (separate-form) antiquant arguments they are.
_V2_ANTIQUANT = {"dequant_scale_key": "key_antiquant_scale", "dequant_offset_key": "key_antiquant_offset",
                 "dequant_scale_value": "value_antiquant_scale", "dequant_offset_value": "value_antiquant_offset",
                 "key_quant_mode": "key_antiquant_mode", "value_quant_mode": "value_antiquant_mode"}


def _v2_antiquant(op: str, query, key, **kw) -> Optional[dict]:
    """FIA v2's dequant_scale/offset_key/value and key/value_quant_mode. With an int8 key/value and an fp16/bf16
    query they are v1's separate-form KV antiquant (key_antiquant_scale, ..., key_antiquant_mode; same modes 0-5,
    x = (x_int8 + offset) * scale); the decode op validates them exactly as in v1. Upstream's other uses of the same
    arguments: an int8 query (full quantisation) is `quant.mla_full_quant_args`'s, which runs first; int4 packed in
    int32 raises NotImplementedError naming them."""
    given = {name: value for name, value in kw.items()
             if value is not None and not (name.endswith("_mode") and value in (0,))}
    if not given:
        return None
    if isinstance(query, Tensor) and query.dtype == torch.int8:
        _args.not_implemented(op, "full quantisation (an int8 'query')", **{n: kw[n] for n in given})
    if isinstance(key, Tensor) and key.dtype == torch.int32:
        _args.not_implemented(op, "int4 (int32-packed) KV antiquant", **{n: kw[n] for n in given})
    return _antiquant_args(op, **{_V2_ANTIQUANT[name]: value for name, value in kw.items()})


@_args.torch_npu_api
def npu_fused_infer_attention_score(query: Tensor, key, value, *, pse_shift: Optional[Tensor] = None,
                                    atten_mask: Optional[Tensor] = None, actual_seq_lengths: SeqLens = None,
                                    actual_seq_lengths_kv: SeqLens = None, dequant_scale1=None, quant_scale1=None,
                                    dequant_scale2=None, quant_scale2=None, quant_offset2=None, antiquant_scale=None,
                                    antiquant_offset=None, key_antiquant_scale=None, key_antiquant_offset=None,
                                    value_antiquant_scale=None, value_antiquant_offset=None,
                                    block_table: Optional[Tensor] = None, query_padding_size=None,
                                    kv_padding_size=None, key_shared_prefix=None, value_shared_prefix=None,
                                    actual_shared_prefix_len=None, query_rope=None, key_rope=None,
                                    key_rope_antiquant_scale=None, num_heads: int = 1, scale: float = 1.0,
                                    pre_tokens: int = MAX_TOKENS, next_tokens: int = MAX_TOKENS,
                                    input_layout: str = "BSH", num_key_value_heads: int = 0, sparse_mode: int = 0,
                                    inner_precise: int = 0, block_size: int = 0, antiquant_mode: int = 0,
                                    key_antiquant_mode: int = 0, value_antiquant_mode: int = 0,
                                    softmax_lse_flag: bool = False) -> Tuple[Tensor, Tensor]:
    """torch_npu.npu_fused_infer_attention_score (keyword arguments as upstream). Returns (attention_out, softmax_lse).

    Without `block_table`: the prefill path of `npu_prompt_flash_attention` (same per-batch lengths, masks, sparse
    modes, pse_shift; any Sq), but `next_tokens` defaults to 2147483647 here, as upstream. Layouts: BSH, BSND, BNSD,
    TND, NTD, NSD (BNSD without the batch axis) and the input_output pairs BNSD_BSND, BSH_BNSD, BSND_BNSD,
    BSH_NBSD, BSND_NBSD, BNSD_NBSD, TND_NTD, NTD_TND. Lengths: a list, a CPU int tensor or an int tensor on the
    inputs' device; one entry applies to every batch, a longer list is cut to B; cumulative ends for TND/NTD.
    As upstream, a one-token query outside TND (the decode branch) ignores actual_seq_lengths, pre_tokens,
    next_tokens and sparse_modes 0-3 (the 2048x2048 mask of modes 2/3 with it) — except sparse_mode 4, whose
    sliding window applies there too (a deliberate difference, docs/inference.md); otherwise sparse_mode 2-4 need
    that optimised mask (ValueError without it), bool, uint8 or int8.
    With `block_table` (paged KV cache): the same result as the keys laid out contiguously, for every sparse mode,
    band, mask, pse_shift, query length and softmax_lse_flag; `actual_seq_lengths_kv` (required) holds each
    sequence's KV length, also for TND. The op decides how to compute a call (one-token calls whose band hides no
    key through `npu_fa::incre_flash_attention` on the cache in place; docs/inference.md, "Routes"). Blocks may be
    shared between sequences (read-only).
    `softmax_lse_flag=True` returns the fp32 log-sum-exp [B,N,Sq,1] ([T,N,1] for TND/NTD; -inf for rows that see no
    key); otherwise softmax_lse is an empty tensor (shape [0], as torch_npu's).
    int8 key/value (KV antiquant, fp16/bf16 query): `key_antiquant_scale`/`value_antiquant_scale` (+ offsets, modes
    `key_antiquant_mode`/`value_antiquant_mode`: 0 per-channel, 1 per-token, 2 per-tensor per-head, 3 per-token
    per-head) or the stacked `antiquant_scale`/`antiquant_offset` ([2, ...], `antiquant_mode` 0/1); x = (x_int8 +
    offset) * scale. Both routes read the int8 cache itself (the decode kernel with integer dot products, the
    prefill kernel dequantising tile by tile; docs/inference.md). The padding-size arguments raise
    NotImplementedError.
    Quantised attention (docs/inference.md, "Quantised attention"): `quant_scale2` (+ `quant_offset2`) give an int8
    attention_out, saturate(round_half_even(out·quant_scale2 + quant_offset2)), per-tensor or per-channel (N·D); an
    int8 query, key and value with `dequant_scale1`, `quant_scale1`, `dequant_scale2` (per-tensor; float32 or
    torch_npu's int64/uint64 packed form) run upstream's full-quantisation arithmetic (float16 out, int8 with
    quant_scale2). Shared prefix: `key_shared_prefix` / `value_shared_prefix` (batch 1, the key's other dims) and
    `actual_shared_prefix_len` (one int, default the prefix's S): every sequence attends to the prefix's first
    actual_shared_prefix_len keys followed by its own; masks and pse_shift index that concatenation.
    MLA: `query_rope` / `key_rope` (both or neither; query's / key's shape with the rope dim last, same dtypes) add
    q_rope·k_ropeᵀ to the scores. Absorbed MLA (head dim 512 = kv_lora_rank, which needs num_key_value_heads=1 and
    rope dim 64 as upstream): the latent cache is key (and usually value, the same tensor), every layout and paged
    or contiguous cache above, decode and prefill (sparse_mode 0/3/4, also 2), and softmax_lse_flag (which upstream
    lacks there). One KV head with a band-only sparse mode runs a dedicated kernel reading the caches in place; other
    head dims (upstream's non-absorbed 128), GQA, masks and pse_shift append the rope parts to the heads.
    `key_rope_antiquant_scale` is reserved upstream: accepted (a tensor) and unused. docs/inference.md, "MLA".
    """
    op = "npu_fused_infer_attention_score"
    full = _quant.full_quant_args(op, query, key, value, dequant_scale1, quant_scale1, dequant_scale2)
    post = _int8_output_args(op, query, quant_scale2, quant_offset2, sparse_mode, pre_tokens, next_tokens)
    if key_rope_antiquant_scale is not None and not isinstance(key_rope_antiquant_scale, Tensor):
        raise TypeError(f"{op}: argument 'key_rope_antiquant_scale' must be a Tensor or None; got "
                        f"{type(key_rope_antiquant_scale).__name__}")
    if isinstance(key, Tensor) and key.dtype == torch.int32:  # int4 packed in int32 (upstream's int4 antiquant)
        _args.not_implemented(op, "int4 (int32-packed) KV antiquant", antiquant_scale=antiquant_scale,
                              antiquant_offset=antiquant_offset, key_antiquant_scale=key_antiquant_scale,
                              key_antiquant_offset=key_antiquant_offset, value_antiquant_scale=value_antiquant_scale,
                              value_antiquant_offset=value_antiquant_offset)
    antiquant = _antiquant_args(op, antiquant_scale=antiquant_scale, antiquant_offset=antiquant_offset,
                                key_antiquant_scale=key_antiquant_scale, key_antiquant_offset=key_antiquant_offset,
                                value_antiquant_scale=value_antiquant_scale,
                                value_antiquant_offset=value_antiquant_offset, antiquant_mode=antiquant_mode,
                                key_antiquant_mode=key_antiquant_mode, value_antiquant_mode=value_antiquant_mode)
    _args.not_implemented(op, "attention with padding sizes", query_padding_size=query_padding_size,
                          kv_padding_size=kv_padding_size)
    if key_shared_prefix is not None or value_shared_prefix is not None or actual_shared_prefix_len is not None:
        key, value = _args.single_tensor(op, "key", key), _args.single_tensor(op, "value", value)
        key, value, atten_mask, pse_shift, actual_seq_lengths_kv = _quant.with_shared_prefix(
            op, key, value, key_shared_prefix, value_shared_prefix, actual_shared_prefix_len,
            input_layout=input_layout, query=query, block_table=block_table, atten_mask=atten_mask,
            pse_shift=pse_shift, sparse_mode=sparse_mode, antiquant=antiquant,
            actual_seq_lengths_kv=_args.host_int_tensor(op, "actual_seq_lengths_kv", actual_seq_lengths_kv,
                                                        query.device))
    out, lse = _fused_infer(op, query, key, value, pse_shift=pse_shift, atten_mask=atten_mask,
                            actual_seq_lengths=actual_seq_lengths, actual_seq_lengths_kv=actual_seq_lengths_kv,
                            block_table=block_table, num_heads=num_heads, scale=scale, pre_tokens=pre_tokens,
                            next_tokens=next_tokens, input_layout=input_layout,
                            num_key_value_heads=num_key_value_heads, sparse_mode=sparse_mode,
                            inner_precise=inner_precise, block_size=block_size, softmax_lse_flag=softmax_lse_flag,
                            antiquant=antiquant, query_rope=query_rope, key_rope=key_rope, full_quant=full)
    if post is not None:
        out = _quant.post_quantise(op, out, _fia_out_layout(input_layout), post)
    return out, lse


@_args.torch_npu_api
def npu_fused_infer_attention_score_v2(
        query: Tensor, key: Tensor, value: Tensor, *, query_rope: Optional[Tensor] = None,
        key_rope: Optional[Tensor] = None, pse_shift: Optional[Tensor] = None, atten_mask: Optional[Tensor] = None,
        actual_seq_qlen: SeqLens = None, actual_seq_kvlen: SeqLens = None, block_table: Optional[Tensor] = None,
        dequant_scale_query: Optional[Tensor] = None, dequant_scale_key: Optional[Tensor] = None,
        dequant_offset_key: Optional[Tensor] = None, dequant_scale_value: Optional[Tensor] = None,
        dequant_offset_value: Optional[Tensor] = None, dequant_scale_key_rope: Optional[Tensor] = None,
        quant_scale_out: Optional[Tensor] = None, quant_offset_out: Optional[Tensor] = None,
        quant_scale_p: Optional[Tensor] = None, learnable_sink: Optional[Tensor] = None, num_query_heads: int = 1,
        num_key_value_heads: int = 0, softmax_scale: float = 1.0, pre_tokens: int = MAX_TOKENS,
        next_tokens: int = MAX_TOKENS, input_layout: str = "BSH", sparse_mode: int = 0, block_size: int = 0,
        query_quant_mode: int = 0, key_quant_mode: int = 0, value_quant_mode: int = 0, inner_precise: int = 0,
        return_softmax_lse: bool = False, query_dtype: Optional[int] = None, key_dtype: Optional[int] = None,
        value_dtype: Optional[int] = None, query_rope_dtype: Optional[int] = None,
        key_rope_dtype: Optional[int] = None, key_shared_prefix_dtype: Optional[int] = None,
        value_shared_prefix_dtype: Optional[int] = None, dequant_scale_query_dtype: Optional[int] = None,
        dequant_scale_key_dtype: Optional[int] = None, dequant_scale_value_dtype: Optional[int] = None,
        dequant_scale_key_rope_dtype: Optional[int] = None, out_dtype: Optional[int] = None) -> Tuple[Tensor, Tensor]:
    """torch_npu.npu_fused_infer_attention_score_v2: `npu_fused_infer_attention_score` with renamed arguments
    (num_query_heads = num_heads, softmax_scale = scale, actual_seq_qlen / actual_seq_kvlen = actual_seq_lengths /
    actual_seq_lengths_kv, return_softmax_lse = softmax_lse_flag) and the same semantics, plus `learnable_sink`:
    a per-head logit (shape (num_query_heads,)) added to each softmax denominator, i.e. out·sigmoid(lse − sink) and
    lse' = logaddexp(lse, sink); TND / NTD_TND only and not with pse_shift, as upstream.
    int8 key/value with an fp16/bf16 query (KV antiquant): dequant_scale_key / dequant_offset_key /
    dequant_scale_value / dequant_offset_value and key_quant_mode / value_quant_mode are v1's key_antiquant_scale /
    key_antiquant_offset / value_antiquant_scale / value_antiquant_offset / key_antiquant_mode / value_antiquant_mode
    (0 per-channel or per-tensor, 1 per-token, 2 per-tensor per-head, 3 per-token per-head; x = (x_int8 + offset) *
    scale), with v1's rules. `query_rope` / `key_rope` (MLA) as in v1. `quant_scale_out` (+ `quant_offset_out`) give
    an int8 attention_out as v1's quant_scale2 / quant_offset2 (docs/inference.md, "Quantised attention").
    MLA full quantisation (upstream's int8 query, query D 512): int8 query / key / value, bfloat16 query_rope /
    key_rope, `query_quant_mode=3` with float32 `dequant_scale_query` per token and head (the query's shape without
    D), float32 per-tensor `dequant_scale_key` / `dequant_scale_value` (key/value_quant_mode 0): softmax((Q·Kᵀ +
    q_rope·k_ropeᵀ)·dsq·dsk·softmax_scale)·V·dsv as bfloat16 (`quant.mla_full_quant_inputs`). `out_dtype` may
    name the dtype the call produces; other dtypes (fp8 outputs), an int8 query without rope parts, int4 packed in
    int32, the other *_dtype arguments and the tree mask of sparse_mode 9 (MLA only) raise NotImplementedError
    naming them; dequant_scale_key_rope and quant_scale_p are reserved upstream (ValueError unless None).
    """
    op = "npu_fused_infer_attention_score_v2"
    _args.reserved(op, dequant_scale_key_rope=dequant_scale_key_rope, quant_scale_p=quant_scale_p)
    full = _quant.mla_full_quant_args(
        op, query, key, value, query_rope, key_rope, input_layout=input_layout, num_heads=num_query_heads,
        query_quant_mode=query_quant_mode, dequant_scale_query=dequant_scale_query,
        dequant_scale_key=dequant_scale_key, dequant_scale_value=dequant_scale_value,
        dequant_offset_key=dequant_offset_key, dequant_offset_value=dequant_offset_value,
        key_quant_mode=key_quant_mode, value_quant_mode=value_quant_mode, quant_scale_out=quant_scale_out,
        quant_offset_out=quant_offset_out, pse_shift=pse_shift, learnable_sink=learnable_sink,
        sparse_mode=sparse_mode)
    post = _int8_output_args(op, query, quant_scale_out, quant_offset_out, sparse_mode, pre_tokens, next_tokens,
                             names=("quant_scale_out", "quant_offset_out"))
    produced = torch.bfloat16 if full else torch.int8 if post else getattr(query, "dtype", None)
    _args.same_dtype_or_none(op, "out_dtype", out_dtype, produced,
                             f"an output dtype other than the call's own ({produced})")
    antiquant = None if full else _v2_antiquant(
        op, query, key, dequant_scale_key=dequant_scale_key, dequant_offset_key=dequant_offset_key,
        dequant_scale_value=dequant_scale_value, dequant_offset_value=dequant_offset_value,
        key_quant_mode=key_quant_mode, value_quant_mode=value_quant_mode)
    _args.not_implemented(op, "attention on reinterpreted (low-precision) dtypes", query_dtype=query_dtype,
                          key_dtype=key_dtype, value_dtype=value_dtype, query_rope_dtype=query_rope_dtype,
                          key_rope_dtype=key_rope_dtype, key_shared_prefix_dtype=key_shared_prefix_dtype,
                          value_shared_prefix_dtype=value_shared_prefix_dtype,
                          dequant_scale_query_dtype=dequant_scale_query_dtype,
                          dequant_scale_key_dtype=dequant_scale_key_dtype,
                          dequant_scale_value_dtype=dequant_scale_value_dtype,
                          dequant_scale_key_rope_dtype=dequant_scale_key_rope_dtype)
    if sparse_mode == 9:
        raise NotImplementedError(f"{op}: the tree mask of 'sparse_mode'=9 (MLA only upstream) is not implemented")
    if full:
        # Dequantised operands in float32 through the float op (every layout, paged / NZ cache, mask and lse rule).
        query, key, value, query_rope, key_rope = _quant.mla_full_quant_inputs(
            full, query, _args.single_tensor(op, "key", key), _args.single_tensor(op, "value", value), query_rope,
            key_rope, input_layout=input_layout, num_heads=num_query_heads)
    try:
        out, lse = _fused_infer(op, query, key, value, pse_shift=pse_shift, atten_mask=atten_mask,
                                actual_seq_lengths=actual_seq_qlen, actual_seq_lengths_kv=actual_seq_kvlen,
                                block_table=block_table, num_heads=num_query_heads, scale=softmax_scale,
                                pre_tokens=pre_tokens, next_tokens=next_tokens, input_layout=input_layout,
                                num_key_value_heads=num_key_value_heads, sparse_mode=sparse_mode,
                                inner_precise=inner_precise, block_size=block_size, softmax_lse_flag=return_softmax_lse,
                                learnable_sink=learnable_sink, antiquant=antiquant, query_rope=query_rope,
                                key_rope=key_rope)
    except (ValueError, TypeError, NotImplementedError) as e:
        # The decode op checks the antiquant arguments under their v1 names: name v2's in the message instead.
        if not antiquant:
            raise
        msg = str(e)
        for v2_name, v1_name in _V2_ANTIQUANT.items():
            msg = msg.replace(f"'{v1_name}'", f"'{v2_name}'")
        if msg == str(e):
            raise
        raise type(e)(msg) from None
    if full:
        out = _quant.mla_full_quant_output(full, out)
    if post is not None:
        out = _quant.post_quantise(op, out, _fia_out_layout(input_layout), post,
                                   names=("quant_scale_out", "quant_offset_out"))
    return out, lse


# ---- Graph-mode calling conventions of the two FIA APIs: `.out` with preallocated results and a workspace ----

def _out_variant(fn, lse_flag: str):
    """torch_npu's `<fn>.out(..., workspace=None, out=[attention_out, softmax_lse])` (serving engines preallocate the
    results for NPU graph capture): runs `fn` and writes its results into the given tensors. attention_out must
    have the result's shape (its dtype is cast to); softmax_lse is written only when `lse_flag` is set (resized to
    the lse's shape unless it already has as many elements). `workspace` is accepted: the CPU kernels need none."""
    name = f"{fn.__name__}.out"

    def out_fn(*args, workspace: Optional[Tensor] = None, out: Optional[Sequence[Tensor]] = None,
               attention_out: Optional[Tensor] = None, softmax_lse: Optional[Tensor] = None, **kwargs):
        if out is not None:
            if attention_out is not None or softmax_lse is not None:
                raise ValueError(f"{name}: pass the results either as 'out' or as 'attention_out'/'softmax_lse', "
                                 f"not both")
            if not isinstance(out, (list, tuple)) or len(out) != 2:
                raise ValueError(f"{name}: argument 'out' must be a list of two tensors [attention_out, "
                                 f"softmax_lse]; got {out!r}")
            attention_out, softmax_lse = out
        for arg, t in (("attention_out", attention_out), ("softmax_lse", softmax_lse), ("workspace", workspace)):
            if t is None and arg == "workspace":
                continue
            if not isinstance(t, Tensor):
                raise TypeError(f"{name}: argument '{arg}' must be a tensor; got {type(t).__name__}")
        result, lse = fn(*args, **kwargs)
        if attention_out.shape != result.shape:
            raise ValueError(f"{name}: argument 'attention_out' must have the result's shape {list(result.shape)}; "
                             f"got {list(attention_out.shape)}")
        attention_out.copy_(result)
        if kwargs.get(lse_flag, False):
            if softmax_lse.numel() != lse.numel():
                softmax_lse.resize_(lse.shape)
            softmax_lse.view(lse.shape).copy_(lse)
        return attention_out, softmax_lse

    out_fn.__name__ = out_fn.__qualname__ = "out"
    out_fn.__doc__ = _out_variant.__doc__.replace("`<fn>", f"`{fn.__name__}")
    return out_fn


def _workspace_query(fn):
    """torch_npu's `_<fn>_get_max_workspace(<fn's arguments>)`: the workspace tensor graph-mode callers pass to
    `<fn>.out`. The CPU kernels take none, so it is an empty uint8 tensor on the query's device; the arguments are
    bound to fn's signature (TypeError for an unknown or missing one, as upstream)."""
    sig = inspect.signature(fn)

    def get_max_workspace(*args, **kwargs) -> Tensor:
        query = sig.bind(*args, **kwargs).arguments["query"]
        return torch.empty(0, dtype=torch.uint8, device=query.device)

    get_max_workspace.__name__ = get_max_workspace.__qualname__ = f"_{fn.__name__}_get_max_workspace"
    get_max_workspace.__signature__ = sig.replace(return_annotation=Tensor)
    return _args.torch_npu_api(get_max_workspace)


npu_fused_infer_attention_score.out = _out_variant(npu_fused_infer_attention_score, "softmax_lse_flag")
npu_fused_infer_attention_score_v2.out = _out_variant(npu_fused_infer_attention_score_v2, "return_softmax_lse")
_npu_fused_infer_attention_score_get_max_workspace = _workspace_query(npu_fused_infer_attention_score)
_npu_fused_infer_attention_score_v2_get_max_workspace = _workspace_query(npu_fused_infer_attention_score_v2)


def attention_update(lse: Union[Tensor, Sequence[Tensor]], out: Union[Tensor, Sequence[Tensor]]
                     ) -> Tuple[Tensor, Tensor]:
    """Merges partial attention results computed over disjoint key ranges (ring / context-parallel attention).

    `lse`: a list of K fp32 log-sum-exp tensors [...] (or one stacked [K, ...] tensor); `out`: a list of K partial
    outputs [..., D] (or stacked [K, ..., D]). Returns (out [..., D], lse [...]) with
    lse = log Σ exp(lse_i) and out = Σ exp(lse_i − lse)·out_i. A partial lse of −inf (an empty key range) gets
    weight exactly 0 (rows where all are −inf give 0 and −inf). Differentiable in lse and out.
    See `npu_attention_update` for torch_npu's form.
    """
    if isinstance(lse, (list, tuple)):
        lse = torch.stack(list(lse))
    if isinstance(out, (list, tuple)):
        out = torch.stack(list(out))
    return _OPS.attention_update(lse, out)


_UPDATE_OUT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


@_args.torch_npu_api
def npu_attention_update(lse: Sequence[Tensor], local_out: Sequence[Tensor], update_type: int
                         ) -> Tuple[Tensor, Optional[Tensor]]:
    """torch_npu.npu_attention_update: merges the partial results of SP sequence-parallel ranks.

    `lse`: SP fp32 tensors [N] (N = batch·seq·heads), `local_out`: SP tensors [N, head_dim] (fp32/fp16/bf16, one
    dtype). Returns (out [N, head_dim] in local_out's dtype, lse_out [N] fp32) with lse_out = log Σ exp(lse_i) and
    out = Σ exp(lse_i − lse_out)·out_i; update_type 0 returns (out, None) — torch_npu leaves the second output
    undefined — and 1 returns both. Checked as upstream documents: 1 ≤ SP ≤ 16, head_dim a multiple of 8 in
    [8, 512], update_type 0 or 1 (ValueError otherwise). A part with lse −inf gets weight 0 (`attention_update`).
    """
    op = "npu_attention_update"
    for name, value in (("lse", lse), ("local_out", local_out)):
        if not isinstance(value, (list, tuple)) or not all(isinstance(t, Tensor) for t in value):
            raise TypeError(f"{op}: argument '{name}' must be a list of tensors; got {type(value).__name__}")
    if isinstance(update_type, bool) or update_type not in (0, 1):
        raise ValueError(f"{op}: argument 'update_type' must be 0 (out only) or 1 (out and lse_out); "
                         f"got {update_type!r}")
    if not 1 <= len(lse) <= 16 or len(local_out) != len(lse):
        raise ValueError(f"{op}: arguments 'lse' and 'local_out' must be lists of the same length SP in [1, 16]; got "
                         f"{len(lse)} and {len(local_out)} tensors")
    n, h, dtype = lse[0].shape, local_out[0].shape[-1:], local_out[0].dtype
    for i, (l, o) in enumerate(zip(lse, local_out)):
        if l.dtype != torch.float32:
            raise ValueError(f"{op}: argument 'lse[{i}]' must be float32; got {l.dtype}")
        if o.dtype not in _UPDATE_OUT_DTYPES or o.dtype != dtype:
            raise ValueError(f"{op}: argument 'local_out[{i}]' must be float32, float16 or bfloat16 like "
                             f"local_out[0] ({dtype}); got {o.dtype}")
        if l.dim() != 1 or o.dim() != 2 or l.shape != n or o.shape != (n[0], h[0]):
            raise ValueError(f"{op}: 'lse[{i}]' must be [N] and 'local_out[{i}]' [N, head_dim] with the N and "
                             f"head_dim of the first pair ({list(n)}, {[*n, *h]}); got {list(l.shape)} and "
                             f"{list(o.shape)}")
    if not (8 <= h[0] <= 512 and h[0] % 8 == 0):
        raise ValueError(f"{op}: head_dim (the last dim of 'local_out') must be a multiple of 8 in [8, 512]; "
                         f"got {h[0]}")
    out, lse_out = _OPS.attention_update(torch.stack(list(lse)), torch.stack(list(local_out)))
    return out, (lse_out if update_type == 1 else None)


# ================================================================================================================
# Decode: incre_flash_attention (one query token per sequence, contiguous or paged KV cache)
# ================================================================================================================


@_args.torch_npu_api
def npu_incre_flash_attention(query: Tensor, key: Tensor, value: Tensor, *, padding_mask: Optional[Tensor] = None,
                              atten_mask: Optional[Tensor] = None, pse_shift: Optional[Tensor] = None,
                              actual_seq_lengths: Union[Sequence[int], Tensor, None] = None,
                              antiquant_scale: Optional[Tensor] = None, antiquant_offset: Optional[Tensor] = None,
                              block_table: Optional[Tensor] = None, dequant_scale1: Optional[Tensor] = None,
                              quant_scale1: Optional[Tensor] = None, dequant_scale2: Optional[Tensor] = None,
                              quant_scale2: Optional[Tensor] = None, quant_offset2: Optional[Tensor] = None,
                              kv_padding_size: Union[int, Tensor, None] = None, num_heads: int = 1,
                              scale_value: float = 1.0, input_layout: str = "BSH", num_key_value_heads: int = 0,
                              block_size: int = 0, inner_precise: int = 1) -> Tensor:
    """Decode attention with torch_npu's signature: one query token per sequence against a contiguous or paged KV
    cache. See `torch.ops.npu_fa.incre_flash_attention` and docs/inference.md for the semantics.

    A paged cache may also be given as (num_blocks, block_size, N2, D) (PagedKVCache's default layout), viewed as
    (num_blocks, block_size, N2*D). padding_mask is reserved upstream and must be None.
    int8 key/value (an int8 KV cache, fp16/bf16 query): `antiquant_scale` / `antiquant_offset` stack key's and
    value's per-channel factors, [2, N2, 1, D] (BNSD), [2, N2, D] (BSND) or [2, H] (BSH), or [2] per-tensor; the
    kernel reads the int8 cache and dequantises (x + offset) * scale in registers (docs/inference.md).
    `quant_scale2` (+ `quant_offset2`) give an int8 result, saturate(round_half_even(out·quant_scale2 +
    quant_offset2)), per-tensor or per-channel (N·D) (docs/inference.md, "Quantised attention").
    dequant_scale1 / quant_scale1 / dequant_scale2 belong to an int8 query, key and value, which upstream's
    incre_flash_attention does not support: ValueError naming them (use npu_fused_infer_attention_score).
    actual_seq_lengths may be a list of ints, a CPU int tensor or an int tensor on the inputs' device;
    kv_padding_size an int or a one-element int tensor (CPU or the inputs' device): both are read on the host.
    """
    op = "npu_incre_flash_attention"
    _args.reserved(op, padding_mask=padding_mask)
    given = [n for n, t in (("dequant_scale1", dequant_scale1), ("quant_scale1", quant_scale1),
                            ("dequant_scale2", dequant_scale2)) if t is not None]
    if given:
        raise ValueError(f"{op}: argument{'s' if len(given) > 1 else ''} {', '.join(repr(n) for n in given)} "
                         f"must be None: they belong to an int8 query, key and value, which upstream's "
                         f"incre_flash_attention does not support (npu_fused_infer_attention_score does)")
    post = _quant.post_quant_args(op, query.dtype, quant_scale2, quant_offset2)
    antiquant = _antiquant_args(op, antiquant_scale=antiquant_scale, antiquant_offset=antiquant_offset)
    lengths = _args.host_int_tensor(op, "actual_seq_lengths", actual_seq_lengths, query.device)
    if block_table is not None and input_layout != "BNSD":
        # PagedKVCache's default (num_blocks, block_size, N2, D) is the kernel's (num_blocks, block_size, N2*D).
        key, value = (t.flatten(2) if t.dim() == 4 and t.shape[1] == block_size else t for t in (key, value))
    kv_padding_size = _args.int_scalar_tensor(op, "kv_padding_size", kv_padding_size, query.device)
    if isinstance(kv_padding_size, Tensor) and kv_padding_size.device.type != "cpu":
        kv_padding_size = _args.host_int_tensor(op, "kv_padding_size", kv_padding_size, query.device)
    out = _OPS.incre_flash_attention(query, key, value, atten_mask, pse_shift, lengths, block_table,
                                     kv_padding_size, num_heads, scale_value, input_layout, num_key_value_heads,
                                     block_size, inner_precise, **antiquant)
    return out if post is None else _quant.post_quantise(op, out, input_layout, post)
