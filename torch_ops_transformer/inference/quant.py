"""Quantised attention of the inference ops (torch_npu's npu_prompt_flash_attention, npu_fused_infer_attention_score
(v1 and v2) and npu_incre_flash_attention): int8 output, full quantisation and the shared KV prefix, composed in
Python around the float ops (docs/inference.md, "Quantised attention").

* int8 output ("post-quantisation", quant_scale2 / quant_offset2, v2: quant_scale_out / quant_offset_out): the float
  op's result y (in the query's dtype) becomes  int8 = saturate(round_half_even(y * scale + offset))  to [-128, 127],
  computed in float32; scale / offset per-tensor (one element) or per-channel (N*D elements, in (N, D) order).
* full quantisation (int8 query, key and value; dequant_scale1, quant_scale1, dequant_scale2): a reference-faithful
  Python implementation of upstream's arithmetic (`full_quant_attention`); the float path is not involved.
* shared prefix (key_shared_prefix / value_shared_prefix / actual_shared_prefix_len): the prefix's first
  actual_shared_prefix_len positions are prepended to every sequence's keys and values (`with_shared_prefix`).
* v2's MLA full quantisation (int8 query / key / value, query_quant_mode 3 with dequant_scale_query per token and
  head, per-tensor dequant_scale_key / dequant_scale_value, bf16 rope parts): the float op on the dequantised
  operands in float32 (`mla_full_quant_args`, `mla_full_quant_inputs`).

Everything here is plain PyTorch on tensors whose shapes the call fixes: no Python control flow on tensor values
except the host-side length checks the float ops make as well.
"""
from typing import Optional, Tuple

import torch
from torch import Tensor

F16_MAX = 65504.0
KV_TILE = 1024        # keys per step of the full-quant online softmax: P is quantised against the running row max
Q_TILE = 128          # query rows per step (memory only: it does not change results)
_DEQUANT_DTYPES = (torch.float32, torch.int64, torch.uint64)


def _tensor(op: str, name: str, value) -> Tensor:
    if not isinstance(value, Tensor):
        raise TypeError(f"{op}: argument '{name}' must be a Tensor or None; got {type(value).__name__}")
    return value


# ================================================================================================================
# int8 output (post-quantisation)
# ================================================================================================================

def post_quant_args(op: str, query_dtype: torch.dtype, scale, offset, names: Tuple[str, str] = ("quant_scale2",
                                                                                                 "quant_offset2")
                    ) -> Optional[Tuple[Tensor, Optional[Tensor]]]:
    """Checks the output-quantisation factors as upstream documents them: the offset needs the scale; the scale is
    float32, or bfloat16 too when the query is bfloat16; the offset has the scale's dtype and shape. Returns
    (scale, offset) or None when neither is given. Shapes are checked against the result (`post_quantise`)."""
    s_name, o_name = names
    if scale is None:
        if offset is not None:
            raise ValueError(f"{op}: argument '{o_name}' needs '{s_name}' (int8 output: out = round(y * {s_name} + "
                             f"{o_name})); got '{o_name}' without '{s_name}'")
        return None
    scale = _tensor(op, s_name, scale)
    allowed = (torch.float32, torch.bfloat16) if query_dtype == torch.bfloat16 else (torch.float32,)
    if scale.dtype not in allowed:
        raise TypeError(f"{op}: argument '{s_name}' must be {' or '.join(str(d) for d in allowed)} for a "
                        f"{query_dtype} query (bfloat16 only with a bfloat16 query, as upstream); got {scale.dtype}")
    if offset is not None:
        offset = _tensor(op, o_name, offset)
        if offset.dtype != scale.dtype:
            raise TypeError(f"{op}: argument '{o_name}' must have the dtype of '{s_name}' ({scale.dtype}); got "
                            f"{offset.dtype}")
        if offset.shape != scale.shape:
            raise ValueError(f"{op}: argument '{o_name}' must have the shape of '{s_name}' ({list(scale.shape)}); "
                             f"got {list(offset.shape)}")
    return scale, offset


# Output layout -> (axis of the heads N, axis of the head dim D) in the result; BSH has one axis H = N*D.
_OUT_AXES = {"BSH": None, "BSND": (2, 3), "TND": (1, 2), "BNSD": (1, 3), "NBSD": (0, 3), "NTD": (0, 2),
             "NSD": (0, 2)}


