"""The ATB functions of the shim (torch_npu.op_plugin.atb._atb_ops: _npu_reshape_and_cache, _npu_paged_attention,
_npu_flash_attention, _npu_flash_attention_unpad), called as vLLM-Ascend calls them (keyword arguments, results
written into `out`), against float64 references in plain PyTorch."""
import math

import pytest
import torch

from test.common.reference import check_tolerance
from torch_ops_transformer.compat import atb

N, N_KV, D, BLOCK = 4, 2, 16, 16


def _attention64(q, k, v, scale, visible=None):
    """q [Sq, N, D], k/v [Skv, N_kv, D] -> [Sq, N, D] in float64 (GQA: query head h reads kv head h // (N/N_kv))."""
    group = q.shape[1] // k.shape[1]
    k, v = (t.double().repeat_interleave(group, dim=1) for t in (k, v))
    s = torch.einsum("qhd,khd->hqk", q.double(), k) * scale
    if visible is not None:
        s = s.masked_fill(~visible, -math.inf)
    return torch.einsum("hqk,khd->qhd", torch.softmax(s, dim=-1), v)


def _same_dtype(q, k, v, scale, visible=None):
    group = q.shape[1] // k.shape[1]
    k, v = (t.repeat_interleave(group, dim=1) for t in (k, v))
    s = torch.einsum("qhd,khd->hqk", q, k) * scale
    if visible is not None:
        s = s.masked_fill(~visible, -math.inf)
    return torch.einsum("hqk,khd->qhd", torch.softmax(s.float(), dim=-1).to(q.dtype), v)


def _caches(dtype, blocks=6):
    return (torch.zeros(blocks, BLOCK, N_KV, D, dtype=dtype), torch.zeros(blocks, BLOCK, N_KV, D, dtype=dtype))


