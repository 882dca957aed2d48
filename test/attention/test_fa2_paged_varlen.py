"""flash_attn_varlen_func(block_table=...): FlashAttention-2's paged K/V ([num_blocks, page_block_size, N2, D],
block_table int32 [B, max_blocks], cu_seqlens_k cumulative KV lengths) against the float64 reference on each
sequence's logical keys, and bad inputs."""
import math

import pytest
import torch

import torch_ops_transformer as tot
from test.attention.fa2_reference import attend
from test.common.reference import DTYPES, check_tolerance


def _paged_case(block_size, dtype, qlens, klens, n=4, n2=2, d=16, seed=0):
    gen = torch.Generator().manual_seed(seed)
    b = len(qlens)
    max_blocks = max(math.ceil(max(klens) / block_size), 1) + 1
    num_blocks = b * max_blocks + 2
    k_cache = torch.randn(num_blocks, block_size, n2, d, generator=gen).to(dtype)
    v_cache = torch.randn(num_blocks, block_size, n2, d, generator=gen).to(dtype)
    table = torch.randperm(num_blocks, generator=gen)[:b * max_blocks].view(b, max_blocks).to(torch.int32)
    q = torch.randn(sum(qlens), n, d, generator=gen).to(dtype)
    cu_q = torch.tensor([0] + qlens).cumsum(0).to(torch.int32)
    cu_k = torch.tensor([0] + klens).cumsum(0).to(torch.int32)
    return q, k_cache, v_cache, table, cu_q, cu_k


def _reference(q, k_cache, v_cache, table, cu_q, cu_k, causal, window, dtype):
    outs, lses = [], []
    for b in range(table.shape[0]):
        length = int(cu_k[b + 1] - cu_k[b])
        keys = k_cache[table[b].long()].flatten(0, 1)[:length].to(dtype)
        values = v_cache[table[b].long()].flatten(0, 1)[:length].to(dtype)
        o, lse = attend(q[cu_q[b]:cu_q[b + 1]].to(dtype), keys, values, q.shape[-1] ** -0.5, causal, window)
        outs.append(o)
        lses.append(lse)
    return torch.cat(outs), torch.cat(lses, dim=1)


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("block_size", [16, 32, 256])
@pytest.mark.parametrize("causal,window", [(False, (-1, -1)), (True, (-1, -1)), (False, (4, 2))])
def test_paged_varlen(dtype, block_size, causal, window):
    qlens, klens = [3, 1, 6, 0], [20, 33, 6, 5]
    dt = DTYPES[dtype]
    q, kc, vc, table, cu_q, cu_k = _paged_case(block_size, dt, qlens, klens)
    out, lse, _ = tot.flash_attn_varlen_func(q, kc, vc, cu_q, cu_k, max(qlens), max(klens), causal=causal,
                                             window_size=window, return_attn_probs=True, block_table=table)
    ref, ref_lse = _reference(q, kc, vc, table, cu_q, cu_k, causal, window, torch.float64)
    same, same_lse = _reference(q, kc, vc, table, cu_q, cu_k, causal, window, dt)
    check_tolerance("paged varlen out", out, ref, same)
    check_tolerance("paged varlen lse", lse, ref_lse, same_lse)
    # the same numbers as the packed (non-paged) call on the gathered keys
    keys = torch.cat([kc[table[b].long()].flatten(0, 1)[:n] for b, n in enumerate(klens)])
    values = torch.cat([vc[table[b].long()].flatten(0, 1)[:n] for b, n in enumerate(klens)])
    packed = tot.flash_attn_varlen_func(q, keys, values, cu_q, cu_k, max(qlens), max(klens), causal=causal,
                                        window_size=window)
    assert torch.equal(out, packed)


def test_paged_varlen_int64_table_and_shared_blocks():
    q, kc, vc, table, cu_q, cu_k = _paged_case(16, torch.float32, [2, 2], [10, 10])
    table[1] = table[0]  # a shared prefix: both sequences read the same blocks
    out = tot.flash_attn_varlen_func(q, kc, vc, cu_q, cu_k, 2, 10, block_table=table.long())
    ref, _ = _reference(q, kc, vc, table, cu_q, cu_k, False, (-1, -1), torch.float64)
    torch.testing.assert_close(out.double(), ref, atol=1e-5, rtol=1e-5)


def _bad(**over):
    q, kc, vc, table, cu_q, cu_k = _paged_case(16, torch.float32, [2, 2], [10, 12])
    kw = dict(q=q, k=kc, v=vc, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=2, max_seqlen_k=12,
              block_table=table)
    kw.update(over)
    return kw


BAD = {
    "block_table_dtype": (_bad(block_table=torch.zeros(2, 2)), TypeError,
                          r"argument 'block_table' must be an int32 tensor .* got torch.float32"),
    "block_table_batch": (_bad(block_table=torch.zeros(3, 2, dtype=torch.int32)), ValueError,
                          r"argument 'block_table' must have shape \[batch, max_blocks_per_seq\] with batch = 2; "
                          r"got \[3, 2\]"),
    "k_not_paged": (_bad(k=torch.randn(22, 2, 16)), ValueError,
                    r"argument 'k' must be a paged cache \[num_blocks, page_block_size, N2, D\] when block_table "
                    r"is given; got \[22, 2, 16\]"),
    # Past the table's capacity: an ArgumentError (ValueError and RuntimeError) naming block_table, as FA2.
    "length_past_blocks": (_bad(cu_seqlens_k=torch.tensor([0, 10, 60], dtype=torch.int32), max_seqlen_k=50),
                           RuntimeError, r"argument 'block_table' holds 2 blocks of 16 = 32 slots per sequence, "
                                         r"fewer than the 50 keys cu_seqlens_k gives sequence 1"),
    "negative_length": (_bad(cu_seqlens_k=torch.tensor([0, 10, 5], dtype=torch.int32)),
                        ValueError, r"argument 'cu_seqlens_k' must give each sequence a length in \[0, 32\] .* "
                                    r"got -5 for sequence 1"),
}


@pytest.mark.parametrize("name", list(BAD))
def test_bad_paged_varlen(name):
    kwargs, exc, pattern = BAD[name]
    with pytest.raises(exc, match=pattern):
        tot.flash_attn_varlen_func(**kwargs)