def post_quantise(op: str, out: Tensor, out_layout: str, factors: Tuple[Tensor, Optional[Tensor]],
                  names: Tuple[str, str] = ("quant_scale2", "quant_offset2")) -> Tensor:
    """int8 = saturate(round_half_even(out * scale + offset)) to [-128, 127], in float32 on `out` (the attention
    result in its dtype). scale / offset: one element (per-tensor) or N*D elements (per-channel, read in (N, D)
    order: (H,), (1, 1, H), (N, D), (1, N, 1, D), (1, 1, N, D), ...)."""
    scale, offset = factors
    axes = _OUT_AXES[out_layout]
    if axes is None:
        channels, view = out.shape[-1], (out.shape[-1],)
        form = f"H = {out.shape[-1]}"
    else:
        n, d = out.shape[axes[0]], out.shape[axes[1]]
        channels = n * d
        view = [1] * (out.dim() - axes[0])
        view[0], view[-1] = n, d
        form = f"N*D = {n}*{d}"
    if scale.numel() == 1:
        s = scale.reshape(()).float()
        o = offset.reshape(()).float() if offset is not None else None
    elif scale.numel() == channels:
        s = scale.reshape(view).float()
        o = offset.reshape(view).float() if offset is not None else None
    else:
        raise ValueError(f"{op}: argument '{names[0]}' must have one element (per-tensor) or {form} elements "
                         f"(per-channel, e.g. shape {list(view) if axes is None else [view[0], view[-1]]}); got "
                         f"shape {list(scale.shape)}")
    y = out.float() * s
    if o is not None:
        y = y + o
    return torch.round(y).clamp_(-128, 127).to(torch.int8)


# ================================================================================================================
# Full quantisation: int8 query, key and value
# ================================================================================================================

def _per_tensor(op: str, name: str, t) -> Tensor:
    t = _tensor(op, name, t)
    if t.numel() != 1:
        raise ValueError(f"{op}: argument '{name}' must be per-tensor (one element); got shape {list(t.shape)}")
    return t.reshape(1)


def dequant_scale(op: str, name: str, t, fp19: bool) -> Tensor:
    """A dequantisation factor as float32 [1]: float32 as given, or int64 / uint64 in torch_npu's packed form
    (npu_trans_quant_param: the float32 bits in the low 32 bits). With `fp19` the factor is truncated to FP19 (sign,
    8-bit exponent, 10-bit mantissa: bits & 0xFFFFE000), the precision the dequantisation after Q·Kᵀ uses."""
    t = _per_tensor(op, name, t)
    if t.dtype not in _DEQUANT_DTYPES:
        raise TypeError(f"{op}: argument '{name}' must be float32 or the int64/uint64 packed form of "
                        f"torch_npu.npu_trans_quant_param; got {t.dtype}")
    if t.dtype != torch.float32:
        bits = t.contiguous().view(torch.int32)[:1]   # the low 32 bits (little-endian)
    else:
        bits = t.contiguous().view(torch.int32)
    if fp19:
        bits = bits & -8192                              # 0xFFFFE000 as int32
    return bits.view(torch.float32)


def full_quant_args(op: str, query, key, value, dequant_scale1, quant_scale1, dequant_scale2,
                    names: Tuple[str, str, str] = ("dequant_scale1", "quant_scale1", "dequant_scale2")
                    ) -> Optional[dict]:
    """The full-quantisation arguments: required, all three, with an int8 query (and then int8 key and value); not
    allowed with a float query (upstream's rule). Returns the factors as float32 [1] tensors, or None."""
    given = {n: v for n, v in zip(names, (dequant_scale1, quant_scale1, dequant_scale2)) if v is not None}
    int8_query = isinstance(query, Tensor) and query.dtype == torch.int8
    if not int8_query:
        if given:
            raise ValueError(f"{op}: argument{'s' if len(given) > 1 else ''} {', '.join(repr(n) for n in given)} "
                             f"need an int8 query, key and value (full quantisation); with a "
                             f"{getattr(query, 'dtype', type(query).__name__)} query they must be None")
        return None
    for name, t in (("key", key), ("value", value)):
        if not isinstance(t, Tensor) or t.dtype != torch.int8:
            raise TypeError(f"{op}: an int8 query (full quantisation) needs an int8 '{name}'; got "
                            f"{getattr(t, 'dtype', type(t).__name__)}")
    missing = [n for n in names if n not in given]
    if missing:
        raise ValueError(f"{op}: an int8 query (full quantisation) needs argument{'s' if len(missing) > 1 else ''} "
                         f"{', '.join(repr(n) for n in missing)}; got None")
    qs1 = _per_tensor(op, names[1], quant_scale1)
    if qs1.dtype != torch.float32:
        raise TypeError(f"{op}: argument '{names[1]}' must be float32; got {qs1.dtype}")
    return {"dequant_scale1": dequant_scale(op, names[0], dequant_scale1, fp19=True),
            "quant_scale1": qs1,
            "dequant_scale2": dequant_scale(op, names[2], dequant_scale2, fp19=False)}


