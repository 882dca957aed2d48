"""Port of op-plugin test/test_custom_ops/test_mla_prolog_v3.py (torch_npu.npu_mla_prolog_v3 and
npu_mla_prolog_v3_functional).

Upstream cases (B 2, S 1, He 7168, Hcq 1536, Hckv 512, N 32, D 128, Dr 64, Skv 6144, BlockSize 128; qc_qr_scale and
kc_scale 10):
- test_op_exec_mla_prolog_npu_v3 (Ascend910B): int8 token_x and weights (weight_quant_mode 2), per-tensor int8
  kv_cache (kv_cache_quant_mode 1, quant_scale_ckv [1]), int8 query (query_quant_mode 1), query_norm_flag. Ported:
  query within 1, query_rope, caches and dequant_scale_q_nope within prec 0.005, as upstream.
- test_op_exec_mla_prolog_npu_v3_functional (Ascend910B): the same through the functional form (caches returned,
  the arguments unchanged). Ported.
- test_op_exec_mla_prolog_npu_v3_mxfp8, test_op_exec_mla_prolog_npu_v3_functional_mxfp8 (Ascend950): float8_e4m3fn
  token_x / weights / cache with float8_e8m0 block scales (weight_quant_mode 3). Cannot apply: mxfp8 is an NPU
  format this package does not implement; checked to raise NotImplementedError naming 'weight_quant_mode'.
The weights' FRACTAL_NZ cast is an NPU storage format: the ports pass the ND weights.
"""
import pytest
import torch

from test.torch_npu._mla_prolog_common import POSITIONAL, golden_int8, int8_inputs
from test.torch_npu.common import on_cpu, to_device, torch_npu
from test.torch_npu.rtol import assert_rtol_equal

SCALES = ("dequant_scale_x", "dequant_scale_w_dq", "dequant_scale_w_uq_qr", "dequant_scale_w_dkv_kr",
          "smooth_scales_cq")


def _run(functional):
    a = int8_inputs(B=2, S=1, Skv=6144, seed=0)
    quant_scale_ckv = torch.rand(1, generator=torch.Generator().manual_seed(1))
    args = to_device(*(a[k] for k in POSITIONAL))
    kv, kr = to_device(a["kv_cache"].clone(), a["kr_cache"].clone())
    fn = torch_npu.npu_mla_prolog_v3_functional if functional else torch_npu.npu_mla_prolog_v3
    out = fn(*args, kv, kr, cache_index=to_device(a["cache_index"]), rmsnorm_epsilon_cq=1e-5,
             rmsnorm_epsilon_ckv=1e-5, cache_mode="PA_BSND", quant_scale_ckv=to_device(quant_scale_ckv),
             query_norm_flag=True, weight_quant_mode=2, kv_cache_quant_mode=1, query_quant_mode=1,
             ckvkr_repo_mode=0, quant_scale_repo_mode=0, tile_size=128, k_nope_clip_alpha=None, qc_qr_scale=10.0,
             kc_scale=10.0, **{k: to_device(a[k]) for k in SCALES})
    if functional:
        query, query_rope, dequant_scale_q_nope, _, _, kv_out, kr_out = on_cpu(*out)
        assert torch.equal(on_cpu(kv), a["kv_cache"]) and torch.equal(on_cpu(kr), a["kr_cache"])
    else:
        query, query_rope, dequant_scale_q_nope, _, _ = on_cpu(*out)
        kv_out, kr_out = on_cpu(kv, kr)
    want = golden_int8(*(a[k] for k in POSITIONAL), a["cache_index"], a["kv_cache"], a["kr_cache"], 1e-5, 1e-5,
                       quant_scale_ckv=quant_scale_ckv, qc_qr_scale=10.0, kc_scale=10.0,
                       **{k: a[k] for k in SCALES})
    assert_rtol_equal(want[0], query, prec=1, prec16=1)
    for got, exp in zip((query_rope, kv_out, kr_out, dequant_scale_q_nope), want[1:]):
        assert_rtol_equal(exp.float(), got.float(), prec=0.005, prec16=0.005)


def test_op_exec_mla_prolog_npu_v3():
    _run(functional=False)


def test_op_exec_mla_prolog_npu_v3_functional():
    _run(functional=True)


@pytest.mark.parametrize("functional", [False, True])
def test_mxfp8_is_not_implemented(functional):
    a = int8_inputs(B=1, S=1, Skv=128, seed=0)
    fn = torch_npu.npu_mla_prolog_v3_functional if functional else torch_npu.npu_mla_prolog_v3
    with pytest.raises(NotImplementedError, match="weight_quant_mode"):
        fn(*(a[k] for k in POSITIONAL), a["kv_cache"], a["kr_cache"], cache_index=a["cache_index"],
           weight_quant_mode=3, kv_cache_quant_mode=1, query_quant_mode=1)
