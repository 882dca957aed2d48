"""Quantised MC2 (docs/mc2.md, "Quantised MC2"): the int8 forms of npu_mm_all_reduce_base (dequant_scale per tensor /
channel, float32 / bfloat16 / npu_trans_quant_param's int64, pertoken_scale, int32 bias, x3; weight-only int8 with
antiquant_scale / offset / group size), npu_all_gather_base_mm, npu_mm_reduce_scatter_base and
npu_all_gather_quant_mm (x1_scale, x2_scale, output dtype).

Numerics across gloo ranks (test/mc2/quant_worker.py): bit-exact against each rank's fp32 dequantised value summed
in float64 and rounded once; within the tolerance rule of the float64 reference. Argument errors: one test per rule,
in-process (the checks run before the group behind `hcom` is looked up, so no process group is needed)."""
import os

import pytest
import torch

from test.common.checkout import pythonpath
from test.common.tiers import full_only
from torch_ops_transformer.mc2 import ops
from torch_ops_transformer._internal.spawn import describe, launch

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "quant_worker.py")
NUMERIC = ["all_reduce", "weight_quant", "all_gather", "reduce_scatter", "mismatch"]


def run_ranks(world_size, scenarios, timeout=180.0, env=None):
    results = launch(WORKER, world_size, [",".join(scenarios)], timeout=timeout,
                     env={"MC2_TEST_PG_TIMEOUT": "90", "PYTHONPATH": pythonpath(), **(env or {})})
    report = describe(results)
    for res in results:
        assert res.returncode == 0, report
        for s in scenarios:
            assert f"MC2-OK {s}" in res.stdout, report


@pytest.mark.parametrize("world_size", [2] + full_only(4))
def test_quantised_forms_match_the_exact_and_float64_references(world_size):
    run_ranks(world_size, NUMERIC, timeout=240.0 if world_size > 2 else 180.0)


def test_quantised_forms_on_the_simulated_npu_device():
    run_ranks(2, ["npu"], env={"TOT_NPU_SIM": "1"})


# ---------------------------------------------------------------- argument errors, one per rule

def i8(*shape):
    return torch.ones(*shape, dtype=torch.int8)


X1, X2, N = i8(4, 32), i8(32, 8), 8
F16 = torch.ones(4, 32, dtype=torch.float16)
SCALE = torch.full((N,), 1e-3, dtype=torch.bfloat16)


def ar(x1=X1, x2=X2, **kw):
    return lambda: ops.npu_mm_all_reduce_base(x1, x2, "no_group", **kw)


def wq(**kw):
    kw.setdefault("antiquant_scale", torch.ones(N, dtype=torch.float16))
    return ar(F16, X2, **kw)


def ag(x1=X1, x2=X2, **kw):
    kw.setdefault("x2_scale", torch.ones(1, N))
    return lambda: ops.npu_all_gather_base_mm(x1, x2, "no_group", 2, **kw)


def rs(x1=X1, x2=X2, **kw):
    kw.setdefault("x2_scale", torch.ones(1, N))
    return lambda: ops.npu_mm_reduce_scatter_base(x1, x2, "no_group", 2, **kw)


def agq(x1=X1, x2=X2, world_size=2, **kw):
    kw.setdefault("x2_scale", torch.ones(1, N))
    kw.setdefault("y_dtype", torch.float16)
    return lambda: ops.npu_all_gather_quant_mm(x1, x2, "no_group", world_size, **kw)


