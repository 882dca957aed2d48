"""Ported: op-plugin test/test_custom_ops/test_npu_kv_rms_norm_rope_cache.py.

Upstream cases (TestNPUKvRmsNormRopeCache, Ascend910B), all with batch 64, seq_len 1, 576 pages of 128, bf16,
non-quantised caches filled with 9, is_output_kv False, compared with assertRtolEqual(prec=0.04):
- test_npu_kv_rmsnorm_rope_cache_PA_BNSD, _PA_BLK_NZ, _PA_BLK_BNSD, _PA_NZ: the MLA latent row (kv [64, 1, 1, 576] =
  RMSNorm part 512 + rope part 64) -> ported, all four.
- the same four names defined a second time further down (marked unittest.skip upstream, "skip
  test_kv_rms_norm_rope_cache_v2 now"): the K/V-separate form (kv [64, 1, 1, 192] normed whole, its first 64 values
  roped, v [64, 1, 1, 128] into ckv_cache). Being later definitions of the same names they replace the first four
  in upstream's class, so upstream runs none of them; both forms are ported here under distinct names.
Every case is ported; the quantised path of the golden function (round(x * scale) to int8) is not exercised by any
upstream case (quant_mode 0 everywhere) and is tested in test/kv_cache/test_kv_rms_norm_rope_cache.py.
The golden computation below follows upstream's math (fp32 RMSNorm and interleaved rope, cast to the cache dtype,
token-by-token placement per cache mode) and upstream's comparison (assert_rtol_equal with prec 0.04 for bf16; the
outputs k_rope / c_kv are compared too, as upstream does when is_output_kv is set).
"""
import pytest
import torch

from test.torch_npu.common import on_cpu, to_device, torch_npu
from test.torch_npu.rtol import assert_rtol_equal

DIM_KV = {0: 512, 1: 192}      # gamma length per form (0: latent row, 1: K/V separate)
K_LEN = {0: 64, 1: 192}        # k_cache row
CKV_LEN = {0: 512, 1: 128}     # ckv_cache row


def generate_inputs(form, batch, seq, pages, page_size, cache_mode, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    kv = torch.randn(batch, 1, seq, 576 if form == 0 else 192, generator=g).to(dtype)
    gamma = torch.randn(DIM_KV[form], generator=g).to(dtype)
    cos = torch.randn(batch, 1, seq, 64, generator=g).to(dtype)
    sin = torch.randn(batch, 1, seq, 64, generator=g).to(dtype)
    v = None if form == 0 else torch.randn(batch, 1, seq, 128, generator=g).to(dtype)
    k_cache = torch.ones(pages, page_size, 1, K_LEN[form], dtype=dtype) * 9
    ckv_cache = torch.ones(pages, page_size, 1, CKV_LEN[form], dtype=dtype) * 9
    if "BLK" in cache_mode:
        n = batch * ((seq + page_size - 1) // page_size)
        index = torch.arange(0, n * page_size, page_size, dtype=torch.int64)
    else:
        index = torch.arange(0, batch * seq, dtype=torch.int64)
    # upstream's value ranges
    kv = (-2 + 10) * kv - 10
    gamma = (-10 + 1000) * gamma - 1000
    sin = (0.01 + 0.01) * sin - 0.01
    v = None if v is None else (-2 + 10) * v - 10
    return kv, gamma, cos, sin, index, k_cache, ckv_cache, v


def golden(form, kv, gamma, cos, sin, index, k_cache, ckv_cache, v, cache_mode, eps=1e-5):
    b, _, s, _ = kv.shape
    f32 = torch.float32

    def rms(x):
        return x / torch.sqrt(torch.mean(x * x, dim=-1, keepdim=True) + eps) * gamma.to(f32)

    def rope(x):
        q = x.reshape(b, 1, s, 32, 2).transpose(3, 4).reshape(b, 1, s, 64)
        return q * cos.to(f32) + torch.cat((-q[..., 32:], q[..., :32]), dim=-1) * sin.to(f32)

    if form == 0:
        y = rms(kv[..., :512].to(f32))
        k = rope(kv[..., 512:].to(f32))
        k_out, c_out = k.to(kv.dtype), y.to(kv.dtype)
    else:
        y = rms(kv.to(f32))
        k = torch.cat((rope(y[..., :64]), y[..., 64:]), dim=-1)
        y = v.to(f32)
        k_out, c_out = k.to(kv.dtype), v.clone()
    k, y = k.to(k_cache.dtype), y.to(ckv_cache.dtype)
    pages, page_size = k_cache.shape[:2]
    k_cache, ckv_cache = k_cache.clone(), ckv_cache.clone()
    per_batch = index.shape[0] // b
    for bi in range(b):
        for si in range(s):
            if "BLK" in cache_mode:
                start = int(index[bi * per_batch + si // page_size])
                if start < 0:
                    continue
                page, off = start // page_size, si % page_size
            else:
                slot = int(index[bi * s + si])
                if slot < 0:
                    continue
                page, off = slot // page_size, slot % page_size
            for cache, row in ((k_cache, k[bi, 0, si]), (ckv_cache, y[bi, 0, si])):
                if cache_mode.endswith("NZ"):
                    d0 = 16  # non-quantised 16-bit caches
                    cache.view(pages, -1, page_size, d0)[page, :, off, :] = row.reshape(-1, d0)
                else:
                    cache[page, off, 0, :] = row
    return k_cache, ckv_cache, k_out, c_out


CASES = [(form, mode) for form in (0, 1) for mode in ("PA_BNSD", "PA_BLK_NZ", "PA_BLK_BNSD", "PA_NZ")]


@pytest.mark.parametrize("form,cache_mode", CASES, ids=[f"{'latent' if f == 0 else 'kv_split'}-{m}" for f, m in CASES])
def test_npu_kv_rmsnorm_rope_cache(form, cache_mode):
    dtype = torch.bfloat16
    kv, gamma, cos, sin, index, k_cache, ckv_cache, v = generate_inputs(form, 64, 1, 576, 128, cache_mode, dtype,
                                                                        seed=CASES.index((form, cache_mode)))
    want = golden(form, kv, gamma, cos, sin, index, k_cache, ckv_cache, v, cache_mode)
    args = to_device(kv, gamma, cos, sin, index, k_cache, ckv_cache)
    out = torch_npu.npu_kv_rmsnorm_rope_cache(*args, k_rope_scale=None, c_kv_scale=None, k_rope_offset=None,
                                              c_kv_offset=None, v=to_device(v), epsilon=1e-05,
                                              cache_mode=cache_mode, is_output_kv=True)
    got = on_cpu(*out)
    assert got[2].shape == want[2].shape and got[3].shape == want[3].shape
    assert got[2].dtype == want[2].dtype and got[3].dtype == want[3].dtype
    for w, o in zip(want, got):
        assert_rtol_equal(w, o, prec=0.04)
