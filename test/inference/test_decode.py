"""incre_flash_attention (decode attention): float64 reference grid, paged == contiguous, decode == last row of
full attention, determinism, torch.compile without recompiles, the torch_npu wrapper, and bad inputs."""
from dataclasses import replace

import pytest
import torch

from test.inference.decode_cases import DTYPES, OPS, Case, build, kv_layout, q_layout, reference, run
from test.common.reference import check_tolerance
from torch_ops_transformer import npu_incre_flash_attention

GRID = [
    # layouts x GQA / MQA / MHA, ragged lengths (0, 1, not multiples of the block size)
    Case(layout="BSH"),
    Case(layout="BSND", q_heads=6, kv_heads=6),
    Case(layout="BNSD", q_heads=8, kv_heads=1, lens=(0, 1, 39)),
    Case(layout="BSH", q_heads=12, kv_heads=3, head_dim=24, lens=(13, 40, 2)),
    Case(layout="BSND", q_heads=4, kv_heads=1, head_dim=64, kv_len=600, lens=(600, 517, 1)),
    # dtypes
    Case(layout="BSH", dtype="bf16", lens=(40, 17, 1)),
    Case(layout="BNSD", dtype="fp16", q_heads=8, kv_heads=2, head_dim=32),
    Case(layout="BSND", dtype="bf16", q_heads=16, kv_heads=2, head_dim=40, kv_len=300, lens=(300, 0, 77)),
    # bf16 with D % 32 == 0 (the AVX512-BF16 dot-product path where the CPU has it)
    Case(layout="BSH", dtype="bf16", q_heads=8, kv_heads=2, head_dim=64, kv_len=100, lens=(100, 37, 0), mask="BS",
         pse="BN1S"),
    Case(layout="BNSD", dtype="bf16", q_heads=6, kv_heads=3, head_dim=128, kv_len=96, block=32, lens=(96, 5, 60),
         paged_4d=True),
    # groups of 3 and 5 query heads per KV head: the blocked Q·Kᵀ splits them into 2+1 and 4+1 rows
    Case(layout="BNSD", q_heads=9, kv_heads=3, head_dim=48, kv_len=70, lens=(70, 7, 33), mask="BS", pse="BN1S"),
    Case(layout="BSH", dtype="bf16", q_heads=10, kv_heads=2, head_dim=64, kv_len=70, lens=(70, 3, 66)),
    # masks and pse
    Case(layout="BSH", mask="BS", lens=(40, 9, 0)),
    Case(layout="BNSD", mask="B1S", mask_dtype="uint8", pse="BN1S"),
    Case(layout="BSND", mask="B11S", pse="1N1S", dtype="bf16"),
    # left padding
    Case(layout="BSH", padding=3, lens=(30, 0, 37)),
    Case(layout="BNSD", padding=0, lens=(5, 40, 1), mask="BS", pse="BN1S"),
    # paged caches
    Case(layout="BSH", kv_len=64, block=16, lens=(50, 1, 0)),
    Case(layout="BSND", q_heads=8, kv_heads=2, kv_len=96, block=32, lens=(96, 33, 65), mask="B1S", pse="BN1S"),
    Case(layout="BNSD", kv_len=64, block=16, lens=(17, 64, 31), paged_4d=True),
    Case(layout="BNSD", kv_len=64, block=16, lens=(17, 64, 31), paged_4d=False, dtype="bf16"),
    Case(layout="BSH", q_heads=8, kv_heads=8, head_dim=128, kv_len=1024, block=128, lens=(1000, 129, 1024),
         dtype="fp16"),
    # (blocks, block, N2*D) caches of 16-bit dtypes: one KV head at a time within each tile of a several-head item,
    # several items per sequence (each prefetching the next item's first tile)
    Case(layout="BSH", dtype="bf16", q_heads=16, kv_heads=4, head_dim=128, kv_len=1024, block=128,
         lens=(1000, 129, 600), mask="BS", pse="BN1S"),
    Case(layout="BSND", dtype="fp16", q_heads=6, kv_heads=3, head_dim=40, kv_len=768, block=64,
         lens=(700, 768, 65), mask="B1S", pse="1N1S"),
]


