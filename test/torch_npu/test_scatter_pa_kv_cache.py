"""Ported: op-plugin test/test_custom_ops/test_scatter_pa_kv_cache.py (torch_npu.npu_scatter_pa_kv_cache).

Upstream cases (TestScatterPaKvCache; all skipped upstream until CANN gains aclnnScatterPaKvCache), fp16, 16 tokens,
4 heads, random distinct int32 slots:
- test_npu_scatter_pa_kv_cache_1: PA_NZ (default cache_mode), k/v head size 32/32, 2 blocks of 32, last dim 16;
- _2: v head size 64; _3: block_size 64; _4: block_size 128 (PA_NZ);
- _1_nd_norm / _1_nd_none: ND caches [num_blocks, block_size, N, D] with cache_mode 'Norm' / None.
Golden (upstream's): token i with slot s >= 0 goes to block s // block_size, offset s % block_size; PA_NZ stores the
token's N·D values in chunks of `last`, chunk c at cache[block, c, offset, :]; ND stores the row at
cache[block, offset]. All ported, compared exactly (assertRtolEqual on a copy is exact here). Upstream casts the NZ
caches with npu_format_cast(cache, 29) (FRACTAL_NZ) before the call: that tags the NPU storage format and has no
counterpart on the CPU or the simulated device; the logical [num_blocks, N·D/last, block_size, last] layout the op
writes is the same, so the cast is left out.

Not in upstream's file: vLLM-Ascend's call (keywords, cache_mode='Norm', int64 slots with -1 padding), bf16/fp32,
the errors for cache shapes that fit neither mode and for the compression form (compress_lens, seq_lens,
compress_seq_offsets -> NotImplementedError), and torch.compile.
"""
import pytest
import torch

from test.torch_npu.common import DEVICE, on_cpu, to_device, torch_npu
from test.torch_npu.rtol import assert_rtol_equal