def _to_bnsd(t: Tensor, layout: str, heads: int) -> Tensor:
    if layout == "BSH":
        return t.unflatten(-1, (heads, -1)).transpose(1, 2)
    if layout == "BSND":
        return t.transpose(1, 2)
    return t                                             # BNSD, BNSD_BSND


def _from_bnsd(t: Tensor, layout: str) -> Tensor:
    if layout == "BSH":
        return t.transpose(1, 2).flatten(2).contiguous()
    if layout in ("BSND", "BNSD_BSND"):
        return t.transpose(1, 2).contiguous()
    return t


def _lens(t: Optional[Tensor], batch: int, full: int, op: str, name: str) -> Tensor:
    """Per-batch lengths [B] (int64, CPU) from the wrapper's host tensor (None: the padded size)."""
    if t is None:
        return torch.full((batch,), full, dtype=torch.int64)
    t = t.reshape(-1).to(device="cpu", dtype=torch.int64)
    t = t.expand(batch) if t.numel() == 1 else t[:batch]
    if t.numel() != batch:
        raise ValueError(f"{op}: argument '{name}' must have 1 or at least B = {batch} entries; got {t.numel()}")
    if not torch.compiler.is_compiling() and bool(((t < 0) | (t > full)).any()):
        raise ValueError(f"{op}: argument '{name}' must hold lengths in [0, {full}]; got {t.tolist()}")
    return t


def _mask_bnsd(op: str, mask: Optional[Tensor], batch: int, sq: int, skv: int) -> Optional[Tensor]:
    """The atten_mask as bool [B or 1, 1, Sq, Skv] (True = hidden): (Sq, Skv), (B, Skv) for a one-token query,
    (B or 1, Sq, Skv), (B or 1, 1, Sq, Skv); a larger mask is cut to the leading (Sq, Skv)."""
    if mask is None:
        return None
    m = mask
    if m.dim() == 2:
        m = m.reshape(m.shape[0], 1, 1, m.shape[1]) if sq == 1 and m.shape[0] in (batch, 1) else m[None, None]
    elif m.dim() == 3:
        m = m.unsqueeze(1)
    if m.dim() != 4 or m.shape[-2] < sq or m.shape[-1] < skv or m.shape[0] not in (1, batch):
        raise ValueError(f"{op}: argument 'atten_mask' must be (Sq, Skv), (B, Skv) for one query token, "
                         f"(B or 1, Sq, Skv) or (B or 1, 1, Sq, Skv) with Sq = {sq}, Skv = {skv}; got shape "
                         f"{list(mask.shape)}")
    return m[..., :sq, :skv] != 0


