"""Ported: op-plugin test/test_custom_ops/test_npu_scatter_pa_cache.py.

Upstream case (TestScatterPaCache, Ascend950 only):
- test_npu_scatter_pa_cache: torch_npu.npu_scatter_pa_cache(key, slot_mapping, key_cache=key_cache), the key-only
  form of the paged-cache write, key fp32 [256, 16, 16] into key_cache [16, 16, 16, 16] with slots 0..255.
  -> cannot apply as written: npu_scatter_pa_cache is not a function this package claims (torch_npu documents only
  npu_scatter_pa_kv_cache), and the case's golden indexes both the block and the offset by the slot itself
  (key_cache_out[slot, slot]), which runs past the 16 blocks for slot 16 (an IndexError; the case would not pass on
  any device). What it means to test — the ND ("Norm") write of token i to block slot // block_size, offset
  slot % block_size — is ported through npu_scatter_pa_kv_cache with cache_mode='Norm' and the value side fed the
  same tensors, at upstream's shapes, dtype and slots, compared exactly.
"""
import torch

from test.torch_npu.common import on_cpu, to_device, torch_npu
from test.torch_npu.rtol import assert_rtol_equal


def test_npu_scatter_pa_cache_as_the_norm_write():
    g = torch.Generator().manual_seed(0)
    key = torch.randint(-1, 1, (256, 16, 16), generator=g).to(torch.float32)
    key_cache = torch.randint(-1, 1, (16, 16, 16, 16), generator=g).to(torch.float32)
    slots = torch.arange(0, 256).view(256).to(torch.int32)
    block_size = key_cache.shape[1]
    want = key_cache.clone()
    for i, s in enumerate(slots.tolist()):
        want[s // block_size, s % block_size, :, :] = key[i, :, :]
    kc, vc = to_device(key_cache.clone(), key_cache.clone())
    k = to_device(key)
    torch_npu.npu_scatter_pa_kv_cache(k, k, kc, vc, to_device(slots), cache_mode="Norm")
    assert_rtol_equal(want, on_cpu(kc))
    assert torch.equal(on_cpu(kc), want) and torch.equal(on_cpu(vc), want)
