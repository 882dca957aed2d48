"""The differential oracle over the space of valid calls, not a grid: hypothesis draws random valid calls of the ops
the oracle covers (FlashAttention training forward + backward, prefill with per-batch lengths, paged prefill,
decode contiguous and paged, the SDPA hook forward + backward, RoPE forward + backward, MoE gating, dispatch, grouped
matmul and combine, DeepSeek-V3.2's sparse flash attention, the linear-attention family: the recurrent gated delta
rule over its state cache, the chunked rule forward + backward, the causal conv1d ops over their conv-state cache,
the gated RMSNorm), runs each on the simulated npu under `oracle.check(mode="raise")` — no report may appear (a
false alarm) — and again under every injected fault that applies to it (TOT_NPU_SIM_FAULT for the Ascend C kernels;
argument faults for the ops that run their CPU kernel on the device) — each fault whose effect on the result exceeds
a correct kernel's rounding must be caught (a miss otherwise). Run by
test_oracle_property.py through runner_worker.py; the rates are printed as one `oracle-rates` JSON line on stderr.

Seeded (derandomized) in the default profile; HYPOTHESIS_PROFILE=long draws 25x more, unseeded.
"""
import json
import sys
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Sequence

import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from torch.utils._python_dispatch import TorchDispatchMode

from torch_ops_transformer import oracle
from test.attention.attention_cases import Case as TrainCase, dy_like, make_inputs as train_inputs
from test.inference import decode_cases
from test.inference.prefill_cases import make_inputs as prefill_inputs
from test.npu.runner import env_var
from test.ops.zero_size_cases import to_device as _to
from test.properties.strategies import PROFILE, examples

OPS = torch.ops.npu_fa
NPU = "npu"
FA_FORWARD_FAULTS = ("scale", "window", "mask_tail")
FA_BACKWARD_FAULTS = ("bwd_scale", "bwd_window")
DECODE_FAULTS = ("decode_scale", "decode_tail")
SETTINGS = settings(deadline=None, database=None, derandomize=PROFILE != "long", print_blob=True,
                    suppress_health_check=list(HealthCheck))


@dataclass
class Rates:
    draws: int = 0                 # valid calls run under raise mode without a fault
    false_alarms: List[str] = field(default_factory=list)
    faults_effective: int = 0      # (draw, fault) pairs whose effect exceeds rounding
    faults_caught: int = 0
    faults_below_rounding: int = 0  # the fault changed nothing measurable on this draw: not counted
    misses: List[str] = field(default_factory=list)
    by_family: Dict[str, Dict[str, int]] = field(default_factory=dict)  # draws / effective / caught per family
    by_fault: Dict[str, Dict[str, int]] = field(default_factory=dict)   # effective / caught per fault

    def count(self, family: str, what: str, fault: str = "") -> None:
        row = self.by_family.setdefault(family, {"draws": 0, "effective": 0, "caught": 0})
        row[what] += 1
        if fault:
            self.by_fault.setdefault(fault, {"effective": 0, "caught": 0})[what] += 1


RATES = Rates()


def _tensors(result) -> List[torch.Tensor]:
    flat = result if isinstance(result, (list, tuple)) else [result]
    out = []
    for t in flat:
        if isinstance(t, (list, tuple)):
            out += _tensors(t)
        elif isinstance(t, torch.Tensor):
            out.append(t.detach().cpu())
    return out


def _effect(clean: Sequence[torch.Tensor], faulty: Sequence[torch.Tensor]) -> bool:
    """Does the fault change a floating result by more than a correct kernel's rounding could: 16 ulp of the
    result's largest value at its dtype, plus twice the FA2 rule's absolute floor (1e-5: changes below it are
    within the project's tolerance rule by definition)?"""
    for a, b in zip(clean, faulty):
        if not a.is_floating_point() or a.shape != b.shape or not a.numel():
            continue
        fa, fb = a.double(), b.double()
        both = torch.isfinite(fa) & torch.isfinite(fb)
        if bool((torch.isfinite(fa) != torch.isfinite(fb)).any()):
            return True
        if not bool(both.any()):
            continue
        scale = float(fa[both].abs().max())
        if float((fa - fb)[both].abs().max()) > 16 * torch.finfo(a.dtype).eps * max(scale, 1.0) + 2e-5:
            return True
    return False


def _judge(family: str, describe: str, call: Callable[[], object], faults: Sequence[str]) -> None:
    """Run `call` (which builds npu inputs and returns its results) without and with each fault."""
    try:
        with oracle.check(mode="raise"):
            clean = _tensors(call())
    except oracle.OracleMismatch as e:
        RATES.false_alarms.append(f"{family}: {describe}\n{e.report.text()}")
        return
    RATES.draws += 1
    RATES.count(family, "draws")
    for name in faults:
        with _fault(name):
            faulty = _tensors(call())
            if not _effect(clean, faulty):
                RATES.faults_below_rounding += 1
                continue
            RATES.faults_effective += 1
            RATES.count(family, "effective", name)
            try:
                with oracle.check(mode="raise"):
                    call()
            except oracle.OracleMismatch:
                RATES.faults_caught += 1
                RATES.count(family, "caught", name)
                continue
            RATES.misses.append(f"{family} with fault {name}: {describe}")


