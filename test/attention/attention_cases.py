"""Building flash_attention_score inputs from a compact case description, running our op and the reference, and
comparing them under the tolerance rule."""
import dataclasses
import math
from dataclasses import dataclass
from typing import Dict, Optional, Tuple

import torch
from torch import Tensor

from test.common.reference import DTYPES, GRAD_NAMES, MAX_TOKENS, check_tolerance, dropout_numel, reference_with_grads

OPS = torch.ops.npu_fa


@dataclass(frozen=True)
class Case:
    layout: str = "BSND"
    batch: int = 2
    q_heads: int = 4
    kv_heads: int = 2
    q_len: int = 13
    kv_len: int = 17
    head_dim: int = 16
    v_head_dim: Optional[int] = None        # None = head_dim
    dtype: str = "fp32"
    sparse_mode: int = 0
    pre_tokens: int = MAX_TOKENS
    next_tokens: int = MAX_TOKENS
    mask: Optional[str] = None              # "BNSS", "B1SS", "11SS", "SS" (shapes of the spec) or "compressed"
    mask_dtype: str = "bool"                # or "uint8"
    pse: Optional[str] = None               # "BNSS", "BN1S", "1NSS"
    pse_type: int = 1
    seqlens: Optional[Tuple[Tuple[int, ...], Tuple[int, ...]]] = None  # TND: per-sequence (q lengths, kv lengths)
    keep_prob: float = 1.0
    dropout_offset: int = 0
    scale_mult: float = 1.0                 # scale = scale_mult / sqrt(D); large values make the softmax peaky
    strided: bool = False                   # q/k/v as non-contiguous views (padded rows, permuted, strided D)
    seed: int = 0
    sink: Optional[str] = None              # "random" (float32 [N1] around the scores' scale), "-inf", "large"
    softmax_layout: str = ""                # "" or "TND" (TND statistics order)
    softcap: float = 0.0                    # FlashAttention-2's logit soft-capping (0 = off)
    alibi: Optional[str] = None             # "N" or "BN": fp32 ALiBi slopes as pse (with pse_type 2 or 3)
    start_idx: Optional[Tuple[Tuple[int, ...], Tuple[int, ...]]] = None  # (q_start_idx, kv_start_idx)
    alibi_bottom_right: bool = False

    def replace(self, **kw) -> "Case":
        return dataclasses.replace(self, **kw)

    @property
    def vd(self) -> int:
        return self.v_head_dim or self.head_dim

    @property
    def scale(self) -> float:
        return self.scale_mult / math.sqrt(self.head_dim)

    def __str__(self) -> str:
        default = Case()
        parts = [f"{f.name}={getattr(self, f.name)}" for f in dataclasses.fields(self)
                 if getattr(self, f.name) != getattr(default, f.name) or f.name in ("layout", "dtype")]
        return ",".join(parts)


def _dense_shape(layout: str, b: int, s: int, n: int, d: int) -> Tuple[int, ...]:
    return {"BSH": (b, s, n * d), "SBH": (s, b, n * d), "BSND": (b, s, n, d), "BNSD": (b, n, s, d)}[layout]


def _cumulative(lengths) -> Tensor:
    return torch.tensor(lengths, dtype=torch.int64).cumsum(0)


def _random_mask(shape, gen: torch.Generator, dtype: str) -> Tensor:
    m = torch.rand(shape, generator=gen) < 0.3
    m[..., 1, :] = True  # one fully masked query row (must give zeros, never NaN)
    return m if dtype == "bool" else m.to(torch.uint8)


def _strided_views(args: Dict[str, object]) -> None:
    """Same values, other memory layouts: query with padded rows (head dim contiguous), key stored in reverse axis
    order (permuted strides), value with a head-dim stride of 2."""
    q, k, v = args["query"], args["key"], args["value"]
    args["query"] = torch.cat([q, torch.full_like(q, float("nan"))], dim=-1)[..., :q.shape[-1]]
    args["key"] = k.permute(*reversed(range(k.dim()))).contiguous().permute(*reversed(range(k.dim())))
    args["value"] = torch.stack([v, torch.full_like(v, float("nan"))], dim=-1)[..., 0]
    assert not any(args[n].is_contiguous() for n in ("query", "key", "value"))