def test_reshape_and_cache_writes_slots_and_skips_padding():
    key, value = torch.randn(4, N_KV, D), torch.randn(4, N_KV, D)
    key_cache, value_cache = _caches(torch.float32)
    slots = torch.tensor([0, 21, -1, 50], dtype=torch.int32)
    atb._npu_reshape_and_cache(key=key, value=value, key_cache=key_cache, value_cache=value_cache,
                               slot_indices=slots)
    flat_k, flat_v = key_cache.view(-1, N_KV, D), value_cache.view(-1, N_KV, D)
    for t, s in enumerate(slots.tolist()):
        if s >= 0:
            assert torch.equal(flat_k[s], key[t]) and torch.equal(flat_v[s], value[t])
    assert int((flat_k.abs().sum((1, 2)) != 0).sum()) == 3  # the padding token (-1) is not written


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_paged_attention_decode(dtype):
    torch.manual_seed(0)
    lens = [5, 1, 40]
    key_cache, value_cache = (torch.randn(8, BLOCK, N_KV, D, dtype=dtype) for _ in range(2))
    block_table = torch.tensor([[3, 0, 0], [7, 0, 0], [1, 6, 2]], dtype=torch.int32)
    query = torch.randn(3, N, D, dtype=dtype)
    out = torch.empty_like(query)
    scale = D ** -0.5
    ws = atb._npu_paged_attention_get_workspace(query, key_cache, value_cache, N_KV, N, scale, block_table,
                                                torch.tensor(lens, dtype=torch.int32), out)
    assert atb._npu_paged_attention(query=query, key_cache=key_cache, value_cache=value_cache, num_kv_heads=N_KV,
                                    num_heads=N, scale_value=scale, block_table=block_table,
                                    context_lens=torch.tensor(lens, dtype=torch.int32), out=out,
                                    workspace=ws) is None
    for b, n in enumerate(lens):
        slots = [int(block_table[b, i // BLOCK]) * BLOCK + i % BLOCK for i in range(n)]
        k = key_cache.view(-1, N_KV, D)[slots]
        v = value_cache.view(-1, N_KV, D)[slots]
        ref = _attention64(query[b:b + 1], k, v, scale)
        check_tolerance(f"paged b={b}", out[b:b + 1], ref, _same_dtype(query[b:b + 1], k, v, scale),
                        value_scale=float(v.abs().max()))


@pytest.mark.parametrize("dtype,mask_value", [(torch.float16, -math.inf), (torch.bfloat16, 1.0)])
def test_flash_attention_prefill_with_vllm_ascends_causal_mask(dtype, mask_value):
    """vLLM-Ascend's mask: [S_max, S_max], -inf (float16) or 1 (bfloat16) above the diagonal."""
    torch.manual_seed(1)
    lens = [3, 6, 1]
    t = sum(lens)
    q, k, v = torch.randn(t, N, D, dtype=dtype), torch.randn(t, N_KV, D, dtype=dtype), torch.randn(t, N_KV, D,
                                                                                                      dtype=dtype)
    s_max = 8
    upper = ~torch.ones(s_max, s_max, dtype=torch.bool).tril()
    mask = torch.zeros(s_max, s_max, dtype=dtype).masked_fill(upper, mask_value)
    out = torch.empty(t, N, D, dtype=dtype)
    scale = 0.3
    atb._npu_flash_attention(query=q, key=k, value=v, mask=mask, seq_len=torch.tensor(lens, dtype=torch.int32),
                             scale_value=scale, num_heads=N, num_kv_heads=N_KV, out=out)
    start = 0
    for n in lens:
        sl = slice(start, start + n)
        causal = torch.ones(n, n, dtype=torch.bool).tril()
        check_tolerance(f"prefill len={n}", out[sl], _attention64(q[sl], k[sl], v[sl], scale, causal),
                        _same_dtype(q[sl], k[sl], v[sl], scale, causal), value_scale=float(v[sl].abs().max()))
        start += n


def test_flash_attention_unpad_attends_to_every_key_of_its_sequence():
    torch.manual_seed(2)
    lens = [4, 2]
    q, k, v = torch.randn(6, N * D), torch.randn(6, N_KV * D), torch.randn(6, N_KV * D)  # [T, N·D] form
    out = torch.empty(6, N, D)
    atb._npu_flash_attention_unpad(query=q, key=k, value=v, seq_len=torch.tensor(lens, dtype=torch.int32),
                                   scale_value=0.25, num_heads=N, num_kv_heads=N_KV, out=out)
    q3, k3, v3 = q.view(6, N, D), k.view(6, N_KV, D), v.view(6, N_KV, D)
    for sl in (slice(0, 4), slice(4, 6)):
        check_tolerance("unpad", out[sl], _attention64(q3[sl], k3[sl], v3[sl], 0.25),
                        _same_dtype(q3[sl], k3[sl], v3[sl], 0.25))


def test_bad_arguments_name_themselves():
    q, k = torch.randn(6, N, D), torch.randn(6, N_KV, D)
    out = torch.empty(6, N, D)
    with pytest.raises(RuntimeError, match="'seq_len'.*must sum"):
        atb._npu_flash_attention_unpad(q, k, k, torch.tensor([4, 4], dtype=torch.int32), 0.1, N, N_KV, out)
    with pytest.raises(RuntimeError, match="'num_heads' \\(4\\) and 'num_kv_heads' \\(3\\)"):
        atb._npu_flash_attention_unpad(q, k, k, torch.tensor([6], dtype=torch.int32), 0.1, N, 3, out)
    with pytest.raises(RuntimeError, match="'mask' must be"):
        atb._npu_flash_attention(q, k, k, torch.zeros(2, 2), torch.tensor([6], dtype=torch.int32), 0.1, N, N_KV, out)
    with pytest.raises(RuntimeError, match="'out' must hold"):
        atb._npu_flash_attention_unpad(q, k, k, torch.tensor([6], dtype=torch.int32), 0.1, N, N_KV, out[:2])
    kc, vc = _caches(torch.float32)
    with pytest.raises(RuntimeError, match="one query token per sequence"):
        atb._npu_paged_attention(torch.randn(2, N, D), kc, vc, N_KV, N, 0.1, torch.zeros(3, 1, dtype=torch.int32),
                                 torch.tensor([1, 1], dtype=torch.int32), torch.empty(2, N, D))
    with pytest.raises(RuntimeError, match="'key_cache' must be \\[num_blocks, block_size, num_kv_heads=3"):
        atb._npu_paged_attention(torch.randn(2, 3, D), kc, vc, 3, 3, 0.1, torch.zeros(2, 1, dtype=torch.int32),
                                 torch.tensor([1, 1], dtype=torch.int32), torch.empty(2, 3, D))
