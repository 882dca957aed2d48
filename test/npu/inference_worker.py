"""incre_flash_attention on the simulated npu device (Ascend C decode kernel), run by test_inference.py
through runner_worker (sim enabled; tensors `.to("npu")`).

Each case builds inputs with decode_cases.build, runs the op on npu and on CPU, and checks the npu result against
the float64 reference with the project's rule twice: against plain PyTorch in the same dtype and against the CPU
backend of the op. Sizes are small: the CPU runtime executes the kernel's vector instructions element by element.
Most cases have few (batch, KV head) pairs and so run the split-KV path (partials + SyncAll + merge);
`case_no_split_many_pairs` covers the single-pass path.
"""
from dataclasses import replace

import torch

from test.inference.decode_cases import DTYPES, OPS, Case, build, reference
from test.common.reference import check_tolerance


def _npu(x):
    return x.to("npu") if isinstance(x, torch.Tensor) else x


def _compare(c: Case, seed: int = 0):
    inp = build(c, seed)
    out = OPS.incre_flash_attention(*[_npu(a) for a in inp.args])
    assert out.device.type == "npu" and out.shape == inp.args[0].shape and out.dtype == DTYPES[c.dtype]
    ours = out.cpu().reshape(c.batch, c.q_heads, c.head_dim)
    cpu = OPS.incre_flash_attention(*inp.args).reshape(c.batch, c.q_heads, c.head_dim)
    ref64 = reference(inp, c)
    check_tolerance(f"{c} vs torch", ours, ref64, reference(inp, c, dtype=DTYPES[c.dtype]))
    check_tolerance(f"{c} vs CPU backend", ours, ref64, cpu)
    for b, length in enumerate(inp.lens):
        if length == 0:
            assert (ours[b] == 0).all(), f"{c}: sequence {b} has length 0 but a nonzero output"


def _each_dtype(c: Case):
    for dt in DTYPES:
        _compare(replace(c, dtype=dt))


# ---- contiguous cache: three layouts, ragged lengths (0, 1, tile tails), GQA groups, D tails ----

def case_contiguous_bsh_gqa2_ragged_dtail():
    _each_dtype(Case(layout="BSH", batch=3, q_heads=4, kv_heads=2, head_dim=40, kv_len=45, lens=(37, 0, 1)))


def case_contiguous_bsnd_gqa4_padding():
    _each_dtype(Case(layout="BSND", batch=2, q_heads=8, kv_heads=2, head_dim=16, kv_len=50, lens=(33, 17),
                     padding=5))


def case_contiguous_bnsd_mha_full_length():
    _each_dtype(Case(layout="BNSD", batch=2, q_heads=2, kv_heads=2, head_dim=24, kv_len=70))


def case_contiguous_mqa_head_dim_128():
    _compare(Case(layout="BSH", batch=1, q_heads=4, kv_heads=1, head_dim=128, kv_len=150, lens=(149,),
                  dtype="fp16"))


def case_no_split_many_pairs():
    # 13 batches x 2 KV heads = 26 (b, n2) pairs > 48 / 2: one task per pair, no KV split.
    _compare(Case(layout="BSH", batch=13, q_heads=4, kv_heads=2, head_dim=8, kv_len=20,
                  lens=tuple(range(0, 20, 3)) + tuple(range(1, 19, 3)), dtype="bf16"))


# ---- paged cache: block sizes 16 and 128, both cache layouts ----

def case_paged16_bsh_ragged():
    _each_dtype(Case(layout="BSH", batch=3, q_heads=4, kv_heads=2, head_dim=20, kv_len=64, block=16,
                     lens=(17, 0, 63)))


def case_paged16_bsnd_gqa4_length1():
    _compare(Case(layout="BSND", batch=2, q_heads=8, kv_heads=2, head_dim=32, kv_len=48, block=16, lens=(1, 48),
                  dtype="bf16"))


def case_paged16_bnsd_4d():
    _each_dtype(Case(layout="BNSD", batch=2, q_heads=4, kv_heads=2, head_dim=16, kv_len=64, block=16,
                     lens=(31, 50), paged_4d=True))


def case_paged128_bsh_split():
    _each_dtype(Case(layout="BSH", batch=1, q_heads=2, kv_heads=1, head_dim=16, kv_len=384, block=128,
                     lens=(300,)))


def case_paged128_bnsd_4d_tails():
    _compare(Case(layout="BNSD", batch=2, q_heads=4, kv_heads=2, head_dim=64, kv_len=256, block=128,
                  lens=(129, 255), paged_4d=True, dtype="fp16"))


def case_big_gqa_group_in_chunks():
    # 64 query heads on one KV head with D=256 do not fit UB at once: the kernel takes the group in chunks.
    _compare(Case(layout="BNSD", batch=1, q_heads=64, kv_heads=1, head_dim=256, kv_len=20, lens=(19,),
                  dtype="bf16"))


# ---- combinations the kernel leaves to the CPU kernel (atten_mask, pse_shift): still right on npu ----