def _fault(name: str):
    """The context that injects fault `name`: a kernel fault of the npu glue (TOT_NPU_SIM_FAULT), or, for the ops
    that run their CPU kernel on the device (no kernel of their own to break), an argument fault of ARGUMENT_FAULTS."""
    if name in ARGUMENT_FAULTS:
        return _ArgumentFault(*ARGUMENT_FAULTS[name])
    return env_var("TOT_NPU_SIM_FAULT", name)


def _judge_if_valid(family: str, describe: str, build: Callable[[str], Callable[[], object]],
                    faults: Sequence[str]) -> None:
    """`build(device)` gives the drawn call on that device; draws the op rejects on the CPU are not calls of the
    space (the bad-input rules have their own tests) and are skipped."""
    try:
        build("cpu")()
    except (ValueError, TypeError, RuntimeError, NotImplementedError):
        return
    _judge(family, describe, build(NPU), faults)


# ---- FlashAttention training: forward + backward ------------------------------------------------------------------
@st.composite
def train_cases(draw):
    # Most draws take the Ascend C kernel (dense layouts without pse, dropout, sink or softcap); the rest run the
    # CPU kernel on the device and check the oracle's rules on the forms the kernel leaves to it.
    layout = draw(st.sampled_from(["BSH", "SBH", "BSND", "BNSD", "BSND", "BNSD", "TND"]))
    kv_heads = draw(st.sampled_from([1, 2]))
    q_heads = kv_heads * draw(st.sampled_from([1, 2]))
    mode = draw(st.sampled_from([0, 0, 1, 2, 3, 4]))
    kw = dict(layout=layout, batch=draw(st.integers(1, 2)), q_heads=q_heads, kv_heads=kv_heads,
              q_len=draw(st.integers(2, 70)), kv_len=draw(st.integers(1, 90)),  # (masks hide a row)
              head_dim=draw(st.sampled_from([8, 16, 32, 64])), dtype=draw(st.sampled_from(["fp32", "bf16", "fp16"])),
              sparse_mode=mode, scale_mult=draw(st.sampled_from([0.5, 1.0, 4.0])), seed=draw(st.integers(0, 10**6)))
    if mode in (0, 4):
        kw["pre_tokens"] = draw(st.sampled_from([2147483647, 0, 3, 40]))
        kw["next_tokens"] = draw(st.sampled_from([2147483647, 0, 5, 40]))
    if layout == "TND":
        b = kw["batch"]
        kw["seqlens"] = (tuple(draw(st.lists(st.integers(1, 40), min_size=b, max_size=b))),
                         tuple(draw(st.lists(st.integers(1, 60), min_size=b, max_size=b))))
    if mode in (0, 1):
        kw["mask"] = draw(st.sampled_from([None, "SS", "B1SS", "11SS", "BNSS"] if mode == 0 else
                                          ["SS", "B1SS", "BNSS"]))
    else:
        kw["mask"] = "compressed"
    if layout != "TND" and draw(st.integers(0, 4)) == 0:
        kw["pse"] = draw(st.sampled_from(["BNSS", "BN1S", "1NSS"]))
        kw["pse_type"] = draw(st.sampled_from([0, 1]))
    extra = draw(st.sampled_from(["", "", "", "", "", "", "softcap", "sink", "dropout"]))
    if extra == "softcap":
        kw["softcap"] = 5.0
    elif extra == "sink":
        kw["sink"] = "random"
    elif extra == "dropout":
        kw["keep_prob"] = 0.8   # with an explicit seed: re-run by the oracle with the same mask
    return TrainCase(**kw)


def _train_call(case: TrainCase, device: str):
    args = train_inputs(case)

    def call():
        a = _to(args, device)
        leaves = {n: a[n].requires_grad_() for n in ("query", "key", "value") if n in a}
        out = OPS.flash_attention_score(**a)
        dy = dy_like(out[0].detach().cpu(), seed=case.seed).to(device)
        grads = torch.autograd.grad(out[0], list(leaves.values()), dy)
        return list(out[:3]) + list(grads)
    return call


@settings(SETTINGS, max_examples=examples(40))
@given(case=train_cases())
def _train_property(case):
    _judge_if_valid("flash_attention_score fwd+bwd", repr(case), lambda device: _train_call(case, device),
                    FA_FORWARD_FAULTS + FA_BACKWARD_FAULTS)


def case_flash_attention_training():
    _train_property()


