"""npu_sparse_flash_attention (+ its grad): forward, softmax statistics and gradients against a float64 reference
written token by token from the documented formula (sfa_reference.py), under the project's tolerance rule; layouts
BSND / TND query with BSND, TND and paged (PA_BSND) caches; sparse_mode 0 / 3; block-wise selection; duplicates,
-1 slots and queries without keys; sinks; gradcheck in float64; torch.compile; the simulated npu device."""
import math

import pytest
import torch

import torch_ops_transformer as tot
from test.common.doc_examples import run_examples
from test.common.reference import check_tolerance
from test.common.tiers import full_only, pairwise
from test.sparse_attention.sfa_reference import make_inputs, reference_of

OPS = torch.ops.npu_fa
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
LAYOUTS = {"bsnd": ("BSND", "BSND"), "tnd": ("TND", "TND"), "bsnd_pa": ("BSND", "PA_BSND"),
           "tnd_pa": ("TND", "PA_BSND")}


def _call(inp, **extra):
    kw = dict(inp["kwargs"])
    kw.update(extra)
    return tot.npu_sparse_flash_attention(inp["query"], inp["key"], inp["value"], inp["sparse_indices"],
                                          inp["scale_value"], **kw)


def _shape_args(layout, ragged):
    lq, lkv = LAYOUTS[layout]
    args = dict(layout_query=lq, layout_kv=lkv)
    if ragged:
        args.update(q_lens=[3, 1], kv_lens=[20, 9])
    return args


@pytest.mark.asan
@pytest.mark.parametrize("dtype,layout,sparse_mode,sbs,ragged", pairwise(
    dtype=DTYPES, layout=list(LAYOUTS), sparse_mode=[3, 0], sbs=[1, 4], ragged=[False, True]))
def test_forward_matches_reference(dtype, layout, sparse_mode, sbs, ragged):
    inp = make_inputs(dtype=dtype, sbs=sbs, fill=0.3, seed=sbs + sparse_mode, **_shape_args(layout, ragged))
    out, smax, ssum = _call(inp, sparse_mode=sparse_mode, return_softmax_lse=True)
    ref = reference_of(inp, sparse_mode=sparse_mode)
    same = reference_of(inp, dtype=dtype, sparse_mode=sparse_mode)
    assert out.dtype == dtype and out.shape == ref[0].shape
    check_tolerance("out", out, ref[0], same[0], value_scale=float(inp["value"].abs().max()))
    assert smax.dtype == torch.float32 and smax.shape == ref[1].shape
    finite = torch.isfinite(ref[1])
    assert torch.equal(torch.isfinite(smax), finite)
    # the statistics are fp32 of the scores of dtype inputs: as close as the same-dtype scores
    check_tolerance("lse", (smax + ssum.log())[finite], (ref[1] + ref[2].log())[finite],
                    (same[1] + same[2].log()).float()[finite])


@pytest.mark.parametrize("dtype,layout", pairwise(dtype=DTYPES, layout=list(LAYOUTS)))
def test_backward_matches_reference(dtype, layout):
    inp = make_inputs(dtype=dtype, fill=0.3, seed=3, **_shape_args(layout, True))
    names = ("query", "key", "query_rope", "key_rope")
    base = {"query": inp["query"], "key": inp["key"], "query_rope": inp["kwargs"]["query_rope"],
            "key_rope": inp["kwargs"]["key_rope"]}
    dy = torch.randn(_call(inp)[0].shape, generator=torch.Generator().manual_seed(5))

    def grads(run, cast):
        leaves = {n: base[n].detach().to(cast).requires_grad_() for n in names}
        out = run(leaves)
        got = torch.autograd.grad(out, [leaves[n] for n in names], dy.to(out.dtype))
        return out.detach(), dict(zip(names, got))

    def ours(leaves):
        i = dict(inp, query=leaves["query"], key=leaves["key"], value=leaves["key"],
                 kwargs=dict(inp["kwargs"], query_rope=leaves["query_rope"], key_rope=leaves["key_rope"]))
        return _call(i)[0]

    def ref(dt):
        def run(leaves):
            return reference_of(inp, dtype=dt, query=leaves["query"], key=leaves["key"], value=leaves["key"],
                                query_rope=leaves["query_rope"], key_rope=leaves["key_rope"])[0]
        return run

    o, g = grads(ours, dtype)
    o64, g64 = grads(ref(torch.float64), torch.float64)
    os_, gs = grads(ref(dtype), dtype)
    check_tolerance("out", o, o64, os_)
    for n in names:
        assert g[n].dtype == dtype and g[n].shape == base[n].shape
        check_tolerance(f"d{n}", g[n], g64[n], gs[n])