def _golden_nz(key, value, key_cache, value_cache, slots, block_size, last):
    kc, vc = key_cache.clone(), value_cache.clone()
    for i, s in enumerate(slots.tolist()):
        if s < 0:
            continue
        blk, off = divmod(s, block_size)
        for cache, row in ((kc, key[i].reshape(-1)), (vc, value[i].reshape(-1))):
            for c in range(row.numel() // last):
                cache[blk, c, off, :] = row[c * last:(c + 1) * last]
    return kc, vc


def _golden_nd(key, value, key_cache, value_cache, slots, block_size):
    kc, vc = key_cache.clone(), value_cache.clone()
    for i, s in enumerate(slots.tolist()):
        if s >= 0:
            kc[s // block_size, s % block_size] = key[i]
            vc[s // block_size, s % block_size] = value[i]
    return kc, vc


def _data(bs, num_blocks, block_size, num_head, k_head, v_head, seed, dtype=torch.float16):
    g = torch.Generator().manual_seed(seed)
    key = torch.randn(bs, num_head, k_head, generator=g).to(dtype)
    value = torch.randn(bs, num_head, v_head, generator=g).to(dtype)
    slots = torch.randperm(num_blocks * block_size, generator=g)[:bs].to(torch.int32)
    return key, value, slots


NZ_CASES = {  # upstream case: (block_size, num_head, k_head_size, v_head_size, lastDim_k)
    "1": (32, 4, 32, 32, 16),
    "2": (32, 4, 32, 64, 16),
    "3": (64, 4, 32, 64, 16),
    "4": (128, 4, 32, 64, 16),
}


@pytest.mark.parametrize("case", list(NZ_CASES))
def test_npu_scatter_pa_kv_cache_pa_nz(case):
    block_size, num_head, k_head, v_head, last = NZ_CASES[case]
    bs, num_blocks = 16, 2
    key, value, slots = _data(bs, num_blocks, block_size, num_head, k_head, v_head, seed=int(case))
    g = torch.Generator().manual_seed(10 + int(case))
    key_cache = torch.randn(num_blocks, num_head * k_head // last, block_size, last, generator=g).half()
    value_cache = torch.zeros(num_blocks, num_head * v_head // last, block_size, last).half()
    want_k, want_v = _golden_nz(key, value, key_cache, value_cache, slots, block_size, last)
    kc, vc = to_device(key_cache, value_cache)
    assert torch_npu.npu_scatter_pa_kv_cache(*to_device(key, value), kc, vc, to_device(slots)) is None
    assert_rtol_equal(want_k, on_cpu(kc))
    assert_rtol_equal(want_v, on_cpu(vc))
    assert torch.equal(on_cpu(kc), want_k) and torch.equal(on_cpu(vc), want_v)


@pytest.mark.parametrize("cache_mode", ["Norm", None], ids=["nd_norm", "nd_none"])
def test_npu_scatter_pa_kv_cache_1_nd(cache_mode):
    block_size, num_head, k_head, v_head = 32, 4, 32, 32
    key, value, slots = _data(16, 2, block_size, num_head, k_head, v_head, seed=5)
    key_cache = torch.randn(2, block_size, num_head, k_head, generator=torch.Generator().manual_seed(6)).half()
    value_cache = torch.zeros(2, block_size, num_head, v_head).half()
    want_k, want_v = _golden_nd(key, value, key_cache, value_cache, slots, block_size)
    kc, vc = to_device(key_cache, value_cache)
    torch_npu.npu_scatter_pa_kv_cache(*to_device(key, value), kc, vc, to_device(slots), cache_mode=cache_mode)
    assert torch.equal(on_cpu(kc), want_k) and torch.equal(on_cpu(vc), want_v)


# ---- beyond upstream's file --------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_vllm_ascend_call(dtype):
    """vLLM-Ascend's DeviceOperator.reshape_and_cache: keywords, ND caches [num_blocks, block_size, N, D],
    cache_mode='Norm', int64 slot_mapping whose padded tokens are -1."""
    num_blocks, block_size, n, d = 4, 16, 2, 32
    key, value, _ = _data(10, num_blocks, block_size, n, d, d, seed=7, dtype=dtype)
    slots = torch.tensor([3, 17, -1, 40, 41, 0, -1, 63, 20, 5], dtype=torch.int64)
    key_cache, value_cache = (torch.zeros(num_blocks, block_size, n, d, dtype=dtype) for _ in range(2))
    want_k, want_v = _golden_nd(key, value, key_cache, value_cache, slots, block_size)
    kc, vc = to_device(key_cache, value_cache)
    torch_npu.npu_scatter_pa_kv_cache(key=to_device(key).contiguous(), value=to_device(value).contiguous(),
                                      key_cache=kc, value_cache=vc, slot_mapping=to_device(slots).contiguous(),
                                      cache_mode="Norm")
    assert torch.equal(on_cpu(kc), want_k) and torch.equal(on_cpu(vc), want_v)


def test_nz_view_of_an_nd_allocation():
    """The other common caller pattern: an ND allocation viewed as PA_NZ [num_blocks, N*D/16, block_size, 16] and
    written with the default cache_mode."""
    num_blocks, block_size, n, d = 3, 16, 2, 64
    key, value, slots = _data(12, num_blocks, block_size, n, d, d, seed=8)
    k_alloc, v_alloc = (torch.zeros(num_blocks, block_size, n, d, dtype=torch.float16) for _ in range(2))
    nz = (num_blocks, n * d // 16, block_size, 16)
    want_k, want_v = _golden_nz(key, value, k_alloc.view(nz), v_alloc.view(nz), slots, block_size, 16)
    kc, vc = to_device(k_alloc, v_alloc)
    torch_npu.npu_scatter_pa_kv_cache(*to_device(key, value), kc.view(nz), vc.view(nz), to_device(slots))
    assert torch.equal(on_cpu(kc).view(nz), want_k) and torch.equal(on_cpu(vc).view(nz), want_v)


def test_errors():
    key, value, slots = to_device(*_data(4, 2, 16, 2, 16, 16, seed=9))
    nd = to_device(torch.zeros(2, 16, 2, 16, dtype=torch.float16))
    nz = to_device(torch.zeros(2, 2, 16, 16, dtype=torch.float16))
    with pytest.raises(RuntimeError, match="cache_mode='PA_NZ'.*key_cache.*cache_mode='Norm'"):
        torch_npu.npu_scatter_pa_kv_cache(key, value, nd, nd.clone(), slots)        # ND cache, default mode
    with pytest.raises(ValueError, match="cache_mode"):
        torch_npu.npu_scatter_pa_kv_cache(key, value, nz, nz.clone(), slots, cache_mode="NZ")
    with pytest.raises(ValueError, match="key_cache"):
        torch_npu.npu_scatter_pa_kv_cache(key, value, nz, nz.clone(), slots, cache_mode="Norm")
    with pytest.raises(TypeError, match="key"):
        torch_npu.npu_scatter_pa_kv_cache(key.float(), value, nz, nz.clone(), slots)
    for name in ("compress_lens", "compress_seq_offsets", "seq_lens"):
        with pytest.raises(NotImplementedError, match=name):
            torch_npu.npu_scatter_pa_kv_cache(key, value, nz, nz.clone(), slots, **{name: slots})
    with pytest.raises(ValueError, match="compression"):
        torch_npu.npu_scatter_pa_kv_cache(key.unsqueeze(1), value.unsqueeze(1), nz, nz.clone(), slots)
    with pytest.raises(ValueError, match="slot"):                                   # a slot past the cache
        torch_npu.npu_scatter_pa_kv_cache(key, value, nz, nz.clone(), to_device(torch.tensor([0, 1, 2, 32])))


@pytest.mark.skipif(DEVICE != "cpu", reason="torch.compile is not set up for the simulated npu device")
def test_compiles_without_graph_break():
    num_blocks, block_size, n, d = 2, 16, 2, 32
    key, value, slots = _data(6, num_blocks, block_size, n, d, d, seed=11)
    kc, vc = (torch.zeros(num_blocks, n * d // 16, block_size, 16, dtype=torch.float16) for _ in range(2))
    want_k, want_v = _golden_nz(key, value, kc, vc, slots, block_size, 16)

    @torch.compile(fullgraph=True, backend="aot_eager")
    def write(k, v, key_cache, value_cache, s):
        torch_npu.npu_scatter_pa_kv_cache(k, v, key_cache, value_cache, s)
        return key_cache.sum()

    write(key, value, kc, vc, slots)
    assert torch.equal(kc, want_k) and torch.equal(vc, want_v)