def full_quant_attention(op: str, query: Tensor, key: Tensor, value: Tensor, factors: dict, *, layout: str,
                         num_heads: int, num_key_value_heads: int, scale: float, pse_shift: Optional[Tensor],
                         atten_mask: Optional[Tensor], actual_seq_lengths: Optional[Tensor],
                         actual_seq_lengths_kv: Optional[Tensor], sparse_mode: int, pre_tokens: int,
                         next_tokens: int, softmax_lse_flag: bool) -> Tuple[Tensor, Tensor]:
    """Attention of int8 query / key / value as upstream computes it (its documented factors and its reference
    arithmetic), per batch, head and row:

        S   = Q_int8 · K_int8ᵀ                                  exact int32 accumulation
        s   = fp16(saturate_fp16(S · dequant_scale1)) · fp16(scale) (+ pse_shift)      fp16
        over key tiles of KV_TILE keys, with the running row max m (fp32):
            P   = exp(s − m)                                     fp32, rounded to fp16
            P8  = saturate(round_half_even(fp16(P · fp16(quant_scale1))))   int8
            O   = O · exp(m_old − m) + (P8 · V_int8) · dequant_scale2        int32 products, fp32 accumulation
            l   = l · exp(m_old − m) + Σ exp(s − m)              fp32, unquantised P
        out = fp16(O / l)

    dequant_scale1 is used at FP19 precision (`dequant_scale`). Masks, sparse modes 0-4, pre/next_tokens and the
    per-batch lengths select the visible keys as in the float ops; a row that sees no key gives 0 (lse −inf).
    Returns (out in `layout`'s output layout, float16; lse [B, N, Sq, 1] fp32 or an empty tensor).
    Speed: float64 matmuls over (Q_TILE × KV_TILE) tiles in Python — a semantic path, several times slower than the
    float kernels."""
    if layout not in ("BSH", "BSND", "BNSD", "BNSD_BSND"):
        raise ValueError(f"{op}: full quantisation (an int8 query) supports input_layout BSH, BSND, BNSD and "
                         f"BNSD_BSND (as upstream); got {layout!r}")
    if query.dim() != (3 if layout == "BSH" else 4) or key.dim() != query.dim() or value.dim() != query.dim():
        raise ValueError(f"{op}: query, key and value must be {3 if layout == 'BSH' else 4}-D for input_layout "
                         f"{layout}; got shapes {list(query.shape)}, {list(key.shape)}, {list(value.shape)}")
    n1 = num_heads
    n2 = num_key_value_heads or num_heads
    if n1 <= 0 or n1 % n2:
        raise ValueError(f"{op}: 'num_heads' ({n1}) must be a positive multiple of 'num_key_value_heads' ({n2})")
    q, k, v = _to_bnsd(query, layout, n1), _to_bnsd(key, layout, n2), _to_bnsd(value, layout, n2)
    if q.shape[1] != n1 or k.shape[1] != n2 or v.shape[1] != n2 or q.shape[-1] != k.shape[-1] \
            or k.shape[:3] != v.shape[:3] or k.shape[0] != q.shape[0]:
        raise ValueError(f"{op}: query / key / value shapes {list(query.shape)}, {list(key.shape)}, "
                         f"{list(value.shape)} do not match input_layout {layout} with num_heads={n1}, "
                         f"num_key_value_heads={n2}")
    b, _, sq, d = q.shape
    skv, dv, g = k.shape[2], v.shape[-1], n1 // n2
    dev = q.device
    q_len = _lens(actual_seq_lengths, b, sq, op, "actual_seq_lengths").to(dev).view(b, 1, 1, 1, 1)
    kv_len = _lens(actual_seq_lengths_kv, b, skv, op, "actual_seq_lengths_kv").to(dev).view(b, 1, 1, 1, 1)
    mask = _mask_bnsd(op, atten_mask if sparse_mode in (0, 1) else None, b, sq, skv)
    mask = mask.unsqueeze(1) if mask is not None else None               # [B|1, 1, 1, Sq, Skv]
    pse = None
    if pse_shift is not None:
        if pse_shift.dim() != 4 or pse_shift.shape[0] not in (1, b) or pse_shift.shape[1] != n1 \
                or pse_shift.shape[2] < sq or pse_shift.shape[3] < skv:
            raise ValueError(f"{op}: argument 'pse_shift' must be (B or 1, N, Sq, Skv) = ({b} or 1, {n1}, {sq}, "
                             f"{skv}) or larger in the last two; got shape {list(pse_shift.shape)}")
        pse = pse_shift[:, :, :sq, :skv].to(torch.float16).unflatten(1, (n2, g))   # [B|1, N2, G, Sq, Skv]
    deq1, deq2 = factors["dequant_scale1"].to(dev), factors["dequant_scale2"].to(dev)
    qs1 = factors["quant_scale1"].to(dev).to(torch.float16).float()
    scale16 = torch.tensor(scale, dtype=torch.float16, device=dev)
    q5 = q.unflatten(1, (n2, g)).to(torch.float64)                      # [B, N2, G, Sq, D]
    k5 = k.unsqueeze(2).to(torch.float64)                               # [B, N2, 1, Skv, D]
    v5 = v.unsqueeze(2).to(torch.float64)
    out = torch.zeros(b, n2, g, sq, dv, dtype=torch.float16, device=dev)
    lse = torch.full((b, n2, g, sq, 1), float("-inf"), dtype=torch.float32, device=dev)
    neg_inf = torch.tensor(float("-inf"), device=dev)
    for r0 in range(0, sq, Q_TILE):
        r1 = min(sq, r0 + Q_TILE)
        i = torch.arange(r0, r1, device=dev).view(1, 1, 1, -1, 1)
        m = torch.full((b, n2, g, r1 - r0, 1), float("-inf"), device=dev)
        l_sum = torch.zeros_like(m)
        o = torch.zeros(b, n2, g, r1 - r0, dv, device=dev)
        for c0 in range(0, skv, KV_TILE):
            c1 = min(skv, c0 + KV_TILE)
            j = torch.arange(c0, c1, device=dev).view(1, 1, 1, 1, -1)
            vis = (i < q_len) & (j < kv_len)
            shift = kv_len - q_len
            if sparse_mode == 0 and mask is not None:
                vis = vis & (j >= i - pre_tokens) & (j <= i + next_tokens)
            elif sparse_mode == 2:
                vis = vis & (j <= i)
            elif sparse_mode == 3:
                vis = vis & (j <= i + shift)
            elif sparse_mode == 4:
                vis = vis & (j >= i + shift - pre_tokens) & (j <= i + shift + next_tokens)
            if mask is not None:
                vis = vis & ~mask[..., r0:r1, c0:c1]
            s_int = torch.matmul(q5[..., r0:r1, :], k5[..., c0:c1, :].transpose(-1, -2))   # exact integers
            s16 = (s_int.float() * deq1).clamp_(-F16_MAX, F16_MAX).to(torch.float16) * scale16
            if pse is not None:
                s16 = s16 + pse[..., r0:r1, c0:c1]
            s = torch.where(vis, s16.float(), neg_inf)
            m_new = torch.maximum(m, s.amax(-1, keepdim=True))
            m_safe = torch.where(torch.isfinite(m_new), m_new, torch.zeros_like(m_new))
            p = torch.exp(s - m_safe)                                    # 0 where hidden
            alpha = torch.exp(m - m_safe)                                # 0 while m is -inf
            l_sum = l_sum * alpha + p.sum(-1, keepdim=True)
            p8 = torch.round((p.to(torch.float16).float() * qs1).to(torch.float16).float()).clamp_(-128, 127)
            o = o * alpha + torch.matmul(p8.to(torch.float64), v5[..., c0:c1, :]).float() * deq2
            m = m_new
        seen = l_sum > 0
        out[..., r0:r1, :] = torch.where(seen, o / torch.where(seen, l_sum, torch.ones_like(l_sum)),
                                         torch.zeros_like(o)).to(torch.float16)
        lse[..., r0:r1, :] = torch.where(seen, m + torch.log(torch.where(seen, l_sum, torch.ones_like(l_sum))),
                                         neg_inf)
    out = _from_bnsd(out.flatten(1, 2), layout)
    lse = lse.flatten(1, 2) if softmax_lse_flag else torch.empty(0, dtype=torch.float32, device=dev)
    return out, lse