def test_grad_op_matches_autograd_and_recomputes_missing_statistics():
    inp = make_inputs(fill=0.3, seed=7, q_lens=[3, 2], kv_lens=[20, 11])
    out, smax, ssum = _call(inp, return_softmax_lse=True)
    dy = torch.randn_like(out)
    kw = inp["kwargs"]
    args = (inp["query"], inp["key"], inp["value"], inp["sparse_indices"], dy, out)
    rest = dict(query_rope=kw["query_rope"], key_rope=kw["key_rope"], actual_seq_qlen=kw["actual_seq_lengths_query"],
                actual_seq_kvlen=kw["actual_seq_lengths_kv"], attention_mode=2)
    with_stats = tot.npu_sparse_flash_attention_grad(*args, smax, ssum, inp["scale_value"], 1, **rest)
    empty = torch.empty(0)
    recomputed = tot.npu_sparse_flash_attention_grad(*args, empty, empty, inp["scale_value"], 1, **rest)
    for a, b in zip(with_stats, recomputed):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert [tuple(t.shape) for t in with_stats] == [tuple(inp["query"].shape), tuple(inp["key"].shape),
                                                     tuple(inp["value"].shape), tuple(kw["query_rope"].shape),
                                                     tuple(kw["key_rope"].shape)]


@pytest.mark.parametrize("layout", ["bsnd", *full_only("tnd_pa")])
def test_gradcheck_float64(layout):
    inp = make_inputs(dtype=torch.float64, B=2, S1=2, N1=2, Dn=4, Dr=2, S2=6, K=4, block_size=4, fill=0.3, seed=11,
                      **_shape_args(layout, False))
    kw = inp["kwargs"]

    def f(q, k, qr, kr):
        return OPS.sparse_flash_attention(q, k, k, inp["sparse_indices"], inp["scale_value"], kw["block_table"],
                                          kw["actual_seq_lengths_query"], kw["actual_seq_lengths_kv"], qr, kr, 1,
                                          kw["layout_query"], kw["layout_kv"], 3, attention_mode=2)[0]

    leaves = [t.detach().clone().requires_grad_() for t in (inp["query"], inp["key"], kw["query_rope"],
                                                            kw["key_rope"])]
    assert torch.autograd.gradcheck(f, leaves, eps=1e-6, atol=1e-7, fast_mode=True)


def test_gradcheck_float64_plain_attention_with_value():
    """attention_mode 0: no rope, a value tensor of its own head dim."""
    inp = make_inputs(dtype=torch.float64, B=1, S1=3, N1=2, N2=2, Dn=4, S2=5, K=3, rope=False, fill=0.3, seed=2)

    def f(q, k, v):
        return OPS.sparse_flash_attention(q, k, v, inp["sparse_indices"], 0.7, sparse_mode=0)[0]

    leaves = [t.detach().clone().requires_grad_() for t in (inp["query"], inp["key"], inp["value"])]
    assert torch.autograd.gradcheck(f, leaves, eps=1e-6, atol=1e-7, fast_mode=True)