# ---- prefill: prompt_flash_attention / fused_infer_attention_score ------------------------------------------------
@st.composite
def prefill_draws(draw):
    layout = draw(st.sampled_from(["BSH", "BSND", "BNSD", "TND"]))
    n2 = draw(st.sampled_from([1, 2]))
    n1 = n2 * draw(st.sampled_from([1, 2, 4]))
    b = draw(st.integers(1, 3))
    sq, skv = draw(st.integers(1, 48)), draw(st.integers(1, 80))
    lengths = draw(st.sampled_from(["full", "q", "kv", "both"])) if layout != "TND" else "both"
    q_lens = [draw(st.integers(1, sq)) for _ in range(b)] if lengths in ("q", "both") else None
    kv_lens = [draw(st.integers(1, skv)) for _ in range(b)] if lengths in ("kv", "both") else None
    mode = draw(st.sampled_from([0, 0, 2, 3, 4]))
    mask = draw(st.sampled_from([None, "SS", "BSS", "1SS", "B1SS", "11SS"])) if mode == 0 else "compressed"
    return dict(op=draw(st.sampled_from(["pfa", "fia"])), layout=layout, B=b, N1=n1, N2=n2, Sq=sq, Skv=skv,
                D=draw(st.sampled_from([16, 32, 64])), dtype=draw(st.sampled_from([torch.float32, torch.bfloat16,
                                                                                   torch.float16])),
                q_lens=q_lens, kv_lens=kv_lens, mode=mode, mask=mask, pre=draw(st.sampled_from([2147483647, 4, 30])),
                nxt=draw(st.sampled_from([2147483647, 0, 6])), scale=draw(st.sampled_from([0.05, 0.2, 0.5])),
                lse=draw(st.booleans()), seed=draw(st.integers(0, 10**6)))


def _prefill_mask(d, g):
    if d["mask"] is None:
        return None
    if d["mask"] == "compressed":
        return torch.ones(2048, 2048, dtype=torch.bool).triu(1)
    b, sq, skv = d["B"], d["Sq"], d["Skv"]
    shape = {"SS": (sq, skv), "BSS": (b, sq, skv), "1SS": (1, sq, skv), "B1SS": (b, 1, sq, skv),
             "11SS": (1, 1, sq, skv)}[d["mask"]]
    m = torch.rand(shape, generator=g) < 0.3
    m[..., 0] = False  # every row keeps a key
    return m


def _prefill_call(d, device):
    args, _, _ = prefill_inputs(d["layout"], d["B"], d["N1"], d["N2"], d["Sq"], d["Skv"], d["D"], d["dtype"],
                                d["q_lens"], d["kv_lens"], seed=d["seed"])
    mask = _prefill_mask(d, torch.Generator().manual_seed(d["seed"]))

    def call():
        a = _to(args, device)
        m = _to(mask, device)
        if d["op"] == "pfa":
            return OPS.prompt_flash_attention(a["query"], a["key"], a["value"], atten_mask=m,
                                              actual_seq_lengths=a.get("actual_seq_lengths"),
                                              actual_seq_lengths_kv=a.get("actual_seq_lengths_kv"), num_heads=d["N1"],
                                              scale_value=d["scale"], pre_tokens=d["pre"], next_tokens=d["nxt"],
                                              input_layout=d["layout"], num_key_value_heads=d["N2"],
                                              sparse_mode=d["mode"])
        return OPS.fused_infer_attention_score(a["query"], a["key"], a["value"], atten_mask=m,
                                               actual_seq_lengths=a.get("actual_seq_lengths"),
                                               actual_seq_lengths_kv=a.get("actual_seq_lengths_kv"),
                                               num_heads=d["N1"], scale=d["scale"], pre_tokens=d["pre"],
                                               next_tokens=d["nxt"], input_layout=d["layout"],
                                               num_key_value_heads=d["N2"], sparse_mode=d["mode"],
                                               softmax_lse_flag=d["lse"])
    return call


@settings(SETTINGS, max_examples=examples(40))
@given(d=prefill_draws())
def _prefill_property(d):
    _judge_if_valid("prefill", repr(d), lambda device: _prefill_call(d, device), FA_FORWARD_FAULTS)


def case_prefill():
    _prefill_property()


# ---- decode: incre_flash_attention / one-token fused_infer_attention_score, contiguous and paged ------------------
@st.composite
def decode_draws(draw):
    layout = draw(st.sampled_from(["BSH", "BSND", "BNSD"]))
    n2 = draw(st.sampled_from([1, 2]))
    block = draw(st.sampled_from([None, 16, 32]))
    kv_len = draw(st.integers(1, 6)) * (block or draw(st.sampled_from([8, 24, 50])))
    b = draw(st.integers(1, 3))
    lens = tuple(draw(st.integers(1, kv_len)) for _ in range(b)) if (block or draw(st.booleans())) else None
    case = decode_cases.Case(layout=layout, batch=b, q_heads=n2 * draw(st.sampled_from([1, 2, 4])), kv_heads=n2,
                             head_dim=draw(st.sampled_from([16, 32, 64])), kv_len=kv_len, lens=lens,
                             dtype=draw(st.sampled_from(["fp32", "bf16", "fp16"])),
                             mask=draw(st.sampled_from([None, "BS", "B1S", "B11S"])) if not block else None,
                             block=block, paged_4d=bool(block) and layout == "BNSD" and draw(st.booleans()),
                             scale=draw(st.sampled_from([0.1, 0.25, 0.6])))
    return case, draw(st.sampled_from(["ifa", "fia"])), draw(st.integers(0, 10**6))


