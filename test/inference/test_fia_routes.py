"""fused_infer_attention_score decides how to compute a call once, in the op (common/inference/fia_route.cpp), and
takes the learnable sink itself. On every route — dense prefill, paged decode (the decode op on the cache in place),
paged prefill, an int8 cache (dequantised by the prefill kernel), MLA — the op called with `learnable_sink=s` equals
torch_npu's wrapper (`tot.npu_fused_infer_attention_score_v2(..., learnable_sink=s)`, which only translates calling
conventions) bit for bit, and the float64 reference of test/common under the project's tolerance rule; so does the
gradient of the sink. One test per new error rule."""
import math
from dataclasses import dataclass, field
from typing import Dict, List, Optional

import pytest
import torch

import torch_ops_transformer as tot
from test.common.reference import attention_reference, check_tolerance, reference_with_grads

OPS = torch.ops.npu_fa
N1, D, SCALE = 4, 16, 0.25
SINK = torch.tensor([-1.0, 0.0, 2.5, 6.0])
CAUSAL = torch.ones(2048, 2048, dtype=torch.bool).triu(1)  # the optimised mask of sparse_mode 3


# ---------------------------------------------------------------------------------------------------------------
# Calls: TND, sparse_mode 3 (bottom-right causal: each sequence's query rows are the last of its keys)
# ---------------------------------------------------------------------------------------------------------------

@dataclass
class Call:
    args: tuple                                  # (query, key, value) as the op takes them
    kwargs: dict                                 # the op's keyword arguments, learnable_sink and lse flag aside
    ref: Dict[str, torch.Tensor]                 # float64 query / key / value for the reference (contiguous TND)
    q_ends: List[int]
    kv_ends: List[int]
    v2: dict = field(default_factory=dict)       # wrapper-only arguments (v2's dequant names of the int8 factors)

    def op(self, sink=None, lse=False):
        return OPS.fused_infer_attention_score(*self.args, **self.kwargs, softmax_lse_flag=lse, learnable_sink=sink)

    def wrapper(self, sink=None, lse=False):
        kw = dict(self.kwargs)
        renamed = dict(num_query_heads=kw.pop("num_heads"), softmax_scale=kw.pop("scale"),
                       actual_seq_qlen=kw.pop("actual_seq_lengths").tolist(),
                       actual_seq_kvlen=kw.pop("actual_seq_lengths_kv").tolist())
        for name in [k for k in kw if "antiquant" in k]:
            kw.pop(name)
        return tot.npu_fused_infer_attention_score_v2(*self.args, **kw, **renamed, **self.v2, atten_mask=CAUSAL,
                                                      return_softmax_lse=lse, learnable_sink=sink)

    def reference(self, sink, dtype: Optional[torch.dtype] = torch.float64):
        """(out [T, N1, Dv], lse [T, N1]) in float64, or computed in `dtype` from the inputs rounded to it."""
        q, k, v = (self.ref[n] if dtype == torch.float64 else self.ref[n].to(dtype) for n in ("query", "key", "value"))
        return attention_reference(q, k, v, N1, "TND", actual_seq_qlen=self.q_ends, actual_seq_kvlen=self.kv_ends,
                                   scale=SCALE, sparse_mode=3, sink=sink, compute_dtype=dtype)


def _sequences(lens, heads, dim, dtype, g):
    return [torch.randn(n, heads, dim, generator=g).to(dtype) for n in lens]


def _ends(lens):
    return torch.tensor(lens).cumsum(0)