def test_plain_attention_with_value_matches_reference():
    inp = make_inputs(B=2, S1=3, N1=4, N2=2, Dn=16, S2=9, K=5, rope=False, fill=0.4, seed=4)
    out = _call(inp, sparse_mode=0)[0]
    ref = reference_of(inp, sparse_mode=0)[0]
    assert out.shape == (2, 3, 4, 20)
    check_tolerance("out", out, ref, reference_of(inp, dtype=torch.float32, sparse_mode=0)[0])


def test_duplicates_count_once_per_slot_and_empty_rows_are_zero():
    inp = make_inputs(B=1, S1=3, S2=8, K=4, seed=1)
    idx = inp["sparse_indices"]
    idx[0, 0, 0] = torch.tensor([0, 0, 0, -1], dtype=torch.int32)   # token 0 three times: out = v_0
    idx[0, 1, 0] = torch.tensor([-1, -1, -1, -1], dtype=torch.int32)  # nothing selected
    idx[0, 2, 0] = torch.tensor([7, 6, -1, -1], dtype=torch.int32)    # causal limit 8 - 3 + 2 = 7: both visible
    out, smax, ssum = _call(inp, return_softmax_lse=True)
    torch.testing.assert_close(out[0, 0], inp["value"][0, 0, 0].expand(4, -1))
    assert torch.equal(out[0, 1], torch.zeros_like(out[0, 1]))
    assert torch.isneginf(smax[0, 0, 1]).all() and torch.equal(ssum[0, 0, 1], torch.zeros(4))
    torch.testing.assert_close(ssum[0, 0, 0], torch.full((4,), 3.0))  # three equal scores at the max
    check_tolerance("out", out, reference_of(inp)[0], reference_of(inp, dtype=torch.float32)[0])


def test_causal_limit_hides_later_tokens_and_may_empty_a_row():
    # q_len 3, kv_len 4: query i sees j <= 1 + i; query 0 selecting only token 3 sees nothing
    inp = make_inputs(B=1, S1=3, S2=4, K=2, seed=2)
    inp["sparse_indices"][0, :, 0] = torch.tensor([[3, -1], [3, 1], [3, 0]], dtype=torch.int32)
    out3, smax, ssum = _call(inp, return_softmax_lse=True)
    out0 = _call(inp, sparse_mode=0)[0]
    assert torch.equal(out3[0, 0], torch.zeros_like(out3[0, 0])) and torch.isneginf(smax[0, 0, 0]).all()
    torch.testing.assert_close(out3[0, 1], inp["value"][0, 1, 0].expand(4, -1))   # token 3 hidden from query 1
    torch.testing.assert_close(out0[0, 0], inp["value"][0, 3, 0].expand(4, -1))
    check_tolerance("out", out3, reference_of(inp)[0], reference_of(inp, dtype=torch.float32)[0])
    assert not torch.isnan(out3).any()


def test_indices_beyond_the_kv_length_select_nothing():
    inp = make_inputs(B=1, S1=1, S2=8, K=3, kv_lens=[5], seed=3)
    inp["sparse_indices"][0, 0, 0] = torch.tensor([6, 2, 9], dtype=torch.int32)
    out = _call(inp, sparse_mode=0)[0]
    torch.testing.assert_close(out[0, 0], inp["value"][0, 2, 0].expand(4, -1))


def test_block_wise_selection_clips_the_last_block():
    inp = make_inputs(B=1, S1=1, S2=16, K=2, sbs=4, kv_lens=[10], seed=4)
    inp["sparse_indices"][0, 0, 0] = torch.tensor([2, -1], dtype=torch.int32)  # tokens 8, 9 (10, 11 beyond)
    out = _call(inp, sparse_mode=0)[0]
    ref = reference_of(inp, sparse_mode=0)[0]
    check_tolerance("out", out, ref, reference_of(inp, dtype=torch.float32, sparse_mode=0)[0])