def _decode_call(case, op, seed, device):
    inp = decode_cases.build(case, seed)
    a = list(inp.args)
    if inp.mask is not None:
        a[3] = a[3].clone()
        a[3].view(case.batch, -1)[:, 0] = False  # every sequence keeps a key

    def call():
        x = _to(a, device)
        if op == "ifa":
            return OPS.incre_flash_attention(*x)
        q, k, v, mask, pse, lens, table = x[:7]
        return OPS.fused_infer_attention_score(q, k, v, pse_shift=pse, atten_mask=mask, actual_seq_lengths_kv=lens,
                                               block_table=table, num_heads=case.q_heads, scale=case.scale,
                                               input_layout=case.layout, num_key_value_heads=case.kv_heads,
                                               block_size=case.block or 0, softmax_lse_flag=True)
    return call


@settings(SETTINGS, max_examples=examples(40))
@given(d=decode_draws())
def _decode_property(d):
    case, op, seed = d
    _judge_if_valid("decode", repr(d), lambda device: _decode_call(case, op, seed, device), DECODE_FAULTS)


def case_decode():
    _decode_property()


# ---- SDPA hook, RoPE, MoE -----------------------------------------------------------------------------------------
@settings(SETTINGS, max_examples=examples(20))
@given(b=st.integers(1, 2), h=st.sampled_from([1, 2, 4]), group=st.sampled_from([1, 2]), l=st.integers(1, 40),
       s=st.integers(1, 60), e=st.sampled_from([8, 32]), causal=st.booleans(), mask=st.sampled_from([None, "bool", "float"]),
       dtype=st.sampled_from([torch.float32, torch.bfloat16]), seed=st.integers(0, 10**6))
def _sdpa_property(b, h, group, l, s, e, causal, mask, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, h * group, l, e, generator=g).to(dtype)
    k, v = (torch.randn(b, h, s, e, generator=g).to(dtype) for _ in range(2))
    m = None
    if mask is not None and not causal:
        m = torch.rand(b, 1, l, s, generator=g) < 0.7
        m[..., 0] = True
        if mask == "float":
            m = torch.zeros(m.shape).masked_fill(~m, float("-inf")).to(dtype)

    def call(device=NPU):
        leaves = [t.to(device).requires_grad_() for t in (q, k, v)]
        out = F.scaled_dot_product_attention(*leaves, attn_mask=_to(m, device), is_causal=causal, enable_gqa=True)
        return [out] + list(torch.autograd.grad(out, leaves, torch.ones_like(out)))
    _judge("sdpa fwd+bwd", f"b={b} h={h} group={group} l={l} s={s} e={e} causal={causal} mask={mask} {dtype}", call,
           FA_FORWARD_FAULTS + FA_BACKWARD_FAULTS)


def case_sdpa_hook():
    _sdpa_property()


@settings(SETTINGS, max_examples=examples(12))
@given(shape=st.sampled_from([(1, 7, 2, 64), (2, 16, 4, 32), (1, 33, 1, 128), (3, 5, 8, 16)]),
       mode=st.sampled_from([0, 1]), dtype=st.sampled_from([torch.float32, torch.bfloat16, torch.float16]),
       seed=st.integers(0, 10**6))
