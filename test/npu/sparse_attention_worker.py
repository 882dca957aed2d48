"""sparse_flash_attention on the simulated npu device (the Ascend C sparse attention kernel), run by
test_sparse_attention.py through runner_worker (sim enabled; tensors `.to("npu")`).

Each case builds a call with the sparse attention tests' input builder, runs the op on npu with the CPU fallback
forbidden (TOT_NPU_SIM_NO_FALLBACK=1: the kernel ran) and on CPU, and checks the output against the float64
reference (sfa_reference) with the project's rule twice: against plain PyTorch in the same dtype and against the CPU
backend of the op; softmax_max / softmax_sum against the float64 statistics (-inf and 0 exactly where a row has no
key). The grid: query / KV layouts BSND-BSND, BSND-PA_BSND, TND-TND, TND-PA_BSND x sparse_mode 0 / 3 x
sparse_block_size 1 / 4 x rope (attention_mode 2, value = key) or plain (a value of its own head dim) x sinks, with
-1 slots anywhere, a row whose slots are all -1, a sequence without keys and padding rows. The default tier runs
a few covering combinations; the full tier the whole product. Sizes are small: the CPU runtime executes the
kernel's vector instructions element by element.
"""
import itertools
import math

import torch

from test.common.reference import check_tolerance
from test.npu.runner import full_case, no_fallback
from test.sparse_attention.sfa_reference import make_inputs, reference_of

OPS = torch.ops.npu_fa
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}


def _npu(x):
    return x.to("npu") if isinstance(x, torch.Tensor) else x


def _build(layout_q, layout_kv, sbs, rope, dtype, seed):
    """A call with ragged sequences: the second has no keys (BSND query: also padding rows), -1 slots anywhere
    and one row whose slots are all -1."""
    tnd = layout_q == "TND"
    q_lens = [3, 2, 1] if tnd else [3, 1, 2]
    kv_lens = [19, 0, 11] if layout_kv != "BSND" else [20, 0, 11]
    shape = dict(B=3, S1=3, N1=4, N2=2, Dn=24, Dr=8, S2=20, K=5, sbs=sbs, block_size=8, q_lens=q_lens,
                 kv_lens=kv_lens)
    inp = make_inputs(layout_query=layout_q, layout_kv=layout_kv, rope=rope, dtype=dtype, seed=seed, **shape)
    idx = inp["sparse_indices"]
    flat = idx.view(-1, idx.shape[-1])
    g = torch.Generator().manual_seed(seed + 7)
    holes = torch.rand(flat.shape, generator=g) < 0.25
    flat[holes] = -1
    flat[0] = -1  # query row 0, KV head 0: no key at all
    return inp


def _run(inp, sparse_mode, sinks):
    kw = dict(inp["kwargs"], sparse_mode=sparse_mode, return_softmax_lse=True, sinks=sinks)
    args = (inp["query"], inp["key"], inp["value"], inp["sparse_indices"], inp["scale_value"])
    cpu = OPS.sparse_flash_attention(*args, **kw)
    value_is_key = inp["value"] is inp["key"]
    nargs = [_npu(a) for a in args]
    if value_is_key:
        nargs[2] = nargs[1]  # the MLA cache: value is key's memory on the device too
    nkw = {k: (v if k.startswith("actual_seq") else _npu(v)) for k, v in kw.items()}
    with no_fallback(True):
        npu = OPS.sparse_flash_attention(*nargs, **nkw)
    assert all(t.device.type == "npu" for t in npu)
    return tuple(t.cpu() for t in npu), cpu


def _check(name, inp, sparse_mode, sinks, dtype):
    (out, smax, ssum), (cpu_out, cpu_max, cpu_sum) = _run(inp, sparse_mode, sinks)
    ref_out, ref_max, ref_sum = reference_of(inp, sparse_mode=sparse_mode, sinks=sinks)
    same_out = reference_of(inp, dtype=dtype, sparse_mode=sparse_mode, sinks=sinks)[0]
    assert out.dtype == dtype and out.shape == cpu_out.shape and smax.dtype == torch.float32
    check_tolerance(f"{name} vs torch", out, ref_out, same_out)
    check_tolerance(f"{name} vs CPU backend", out, ref_out, cpu_out)
    keyless = torch.isinf(ref_max)
    assert torch.equal(torch.isinf(smax), keyless) and (smax[keyless] < 0).all(), f"{name}: -inf rows"
    assert (ssum[keyless] == 0).all(), f"{name}: sum of rows without keys"
    for what, ours, ref in (("softmax_max", smax, ref_max), ("softmax_sum", ssum, ref_sum)):
        torch.testing.assert_close(ours[~keyless].double(), ref[~keyless], rtol=2e-5, atol=1e-5,
                                   msg=lambda m: f"{name} {what}: {m}")
    # rows without keys give zeros (also with a sink: the sink's value row is zero)
    rows_without = (ref_out.abs().flatten(-1).amax(-1) == 0)
    assert (out.flatten(-1)[rows_without.reshape(out.shape[:-1])] == 0).all() if rows_without.any() else True


def _case(layout_q, layout_kv, sparse_mode, sbs, rope, sinks, dtype="fp32", seed=0):
    dt = DTYPES[dtype]
    inp = _build(layout_q, layout_kv, sbs, rope, dt, seed)
    s = torch.randn(4, generator=torch.Generator().manual_seed(seed + 3)) if sinks else None
    name = f"{layout_q}/{layout_kv} mode={sparse_mode} sbs={sbs} rope={rope} sinks={sinks} {dtype}"
    _check(name, inp, sparse_mode, s, dt)