def _id(c: Case) -> str:
    extra = [x for x in (c.mask and f"mask{c.mask}", c.pse and f"pse{c.pse}",
                         c.padding is not None and f"pad{c.padding}", c.block and f"block{c.block}",
                         c.paged_4d and "4d") if x]
    return f"{c.layout}-{c.dtype}-N{c.q_heads}/{c.kv_heads}-D{c.head_dim}-S{c.kv_len}-{c.lens}" + "".join(
        f"-{e}" for e in extra)


@pytest.mark.asan
@pytest.mark.parametrize("case", GRID, ids=_id)
def test_reference(case):
    inp = build(case)
    out = run(inp)
    assert out.shape == inp.args[0].shape and out.dtype == DTYPES[case.dtype]
    ours = out.reshape(case.batch, case.q_heads, case.head_dim)
    ref64 = reference(inp, case)
    same = reference(inp, case, dtype=DTYPES[case.dtype])
    check_tolerance(_id(case), ours, ref64, same)
    for b, L in enumerate(inp.lens):
        if L == 0:
            assert (ours[b] == 0).all()


@pytest.mark.asan
@pytest.mark.parametrize("layout,four_d", [("BSH", False), ("BSND", False), ("BNSD", True)])
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_paged_equals_contiguous(layout, four_d, dtype):
    B, N1, N2, D, S, block = 3, 8, 2, 32, 1024, 64
    lens = (1000, 1, 513)
    paged_case = Case(layout=layout, batch=B, q_heads=N1, kv_heads=N2, head_dim=D, kv_len=S, lens=lens,
                      dtype=dtype, block=block, paged_4d=four_d, mask="BS", pse="BN1S")
    inp = build(paged_case)
    contiguous = replace(paged_case, block=None, paged_4d=False)
    inp_c = build(contiguous)
    assert torch.equal(inp.k, inp_c.k) and torch.equal(inp.q, inp_c.q)
    torch.testing.assert_close(run(inp), run(inp_c), rtol=1e-5 if dtype == "fp32" else 1e-2,
                               atol=1e-6 if dtype == "fp32" else 1e-2)