@pytest.mark.parametrize("layout", ["bsnd", "tnd_pa"])
def test_sinks_match_reference(layout):
    inp = make_inputs(fill=0.5, seed=8, **_shape_args(layout, True))
    sinks = torch.randn(4, generator=torch.Generator().manual_seed(1)) * 2
    out, smax, ssum = _call(inp, sinks=sinks, return_softmax_lse=True)
    ref = reference_of(inp, sinks=sinks)
    check_tolerance("out", out, ref[0], reference_of(inp, dtype=torch.float32, sinks=sinks)[0])
    valid = torch.isfinite(ref[1])
    torch.testing.assert_close(smax[valid], ref[1][valid].float())
    torch.testing.assert_close(ssum[valid], ref[2][valid].float())


def test_sinks_gradients_through_the_statistics():
    inp = make_inputs(dtype=torch.float64, B=1, S1=2, N1=2, Dn=4, Dr=2, S2=5, K=3, seed=9)
    sinks = torch.tensor([0.5, -1.0])
    kw = inp["kwargs"]

    def f(q, k, qr, kr):
        return OPS.sparse_flash_attention(q, k, k, inp["sparse_indices"], 0.6, query_rope=qr, key_rope=kr,
                                          attention_mode=2, sinks=sinks)[0]

    leaves = [t.detach().clone().requires_grad_() for t in (inp["query"], inp["key"], kw["query_rope"],
                                                            kw["key_rope"])]
    assert torch.autograd.gradcheck(f, leaves, eps=1e-6, atol=1e-7, fast_mode=True)


def _sinks(dtype=torch.float32, N1=4, seed=1):
    return torch.randn(N1, generator=torch.Generator().manual_seed(seed), dtype=dtype) * 2


@pytest.mark.parametrize("dtype,layout", pairwise(dtype={"fp32": torch.float32, "bf16": torch.bfloat16},
                                                  layout=["bsnd", "tnd_pa"]))
def test_sinks_gradient_matches_reference(dtype, layout):
    """d_sinks (and d_query, which the sinks change) through autograd against autograd of the float64 reference;
    the float32 sinks of a bf16 call get a float32 gradient."""
    inp = make_inputs(dtype=dtype, fill=0.5, seed=8, **_shape_args(layout, True))
    dy = torch.randn(_call(inp)[0].shape, generator=torch.Generator().manual_seed(4))

    def grads(run, qdtype):
        q = inp["query"].detach().to(qdtype).requires_grad_()
        sinks = _sinks().requires_grad_()
        out = run(q, sinks)
        return torch.autograd.grad(out, [q, sinks], dy.to(out.dtype))

    ours = grads(lambda q, sinks: _call(dict(inp, query=q), sinks=sinks)[0], dtype)
    ref64 = grads(lambda q, sinks: reference_of(inp, query=q, sinks=sinks)[0], torch.float64)
    same = grads(lambda q, sinks: reference_of(inp, dtype=dtype, query=q, sinks=sinks)[0], dtype)
    assert ours[1].dtype == torch.float32 and ours[1].shape == (4,)
    check_tolerance("dquery", ours[0], ref64[0], same[0])
    check_tolerance("dsinks", ours[1], ref64[1], same[1])


@pytest.mark.parametrize("layout", ["bsnd", *full_only("tnd_pa")])
def test_gradcheck_float64_with_sinks(layout):
    """float64 sinks with a float64 query (the one pairing besides float32 sinks), all five inputs checked."""
    inp = make_inputs(dtype=torch.float64, B=2, S1=2, N1=2, Dn=4, Dr=2, S2=6, K=4, block_size=4, fill=0.3, seed=11,
                      **_shape_args(layout, False))
    kw = inp["kwargs"]

    def f(q, k, qr, kr, sinks):
        return OPS.sparse_flash_attention(q, k, k, inp["sparse_indices"], inp["scale_value"], kw["block_table"],
                                          kw["actual_seq_lengths_query"], kw["actual_seq_lengths_kv"], qr, kr, 1,
                                          kw["layout_query"], kw["layout_kv"], 3, attention_mode=2, sinks=sinks)[0]

    leaves = [t.detach().clone().requires_grad_() for t in (inp["query"], inp["key"], kw["query_rope"],
                                                            kw["key_rope"], _sinks(torch.float64, N1=2))]
    assert torch.autograd.gradcheck(f, leaves, eps=1e-6, atol=1e-7, fast_mode=True)