def make_inputs(case: Case) -> Dict[str, object]:
    """The op's arguments for a case (tensors in case.dtype; q/k/v/pse are leaves without grad)."""
    gen = torch.Generator().manual_seed(1000 + case.seed)
    dt = DTYPES[case.dtype]
    n1, n2, d, vd = case.q_heads, case.kv_heads, case.head_dim, case.vd

    def randn(*shape, std=1.0):
        return (torch.randn(shape, generator=gen, dtype=torch.float64) * std).to(dt)

    args: Dict[str, object] = {"head_num": n1, "input_layout": case.layout, "scale": case.scale,
                               "keep_prob": case.keep_prob, "pre_tokens": case.pre_tokens,
                               "next_tokens": case.next_tokens, "sparse_mode": case.sparse_mode,
                               "pse_type": case.pse_type}
    if case.layout == "TND":
        qlens, kvlens = case.seqlens
        tq, tk = sum(qlens), sum(kvlens)
        args.update(query=randn(tq, n1, d, std=1.5), key=randn(tk, n2, d), value=randn(tk, n2, vd),
                    actual_seq_qlen=_cumulative(qlens), actual_seq_kvlen=_cumulative(kvlens))
        sq, skv, b = max(qlens, default=0), max(kvlens, default=0), len(qlens)
    else:
        b, sq, skv = case.batch, case.q_len, case.kv_len
        args.update(query=randn(*_dense_shape(case.layout, b, sq, n1, d), std=1.5),
                    key=randn(*_dense_shape(case.layout, b, skv, n2, d)),
                    value=randn(*_dense_shape(case.layout, b, skv, n2, vd)))
    if case.mask == "compressed":
        args["atten_mask"] = torch.ones(2048, 2048, dtype=torch.bool).triu(1)
    elif case.mask is not None:
        shape = {"BNSS": (b, n1, sq, skv), "B1SS": (b, 1, sq, skv), "11SS": (1, 1, sq, skv), "SS": (sq, skv)}[case.mask]
        if case.layout == "TND":
            shape = (sq + 3, skv + 2)  # TND: a 2-D mask indexed by position in each sequence, may be larger
        args["atten_mask"] = _random_mask(shape, gen, case.mask_dtype)
    if case.pse is not None:
        shape = {"BNSS": (b, n1, sq, skv), "BN1S": (b, n1, 1, skv), "1NSS": (1, n1, sq, skv)}[case.pse]
        args["pse"] = randn(*shape)
    if case.alibi is not None:
        # Slopes as ALiBi uses them (2^(-8h/N)), a few negative; [B, N] rows differ per batch.
        slopes = 2.0 ** (-8.0 * (torch.arange(n1, dtype=torch.float64) + 1) / n1)
        slopes[-1] = -slopes[-1]
        if case.alibi == "BN":
            slopes = slopes * torch.linspace(0.5, 1.5, b, dtype=torch.float64).view(b, 1)
        args["pse"] = slopes.float()
    if case.softcap:
        args["softcap"] = case.softcap
    if case.start_idx is not None:
        args["q_start_idx"], args["kv_start_idx"] = list(case.start_idx[0]), list(case.start_idx[1])
    if case.alibi_bottom_right:
        args["alibi_bottom_right"] = True
    if case.sink is not None:
        sink = torch.randn(n1, generator=gen, dtype=torch.float64).float() * 2.0
        if case.sink == "-inf":
            sink[0] = float("-inf")
        elif case.sink == "large":
            sink[-1] = 30.0  # dominates every row of that head: its outputs are ~0
        args["sink"] = sink
    if case.softmax_layout:
        args["softmax_layout"] = case.softmax_layout
    if case.keep_prob < 1.0:
        args["seed"] = torch.tensor(7919 + case.seed, dtype=torch.int64)
        args["offset"] = torch.tensor(case.dropout_offset, dtype=torch.int64)
    if case.strided:
        _strided_views(args)
    return args


def dy_like(out: Tensor, seed: int = 0) -> Tensor:
    gen = torch.Generator().manual_seed(2000 + seed)
    return torch.randn(out.shape, generator=gen, dtype=torch.float64).to(out.dtype)


@dataclass
class Result:
    out: Tensor
    lse: Tensor
    grads: Dict[str, Tensor]
    softmax_max: Optional[Tensor] = None
    softmax_sum: Optional[Tensor] = None
    seed: Optional[Tensor] = None
    offset: Optional[Tensor] = None


def run_ours(args: Dict[str, object], dy: Optional[Tensor] = None, seed_dy: int = 0) -> Result:
    """Our op forward, then autograd backward with dy (random of the output's shape when dy is None)."""
    kw = dict(args)
    leaves = {}
    for name in GRAD_NAMES:
        if kw.get(name) is not None:
            leaves[name] = kw[name].detach().requires_grad_(True)  # keeps the strides of the input
            kw[name] = leaves[name]
    out, smax, ssum, sout, seed, offset = OPS.flash_attention_score(**kw)
    dy = dy_like(out, seed_dy) if dy is None else dy
    got = torch.autograd.grad(out, list(leaves.values()), dy, allow_unused=True)
    grads = {n: g for n, g in zip(leaves, got)}
    smax, ssum = stats_in_tnd_order(args, smax), stats_in_tnd_order(args, ssum)
    lse = smax[..., 0] + torch.log(ssum[..., 0])
    return Result(out.detach(), lse, grads, smax, ssum, seed, offset)


