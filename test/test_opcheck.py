"""torch.library.opcheck (schema, autograd registration, fake tensor, AOT dispatch with dynamic shapes) for every
op of native_functions.yaml marked opcheck-tested, read from torch_ops_transformer.OPS."""
import pytest
import torch

from attention_cases import Case, make_inputs
from torch_ops_transformer import OPS as REGISTRY

OPS = torch.ops.npu_fa


def _score_args(case: Case, requires_grad=True):
    args = make_inputs(case)
    for n in ("query", "key", "value", "pse"):
        if args.get(n) is not None:
            args[n].requires_grad_(requires_grad)
    q, k, v = args.pop("query"), args.pop("key"), args.pop("value")
    return (q, k, v, args.pop("head_num"), args.pop("input_layout")), args


def _grad_args(case: Case):
    (q, k, v, n, layout), kw = _score_args(case, requires_grad=False)
    out, smax, ssum, _, seed, offset = OPS.flash_attention_score(q, k, v, n, layout, **kw)
    dy = torch.randn_like(out)
    kw.update(softmax_max=smax, softmax_sum=ssum, attention_in=out, seed=seed, offset=offset)
    return (q, k, v, dy, n, layout), kw


SMALL = dict(batch=2, q_heads=2, kv_heads=1, q_len=5, kv_len=7, head_dim=8)
CASES = {
    "flash_attention_score": {
        "no_dropout": lambda: _score_args(Case(**SMALL)),
        "dropout_with_seed": lambda: _score_args(Case(keep_prob=0.8, **SMALL)),
        "pse_mask_BNSD": lambda: _score_args(Case(layout="BNSD", pse="BNSS", mask="B1SS", **SMALL)),
        "varlen_TND_causal": lambda: _score_args(Case(layout="TND", q_heads=2, kv_heads=1, head_dim=8,
                                                      seqlens=((3, 0, 4), (2, 5, 1)), sparse_mode=3)),
    },
    "flash_attention_score_grad": {
        "no_dropout": lambda: _grad_args(Case(**SMALL)),
        "dropout_pse": lambda: _grad_args(Case(keep_prob=0.8, pse="BN1S", **SMALL)),
        "varlen_TND": lambda: _grad_args(Case(layout="TND", q_heads=2, kv_heads=2, head_dim=8,
                                              seqlens=((3, 1), (4, 2)), sparse_mode=2)),
    },
    "dropout_gen_mask": {
        "basic": lambda: ((torch.tensor(3), torch.tensor(5), 6, 9, 0.7), {}),
    },
}

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