def _rope_property(shape, mode, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    b, s, n, d = shape
    x = torch.randn(shape, generator=g).to(dtype)
    ang = torch.randn(1, s, 1, d, generator=g)
    cos, sin = ang.cos().to(dtype), ang.sin().to(dtype)

    def call():
        leaf = x.to(NPU).requires_grad_()
        y = OPS.rotary_position_embedding(leaf, cos.to(NPU), sin.to(NPU), mode)
        return [y, torch.autograd.grad(y, leaf, torch.ones_like(y))[0]]
    _judge("rope fwd+bwd", f"{shape} mode={mode} {dtype}", call, ())


def case_rope():
    _rope_property()


@settings(SETTINGS, max_examples=examples(15))
@given(rows=st.integers(1, 40), experts=st.sampled_from([8, 16, 60, 64]), k=st.integers(1, 4),
       hidden=st.sampled_from([16, 64]), dtype=st.sampled_from([torch.float32, torch.bfloat16, torch.float16]),
       seed=st.integers(0, 10**6))
def _moe_property(rows, experts, k, hidden, dtype, seed):
    """Gating -> dispatch -> grouped matmul -> combine, each op on the device judged on its own."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(rows, experts, generator=g).to(dtype)
    x = torch.randn(rows, hidden, generator=g).to(dtype)
    w = (torch.randn(experts, hidden, hidden, generator=g) / hidden ** 0.5).to(dtype)

    def call():
        y, idx, _ = OPS.moe_gating_top_k_softmax(logits.to(NPU), None, k)
        ex, row_idx, counts, _ = OPS.moe_init_routing_v2(x.to(NPU), idx, active_num=rows * k, expert_num=experts,
                                                         expert_tokens_num_type=1, expert_tokens_num_flag=True)
        out = OPS.grouped_matmul([ex], [w.to(NPU)], [], counts, 0, 1, 0)[0][0]
        comb = OPS.moe_finalize_routing(out, None, None, None, y.to(out.dtype), row_idx, idx, 0)
        return [y, idx, ex, row_idx, counts, out, comb]
    _judge("moe chain", f"rows={rows} experts={experts} k={k} hidden={hidden} {dtype}", call, ())


def case_moe():
    _moe_property()


# ---- DeepSeek-V3.2 sparse flash attention (its Ascend C kernel) --------------------------------------------------
SFA_FAULTS = ("sfa_scale", "sfa_causal")


@settings(SETTINGS, max_examples=examples(25))
@given(layouts=st.sampled_from([("BSND", "BSND"), ("BSND", "PA_BSND"), ("TND", "TND"), ("TND", "PA_BSND")]),
       heads=st.sampled_from([(1, 1), (4, 1), (4, 2)]), rope=st.booleans(), sbs=st.sampled_from([1, 4]),
       mode=st.sampled_from([3, 3, 0]), sinks=st.booleans(), q_lens=st.lists(st.integers(1, 4), min_size=1, max_size=2),
       kv_extra=st.lists(st.integers(0, 30), min_size=2, max_size=2), k=st.integers(1, 8),
       fill=st.sampled_from([0.0, 0.3]), dtype=st.sampled_from([torch.float32, torch.bfloat16, torch.float16]),
       seed=st.integers(0, 10**6))
def _sfa_property(layouts, heads, rope, sbs, mode, sinks, q_lens, kv_extra, k, fill, dtype, seed):
    from test.sparse_attention.sfa_reference import make_inputs

    B = len(q_lens)
    kv_lens = [q + e for q, e in zip(q_lens, kv_extra)]  # the causal limit keeps every row some keys
    S1 = max(q_lens)
    q_lens = q_lens if layouts[0] == "TND" else [S1] * B
    inp = make_inputs(layout_query=layouts[0], layout_kv=layouts[1], B=B, S1=S1, N1=heads[0], N2=heads[1], Dn=16,
                      Dr=8, S2=max(kv_lens), K=k, sbs=sbs, block_size=8, q_lens=q_lens, kv_lens=kv_lens, dtype=dtype,
                      seed=seed, rope=rope, fill=fill)
    sink = torch.randn(heads[0], generator=torch.Generator().manual_seed(seed)) if sinks else None

    def build(device):
        def call():
            d = _to(inp, device)
            return OPS.sparse_flash_attention(d["query"], d["key"], d["value"], d["sparse_indices"], d["scale_value"],
                                              sparse_mode=mode, return_softmax_lse=True,
                                              sinks=_to(sink, device), **d["kwargs"])
        return call
    _judge_if_valid("sparse flash attention", f"{layouts} heads={heads} rope={rope} sbs={sbs} mode={mode} "
                    f"sinks={sinks} q={q_lens} kv={kv_lens} k={k} {dtype}", build, SFA_FAULTS)


def case_sparse_flash_attention():
    _sfa_property()


# ---- linear attention: the recurrent rule (its Ascend C kernel) and the ops that run their CPU kernel on npu -------
# The recurrent rule's kernel faults (TOT_NPU_SIM_FAULT) break its host tables: one breaks the outputs only
# ("gdr_scale"), one the written state cache only ("gdr_slot"), so both what the op returns and what it writes are
# judged. The chunked rule, the conv ops and the gated RMSNorm have no Ascend C kernel: on npu they run their CPU
# kernel through the simulated device's generic path, which the oracle checks like any other call (each draw
# asserts how many calls it checked). To prove the rules catch a wrong result there too, the worker breaks those
# calls' arguments on the way to the device (ARGUMENT_FAULTS), as a broken glue would; the oracle keeps its own
# copy of the true arguments.
GDR_FAULTS = ("gdr_scale", "gdr_accepted", "gdr_slot")


def _on_npu(values) -> bool:
    return any(isinstance(t, torch.Tensor) and t.device.type == NPU for t in values)


class _ArgumentFault(TorchDispatchMode):
    """Rewrites arguments of the npu calls of `ops` before they run (entered outside the oracle, so the oracle sees
    the call first; its CPU re-run, on CPU tensors, passes through unchanged). Written arguments are never
    replaced, only read ones: the device must still write the caller's tensors."""

    def __init__(self, ops, rewrite):
        super().__init__()
        self.ops, self.rewrite = {f"npu_fa::{op}" for op in ops}, rewrite

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if getattr(func, "namespace", "") != "npu_fa" or func._schema.name not in self.ops:
            return func(*args, **kwargs)
        values = dict(kwargs)
        values.update({a.name: v for a, v in zip(func._schema.arguments, args)})
        for a in func._schema.arguments:  # (arguments equal to their defaults arrive without them)
            if a.name not in values and a.has_default_value():
                values[a.name] = a.default_value
        if not _on_npu(values.values()):
            return func(*args, **kwargs)
        return func(**self.rewrite(values))


def _scaled(values, factor=1.05):
    values["scale"] = (1.0 if values.get("scale") is None else values["scale"]) * factor
    return values


def _first_tap_dropped(values):
    w = values["weight"].clone()
    w[0] = 0  # the oldest tap
    return dict(values, weight=w)


def _lines_rolled(values):
    lines = values.get("cache_indices")
    return values if lines is None else dict(values, cache_indices=lines.roll(1, 0))


# name -> (ops, rewrite of the device call's arguments)
ARGUMENT_FAULTS = {
    "chunk_scale": (("chunk_gated_delta_rule",), _scaled),
    "chunk_bwd_scale": (("chunk_gated_delta_rule_backward",), _scaled),
    "conv_tap": (("fused_causal_conv1d", "fused_causal_conv1d_v2", "masked_causal_conv1d"), _first_tap_dropped),
    "conv_line": (("fused_causal_conv1d", "fused_causal_conv1d_v2"), _lines_rolled),  # each reads its neighbour's
    "conv_bwd_mask": (("masked_causal_conv1d_backward",), lambda v: dict(v, mask=None)),
    "norm_eps": (("rms_norm_gated",), lambda v: dict(v, epsilon=v["epsilon"] * 1e4)),
}


def _checked_calls(call, expected: int):
    """Runs `call` and requires the oracle (already on) to have checked `expected` calls in it: an op the device
    runs through its CPU kernel must not slip past the oracle."""
    def run():
        before = oracle.stats().checked
        result = call()
        assert oracle.stats().checked - before == expected or not _oracle_on(), \
            f"{oracle.stats().checked - before} calls checked, expected {expected}"
        return result
    return run


def _oracle_on() -> bool:
    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

    return any(isinstance(m, oracle._OracleMode) for m in _get_current_dispatch_mode_stack())


@st.composite
def recurrent_draws(draw):
    lens = draw(st.lists(st.integers(1, 4), min_size=1, max_size=4))
    nk = draw(st.sampled_from([1, 2]))
    d = dict(form=draw(st.sampled_from(["in_place", "functional"])), lens=tuple(lens), Nk=nk,
             Nv=nk * draw(st.sampled_from([1, 2, 3])), Dk=draw(st.sampled_from([8, 19, 32, 64])),
             Dv=draw(st.sampled_from([4, 12, 32])), dtype=draw(st.sampled_from([torch.float32, torch.bfloat16,
                                                                              torch.float16])),
             state_fp32=draw(st.booleans()), with_gk=draw(st.booleans()),
             accepted=tuple(draw(st.integers(1, n)) for n in lens) if draw(st.booleans()) else None,
             slots=sum(lens) + draw(st.integers(0, 5)), default_slots=draw(st.integers(0, 5)) == 0,
             drop=draw(st.sampled_from([(), (), ("beta",), ("g",), ("beta", "g")])),
             scale=draw(st.sampled_from([None, 0.3])), seed=draw(st.integers(0, 10**6)))
    return d


def _recurrent_call(d, device):
    from test.linear_attention.test_recurrent_gated_delta_rule import make_inputs as recurrent_inputs

    (q, k, v, state), kw = recurrent_inputs(d["dtype"], lens=d["lens"], Nk=d["Nk"], Nv=d["Nv"], Dk=d["Dk"],
                                            Dv=d["Dv"], slots=d["slots"], with_gk=d["with_gk"],
                                            state_dtype=torch.float32 if d["state_fp32"] else None,
                                            accepted=d["accepted"], seed=d["seed"])
    for name in d["drop"] + (("ssm_state_indices",) if d["default_slots"] else ()):
        kw.pop(name)
    op = OPS.recurrent_gated_delta_rule if d["form"] == "in_place" else OPS.recurrent_gated_delta_rule_functional

    def call():
        cache = state.clone().to(device)  # a fresh cache per run: the in-place form writes it
        floats = {n: t.to(device) for n, t in kw.items() if t.is_floating_point()}
        hosts = {n: t for n, t in kw.items() if not t.is_floating_point()}  # lengths and slots: host tensors
        res = op(q.to(device), k.to(device), v.to(device), cache, scale=d["scale"], **floats, **hosts)
        return list(res if isinstance(res, tuple) else (res,)) + [cache]
    return _checked_calls(call, 1)


@settings(SETTINGS, max_examples=examples(30))
@given(d=recurrent_draws())
def _recurrent_property(d):
    _judge_if_valid("recurrent gated delta rule", repr(d), lambda device: _recurrent_call(d, device), GDR_FAULTS)


def case_recurrent_gated_delta_rule():
    _recurrent_property()


def _grads(out, leaves, seed):
    """The outputs' gradients with respect to `leaves` for fixed random output gradients."""
    g = torch.Generator().manual_seed(seed)
    outs = [o for o in out if o.requires_grad]
    dys = [torch.randn(o.shape, generator=g).to(o.dtype).to(o.device) for o in outs]
    return list(torch.autograd.grad(outs, leaves, dys))


@settings(SETTINGS, max_examples=examples(12))
@given(lens=st.lists(st.integers(0, 90), min_size=1, max_size=3), heads=st.sampled_from([(1, 1), (1, 2), (2, 4)]),
       dims=st.sampled_from([(8, 4), (16, 16), (32, 8)]), dtype=st.sampled_from([torch.float32, torch.bfloat16]),
       state=st.booleans(), with_g=st.booleans(), with_beta=st.booleans(), seed=st.integers(0, 10**6))
def _chunk_property(lens, heads, dims, dtype, state, with_g, with_beta, seed):
    from test.linear_attention.chunk_gated_delta_rule_reference import make_inputs as chunk_inputs

    if sum(lens) == 0:
        lens = lens + [5]
    inp = chunk_inputs(lens, Nk=heads[0], Nv=heads[1], Dk=dims[0], Dv=dims[1], dtype=dtype, seed=seed, state=state,
                       with_g=with_g)
    if not with_beta:
        inp["beta"] = None
    names = ("query", "key", "value", "beta", "initial_state", "g")

    def build(device):
        def call():
            a = {n: (inp[n].to(device).requires_grad_() if inp[n] is not None else None) for n in names}
            out = OPS.chunk_gated_delta_rule(a["query"], a["key"], a["value"], a["beta"], a["initial_state"],
                                             inp["actual_seq_lengths"], inp["scale"], a["g"])
            return list(out) + _grads(out, [t for t in a.values() if t is not None], seed)
        return _checked_calls(call, 2)
    _judge_if_valid("chunk gated delta rule fwd+bwd", f"lens={lens} heads={heads} dims={dims} {dtype} "
                    f"state={state} g={with_g} beta={with_beta}", build, ("chunk_scale", "chunk_bwd_scale"))


def case_chunk_gated_delta_rule():
    _chunk_property()


@st.composite
def fused_conv_draws(draw):
    mode = draw(st.sampled_from(["prefill", "prefill", "decode", "spec", "batch_3d"]))
    batch = draw(st.integers(1, 4))
    K = draw(st.sampled_from([2, 3, 4]))
    extra = draw(st.integers(1, 3)) if mode == "spec" else draw(st.sampled_from([0, 0, 2]))
    return dict(mode=mode, form=draw(st.sampled_from(["y", "v2"])), batch=batch, K=K, C=K - 1 + extra,
                lens=[draw(st.integers(0 if mode == "prefill" else 1, 20)) for _ in range(batch)],
                dim=draw(st.sampled_from([16, 40, 130])), pad=mode != "batch_3d" and draw(st.integers(0, 3)) == 0,
                bias=draw(st.booleans()), silu=draw(st.booleans()), residual=draw(st.integers(0, 1)),
                dtype=draw(st.sampled_from([torch.float32, torch.bfloat16, torch.float16])),
                seed=draw(st.integers(0, 10**6)))


def _fused_conv_call(d, device):
    g = torch.Generator().manual_seed(d["seed"])
    b, dim, i32 = d["batch"], d["dim"], torch.int32
    lens = {"decode": [1] * b, "spec": [min(n, d["C"] - d["K"] + 2) for n in d["lens"]],
            "batch_3d": [d["lens"][0]] * b}.get(d["mode"], d["lens"])
    x = torch.randn(b, lens[0], dim, generator=g) if d["mode"] == "batch_3d" else torch.randn(sum(lens), dim,
                                                                                                generator=g)
    weight = 0.5 * torch.randn(d["K"], dim, generator=g)
    slots = b + 3
    states = torch.randn(slots, d["C"], dim, generator=g)
    lines = torch.randperm(slots, generator=g)[:b].to(i32)
    if d["pad"]:
        lines[0] = -1
    kw = dict(cache_indices=lines, activation="silu" if d["silu"] else "None", residual_connection=d["residual"])
    if d["mode"] != "batch_3d":
        kw["query_start_loc"] = torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=i32)
    if d["mode"] == "spec":
        kw["num_accepted_tokens"] = torch.tensor([int(torch.randint(1, n + 1, (1,), generator=g)) for n in lens],
                                                 dtype=i32)
    if d["bias"]:
        kw["bias"] = torch.randn(dim, generator=g).to(d["dtype"])
    x, weight, states = (t.to(d["dtype"]) for t in (x, weight, states))

    def call():
        xd, sd = x.clone().to(device), states.clone().to(device)  # fresh: the op writes conv_states (and _v2 x)
        kwd = _to(kw, device)
        if d["form"] == "y":
            return [OPS.fused_causal_conv1d(xd, weight.to(device), sd, **kwd), sd]
        OPS.fused_causal_conv1d_v2(xd, weight.to(device), sd, **kwd)
        return [xd, sd]
    return _checked_calls(call, 1)