def stats_in_tnd_order(args: Dict[str, object], stats: Tensor) -> Tensor:
    """TND statistics with the default softmax_layout hold the rows in NTD order inside their [T, N, 8] shape (as
    torch_npu): the [T, N, 8] tensor of the same rows in TND order."""
    if args["input_layout"] != "TND" or args.get("softmax_layout", "") == "TND":
        return stats
    t, n, _ = stats.shape
    return stats.view(n, t, 8).transpose(0, 1)


def reference_kwargs(args: Dict[str, object], keep: Optional[Tensor]) -> Dict[str, object]:
    skip = ("query", "key", "value", "pse", "sink", "seed", "offset", "softmax_layout", "dropout_mask")
    kw = {k: v for k, v in args.items() if k not in skip}
    kw["dropout_keep"] = keep
    return kw


def keep_matrix(args: Dict[str, object], seed: Tensor, offset: Tensor) -> Optional[Tensor]:
    """The dropout keep mask our op used (flattened), from dropout_gen_mask with the seed/offset the op returned."""
    if args["keep_prob"] >= 1.0:
        return None
    numel = dropout_numel(args["query"], args["key"], args["head_num"], args["input_layout"],
                          args.get("actual_seq_qlen"), args.get("actual_seq_kvlen"))
    return OPS.dropout_gen_mask(seed, offset, 1, numel, args["keep_prob"]).reshape(-1)


def run_reference(args: Dict[str, object], dy: Tensor, keep: Optional[Tensor], same_dtype: bool) -> Result:
    out, lse, grads = reference_with_grads(args, dy, None if same_dtype else torch.float64,
                                           **reference_kwargs(args, keep))
    return Result(out, lse, grads)


def check_stats_layout(res: Result, args: Dict[str, object]) -> None:
    """softmax_max/sum: fp32, [B,N,Sq,8] ([T,N,8] for TND, here already in TND order), the 8 values of a row
    equal."""
    expected = tuple(res.lse.shape) + (8,)
    for name, t in (("softmax_max", res.softmax_max), ("softmax_sum", res.softmax_sum)):
        assert t.dtype == torch.float32, f"{name} dtype {t.dtype}"
        assert tuple(t.shape) == expected, f"{name} shape {list(t.shape)} != {list(expected)}"
        assert torch.equal(t, t[..., :1].expand_as(t)), f"{name}: the 8 values of a row differ"


def compare_with_reference(case: Case, check_grads: bool = True) -> Result:
    """Runs our op and both references for a case and applies the tolerance rule to the output, the logsumexp
    and (optionally) dq, dk, dv, dpse. Returns our result."""
    args = make_inputs(case)
    ours = run_ours(args)
    dy = dy_like(ours.out)
    assert ours.out.dtype == args["query"].dtype
    keep = keep_matrix(args, ours.seed, ours.offset)
    ref = run_reference(args, dy, keep, same_dtype=False)
    same = run_reference(args, dy, keep, same_dtype=True)
    check_stats_layout(ours, args)
    label = str(case)
    check_tolerance(f"[{label}] attention_out", ours.out, ref.out, same.out,
                    value_scale=float(args["value"].detach().abs().max()) if args["value"].numel() else None)
    check_tolerance(f"[{label}] logsumexp", ours.lse, ref.lse, same.lse)
    if check_grads:
        for name in ref.grads:
            assert ours.grads[name] is not None, f"[{label}] no gradient for {name}"
            if name == "pse" and case.pse_type >= 2:  # ALiBi slopes get no gradient (FlashAttention-2's choice)
                assert ours.grads[name].shape == args[name].shape and not ours.grads[name].any()
                continue
            assert ours.grads[name].shape == args[name].shape and ours.grads[name].dtype == args[name].dtype
            check_tolerance(f"[{label}] d{name}", ours.grads[name], ref.grads[name], same.grads[name])
    return ours


# ---- opcheck cases (listed in test/ops/test_opcheck.py) ----

def _score_args(case: Case, requires_grad=True, **extra):
    args = make_inputs(case)
    args.update(extra)
    for n in ("query", "key", "value", "pse", "sink"):
        if args.get(n) is not None:
            args[n].requires_grad_(requires_grad)
    q, k, v = args.pop("query"), args.pop("key"), args.pop("value")
    return (q, k, v, args.pop("head_num"), args.pop("input_layout")), args


