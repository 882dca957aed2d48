"""Port of op-plugin test/test_custom_ops/test_mla_prolog_v2.py (torch_npu.npu_mla_prolog_v2).

Upstream case (Ascend910B; int8 token_x [B 2, S 1, He 7168] and int8 weights with per-token / per-channel dequant
scales, int8 kv_cache with quant_scale_ckv [1, Hckv] used per tensor (its first value), bf16 kr_cache, smooth
scales of ones; the query is int8 per token and head): test_op_exec. Ported with upstream's shapes and tolerances:
query within 1 (prec=1), query_rope, both caches and dequant_scale_q_nope within prec 0.005. The weights'
FRACTAL_NZ cast is an NPU storage format: the port passes the ND weights.
"""
import torch

from test.torch_npu._mla_prolog_common import POSITIONAL, golden_int8, int8_inputs
from test.torch_npu.common import on_cpu, to_device, torch_npu
from test.torch_npu.rtol import assert_rtol_equal


def test_op_exec():
    a = int8_inputs(B=2, S=1, Skv=6144, seed=0)
    quant_scale_ckv = torch.rand(1, 512, generator=torch.Generator().manual_seed(1))
    scales = {k: a[k] for k in ("dequant_scale_x", "dequant_scale_w_dq", "dequant_scale_w_uq_qr",
                                "dequant_scale_w_dkv_kr")}
    args = to_device(*(a[k] for k in POSITIONAL))
    index, kv, kr = to_device(a["cache_index"], a["kv_cache"].clone(), a["kr_cache"].clone())
    out = torch_npu.npu_mla_prolog_v2(
        *args, index, kv, kr, rmsnorm_epsilon_cq=1e-5, rmsnorm_epsilon_ckv=1e-5, cache_mode="PA_BSND",
        quant_scale_ckv=to_device(quant_scale_ckv), smooth_scales_cq=to_device(a["smooth_scales_cq"]),
        **{k: to_device(v) for k, v in scales.items()})
    query, query_rope, kv_out, kr_out, dequant_scale_q_nope = on_cpu(*out)
    want = golden_int8(*(a[k] for k in POSITIONAL), a["cache_index"], a["kv_cache"], a["kr_cache"], 1e-5, 1e-5,
                       quant_scale_ckv=quant_scale_ckv, smooth_scales_cq=a["smooth_scales_cq"], **scales)
    assert_rtol_equal(want[0], query, prec=1, prec16=1)
    for got, exp in zip((query_rope, kv_out, kr_out, dequant_scale_q_nope), want[1:]):
        assert_rtol_equal(exp.float(), got.float(), prec=0.005, prec16=0.005)