def test_grad_op_returns_d_sinks_as_autograd_does():
    """The grad op called directly: d_sinks is its sixth result, equal to autograd's (with or without the forward's
    statistics); torch_npu's five-result tuple is kept when no sinks are passed; without sinks d_sinks is empty."""
    inp = make_inputs(fill=0.3, seed=7, q_lens=[3, 2], kv_lens=[20, 11])
    kw = inp["kwargs"]
    sinks = _sinks().requires_grad_()
    out, smax, ssum = _call(inp, sinks=sinks, return_softmax_lse=True)
    dy = torch.randn_like(out)
    (expected,) = torch.autograd.grad(out, [sinks], dy)
    args = (inp["query"], inp["key"], inp["value"], inp["sparse_indices"], dy, out.detach())
    rest = dict(query_rope=kw["query_rope"], key_rope=kw["key_rope"], actual_seq_qlen=kw["actual_seq_lengths_query"],
                actual_seq_kvlen=kw["actual_seq_lengths_kv"], attention_mode=2)
    for stats in ((smax, ssum), (torch.empty(0), torch.empty(0))):
        grads = tot.npu_sparse_flash_attention_grad(*args, *stats, inp["scale_value"], 1, sinks=sinks.detach(),
                                                    **rest)
        assert len(grads) == 6
        torch.testing.assert_close(grads[5], expected, rtol=1e-5, atol=1e-6)
    assert len(tot.npu_sparse_flash_attention_grad(*args, smax, ssum, inp["scale_value"], 1, **rest)) == 5
    native = OPS.sparse_flash_attention_grad(*args, smax, ssum, inp["scale_value"], 1, kw["query_rope"],
                                             kw["key_rope"], kw["actual_seq_lengths_query"],
                                             kw["actual_seq_lengths_kv"], attention_mode=2)
    assert native[5].shape == (0,) and native[5].dtype == torch.float32


def test_noncontiguous_inputs():
    inp = make_inputs(seed=12)
    ref = _call(inp)[0]
    q = inp["query"].transpose(0, 1).contiguous().transpose(0, 1)
    k = inp["key"].transpose(1, 2).contiguous().transpose(1, 2)
    qr = inp["kwargs"]["query_rope"].transpose(0, 1).contiguous().transpose(0, 1)
    i = dict(inp, query=q, key=k, value=k, kwargs=dict(inp["kwargs"], query_rope=qr))
    assert not q.is_contiguous()
    torch.testing.assert_close(_call(i)[0], ref)


@pytest.mark.parametrize("backend", ["aot_eager", *full_only("inductor")])
def test_compile_fullgraph_forward_backward(backend):
    torch._dynamo.reset()
    inp = make_inputs(seed=13, q_lens=[3, 2], kv_lens=[20, 7])
    kw = inp["kwargs"]

    def f(q, k, qr, kr):
        out, _, _ = tot.npu_sparse_flash_attention(
            q, k, k, inp["sparse_indices"], inp["scale_value"], actual_seq_lengths_query=kw["actual_seq_lengths_query"],
            actual_seq_lengths_kv=kw["actual_seq_lengths_kv"], query_rope=qr, key_rope=kr, attention_mode=2)
        return (out * out).sum()

    base = (inp["query"], inp["key"], kw["query_rope"], kw["key_rope"])
    eager = [t.clone().requires_grad_() for t in base]
    comp = [t.clone().requires_grad_() for t in base]
    f(*eager).backward()
    out = torch.compile(f, backend=backend, fullgraph=True)(*comp)
    out.backward()
    torch.testing.assert_close(out, f(*eager).detach())
    for a, b in zip(eager, comp):
        torch.testing.assert_close(a.grad, b.grad)


