"""Port of op-plugin test/test_custom_ops/test_mla_prolog.py (torch_npu.npu_mla_prolog).

Upstream cases (bf16, He 7168, Hcq 1536, Hckv 512, N 32, D 128, Dr 64, BlockSize 128, BlockNum = B*Skv/BlockSize
with B 8, Skv 1024; cache_index = torch.rand(...).to(int64), i.e. every token writes slot 0, the last one kept;
query, query_rope and both caches within assertRtolEqual(prec=0.005, prec16=0.005) of the golden function):
- test_op_exec: token_x [B, S, He] (S 1), cache_mode PA_BSND. Ported.
- test_op_exec_tnd: token_x [T, He] (T 8). Ported.
The weights' FRACTAL_NZ cast (npu_format_cast) is a storage format of the NPU: the ports pass the ND weights.
"""
import math

import pytest
import torch

from test.torch_npu._mla_prolog_common import POSITIONAL, SIZES, golden_float
from test.torch_npu.common import on_cpu, to_device, torch_npu
from test.torch_npu.rtol import assert_rtol_equal


def _inputs(lead, seed):
    g = torch.Generator().manual_seed(seed)
    z = SIZES
    He, Hcq, Hckv, N, D, Dr, Nkv, bs = (z[k] for k in ("He", "Hcq", "Hckv", "N", "D", "Dr", "Nkv", "BlockSize"))
    nb = math.ceil(8 * 1024 / bs)

    def bf(*shape):
        return torch.rand(*shape, generator=g).to(torch.bfloat16)

    return dict(token_x=bf(*lead, He), weight_dq=bf(He, Hcq), weight_uq_qr=bf(Hcq, N * (D + Dr)),
                weight_uk=bf(N, D, Hckv), weight_dkv_kr=bf(He, Hckv + Dr), rmsnorm_gamma_cq=bf(Hcq),
                rmsnorm_gamma_ckv=bf(Hckv), rope_sin=bf(*lead, Dr), rope_cos=bf(*lead, Dr),
                cache_index=torch.rand(*lead, generator=g).to(torch.int64), kv_cache=bf(nb, bs, Nkv, Hckv),
                kr_cache=bf(nb, bs, Nkv, Dr))


@pytest.mark.parametrize("lead", [(8, 1), (8,)], ids=["test_op_exec", "test_op_exec_tnd"])
def test_op_exec(lead):
    a = _inputs(lead, seed=0)
    args = to_device(*(a[k] for k in POSITIONAL))
    index, kv, kr = to_device(a["cache_index"], a["kv_cache"].clone(), a["kr_cache"].clone())
    query, query_rope, kv_out, kr_out = torch_npu.npu_mla_prolog(
        *args, index, kv, kr, rmsnorm_epsilon_cq=1e-5, rmsnorm_epsilon_ckv=1e-5, cache_mode="PA_BSND")
    want = golden_float(*(a[k] for k in POSITIONAL), a["cache_index"], a["kv_cache"], a["kr_cache"], 1e-5, 1e-5)
    for got, exp in zip((query, query_rope, kv_out, kr_out), want):
        assert_rtol_equal(exp.float(), on_cpu(got).float(), prec=0.005, prec16=0.005)
