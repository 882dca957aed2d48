"""torch.library.opcheck (schema, autograd registration, fake tensor, AOT dispatch with dynamic shapes) for every
op of native_functions.yaml marked opcheck-tested, read from torch_ops_transformer.OPS."""
import glob
import importlib
import os

import pytest
import torch

from torch_ops_transformer import OPS as REGISTRY

OPS = torch.ops.npu_fa


def _collect_cases():
    """OPCHECK_CASES of every test/*_cases.py module: {op: {case name: () -> (args, kwargs)}}."""
    cases = {}
    for path in sorted(glob.glob(os.path.join(os.path.dirname(__file__), "*_cases.py"))):
        module = importlib.import_module(os.path.splitext(os.path.basename(path))[0])
        for op, by_name in getattr(module, "OPCHECK_CASES", {}).items():
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