@settings(SETTINGS, max_examples=examples(20))
@given(d=fused_conv_draws())
def _fused_conv_property(d):
    _judge_if_valid("fused causal conv1d (conv_states in place)", repr(d), lambda device: _fused_conv_call(d, device),
                    ("conv_tap", "conv_line"))


def case_fused_causal_conv1d():
    _fused_conv_property()


@settings(SETTINGS, max_examples=examples(10))
@given(S=st.integers(1, 50), B=st.integers(1, 3), H=st.sampled_from([8, 40, 136]), W=st.sampled_from([1, 3, 4]),
       with_mask=st.booleans(), dtype=st.sampled_from([torch.float32, torch.bfloat16, torch.float16]),
       seed=st.integers(0, 10**6))
def _masked_conv_property(S, B, H, W, with_mask, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    x, w = torch.randn(S, B, H, generator=g).to(dtype), (0.5 * torch.randn(W, H, generator=g)).to(dtype)
    mask = torch.rand(B, S, generator=g) > 0.3 if with_mask else None

    def build(device):
        def call():
            leaves = [x.to(device).requires_grad_(), w.to(device).requires_grad_()]
            out = OPS.masked_causal_conv1d(*leaves, _to(mask, device))
            return [out] + _grads([out], leaves, seed)
        return _checked_calls(call, 2)
    _judge_if_valid("masked causal conv1d fwd+bwd", f"S={S} B={B} H={H} W={W} mask={with_mask} {dtype}", build,
                    ("conv_tap", "conv_bwd_mask"))


def case_masked_causal_conv1d():
    _masked_conv_property()


@settings(SETTINGS, max_examples=examples(8))
@given(rows=st.integers(1, 40), n=st.sampled_from([8, 64, 130]), gate=st.booleans(), fp32_weight=st.booleans(),
       dtype=st.sampled_from([torch.float32, torch.bfloat16, torch.float16]), seed=st.integers(0, 10**6))
def _norm_property(rows, n, gate, fp32_weight, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, n, generator=g).to(dtype)
    w = (1 + 0.1 * torch.randn(n, generator=g)).to(torch.float32 if fp32_weight else dtype)
    z = torch.randn(rows, n, generator=g).to(dtype) if gate else None

    def build(device):
        def call():
            leaves = [t.to(device).requires_grad_() for t in (x, w, z) if t is not None]
            y, rstd = OPS.rms_norm_gated(leaves[0], leaves[1], leaves[2] if gate else None, 1e-6)
            return [y, rstd] + _grads([y], leaves, seed)
        return _checked_calls(call, 2)
    _judge_if_valid("gated rmsnorm fwd+bwd", f"rows={rows} n={n} gate={gate} fp32_weight={fp32_weight} {dtype}", build,
                    ("norm_eps",))


def case_rms_norm_gated():
    _norm_property()


def case_every_op_sample_calls():
    """Every op with tensors, through its opcheck cases (the family case builders), on the device under raise: no
    report. Most ops without an Ascend C kernel run their CPU kernel on the device, so this checks the rules' ladder
    (chains, float64 / float32 runs, perturbations) on every op's outputs and written arguments. The MC2 cases (a
    process group) are left out: collectives are never re-run."""
    from test.ops.test_opcheck import CASE_MODULES
    from test.mc2 import mc2_cases

    checked = 0
    for module in CASE_MODULES:
        if module is mc2_cases:
            continue
        for op, cases in sorted(module.OPCHECK_CASES.items()):
            for name, build in sorted(cases.items()):
                args, kwargs = build()
                func = getattr(OPS, op).default
                before = oracle.stats().checked
                try:
                    with oracle.check(mode="raise"):
                        func(*_to(args, NPU), **_to(kwargs, NPU))
                except oracle.OracleMismatch as e:
                    RATES.false_alarms.append(f"{op} opcheck case {name}\n{e.report.text()}")
                    continue
                except (ValueError, TypeError, RuntimeError, NotImplementedError):
                    continue  # a host-only argument on the device, etc.: the device raised, nothing to judge
                checked += oracle.stats().checked - before
                RATES.draws += 1
                RATES.count("every op (opcheck cases)", "draws")
    assert checked >= 60, checked


def case_zz_rates():
    """The rates over every draw above (cases run in name order): zero false alarms, zero misses."""
    summary = dict(draws=RATES.draws, false_alarms=len(RATES.false_alarms), faults_effective=RATES.faults_effective,
                   faults_caught=RATES.faults_caught, faults_below_rounding=RATES.faults_below_rounding,
                   misses=len(RATES.misses), by_family=RATES.by_family, by_fault=RATES.by_fault,
                   profile=PROFILE)
    print("oracle-rates " + json.dumps(summary), file=sys.stderr)
    assert not RATES.false_alarms, "\n\n".join(RATES.false_alarms[:5])
    assert not RATES.misses, "\n".join(RATES.misses[:10])
    assert RATES.draws >= 20 and RATES.faults_effective >= 20, summary


def case_long_causal_training_step_is_not_reported():
    """A correct fp32 causal step over 700 keys (npu_fusion_attention BSND, sparse_mode 3 with the 2048x2048 mask,
    forward + backward): the backward's bound comes from the float64 chain and grows with the reduction length."""
    import torch_ops_transformer as tot

    for seed in range(3):
        g = torch.Generator().manual_seed(seed)
        q, k, v = (torch.randn(2, 700, 4, 32, generator=g).to(NPU).requires_grad_() for _ in range(3))
        mask = torch.ones(2048, 2048, dtype=torch.bool).triu(1).to(NPU)
        before = oracle.stats().checked
        with oracle.check(mode="raise"):
            out = tot.npu_fusion_attention(q, k, v, 4, "BSND", atten_mask=mask, sparse_mode=3)[0]
            out.backward(torch.randn(out.shape, generator=g).to(NPU))
        assert oracle.stats().checked - before == 2, oracle.stats()