# ================================================================================================================
# Shared prefix
# ================================================================================================================

_PREFIX_S_AXIS = {"BSH": 1, "BSND": 1, "BNSD": 2}


def _prefix_len(op: str, value, full: int) -> int:
    if value is None:
        return full
    if isinstance(value, Tensor):
        if value.numel() != 1 or value.is_floating_point():
            raise ValueError(f"{op}: argument 'actual_shared_prefix_len' must hold one integer; got "
                             f"{value.dtype} of shape {list(value.shape)}")
        value = int(value.reshape(()).item())
    elif isinstance(value, (list, tuple)):
        if len(value) != 1 or isinstance(value[0], bool) or not isinstance(value[0], int):
            raise ValueError(f"{op}: argument 'actual_shared_prefix_len' must be a list of one int (shape [1], as "
                             f"upstream); got {value!r}")
        value = value[0]
    elif isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{op}: argument 'actual_shared_prefix_len' must be a list of one int; got {value!r}")
    if not 0 <= value <= full:
        raise ValueError(f"{op}: argument 'actual_shared_prefix_len' must be in [0, {full}] (the prefix's S); "
                         f"got {value}")
    return value


def with_shared_prefix(op: str, key: Tensor, value: Tensor, key_prefix, value_prefix, prefix_len, *,
                       input_layout: str, query: Tensor, block_table, atten_mask: Optional[Tensor],
                       pse_shift: Optional[Tensor], actual_seq_lengths_kv: Optional[Tensor], sparse_mode: int,
                       antiquant: dict):
    """Prepends the shared prefix to every sequence's keys and values: sequence b attends to
    prefix[:P] followed by key_b[:kv_len_b] (P = actual_shared_prefix_len, default the prefix's S). The masks of
    sparse_mode 0/1 and pse_shift index that concatenation (their last dim must be at least P + the key's S, as
    upstream; a longer one is cut), the causal / band modes align to its end (P + kv_len_b), and
    actual_seq_lengths_kv keeps counting the key's own tokens. Returns (key, value, atten_mask, pse_shift,
    actual_seq_lengths_kv) for the float op. Composed by concatenation: one copy of the keys and values per call."""
    if (key_prefix is None) != (value_prefix is None):
        raise ValueError(f"{op}: arguments 'key_shared_prefix' and 'value_shared_prefix' must be given together; got "
                         f"only '{'key_shared_prefix' if key_prefix is not None else 'value_shared_prefix'}'")
    if key_prefix is None:
        if prefix_len is not None:
            raise ValueError(f"{op}: argument 'actual_shared_prefix_len' needs 'key_shared_prefix' and "
                             f"'value_shared_prefix'; got it without them")
        return None
    kp, vp = _tensor(op, "key_shared_prefix", key_prefix), _tensor(op, "value_shared_prefix", value_prefix)
    base = input_layout.split("_")[0]
    if base not in _PREFIX_S_AXIS:
        raise ValueError(f"{op}: a shared prefix needs input_layout BSH, BSND or BNSD (or their _BSND / _NBSD "
                         f"output forms), as upstream; got {input_layout!r}")
    if block_table is not None:
        raise ValueError(f"{op}: a shared prefix cannot be combined with 'block_table' (page attention), as upstream")
    if isinstance(query, Tensor) and query.dtype == torch.int8:
        raise ValueError(f"{op}: a shared prefix cannot be combined with an int8 query (full quantisation), as "
                         f"upstream")
    modes = {n: v for n, v in antiquant.items() if n.endswith("_mode") and v != 0}
    if modes:
        raise NotImplementedError(f"{op}: a shared prefix with per-token KV antiquant factors is not implemented; "
                                  + ", ".join(f"'{n}'={v}" for n, v in modes.items()) + " must be 0")
    axis = _PREFIX_S_AXIS[base]
    for name, p, kv in (("key_shared_prefix", kp, key), ("value_shared_prefix", vp, value)):
        if p.dtype != kv.dtype:
            raise TypeError(f"{op}: argument '{name}' must have the dtype of '{name.split('_')[0]}' ({kv.dtype}); "
                            f"got {p.dtype}")
        same = p.dim() == kv.dim() and p.shape[0] == 1 and all(
            p.shape[i] == kv.shape[i] for i in range(1, kv.dim()) if i != axis)
        if not same:
            shape = list(kv.shape)
            shape[0], shape[axis] = 1, "prefix_S"
            raise ValueError(f"{op}: argument '{name}' must have shape {shape} (batch 1, the "
                             f"{name.split('_')[0]}'s other dims, input_layout {base}); got {list(p.shape)}")
    if kp.shape[axis] != vp.shape[axis]:
        raise ValueError(f"{op}: 'key_shared_prefix' and 'value_shared_prefix' must have the same S; got "
                         f"{kp.shape[axis]} and {vp.shape[axis]}")
    plen = _prefix_len(op, prefix_len, kp.shape[axis])
    skv = key.shape[axis]
    total = plen + skv

    def cat(prefix: Tensor, t: Tensor) -> Tensor:
        shape = list(t.shape)
        shape[axis] = plen
        return torch.cat([prefix.narrow(axis, 0, plen).expand(shape), t], dim=axis)

    key_cat = cat(kp, key)
    value_cat = key_cat if value is key and vp is kp else cat(vp, value)
    if atten_mask is not None and sparse_mode in (0, 1):
        if atten_mask.shape[-1] < total:
            raise ValueError(f"{op}: with a shared prefix the last dim of 'atten_mask' must be at least "
                             f"actual_shared_prefix_len + the key's S = {plen} + {skv} = {total}; got shape "
                             f"{list(atten_mask.shape)}")
        atten_mask = atten_mask[..., :total]
    if pse_shift is not None:
        if pse_shift.shape[-1] < total:
            raise ValueError(f"{op}: with a shared prefix the last dim of 'pse_shift' must be at least "
                             f"actual_shared_prefix_len + the key's S = {plen} + {skv} = {total}; got shape "
                             f"{list(pse_shift.shape)}")
        pse_shift = pse_shift[..., :total]
    if actual_seq_lengths_kv is None:
        kv_lens = torch.tensor([total], dtype=torch.int64)
    else:
        if actual_seq_lengths_kv.device.type == "cpu" and bool((actual_seq_lengths_kv > skv).any()):
            raise ValueError(f"{op}: argument 'actual_seq_lengths_kv' counts the key's own tokens (without the "
                             f"shared prefix) and must be at most the key's S = {skv}; got "
                             f"{actual_seq_lengths_kv.tolist()}")
        kv_lens = actual_seq_lengths_kv + plen
    return key_cat, value_cat, atten_mask, pse_shift, kv_lens



