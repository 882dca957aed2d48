"""Layout arithmetic shared by the fake kernels and the Python wrappers (no data access, trace-safe)."""
from dataclasses import dataclass
from typing import Tuple

LAYOUTS = ("BSH", "SBH", "BSND", "BNSD", "TND")
_RANK = {"BSH": 3, "SBH": 3, "BSND": 4, "BNSD": 4, "TND": 3}


@dataclass
class AttentionDims:
    batch: int          # B (1 for TND: the sequence count lives in actual_seq_qlen)
    q_len: int          # Sq (T for TND)
    kv_len: int
    q_heads: int        # N1
    kv_heads: int       # N2
    head_dim: int       # D
    v_head_dim: int     # vD
    out_shape: Tuple[int, ...]
    stats_shape: Tuple[int, ...]


def _bsnd(t, layout):
    """(B, S, N-or-H, D-or-None) of a tensor in a layout; for H layouts the last two are (H, None)."""
    s = tuple(t.shape)
    if layout == "BSND":
        return s[0], s[1], s[2], s[3]
    if layout == "BNSD":
        return s[0], s[2], s[1], s[3]
    if layout == "TND":
        return 1, s[0], s[1], s[2]
    if layout == "BSH":
        return s[0], s[1], s[2], None
    return s[1], s[0], s[2], None  # SBH


def attention_dims(op, query, key, value, head_num, input_layout) -> AttentionDims:
    if input_layout not in LAYOUTS:
        raise ValueError(f"{op}: argument 'input_layout' must be one of {', '.join(LAYOUTS)}; got '{input_layout}'")
    rank = _RANK[input_layout]
    for name, t in (("query", query), ("key", key), ("value", value)):
        if t.dim() != rank:
            raise ValueError(f"{op}: argument '{name}' must be a {rank}-D tensor for input_layout {input_layout}; "
                             f"got shape {list(t.shape)}")
    if head_num <= 0:
        raise ValueError(f"{op}: argument 'head_num' must be positive; got {head_num}")
    qb, qs, qn, qd = _bsnd(query, input_layout)
    kb, ks, kn, kd = _bsnd(key, input_layout)
    vb, vs, vn, vd = _bsnd(value, input_layout)
    if qd is None:  # BSH / SBH: split hidden sizes by head_num and the head dim
        if qn % head_num:
            raise ValueError(f"{op}: argument 'query' hidden size {qn} must be divisible by head_num={head_num} "
                             f"for input_layout {input_layout}")
        qd = qn // head_num
        qn = head_num
        if qd == 0 or kn % qd:
            raise ValueError(f"{op}: argument 'key' hidden size {kn} must be a multiple of the head dim {qd} "
                             f"for input_layout {input_layout}")
        kd, kn = qd, kn // qd
        if kn == 0 or vn % kn:
            raise ValueError(f"{op}: argument 'value' must be 3-D with a hidden size divisible by the {kn} "
                             f"key/value heads; got shape {list(value.shape)}")
        vd, vn = vn // kn, kn
    elif qn != head_num:
        raise ValueError(f"{op}: argument 'head_num'={head_num} does not match the {qn} heads of 'query' "
                         f"({input_layout} shape {list(query.shape)})")
    if kd != qd:
        raise ValueError(f"{op}: arguments 'query' and 'key' must have the same head dim; got {qd} and {kd}")
    if kn <= 0 or head_num % kn:
        raise ValueError(f"{op}: key/value heads N2={kn} must divide the query heads N1={head_num} (GQA/MQA)")
    out_shape = list(query.shape)
    out_shape[-1] = head_num * vd if input_layout in ("BSH", "SBH") else vd
    stats_shape = (qs, head_num, 8) if input_layout == "TND" else (qb, head_num, qs, 8)
    return AttentionDims(qb, qs, ks, head_num, kn, qd, vd, tuple(out_shape), stats_shape)