V, T, NI = ValueError, TypeError, NotImplementedError
RULES = {
    # npu_mm_all_reduce_base, torch_npu's order: dtypes, the scales each form takes, x3, pertoken_scale, ...
    "ar_int8_x1_float_x2": (ar(X1, X2.half(), dequant_scale=SCALE), V, ["x1 (torch.int8)", "x2 (torch.float16)",
                                                                         "is vaild"]),
    "ar_x2_not_int8": (ar(X1, X2.short(), dequant_scale=SCALE), V, ["'x2' must be an int8", "torch.int16"]),
    "ar_int4_packed": (ar(X1, X2.int(), dequant_scale=SCALE), NI, ["int4", "'x2'"]),
    "ar_float8": (ar(F16, X2.to(torch.float8_e4m3fn)), NI, ["float8", "'x2'"]),
    "ar_int8_with_antiquant": (ar(dequant_scale=SCALE, antiquant_scale=SCALE), V, ["'antiquant_scale'",
                                                                                  "must be None"]),
    "ar_weight_with_dequant": (wq(dequant_scale=SCALE), V, ["'dequant_scale'", "must be None"]),
    "ar_float_with_scales": (ar(F16, X2.half(), antiquant_scale=SCALE), V, ["'antiquant_scale'",
                                                                              "neither x1 nor x2 is int8"]),
    "ar_k_mismatch": (ar(X1, i8(16, N), dequant_scale=SCALE), V, ["x1's last dim (k = 32)", "(16, 8)"]),
    "ar_x3_shape": (ar(dequant_scale=SCALE, x3=torch.ones(4, 9).bfloat16()), V, ["x3", "(4, 8)", "(4, 9)"]),
    "ar_x3_dtype": (ar(dequant_scale=SCALE, x3=torch.ones(4, N).half()), V, ["x3's dtype (torch.float16)",
                                                                             "torch.bfloat16"]),
    "ar_pertoken_without_dequant": (wq(pertoken_scale=torch.ones(4)), V, ["'pertoken_scale'", "dequant_scale None"]),
    "ar_pertoken_shape": (ar(dequant_scale=SCALE, pertoken_scale=torch.ones(4, 1)), V, ["'pertoken_scale'", "[4]",
                                                                                       "(4, 1)"]),
    "ar_pertoken_dtype": (ar(dequant_scale=SCALE, pertoken_scale=torch.ones(4).half()), T, ["'pertoken_scale'",
                                                                                           "float32",
                                                                                           "torch.float16"]),
    "ar_comm_quant": (ar(dequant_scale=SCALE, comm_quant_scale_1=SCALE, comm_quant_scale_2=SCALE), NI,
                      ["low-bit", "'comm_quant_scale_1'"]),
    "ar_dequant_required": (ar(), V, ["'dequant_scale' is required", "None"]),
    "ar_dequant_dtype": (ar(dequant_scale=SCALE.half()), T, ["'dequant_scale'", "torch.float16"]),
    "ar_dequant_shape": (ar(dequant_scale=torch.ones(2, N).bfloat16()), V, ["'dequant_scale'", "n = 8", "(2, 8)"]),
    "ar_float32_dequant_needs_pertoken": (ar(dequant_scale=SCALE.float()), V, ["float32 'dequant_scale'",
                                                                               "pertoken_scale",
                                                                               "npu_trans_quant_param"]),
    "ar_int8_bias_dtype": (ar(dequant_scale=SCALE, bias=torch.ones(N).bfloat16()), T, ["bias must be torch.int32",
                                                                                       "torch.bfloat16"]),
    "ar_bias_shape": (ar(dequant_scale=SCALE, bias=torch.ones(N + 1, dtype=torch.int32)), V, ["bias", "(8,)",
                                                                                              "(9,)"]),
    "ar_y_dtype_quantised": (ar(dequant_scale=SCALE, y_dtype=torch.int8), NI, ["'y_dtype'", "torch.int8"]),
    "ar_group_size_not_weight_quant": (ar(dequant_scale=SCALE, antiquant_group_size=32), V,
                                       ["'antiquant_group_size'", "must be 0", "32"]),
    "ar_dequant_scale_dtype_reinterpreted": (ar(dequant_scale=SCALE, dequant_scale_dtype=293), NI,
                                             ["'dequant_scale_dtype'", "293"]),
    # weight-only int8
    "wq_scale_required": (ar(F16, X2), V, ["'antiquant_scale' is required"]),
    "wq_scale_dtype": (wq(antiquant_scale=torch.ones(N, dtype=torch.bfloat16)), T, ["'antiquant_scale'",
                                                                                    "torch.float16",
                                                                                    "torch.bfloat16"]),
    "wq_scale_shape": (wq(antiquant_scale=torch.ones(2, N, dtype=torch.float16)), V, ["'antiquant_scale'",
                                                                                      "(2, 8)"]),
    "wq_group_scale_shape": (ar(F16.repeat(1, 2), i8(64, N), antiquant_scale=torch.ones(N, dtype=torch.float16),
                                antiquant_group_size=32), V, ["'antiquant_scale'", "[2, 8]", "(8,)"]),
    "wq_group_size": (wq(antiquant_group_size=48), V, ["'antiquant_group_size'", "multiple of 32", "48"]),
    "wq_offset": (wq(antiquant_offset=torch.ones(1, dtype=torch.float16)), V, ["'antiquant_offset'", "(8,)",
                                                                               "(1,)"]),
    "wq_bias_dtype": (wq(bias=torch.ones(N, dtype=torch.int32)), T, ["bias must be torch.float16", "torch.int32"]),
    # all-gather / reduce-scatter forms
    "ag_x2_scale_required": (ag(x2_scale=None), V, ["'x2_scale' is required"]),
    "ag_scales_with_float_input": (ag(F16, X2.half()), V, ["'x2_scale'", "float input"]),
    "ag_weight_only_x2": (ag(F16, X2, x2_scale=None), V, ["x2's dtype (torch.int8)", "npu_mm_all_reduce_base"]),
    "ag_x2_scale_dtype": (ag(x2_scale=torch.ones(1, N).half()), T, ["'x2_scale'", "torch.float16"]),
    "ag_x2_scale_shape": (ag(x2_scale=torch.ones(2, N)), V, ["'x2_scale'", "(2, 8)"]),
    "ag_x1_scale_dtype": (ag(x1_scale=torch.ones(4, 1).half()), T, ["'x1_scale'", "torch.float16"]),
    "ag_x1_scale_shape": (ag(x1_scale=torch.ones(1, 4)), V, ["'x1_scale'", "[4, 1]", "(1, 4)"]),
    "ag_int64_scale_output_dtype": (ag(x2_scale=torch.ones(1, N, dtype=torch.int64), output_dtype=torch.bfloat16),
                                    V, ["'output_dtype'", "float16", "int64 x2_scale", "torch.bfloat16"]),
    "ag_bias": (ag(bias=torch.ones(N, dtype=torch.int32)), NI, ["bias with int8 inputs"]),
    "ag_not_2d": (ag(X1.view(1, 4, 32)), V, ["2-D", "(1, 4, 32)"]),
    "ag_gather_index": (ag(gather_index=1), V, ["'gather_index'", "1"]),
    "rs_m_divisible": (lambda: ops.npu_mm_reduce_scatter_base(i8(3, 32), X2, "no_group", 2, x2_scale=None), V,
                       ["'x2_scale' is required"]),
    "rs_k_mismatch": (rs(X1, i8(16, N)), V, ["input's last dim (k = 32)"]),
    # npu_all_gather_quant_mm
    "agq_world_size": (agq(world_size=3), V, ["'world_size'", "[2, 4, 8, 16, 32, 64]", "3"]),
    "agq_group_sizes": (agq(group_sizes=[1, 1, 128]), NI, ["'group_sizes'", "[1, 1, 128]"]),
    "agq_y_dtype_required": (agq(y_dtype=None), V, ["y_dtype should be provided", "torch.int8"]),
    "agq_y_dtype_of_float_input": (agq(F16, X2.half(), x2_scale=None, y_dtype=torch.bfloat16), V,
                                   ["When input is float16 or bfloat16, output should be the same as input dtype",
                                    "torch.bfloat16"]),
    "agq_x1_dtype": (agq(x1_dtype=290), NI, ["'x1_dtype'", "290"]),
    "agq_quant_scale": (agq(quant_scale=torch.ones(1)), NI, ["'quant_scale'"]),
    "agq_block_size": (agq(block_size=128), NI, ["'block_size'=128"]),
    "agq_amax_output": (agq(amax_output=True), NI, ["amax_output=True"]),
}


@pytest.mark.parametrize("rule", sorted(RULES))
def test_argument_error(rule):
    call, kind, fragments = RULES[rule]
    with pytest.raises(kind) as info:
        call()
    missing = [f for f in fragments if f not in str(info.value)]
    assert not missing, f"message lacks {missing}: {info.value}"
    if kind is ValueError:  # torch_npu raises RuntimeError: the wrappers' ArgumentError is both
        assert isinstance(info.value, RuntimeError), type(info.value)