# ================================================================================================================
# v2's full quantisation of MLA: int8 query, key and value with per-token-per-head query factors
# ================================================================================================================

MLA_QUANT_HEAD_DIM = 512   # upstream defines the int8 query of v2 for absorbed MLA only (head dim = kv_lora_rank)


def _v2_query_quant_mode(op: str, query, query_rope, mode, dequant_scale_query, given: list) -> bool:
    """Whether the call is v2's full quantisation (an int8 query). Rules, as torch_npu documents v2: query_quant_mode
    is 0 or 3 (per-token-per-head, the only mode upstream takes), and 3 goes with an int8 query, dequant_scale_query
    with both. The int8 query outside MLA (the Ascend 950 form with quant_scale_p and other KV modes) is not
    implemented; per-tensor full quantisation is v1's (dequant_scale1 / quant_scale1 / dequant_scale2)."""
    if isinstance(mode, bool) or not isinstance(mode, int) or mode not in (0, 3):
        raise ValueError(f"{op}: argument 'query_quant_mode' must be 0 (no query quantisation) or 3 (per-token "
                         f"per-head, the only mode upstream takes); got {mode!r}")
    int8_query = isinstance(query, Tensor) and query.dtype == torch.int8
    if not int8_query:
        for name, given in (("query_quant_mode", mode == 3), ("dequant_scale_query", dequant_scale_query is not None)):
            if given:
                raise ValueError(f"{op}: argument '{name}' needs an int8 query (full quantisation); with a "
                                 f"{getattr(query, 'dtype', type(query).__name__)} query it must be "
                                 f"{'0' if name == 'query_quant_mode' else 'None'}")
        return False
    if query_rope is None:
        named = f" (arguments {', '.join(repr(n) for n in given)})" if given else ""
        raise NotImplementedError(f"{op}: an int8 'query' without query_rope / key_rope{named}, full quantisation "
                                  f"outside MLA (upstream's Ascend 950 form), is not implemented; per-tensor full "
                                  f"quantisation is npu_fused_infer_attention_score's dequant_scale1 / quant_scale1 "
                                  f"/ dequant_scale2")
    if mode != 3:
        raise ValueError(f"{op}: an int8 query (MLA full quantisation) needs 'query_quant_mode'=3 (per-token "
                         f"per-head); got {mode}")
    return True