def _grad_args(case: Case, **extra):
    (q, k, v, n, layout), kw = _score_args(case, requires_grad=False, **extra)
    out, smax, ssum, _, seed, offset = torch.ops.npu_fa.flash_attention_score(q, k, v, n, layout, **kw)
    dy = torch.randn_like(out)
    kw.update(softmax_max=smax, softmax_sum=ssum, attention_in=out, seed=seed, offset=offset)
    return (q, k, v, dy, n, layout), kw


SMALL = dict(batch=2, q_heads=2, kv_heads=1, q_len=5, kv_len=7, head_dim=8)


def _MASK_BYTES():  # noqa: N802  a bit-packed dropout mask for SMALL (2*2*5*7 bits), random bits
    return torch.randint(0, 256, (32,), dtype=torch.uint8, generator=torch.Generator().manual_seed(3))
OPCHECK_CASES = {
    "flash_attention_score": {
        "no_dropout": lambda: _score_args(Case(**SMALL)),
        "dropout_with_seed": lambda: _score_args(Case(keep_prob=0.8, **SMALL)),
        "pse_mask_BNSD": lambda: _score_args(Case(layout="BNSD", pse="BNSS", mask="B1SS", **SMALL)),
        "varlen_TND_causal": lambda: _score_args(Case(layout="TND", q_heads=2, kv_heads=1, head_dim=8,
                                                      seqlens=((3, 0, 4), (2, 5, 1)), sparse_mode=3)),
        "sink_TND_softmax_layout": lambda: _score_args(Case(layout="TND", q_heads=2, kv_heads=1, head_dim=8,
                                                            seqlens=((3, 4), (2, 5)), sink="random",
                                                            softmax_layout="TND")),
        "sink_dropout_mask": lambda: _score_args(Case(keep_prob=0.8, sink="random", **SMALL),
                                                 dropout_mask=_MASK_BYTES()),
        "softcap_alibi_pse_type2": lambda: _score_args(Case(softcap=3.0, alibi="N", pse_type=2, **SMALL)),
        "softcap_pse_type1": lambda: _score_args(Case(softcap=2.0, pse="BNSS", **SMALL)),
        "alibi_TND_pse_type3_start_idx": lambda: _score_args(Case(layout="TND", q_heads=2, kv_heads=1, head_dim=8,
                                                                  seqlens=((3, 4), (2, 5)), alibi="BN", pse_type=3,
                                                                  start_idx=((1,), (0,)), alibi_bottom_right=True)),
    },
    "flash_attention_score_grad": {
        "no_dropout": lambda: _grad_args(Case(**SMALL)),
        "dropout_pse": lambda: _grad_args(Case(keep_prob=0.8, pse="BN1S", **SMALL)),
        "varlen_TND": lambda: _grad_args(Case(layout="TND", q_heads=2, kv_heads=2, head_dim=8,
                                              seqlens=((3, 1), (4, 2)), sparse_mode=2)),
        "sink_dropout_mask": lambda: _grad_args(Case(keep_prob=0.8, sink="random", **SMALL),
                                                dropout_mask=_MASK_BYTES()),
        "softcap_alibi_pse_type2": lambda: _grad_args(Case(softcap=3.0, alibi="BN", pse_type=2, **SMALL)),
        "softcap_pse_type0": lambda: _grad_args(Case(softcap=2.0, pse="BN1S", pse_type=0, **SMALL)),
    },
    "dropout_gen_mask": {
        "basic": lambda: ((torch.tensor(3), torch.tensor(5), 6, 9, 0.7), {}),
    },
}


# torch_npu's npu_ring_attention_update
def _ring(layout, dtype=torch.float32):
    def make():
        if layout == "SBH":
            attn, stats = (4, 2, 2 * 8), (2, 2, 4, 8)
        else:
            attn, stats = (5, 2, 16), (5, 2, 8)
        st = [torch.rand(stats[:-1]).unsqueeze(-1).expand(stats).contiguous() + 0.5 for _ in range(4)]
        qlen = torch.tensor([2, 5]) if layout == "TND" else None
        return (torch.randn(attn, dtype=dtype), st[0], st[1], torch.randn(attn, dtype=dtype), st[2], st[3], qlen,
                layout, layout if layout == "TND" else ""), {}
    return make


OPCHECK_CASES.update({"ring_attention_update": {"sbh": _ring("SBH"), "tnd_bf16": _ring("TND", torch.bfloat16)}})