def test_lengths_as_lists():
    inp = make_inputs(layout_query="TND", layout_kv="TND", q_lens=[2, 3], kv_lens=[9, 14], seed=14)
    ref = _call(inp)[0]
    kw = dict(inp["kwargs"], actual_seq_lengths_query=[2, 5], actual_seq_lengths_kv=[9, 23])
    out = tot.npu_sparse_flash_attention(inp["query"], inp["key"], inp["value"], inp["sparse_indices"],
                                         inp["scale_value"], **kw)[0]
    assert torch.equal(out, ref)


def test_softmax_statistics_are_empty_without_return_softmax_lse():
    inp = make_inputs(seed=15)
    out, smax, ssum = _call(inp)
    assert smax.shape == (0,) and ssum.shape == (0,) and smax.dtype == torch.float32
    inp_t = make_inputs(layout_query="TND", layout_kv="TND", q_lens=[2, 3], kv_lens=[9, 14], N1=4, N2=2, seed=1)
    _, smax, ssum = _call(inp_t, return_softmax_lse=True)
    assert smax.shape == (2, 5, 2)


def test_large_head_count_speed_path_matches_reference():
    """DeepSeek-like head ratio (64 query heads on one latent head), few keys: the GEMM path over gathered tiles."""
    inp = make_inputs(B=1, S1=2, N1=64, Dn=64, Dr=16, S2=40, K=24, dtype=torch.bfloat16, fill=0.2, seed=16)
    out = _call(inp)[0]
    check_tolerance("out", out, reference_of(inp)[0], reference_of(inp, dtype=torch.bfloat16)[0],
                    value_scale=float(inp["value"].abs().max()))


@pytest.mark.parametrize("rope", [True, False])
def test_decode_with_many_selected_rows_matches_reference_on_any_thread_count(rope):
    """A decode step (one query row per sequence) selecting more rows than the forward's row blocks (256) and more
    value columns than its column blocks (64), a head count off the vector width, sinks: the float64 reference,
    bit-equal on 1 and 2 threads, and each row's result equal to the same row computed in a batch (the batch runs
    its items in parallel, a lone decode row splits its blocks across the threads)."""
    inp = make_inputs(B=3, S1=1, N1=20, Dn=72 if rope else 68, Dr=8 if rope else 0, S2=700, K=600, rope=rope,
                      dtype=torch.bfloat16, fill=0.1, seed=21)
    sinks = torch.randn(20, generator=torch.Generator().manual_seed(3))
    before = torch.get_num_threads()
    try:
        runs = []
        for threads in (1, 2):
            torch.set_num_threads(threads)
            runs.append(_call(inp, sinks=sinks, return_softmax_lse=True))
    finally:
        torch.set_num_threads(before)
    for a, b in zip(*runs):
        assert torch.equal(a, b)
    out = runs[0][0]
    check_tolerance("out", out, reference_of(inp, sinks=sinks.double())[0],
                    reference_of(inp, dtype=torch.bfloat16, sinks=sinks)[0],
                    value_scale=float(inp["value"].abs().max()))
    for b in range(3):
        one = dict(inp, query=inp["query"][b:b + 1], sparse_indices=inp["sparse_indices"][b:b + 1],
                   kwargs=dict(inp["kwargs"], block_table=None))
        one["key"], one["value"] = inp["key"][b:b + 1], inp["value"][b:b + 1]
        if rope:
            one["kwargs"]["query_rope"] = inp["kwargs"]["query_rope"][b:b + 1]
            one["kwargs"]["key_rope"] = inp["kwargs"]["key_rope"][b:b + 1]
        assert torch.equal(_call(one, sinks=sinks)[0], out[b:b + 1])


def test_doc_example():
    run_examples("sparse_attention.md", "Sparse flash attention")
