"""torch.library.opcheck (schema, autograd registration, fake tensor, AOT dispatch with dynamic shapes) for every
op of native_functions.yaml marked opcheck-tested, read from torch_ops_transformer.OPS. The cases come from each
family's case-builder module (<family folder>/*_cases.py), listed in CASE_MODULES."""
import pytest
import torch

from test.attention import attention_cases
from test.inference import decode_cases, int8_cases, prefill_cases
from test.kv_cache import kv_cache_cases
from test.mc2 import mc2_cases
from test.mla import mla_prolog_cases
from test.moe import distribute_cases, fused_ffn_cases, grouped_matmul_cases, routing_cases
from test.norm import norm_cases
from test.quant import quant_cases
from test.rope import rope_cases
from test.linear_attention import chunk_gated_delta_rule_cases
from test.sampling import sampling_cases
from test.sparse_attention import indexer_cases
from test.sparse_attention import sfa_cases
from test.linear_attention import recurrent_gated_delta_rule_cases
from test.linear_attention import causal_conv1d_cases
from torch_ops_transformer import OPS as REGISTRY

OPS = torch.ops.npu_fa
CASE_MODULES = (attention_cases, distribute_cases, fused_ffn_cases, grouped_matmul_cases, decode_cases, int8_cases,
                kv_cache_cases, mc2_cases, mla_prolog_cases, norm_cases, routing_cases, prefill_cases, quant_cases,
                rope_cases)
CASE_MODULES += (sampling_cases,)
CASE_MODULES += (indexer_cases,)
CASE_MODULES += (sfa_cases,)
CASE_MODULES += (recurrent_gated_delta_rule_cases,)
CASE_MODULES += (chunk_gated_delta_rule_cases,)
CASE_MODULES += (causal_conv1d_cases,)


def _collect_cases():
    """OPCHECK_CASES of every module of CASE_MODULES: {op: {case name: () -> (args, kwargs)}}."""
    cases = {}
    for module in CASE_MODULES:
        for op, by_name in module.OPCHECK_CASES.items():
            cases.setdefault(op, {}).update(by_name)
    return cases


CASES = _collect_cases()
OPCHECK_OPS = sorted(name for name, (_, _, _, opcheck) in REGISTRY.items() if opcheck)


def test_every_op_with_tensors_has_an_opcheck_case():
    for name, (_, _, _, opcheck) in REGISTRY.items():
        schema = getattr(OPS, name).default._schema
        has_tensors = any("Tensor" in str(a.type) for a in schema.arguments)
        assert opcheck == has_tensors, f"{name}: opcheck={opcheck} but has tensor arguments={has_tensors}"
        if opcheck:
            assert CASES.get(name), f"{name} is opcheck-tested in native_functions.yaml but has no case here"
    assert set(CASES) == set(OPCHECK_OPS), "cases for ops that are not opcheck-tested (or renamed)"


@pytest.mark.parametrize("op,case", [(op, c) for op in OPCHECK_OPS for c in CASES.get(op, {})])
def test_opcheck(op, case):
    args, kwargs = CASES[op][case]()
    torch.library.opcheck(getattr(OPS, op).default, args, kwargs)