# ---- default tier: every value of every axis, pairwise, in the three dtypes ----

def case_bsnd_bsnd_mla_causal_fp16():
    _case("BSND", "BSND", 3, 1, True, False, "fp16")


def case_bsnd_paged_plain_sbs4_sinks_bf16():
    _case("BSND", "PA_BSND", 0, 4, False, True, "bf16")


def case_tnd_tnd_mla_sbs4_sinks_fp32():
    _case("TND", "TND", 3, 4, True, True, "fp32")


def case_tnd_paged_plain_mode0_fp32():
    _case("TND", "PA_BSND", 0, 1, False, False, "fp32")


def case_deepseek_like_paged_decode():
    # one query token per sequence, 16 heads of 512 + 64 sharing one latent cache, 64 selected tokens
    g = torch.Generator().manual_seed(5)
    B, N1, Dn, Dr, bs, K = 2, 16, 512, 64, 16, 64
    lens = [70, 33]
    blocks = 12
    key = torch.randn(blocks, bs, 1, Dn, generator=g).to(torch.bfloat16)
    key_rope = torch.randn(blocks, bs, 1, Dr, generator=g).to(torch.bfloat16)
    table = torch.randperm(blocks, generator=g)[:10].view(2, 5).to(torch.int32)
    query = torch.randn(B, 1, N1, Dn, generator=g).to(torch.bfloat16)
    query_rope = torch.randn(B, 1, N1, Dr, generator=g).to(torch.bfloat16)
    idx = torch.stack([torch.randint(0, n, (1, 1, K), generator=g, dtype=torch.int32) for n in lens])
    kwargs = dict(block_table=table, actual_seq_lengths_query=None, actual_seq_lengths_kv=torch.tensor(lens),
                  query_rope=query_rope, key_rope=key_rope, sparse_block_size=1, layout_query="BSND",
                  layout_kv="PA_BSND", attention_mode=2)
    inp = dict(query=query, key=key, value=key, sparse_indices=idx, scale_value=1 / math.sqrt(Dn + Dr),
               kwargs=kwargs)
    _check("deepseek-like decode", inp, 3, None, torch.bfloat16)


def case_without_lse_and_empty_batch():
    inp = _build("BSND", "BSND", 1, True, torch.float32, 4)
    args = (inp["query"], inp["key"], inp["value"], inp["sparse_indices"], inp["scale_value"])
    cpu_out = OPS.sparse_flash_attention(*args, **inp["kwargs"])[0]
    nargs = [_npu(a) for a in args]
    nargs[2] = nargs[1]
    nkw = {k: (v if k.startswith("actual_seq") else _npu(v)) for k, v in inp["kwargs"].items()}
    with no_fallback(True):
        out, smax, ssum = OPS.sparse_flash_attention(*nargs, **nkw)
    assert smax.shape == (0,) and ssum.shape == (0,) and smax.device.type == "npu"
    torch.testing.assert_close(out.cpu(), cpu_out, rtol=1e-5, atol=1e-5)
    # no query positions (S1 = 0): empty outputs and statistics, nothing launched
    empty = list(nargs)
    empty[0], empty[3] = nargs[0][:, :0], nargs[3][:, :0]
    ekw = dict(nkw, actual_seq_lengths_query=None, query_rope=nkw["query_rope"][:, :0], return_softmax_lse=True)
    with no_fallback(True):
        out, smax, ssum = OPS.sparse_flash_attention(*empty, **ekw)
    assert out.shape == (3, 0, 4, 24) and smax.shape == (3, 2, 0, 2) and out.device.type == "npu"


def case_errors_match_cpu():
    inp = _build("BSND", "PA_BSND", 1, True, torch.float32, 2)
    args = (inp["query"], inp["key"], inp["value"], inp["sparse_indices"], inp["scale_value"])
    bad = [dict(sparse_mode=1), dict(attention_mode=0), dict(sinks=torch.zeros(3)), dict(sparse_block_size=3),
           dict(block_table=None), dict(layout_kv="TND")]
    for change in bad:
        kw = dict(inp["kwargs"], **change)
        try:
            OPS.sparse_flash_attention(*args, **kw)
        except (ValueError, TypeError, RuntimeError) as e:
            cpu_err = (type(e), str(e).split("\n")[0])
        else:
            raise AssertionError(f"{change}: the CPU op accepted it")
        nargs = [_npu(a) for a in args]
        nkw = {k: (v if k.startswith("actual_seq") else _npu(v)) for k, v in kw.items()}
        try:
            OPS.sparse_flash_attention(*nargs, **nkw)
        except (ValueError, TypeError, RuntimeError) as e:
            assert (type(e), str(e).split("\n")[0]) == cpu_err, (change, e, cpu_err)
        else:
            raise AssertionError(f"{change}: the npu op accepted it")


# ---- full tier: the whole product in fp32, and 16-bit variants ----

_AXES = list(itertools.product([("BSND", "BSND"), ("BSND", "PA_BSND"), ("TND", "TND"), ("TND", "PA_BSND")],
                               [0, 3], [1, 4], [True, False], [False, True]))


@full_case
def case_full_product_fp32():
    for (lq, lkv), mode, sbs, rope, sinks in _AXES:
        _case(lq, lkv, mode, sbs, rope, sinks, "fp32", seed=11)


@full_case
def case_full_product_16bit():
    for i, ((lq, lkv), mode, sbs, rope, sinks) in enumerate(_AXES):
        _case(lq, lkv, mode, sbs, rope, sinks, "fp16" if i % 2 else "bf16", seed=13)