@pytest.mark.parametrize("dtype", ["bf16", "fp16", "fp32"])
def test_paged_heads_together_nan_stays_in_its_head(dtype):
    """A NaN key of one KV head in a (blocks, block, N2*D) cache, where one item takes every KV head: the NaN rows
    are exactly that head's query group, the other rows match the float64 reference."""
    c = Case(layout="BSH", dtype=dtype, batch=2, q_heads=8, kv_heads=4, head_dim=64, kv_len=512, block=64,
             lens=(512, 300))
    inp = build(c)
    B, N2, D, bad_head, bad_pos = c.batch, c.kv_heads, c.head_dim, 2, 200
    key, table = inp.args[1], inp.args[6]
    key[int(table[0, bad_pos // c.block]), bad_pos % c.block, bad_head * D] = float("nan")
    inp.k[0, bad_head, bad_pos, 0] = float("nan")
    ours = run(inp).reshape(B, c.q_heads, D)
    ref64 = reference(inp, c)
    G = c.q_heads // N2
    want_nan = torch.zeros(B, c.q_heads, dtype=torch.bool)
    want_nan[0, bad_head * G:(bad_head + 1) * G] = True
    assert torch.equal(ours.isnan().any(-1), want_nan) and ours[want_nan].isnan().all()
    fine = ~want_nan
    check_tolerance(f"nan-{dtype}", ours[fine], ref64[fine], reference(inp, c, dtype=DTYPES[dtype])[fine])


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_decode_is_last_row_of_full_attention(dtype):
    g = torch.Generator().manual_seed(1)
    dt = DTYPES[dtype]
    B, N1, N2, S, D = 2, 8, 2, 77, 32
    q = torch.randn(B, S, N1, D, generator=g).to(dt)
    k = torch.randn(B, S, N2, D, generator=g).to(dt)
    v = torch.randn(B, S, N2, D, generator=g).to(dt)
    full = OPS.flash_attention_score(q, k, v, N1, "BSND", scale=D ** -0.5, sparse_mode=3,
                                     atten_mask=torch.triu(torch.ones(2048, 2048, dtype=torch.bool), 1))[0]
    dec = OPS.incre_flash_attention(q[:, -1:], k, v, None, None, None, None, None, N1, D ** -0.5, "BSND", N2)
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == "fp32" else dict(rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(dec[:, 0].float(), full[:, -1].float(), **tol)


@pytest.mark.parametrize("case", [
    Case(layout="BSH", q_heads=8, kv_heads=2, head_dim=64, kv_len=4096, lens=(4096, 3000, 17)),
    Case(layout="BSH", q_heads=16, kv_heads=4, head_dim=128, kv_len=4096, block=128, lens=(4096, 3000, 17),
         dtype="bf16"),
], ids=["BSH-fp32", "paged-blocks-block-N2D-bf16"])
def test_deterministic_across_threads(case):
    inp = build(case)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = run(inp)
        torch.set_num_threads(max(2, threads))
        many = run(inp)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(one, many)


def test_compile_varying_lengths_no_recompile():
    from torch._dynamo.testing import CompileCounterWithBackend

    c = Case(layout="BSH", kv_len=64, block=16, lens=(50, 1, 0))
    inp = build(c)
    cnt = CompileCounterWithBackend("aot_eager")
    args = list(inp.args)

    @torch.compile(backend=cnt, fullgraph=True)
    def f(q, k, v, lens, table):
        return OPS.incre_flash_attention(q, k, v, None, None, lens, table, None, c.q_heads, c.scale, "BSH",
                                         c.kv_heads, c.block) * 2

    for lens in ((50, 1, 0), (64, 33, 7), (3, 3, 3)):
        inp = build(replace(c, lens=lens))
        out = f(inp.args[0], inp.args[1], inp.args[2], inp.args[5], inp.args[6])
        torch.testing.assert_close(out, 2 * run(inp))
    assert cnt.frame_count == 1


# ---- the torch_npu wrapper ----

def test_wrapper_lists_and_padding_int():
    c = Case(layout="BSH", lens=(30, 0, 37), padding=3)
    inp = build(c)
    a = inp.args
    out = npu_incre_flash_attention(a[0], a[1], a[2], actual_seq_lengths=list(c.lens), kv_padding_size=3,
                                    num_heads=c.q_heads, num_key_value_heads=c.kv_heads, scale_value=c.scale,
                                    input_layout="BSH")
    torch.testing.assert_close(out, run(inp))


def test_wrapper_paged_and_defaults():
    c = Case(layout="BNSD", q_heads=4, kv_heads=4, kv_len=64, block=16, lens=(64, 20, 5), paged_4d=True)
    inp = build(c)
    a = inp.args
    out = npu_incre_flash_attention(a[0], a[1], a[2], block_table=a[6], actual_seq_lengths=[64, 20, 5],
                                    num_heads=4, input_layout="BNSD", block_size=16, scale_value=c.scale)
    torch.testing.assert_close(out, run(inp))


@pytest.mark.parametrize("arg", ["dequant_scale1", "quant_scale1", "dequant_scale2", "quant_offset2"])
def test_wrapper_quant_rejected(arg):
    # full-quantisation factors (int8 query: unsupported upstream) and an offset without quant_scale2; int8 output
    # itself (quant_scale2) is tested in test/inference/test_quant_attention.py
    inp = build(Case())
    with pytest.raises(ValueError, match=arg):
        npu_incre_flash_attention(*inp.args[:3], num_heads=4, num_key_value_heads=2, **{arg: torch.ones(1)})


# ---- bad inputs ----

def _paged_args(**over):
    c = Case(layout="BSH", kv_len=64, block=16, lens=(50, 20, 0))
    return list(build(c).args), c


def _call(args):
    return OPS.incre_flash_attention(*args)


@pytest.mark.asan
def test_bad_block_table_out_of_range():
    args, _ = _paged_args()
    table = args[6].clone()
    table[1, 1] = args[1].shape[0]
    args[6] = table
    with pytest.raises(ValueError, match=r"block_table.*out of range"):
        _call(args)
    table[1, 1] = -1
    with pytest.raises(ValueError, match=r"block_table.*out of range"):
        _call(args)


@pytest.mark.asan
@pytest.mark.parametrize("bs", [8, 24, 1024])
def test_bad_block_size(bs):
    args, _ = _paged_args()
    args[12] = bs
    with pytest.raises(ValueError, match="block_size"):
        _call(args)


@pytest.mark.asan
def test_bad_lengths_beyond_capacity():
    args, _ = _paged_args()
    args[5] = torch.tensor([65, 1, 1])
    with pytest.raises(ValueError, match="actual_seq_lengths"):
        _call(args)
    c = Case(lens=(41, 1, 1))
    with pytest.raises(ValueError, match="actual_seq_lengths"):
        run(build(c))


@pytest.mark.asan
def test_bad_query_length():
    inp = build(Case(layout="BSND"))
    args = list(inp.args)
    args[0] = torch.cat([args[0], args[0]], 1)
    with pytest.raises(ValueError, match="query length 1"):
        _call(args)


@pytest.mark.asan
def test_bad_layout_and_shapes():
    args = list(build(Case(layout="BSH")).args)
    bad = list(args)
    bad[10] = "TND"
    with pytest.raises(ValueError, match="input_layout"):
        _call(bad)
    bad = list(args)
    bad[10] = "BNSD"  # 3-D query with a 4-D layout
    with pytest.raises(ValueError, match="query"):
        _call(bad)
    bad = list(args)
    bad[1] = bad[1][:, :, :-1]
    with pytest.raises(ValueError, match="key"):
        _call(bad)
    bad = list(args)
    bad[3] = torch.zeros(3, 5, dtype=torch.bool)  # mask narrower than the cache
    with pytest.raises(ValueError, match="atten_mask"):
        _call(bad)


def test_bad_head_counts():
    args = list(build(Case(layout="BSND", q_heads=4, kv_heads=2)).args)
    args[11] = 3
    with pytest.raises(ValueError, match="num_key_value_heads"):
        _call(args)


def test_bad_dtypes():
    args = list(build(Case()).args)
    bad = list(args)
    bad[1] = bad[1].to(torch.bfloat16)
    with pytest.raises(TypeError, match="dtype"):
        _call(bad)
    bad = list(args)
    bad[3] = torch.zeros(3, 40, dtype=torch.float32)
    with pytest.raises(TypeError, match="atten_mask"):
        _call(bad)


@pytest.mark.asan
def test_kv_padding_size_overflow_is_an_error():
    # pad + length past int64 used to wrap, pass the capacity check and read outside the cache.
    q, k = torch.randn(1, 2, 1, 16), torch.randn(1, 2, 8, 16)
    for pad in (2**63 - 2, 2**63 - 1, 2**62):
        with pytest.raises(ValueError, match="kv_padding_size"):
            OPS.incre_flash_attention(q, k, k, num_heads=2, input_layout="BNSD", actual_seq_lengths=torch.tensor([4]),
                                      kv_padding_size=torch.tensor([pad]))
    with pytest.raises(ValueError, match="kv_padding_size.*>= 0"):
        OPS.incre_flash_attention(q, k, k, num_heads=2, input_layout="BNSD", actual_seq_lengths=torch.tensor([4]),
                                  kv_padding_size=torch.tensor([-1]))