def _query_scale_shape(query: Tensor, input_layout: str, num_heads: int) -> list:
    """dequant_scale_query's shape: the query's without D, i.e. (B, S, N) for BSH (its H = N*D)."""
    if input_layout.split("_")[0] == "BSH":
        return [query.shape[0], query.shape[1], num_heads]
    return list(query.shape[:-1])


def mla_full_quant_args(op: str, query, key, value, query_rope, key_rope, *, input_layout: str, num_heads: int,
                        query_quant_mode, dequant_scale_query, dequant_scale_key, dequant_scale_value,
                        dequant_offset_key, dequant_offset_value, key_quant_mode: int, value_quant_mode: int,
                        quant_scale_out, quant_offset_out, pse_shift, learnable_sink, sparse_mode: int
                        ) -> Optional[dict]:
    """Checks v2's MLA full quantisation as torch_npu documents it (its "MLA场景约束", query D = 512): int8 query,
    key and value; bfloat16 query_rope / key_rope; float32 dequant_scale_query per token and head (the query's shape
    without D), float32 per-tensor dequant_scale_key and dequant_scale_value (key/value_quant_mode 0), no offsets,
    no int8 output, no pse_shift, sparse_mode 0 or 3 (9: the tree mask, not implemented). Returns the factors
    (float32: query [the shape above], key [1], value [1]) or None for a call that is not one."""
    given = [n for n, t in (("dequant_scale_query", dequant_scale_query), ("dequant_scale_key", dequant_scale_key),
                            ("dequant_scale_value", dequant_scale_value)) if t is not None]
    if not _v2_query_quant_mode(op, query, query_rope, query_quant_mode, dequant_scale_query, given):
        return None
    for name, t in (("key", key), ("value", value)):
        if not isinstance(t, Tensor) or t.dtype != torch.int8:
            raise TypeError(f"{op}: an int8 query (MLA full quantisation) needs an int8 '{name}'; got "
                            f"{getattr(t, 'dtype', type(t).__name__)}")
    for name, t in (("query_rope", query_rope), ("key_rope", key_rope)):
        if not isinstance(t, Tensor) or t.dtype != torch.bfloat16:
            raise TypeError(f"{op}: MLA full quantisation takes a bfloat16 '{name}' (as upstream); got "
                            f"{getattr(t, 'dtype', type(t).__name__)}")
    d = query.shape[-1] // (num_heads if input_layout.split("_")[0] == "BSH" else 1)
    if d != MLA_QUANT_HEAD_DIM:
        raise ValueError(f"{op}: MLA full quantisation needs the query's head dim D = {MLA_QUANT_HEAD_DIM} "
                         f"(kv_lora_rank, as upstream); got D = {d} for 'query' of shape {list(query.shape)}")
    for name, t in (("dequant_offset_key", dequant_offset_key), ("dequant_offset_value", dequant_offset_value),
                    ("quant_scale_out", quant_scale_out), ("quant_offset_out", quant_offset_out),
                    ("pse_shift", pse_shift), ("learnable_sink", learnable_sink)):
        if t is not None:
            raise ValueError(f"{op}: MLA full quantisation (an int8 query) cannot be combined with '{name}' (as "
                             f"upstream); it must be None")
    for name, mode in (("key_quant_mode", key_quant_mode), ("value_quant_mode", value_quant_mode)):
        if mode != 0:
            raise ValueError(f"{op}: MLA full quantisation takes per-tensor key / value factors: '{name}' must be 0 "
                             f"(as upstream); got {mode}")
    if sparse_mode not in (0, 3, 9):
        raise ValueError(f"{op}: MLA full quantisation supports sparse_mode 0 and 3 (and 9, the tree mask), as "
                         f"upstream; got 'sparse_mode'={sparse_mode}")
    if dequant_scale_query is None:
        raise ValueError(f"{op}: an int8 query (MLA full quantisation) needs 'dequant_scale_query'; got None")
    dsq = _tensor(op, "dequant_scale_query", dequant_scale_query)
    if dsq.dtype != torch.float32:
        raise TypeError(f"{op}: argument 'dequant_scale_query' must be float32; got {dsq.dtype}")
    want = _query_scale_shape(query, input_layout, num_heads)
    if list(dsq.shape) != want:
        raise ValueError(f"{op}: argument 'dequant_scale_query' must have the query's shape without D (per token "
                         f"and head): {want} for input_layout {input_layout}; got {list(dsq.shape)}")
    factors = {"query": dsq}
    for role, name, t in (("key", "dequant_scale_key", dequant_scale_key),
                          ("value", "dequant_scale_value", dequant_scale_value)):
        if t is None:
            raise ValueError(f"{op}: an int8 query (MLA full quantisation) needs '{name}' (per-tensor); got None")
        t = _per_tensor(op, name, t)
        if t.dtype != torch.float32:
            raise TypeError(f"{op}: argument '{name}' must be float32 (MLA full quantisation); got {t.dtype}")
        factors[role] = t
    return factors