def _paged(seqs, block_size, g):
    """(cache (num_blocks, block_size, heads, dim), block_table int32): each sequence's blocks scattered over a
    shuffled pool; NaN in unused blocks and past each sequence's end, so a read outside a sequence shows."""
    per = [max(1, -(-s.shape[0] // block_size)) for s in seqs]
    total = sum(per) + 2
    perm = torch.randperm(total, generator=g).tolist()
    cache = torch.full((total, block_size) + tuple(seqs[0].shape[1:]), math.nan, dtype=seqs[0].dtype)
    table = torch.zeros(len(seqs), max(per) + 1, dtype=torch.int32)  # a spare column: never read
    for b, s in enumerate(seqs):
        for i in range(per[b]):
            blk = perm.pop()
            table[b, i] = blk
            rows = s[i * block_size:(i + 1) * block_size]
            cache[blk, :rows.shape[0]] = rows
    return cache, table


def _kwargs(q_lens, kv_ends_or_lens, n2, **extra):
    return dict(actual_seq_lengths=_ends(q_lens), actual_seq_lengths_kv=torch.tensor(kv_ends_or_lens), num_heads=N1,
                scale=SCALE, input_layout="TND", num_key_value_heads=n2, sparse_mode=3, **extra)


def dense(dtype=torch.float32, q_lens=(3, 5, 1), kv_lens=(6, 9, 4)) -> Call:
    g = torch.Generator().manual_seed(1)
    qs, ks, vs = (_sequences(lens, h, D, dtype, g) for lens, h in ((q_lens, N1), (kv_lens, 2), (kv_lens, 2)))
    q, k, v = torch.cat(qs), torch.cat(ks), torch.cat(vs)
    return Call((q, k, v), _kwargs(q_lens, _ends(kv_lens).tolist(), 2), dict(query=q.double(), key=k.double(),
                value=v.double()), _ends(q_lens).tolist(), _ends(kv_lens).tolist())


def paged(q_lens, kv_lens, dtype=torch.float32, block_size=16) -> Call:
    g = torch.Generator().manual_seed(2)
    qs, ks, vs = (_sequences(lens, h, D, dtype, g) for lens, h in ((q_lens, N1), (kv_lens, 2), (kv_lens, 2)))
    k_cache, table = _paged(ks, block_size, torch.Generator().manual_seed(3))
    v_cache, _ = _paged(vs, block_size, torch.Generator().manual_seed(3))
    q = torch.cat(qs)
    return Call((q, k_cache, v_cache), _kwargs(q_lens, list(kv_lens), 2, block_table=table, block_size=block_size),
                dict(query=q.double(), key=torch.cat(ks).double(), value=torch.cat(vs).double()),
                _ends(q_lens).tolist(), _ends(kv_lens).tolist())


def int8(q_lens=(3, 5), kv_lens=(6, 9)) -> Call:
    """An int8 cache with per-channel factors [N2, D] and offsets, bf16 queries: x = (x_int8 + offset) * scale."""
    g = torch.Generator().manual_seed(4)
    q = torch.cat(_sequences(q_lens, N1, D, torch.bfloat16, g))
    k8, v8 = (torch.randint(-127, 128, (sum(kv_lens), 2, D), generator=g, dtype=torch.int8) for _ in range(2))
    scale = {n: torch.rand(2, D, generator=g) * 0.02 + 0.005 for n in ("key", "value")}
    offset = {n: torch.randint(-3, 4, (2, D), generator=g).float() for n in ("key", "value")}
    deq = {n: (t.double() + offset[n].double()) * scale[n].double() for n, t in (("key", k8), ("value", v8))}
    factors = dict(key_antiquant_scale=scale["key"], key_antiquant_offset=offset["key"],
                   value_antiquant_scale=scale["value"], value_antiquant_offset=offset["value"])
    v2 = dict(dequant_scale_key=scale["key"], dequant_offset_key=offset["key"], dequant_scale_value=scale["value"],
              dequant_offset_value=offset["value"])
    return Call((q, k8, v8), _kwargs(q_lens, _ends(kv_lens).tolist(), 2, **factors),
                dict(query=q.double(), key=deq["key"], value=deq["value"]), _ends(q_lens).tolist(),
                _ends(kv_lens).tolist(), v2)


def mla(q_lens=(1, 3), kv_lens=(20, 9), rope=8, block_size=16) -> Call:
    """Absorbed MLA: one latent KV head read as key and value (a paged cache), rope parts added to the scores."""
    g = torch.Generator().manual_seed(5)
    q, qr = (torch.cat(_sequences(q_lens, N1, d, torch.float32, g)) for d in (D, rope))
    latent, k_rope = (_sequences(kv_lens, 1, d, torch.float32, g) for d in (D, rope))
    cache, table = _paged(latent, block_size, torch.Generator().manual_seed(6))
    rope_cache, _ = _paged(k_rope, block_size, torch.Generator().manual_seed(6))
    c = torch.cat(latent).double()
    return Call((q, cache, cache), _kwargs(q_lens, list(kv_lens), 1, block_table=table, block_size=block_size,
                                           query_rope=qr, key_rope=rope_cache),
                dict(query=torch.cat([q, qr], -1).double(), key=torch.cat([c, torch.cat(k_rope).double()], -1),
                     value=c), _ends(q_lens).tolist(), _ends(kv_lens).tolist())


ROUTES = {
    "dense_prefill": lambda: dense(),
    "dense_prefill_bf16": lambda: dense(torch.bfloat16),
    "paged_decode": lambda: paged([1, 1, 1], [40, 0, 17]),       # one token per sequence, one without keys
    "paged_prefill": lambda: paged([1, 6, 1, 11], [19, 30, 2, 11]),
    "int8_dequant": int8,
    "mla": mla,
}


def _decode_op_ran(call, **kw):
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        result = call(**kw)
    return result, "npu_fa::incre_flash_attention" in {e.name for e in prof.events()}


def _check_against_reference(name, call, out, lse, lse_flag):
    ref, ref_lse = call.reference(SINK)
    same, same_lse = call.reference(SINK, out.dtype)
    check_tolerance(name, out, ref, same)
    if lse_flag:
        assert lse.shape == (out.shape[0], N1, 1) and lse.dtype == torch.float32, name
        check_tolerance(name + " lse", lse[..., 0], ref_lse, same_lse.float())
    else:
        assert lse.numel() == 0, name


@pytest.mark.parametrize("lse_flag", [False, True], ids=["no_lse", "lse"])
@pytest.mark.parametrize("route", list(ROUTES))
def test_op_with_sink_equals_the_wrapper_and_the_reference(route, lse_flag):
    call = ROUTES[route]()
    (out, lse), decoded = _decode_op_ran(call.op, sink=SINK, lse=lse_flag)
    assert decoded == (route == "paged_decode" and not lse_flag), "the decode route is the op's, for one-token calls"
    w_out, w_lse = call.wrapper(sink=SINK, lse=lse_flag)
    assert torch.equal(out, w_out) and torch.equal(lse, w_lse), "the wrapper calls the op once, with these arguments"
    _check_against_reference(f"{route} lse={lse_flag}", call, out, lse, lse_flag)


@pytest.mark.parametrize("route", list(ROUTES))
def test_sink_of_minus_inf_is_the_call_without_sink(route):
    call = ROUTES[route]()
    out, lse = call.op(sink=torch.full((N1,), -math.inf), lse=True)
    plain, plain_lse = call.op(lse=True)
    assert torch.equal(out, plain) and torch.equal(lse, plain_lse)


# ---------------------------------------------------------------------------------------------------------------
# The sink's gradient (the op's only differentiable input, as it was through the wrapper's former Python formula)
# ---------------------------------------------------------------------------------------------------------------

GRAD_ROUTES = ["dense_prefill", "paged_decode", "paged_prefill", "int8_dequant", "mla"]


@pytest.mark.parametrize("lse_flag", [False, True], ids=["no_lse", "lse"])
@pytest.mark.parametrize("route", GRAD_ROUTES)
def test_sink_gradient_through_the_output(route, lse_flag):
    call = ROUTES[route]()
    sink = SINK.clone().requires_grad_()
    out, _ = call.op(sink=sink, lse=lse_flag)
    dy = torch.randn(out.shape, generator=torch.Generator().manual_seed(7)).to(out.dtype)
    (grad,) = torch.autograd.grad(out, sink, dy)
    w_sink = SINK.clone().requires_grad_()
    (w_grad,) = torch.autograd.grad(call.wrapper(sink=w_sink, lse=lse_flag)[0], w_sink, dy)
    assert torch.equal(grad, w_grad)
    kw = dict(head_num=N1, input_layout="TND", actual_seq_qlen=call.q_ends, actual_seq_kvlen=call.kv_ends,
              scale=SCALE, sparse_mode=3)
    inputs = dict(call.ref, sink=SINK)
    _, _, ref = reference_with_grads(inputs, dy.double(), torch.float64, **kw)
    same_inputs = {n: t.to(out.dtype) for n, t in call.ref.items()}
    _, _, same = reference_with_grads(dict(same_inputs, sink=SINK), dy, None, **kw)
    check_tolerance(f"{route} dsink", grad, ref["sink"], same["sink"])


@pytest.mark.parametrize("route", GRAD_ROUTES)
def test_sink_gradient_through_the_lse(route):
    """d lse'/d sink = exp(sink - lse') per row: the sink's probability."""
    call = ROUTES[route]()
    sink = SINK.clone().requires_grad_()
    _, lse = call.op(sink=sink, lse=True)
    g = torch.randn(lse.shape, generator=torch.Generator().manual_seed(8))
    (grad,) = torch.autograd.grad(lse, sink, g)
    _, lse64 = call.reference(SINK)
    ref = (g[..., 0].double() * torch.exp(SINK.double() - lse64)).sum(0)
    dtype = call.args[0].dtype  # torch_same_dtype: the same formula in the query's dtype
    _, lse_same = call.reference(SINK, dtype)
    same = (g[..., 0].to(dtype) * torch.exp(SINK.to(dtype) - lse_same)).sum(0)
    check_tolerance(f"{route} dsink via lse", grad, ref, same)


def test_wrapper_sink_of_another_dtype_gets_its_gradient():
    call = ROUTES["paged_prefill"]()
    sink = SINK.to(torch.bfloat16).requires_grad_()
    out, _ = call.wrapper(sink=sink)
    out.sum().backward()
    assert sink.grad is not None and sink.grad.dtype == torch.bfloat16 and torch.isfinite(sink.grad).all()


def test_no_gradient_without_a_sink_that_requires_it():
    call = ROUTES["dense_prefill"]()
    q = call.args[0].clone().requires_grad_()
    out, _ = OPS.fused_infer_attention_score(q, *call.args[1:], **call.kwargs, learnable_sink=SINK)
    assert torch.autograd.grad(out.sum(), q, allow_unused=True) == (None,)  # an inference op: no query gradient


# ---------------------------------------------------------------------------------------------------------------
# The decision is the op's: what the wrapper used to decide in Python now holds for the op called directly
# ---------------------------------------------------------------------------------------------------------------

def test_tnd_decode_batch_reads_the_cache_in_place_from_the_op():
    call = paged([1, 1, 1], [40, 5, 17])
    for sink in (SINK, None):
        (out, lse), decoded = _decode_op_ran(call.op, sink=sink)
        assert decoded and lse.numel() == 0
    _check_against_reference("tnd decode", call, call.op(sink=SINK)[0], torch.empty(0), False)


@pytest.mark.parametrize("layout", ["BNSD", "BSH"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=["fp32", "bf16", "fp16"])
def test_contiguous_one_token_call_runs_the_decode_op(dtype, layout):
    """A one-token call on a contiguous cache of any dtype takes the decode op (key chunks over the threads), with
    per-sequence lengths, a per-sequence mask and a sink; out of the decode op, equal to the float64 reference."""
    g = torch.Generator().manual_seed(7)
    B, S = 3, 300
    q, k, v = (torch.randn(B, n, s, D, generator=g).to(dtype) for n, s in ((N1, 1), (2, S), (2, S)))
    kv_lens = [S, 37, 0]
    mask = torch.rand(B, 1, 1, S, generator=g) < 0.2  # True hides a key
    kw = dict(num_heads=N1, scale=SCALE, num_key_value_heads=2, actual_seq_lengths_kv=torch.tensor(kv_lens),
              atten_mask=mask, learnable_sink=SINK)
    to_layout = (lambda t: t) if layout == "BNSD" else (lambda t: t.transpose(1, 2).flatten(2))
    (out, _), decoded = _decode_op_ran(lambda: OPS.fused_infer_attention_score(
        to_layout(q), to_layout(k), to_layout(v), input_layout=layout, **kw))
    assert decoded, "a contiguous one-token call is the decode op's"
    refs = [attention_reference(q[b:b + 1], k[b:b + 1, :, :kv_lens[b]], v[b:b + 1, :, :kv_lens[b]], N1, "BNSD",
                                atten_mask=mask[b:b + 1, ..., :kv_lens[b]], scale=SCALE, sink=SINK, compute_dtype=cd)[0]
            for cd in (torch.float64, dtype) for b in range(B)]
    ref, same = torch.cat(refs[:B]), torch.cat(refs[B:])
    out = out if layout == "BNSD" else out.view(B, 1, N1, D).transpose(1, 2)
    check_tolerance(f"{dtype} {layout}", out, ref, same)


def test_contiguous_one_token_call_reports_bad_arguments_as_its_own():
    """The decode route of a contiguous call is taken after the prefill parser's checks: errors name this op."""
    q, k = torch.randn(2, N1, 1, 2 * D), torch.randn(2, 2, 8, D)
    with pytest.raises(ValueError, match=r"fused_infer_attention_score: arguments 'query' and 'key' must have the "
                                         r"same head dim; got 32 and 16"):
        OPS.fused_infer_attention_score(q, k, k, num_heads=N1, scale=SCALE, input_layout="BNSD",
                                        num_key_value_heads=2)


def test_window_blocks_before_the_window_are_never_read_by_the_op():
    """sparse_mode 4 over a paged cache: block_table entries wholly before the window may be -1 (freed)."""
    call = paged([1, 4, 1], [200, 150, 9])
    pre, table = 20, call.kwargs["block_table"].clone()
    for row, (lq, lk) in enumerate(zip([1, 4, 1], [200, 150, 9])):
        table[row, :max(0, lk - lq - pre) // 16] = -1
    kw = dict(call.kwargs, block_table=table, sparse_mode=4, pre_tokens=pre, next_tokens=0)
    out, lse = OPS.fused_infer_attention_score(*call.args, **kw, softmax_lse_flag=True, learnable_sink=SINK)
    whole, whole_lse = OPS.fused_infer_attention_score(*call.args, **dict(kw, block_table=call.kwargs["block_table"]),
                                                       softmax_lse_flag=True, learnable_sink=SINK)
    torch.testing.assert_close(out, whole, rtol=0, atol=0)
    torch.testing.assert_close(lse, whole_lse, rtol=0, atol=0)


# ---------------------------------------------------------------------------------------------------------------
# Bad learnable_sink: the error names the argument, the expectation and what was given (eager and fake kernels)
# ---------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("device", ["cpu", "meta"])
def test_sink_of_another_dtype_is_a_type_error(device):
    call = ROUTES["dense_prefill"]()
    args = [t.to(device) for t in call.args]
    kw = {k: (v.to(device) if isinstance(v, torch.Tensor) and not k.startswith("actual") else v)
          for k, v in call.kwargs.items()}
    with pytest.raises(TypeError, match=r"fused_infer_attention_score: argument 'learnable_sink' must be a float32 "
                                        r"tensor \(one logit per query head\); got (BFloat16|torch\.bfloat16)"):
        OPS.fused_infer_attention_score(*args, **kw, learnable_sink=SINK.to(torch.bfloat16).to(device))


@pytest.mark.parametrize("shape", [(2,), (1, N1), ()], ids=["too_few", "2d", "scalar"])
@pytest.mark.parametrize("device", ["cpu", "meta"])
def test_sink_of_another_shape_is_a_value_error(device, shape):
    call = ROUTES["paged_decode"]()
    args = [t.to(device) for t in call.args]
    kw = {k: (v.to(device) if isinstance(v, torch.Tensor) and not k.startswith("actual") else v)
          for k, v in call.kwargs.items()}
    got = str(list(shape)).replace("[", r"\[").replace("]", r"\]")
    with pytest.raises(ValueError, match=rf"fused_infer_attention_score: argument 'learnable_sink' must have shape "
                                         rf"\[num_heads={N1}\] \(one logit per query head\); got {got}"):
        OPS.fused_infer_attention_score(*args, **kw, learnable_sink=torch.zeros(shape, device=device))