def case_fallback_mask_and_pse():
    _compare(Case(layout="BSND", batch=2, q_heads=4, kv_heads=2, head_dim=16, kv_len=32, lens=(20, 9),
                  mask="B1S", pse="BN1S", dtype="fp16"))
    _compare(Case(layout="BSH", batch=2, q_heads=4, kv_heads=2, head_dim=16, kv_len=64, block=16, lens=(40, 3),
                  mask="BS"))


def case_paged_shared_blocks():
    # Prefix caching: one physical block in two sequences' tables, and twice in one table (reads only).
    c = Case(layout="BSH", batch=3, q_heads=4, kv_heads=2, head_dim=16, kv_len=64, block=16, lens=(50, 40, 33))
    args = list(build(c).args)
    table = args[6].clone()
    table[1, 0] = table[0, 0]
    table[2, 2] = table[2, 1]
    args[6] = table
    npu = OPS.incre_flash_attention(*[_npu(a) for a in args]).cpu()
    cpu = OPS.incre_flash_attention(*args)
    assert torch.allclose(npu, cpu, rtol=1e-5, atol=1e-5) and not npu.isnan().any()


# ---- bad inputs: the same errors as the CPU op ----

def _error(args):
    try:
        OPS.incre_flash_attention(*args)
    except Exception as e:  # noqa: BLE001 - compared below
        return type(e), str(e).split("\n")[0]
    raise AssertionError("no error raised")


def _same_error(args, expect):
    cpu = _error(args)
    npu = _error([_npu(a) for a in args])
    assert expect in cpu[1], cpu
    assert cpu == npu, f"CPU raised {cpu}, npu raised {npu}"


def case_errors_bad_block_table_identical_to_cpu():
    c = Case(layout="BSH", kv_len=64, block=16, lens=(50, 20, 0))
    args = list(build(c).args)
    table = args[6].clone()
    table[1, 1] = args[1].shape[0]
    _same_error(args[:6] + [table] + args[7:], "out of range")
    table = args[6].clone()
    table[1, 1] = -1
    _same_error(args[:6] + [table] + args[7:], "out of range")
    _same_error(args[:6] + [args[6][:2]] + args[7:], "block_table")
    _same_error(args[:6] + [args[6].float()] + args[7:], "block_table")
    _same_error(args[:12] + [24] + args[13:], "block_size")
    _same_error(args[:5] + [None] + args[6:], "actual_seq_lengths")
    _same_error(args[:5] + [torch.tensor([50, 20, 65])] + args[6:], "actual_seq_lengths")


def case_kernel_runs_not_the_cpu_fallback():
    # Deterministic proxy for "which path ran": the Ascend C kernel sums in another order than the CPU kernel, so
    # its fp32 result differs in the last bits; the atten_mask fallback runs the CPU kernel itself (bit-identical).
    def both(c):
        inp = build(c)
        return OPS.incre_flash_attention(*[_npu(a) for a in inp.args]).cpu(), OPS.incre_flash_attention(*inp.args)
    npu, cpu = both(Case(layout="BNSD", batch=3, q_heads=8, kv_heads=2, head_dim=64, kv_len=100, lens=(99, 50, 7)))
    assert not torch.equal(npu, cpu) and torch.allclose(npu, cpu, rtol=1e-5, atol=1e-5)
    npu, cpu = both(Case(layout="BSH", batch=2, q_heads=4, kv_heads=2, head_dim=16, kv_len=32, lens=(20, 9), mask="BS"))
    assert torch.equal(npu, cpu)


def case_int8_cache_falls_back_to_the_cpu_kernel():
    # The Ascend C kernel has no int8 path: int8 caches (KV antiquant) run the CPU kernel on CPU aliases, so the
    # npu result is bit-identical to the CPU one, for a contiguous and a paged cache and for the fused entry.
    from test.inference import int8_cases as I8
    for c in (I8.Case(layout="BSH", dtype="bf16", batch=2, q_heads=4, kv_heads=2, head_dim=32, kv_len=40, lens=(40, 9)),
              I8.Case(layout="BNSD", dtype="fp16", batch=2, q_heads=4, kv_heads=2, head_dim=32, kv_len=64, block=32,
                      lens=(50, 3), paged_4d=True, k_mode=1, v_mode=1, form="stacked")):
        inp = I8.build(c)
        kw = {k: _npu(v) for k, v in inp.kwargs.items()}
        npu = OPS.incre_flash_attention(*[_npu(a) for a in inp.args], **kw)
        assert npu.device.type == "npu"
        assert torch.equal(npu.cpu(), I8.run(inp)), c
        a = inp.args
        fia_kw = dict(block_table=a[6], num_heads=a[8], scale=a[9], input_layout=a[10], num_key_value_heads=a[11],
                      block_size=a[12], actual_seq_lengths_kv=a[5])
        out, _ = OPS.fused_infer_attention_score(_npu(a[0]), _npu(a[1]), _npu(a[2]),
                                                 **{k: _npu(v) for k, v in fia_kw.items()}, **kw)
        ref, _ = OPS.fused_infer_attention_score(a[0], a[1], a[2], **fia_kw, **inp.kwargs)
        assert out.device.type == "npu" and torch.equal(out.cpu(), ref), c
