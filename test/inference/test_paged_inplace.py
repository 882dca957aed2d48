"""Paged prefill read in place and the work split of mixed batches.

A paged fused_infer_attention_score call that is not a pure decode runs the prefill kernel on the cache in place
(its K/V packing walks the block table; nothing is gathered first), and each sequence of a batch chooses how many
query heads one work item packs (a decode row inside a mixed batch packs its whole group). Checked here: mixed
batches (a chunked prefill next to decode rows, GQA) on every cache layout against a float64 reference (tolerance
rule: max|ours - ref64| <= 2 * max|torch same dtype - ref64| + 1e-5), results bit-identical for 1 and 2 threads, and
equal to the same call on a contiguous TND cache within the tolerance rule; plus the ISA-chosen default tiles.
"""
import pytest
import torch

import torch_ops_transformer as tot
from test.inference.test_fia_serving import CAUSAL, N1, N2, SCALE, Batch

MIXED = ([9, 1, 1, 3, 1], [40, 17, 70, 3, 33])    # chunked prefill, decode rows, a whole short prompt


def call(batch, layout, block_size=16):
    q = batch.tnd("q")
    k, table = batch.paged("k", block_size, layout)
    v, _ = batch.paged("v", block_size, layout)
    return tot.npu_fused_infer_attention_score(
        q, k, v, atten_mask=CAUSAL, actual_seq_lengths=torch.tensor(batch.q_lens).cumsum(0).tolist(),
        actual_seq_lengths_kv=batch.kv_lens, num_heads=N1, num_key_value_heads=N2, scale=SCALE, input_layout="TND",
        sparse_mode=3, block_table=table, block_size=block_size, softmax_lse_flag=True)


def bound(want, dtype):
    return 2 * (want.to(dtype).double() - want).abs().max().item() + 1e-5


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("layout", ["3d", "4d_bsnd", "4d_bnsd"])
def test_mixed_batch_in_place(dtype, layout):
    batch = Batch(*MIXED, dtype=dtype)
    nan_free = Batch(*MIXED, dtype=dtype)              # (the paged caches hold NaN outside the sequences)
    refs = batch.reference(3)
    want = torch.cat([r[0] for r in refs])
    old = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        out1, lse1 = call(batch, layout)
        torch.set_num_threads(2)
        out2, lse2 = call(batch, layout)
    finally:
        torch.set_num_threads(old)
    assert torch.equal(out1, out2) and torch.equal(lse1, lse2), "results depend on the thread count"
    err = (out1.double() - want).abs().max().item()
    assert err <= bound(want, dtype), f"max error {err:.3g}"
    want_lse = torch.cat([r[1] for r in refs])[..., None]
    assert (lse1.double() - want_lse).abs().max().item() <= bound(want_lse, torch.float32)
    # the same call on a contiguous TND cache
    ends = lambda lens: torch.tensor(lens).cumsum(0).tolist()
    contig, _ = tot.npu_fused_infer_attention_score(
        nan_free.tnd("q"), nan_free.tnd("k"), nan_free.tnd("v"), atten_mask=CAUSAL,
        actual_seq_lengths=ends(batch.q_lens), actual_seq_lengths_kv=ends(batch.kv_lens), num_heads=N1,
        num_key_value_heads=N2, scale=SCALE, input_layout="TND", sparse_mode=3)
    assert (contig.double() - out1.double()).abs().max().item() <= 2 * bound(want, dtype)


def test_paged_block_table_checked():
    batch = Batch(*MIXED)
    q = batch.tnd("q")
    k, table = batch.paged("k", 16, "3d")
    v, _ = batch.paged("v", 16, "3d")
    table[0, 0] = k.shape[0] + 5
    with pytest.raises((ValueError, RuntimeError), match="block_table"):
        tot.npu_fused_infer_attention_score(
            q, k, v, atten_mask=CAUSAL, actual_seq_lengths=torch.tensor(batch.q_lens).cumsum(0).tolist(),
            actual_seq_lengths_kv=batch.kv_lens, num_heads=N1, num_key_value_heads=N2, scale=SCALE,
            input_layout="TND", sparse_mode=3, block_table=table, block_size=16)


def test_default_tiles_by_isa():
    ops = torch.ops.npu_fa
    for d in (64, 128, 256):
        q, kv = ops.attention_default_tiles(d, 2, "amx")      # AMX-BF16: whole 16-row / 32-key tiles, big key blocks
        assert q % 32 == 0 and 64 <= q <= 128 and kv % 32 == 0 and 512 <= kv <= 1024
        q4, kv4 = ops.attention_default_tiles(d, 4, "amx")    # fp32 products do not run on AMX
        assert [q4, kv4] == ops.attention_default_tiles(d, 4, "avx512")
        qa, kva = ops.attention_default_tiles(d, 2, "avx512")
        assert qa == 64 and kva % 64 == 0 and 64 <= kva <= 1024
        assert ops.attention_default_tiles(d, 2, "avx2") == [qa, kva]
    caps = torch.cpu.get_capabilities() if hasattr(torch.cpu, "get_capabilities") else {}
    amx = bool(caps.get("amx_tile", False) and caps.get("amx_bf16", False))
    assert ops.attention_default_tiles(128, 2, "auto") == ops.attention_default_tiles(128, 2, "amx" if amx else "avx512")
    with pytest.raises((ValueError, RuntimeError), match="isa"):
        ops.attention_default_tiles(128, 2, "sse")
