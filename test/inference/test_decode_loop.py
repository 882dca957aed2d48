"""End to end: the PagedKVCache decode loop of its docstring feeding npu_incre_flash_attention, checked against
the float64 reference on each sequence's own keys (ragged prompts, blocks shared out of order, a freed sequence)."""
import math

import pytest
import torch

import torch_ops_transformer as tot
from test.common.reference import attention_reference

N1, N2, D, BLOCK = 4, 2, 16, 16


def _attend_reference(q, k, v):
    """q [N1, D], k/v [S, N2, D] -> float64 [N1, D] via the project's reference (BSND, one query row)."""
    out, _ = attention_reference(q.double()[None, None], k.double()[None], v.double()[None], N1, "BSND",
                                 scale=1 / math.sqrt(D))
    return out[0, 0]


@pytest.mark.parametrize("layout", ["BSND", "BSH"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_paged_decode_loop_matches_reference(layout, dtype):
    g = torch.Generator().manual_seed(0)
    rnd = lambda *s: torch.randn(*s, generator=g).to(dtype)
    cache = tot.PagedKVCache(num_blocks=32, block_size=BLOCK, num_kv_heads=N2, head_dim=D, dtype=dtype, layout=layout)
    prompts = [37, 5, 16]
    ids = [cache.add_sequence() for _ in prompts]
    history = {i: ([], []) for i in ids}
    for sid, n in zip(ids, prompts):  # ragged prefill, one sequence at a time (blocks interleave)
        k, v = rnd(n, N2, D), rnd(n, N2, D)
        cache.append([sid] * n, k if layout == "BSND" else k.flatten(1), v if layout == "BSND" else v.flatten(1))
        history[sid][0].append(k)
        history[sid][1].append(v)
    for step in range(3):
        k, v = rnd(len(ids), N2, D), rnd(len(ids), N2, D)
        cache.append(ids, k if layout == "BSND" else k.flatten(1), v if layout == "BSND" else v.flatten(1))
        for b, sid in enumerate(ids):
            history[sid][0].append(k[b:b + 1])
            history[sid][1].append(v[b:b + 1])
        q = rnd(len(ids), 1, N1, D)
        out = tot.npu_incre_flash_attention(
            q if layout == "BSND" else q.flatten(2), cache.key_cache, cache.value_cache,
            block_table=cache.block_table(ids), actual_seq_lengths=cache.seq_lens(ids), block_size=BLOCK,
            input_layout=layout, num_heads=N1, num_key_value_heads=N2, scale_value=1 / math.sqrt(D))
        out = out.reshape(len(ids), N1, D)
        tol = 1e-5 if dtype == torch.float32 else 2e-2
        for b, sid in enumerate(ids):
            ref = _attend_reference(q[b, 0], torch.cat(history[sid][0]), torch.cat(history[sid][1]))
            torch.testing.assert_close(out[b].double(), ref, atol=tol, rtol=tol)
        if step == 0:  # free the middle sequence; its blocks are reused by the others
            cache.free(ids[1])
            del history[ids[1]]
            ids = [ids[0], ids[2]]