def _dequantised_cache(t: Tensor) -> Tensor:
    """An int8 (or bf16 rope) cache as float32 holding the same values (exact); a 5-D NZ cache becomes its ND
    [num_blocks, block_size, N, D] form, because NZ pieces are 32 bytes and so hold fewer float32 values."""
    if t.dim() == 5:
        blocks, n, pieces, bs, c0 = t.shape
        t = t.permute(0, 3, 1, 2, 4).reshape(blocks, bs, n, pieces * c0)
    return t.to(torch.float32)


def _times_query_factor(t: Tensor, factor: Tensor, input_layout: str, num_heads: int) -> Tensor:
    """t (query or query_rope in its layout) times the per-token-per-head factor (the query's shape without D)."""
    if input_layout.split("_")[0] == "BSH":
        return (t.unflatten(-1, (num_heads, -1)).to(torch.float32) * factor.unsqueeze(-1)).flatten(-2)
    return t.to(torch.float32) * factor.unsqueeze(-1)


def mla_full_quant_inputs(factors: dict, query: Tensor, key: Tensor, value: Tensor, query_rope: Tensor,
                          key_rope: Tensor, *, input_layout: str, num_heads: int):
    """The float32 operands of the float attention that equals upstream's formula

        scores = (Q_int8 · K_int8ᵀ + query_rope · key_ropeᵀ) · dequant_scale_query[token, head] · dequant_scale_key
                 · softmax_scale
        out    = softmax(scores) · V_int8 · dequant_scale_value               (bfloat16)

    (the rope term is dequantised with the query's and key's factors too: npu_mla_prolog_v2 divides query_rope by
    them). The factor c = dequant_scale_query · dequant_scale_key multiplies the query side (query and query_rope),
    so key, value and key_rope are their integer / bf16 values in float32 (exact); dequant_scale_value multiplies
    the result (`mla_full_quant_output`). Returns (query, key, value, query_rope, key_rope)."""
    c = factors["query"].to(query.device) * factors["key"].to(query.device)
    q = _times_query_factor(query, c, input_layout, num_heads)
    q_rope = _times_query_factor(query_rope, c, input_layout, num_heads)
    k = _dequantised_cache(key)
    v = k if value is key else _dequantised_cache(value)   # the latent cache passed twice stays one tensor
    return q, k, v, q_rope, _dequantised_cache(key_rope)


def mla_full_quant_output(factors: dict, out: Tensor) -> Tensor:
    """The float32 attention of the dequantised operands times dequant_scale_value, as bfloat16 (upstream's output
    dtype for MLA full quantisation)."""
    return (out * factors["value"].to(out.device)).to(torch.bfloat16)
