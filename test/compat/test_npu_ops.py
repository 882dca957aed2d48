"""`torch.ops.npu.<name>` (torch_ops_transformer/compat/npu_ops.py): with the shim installed, every mirrored torch_npu
function is also an operator of the `npu` namespace with upstream's schema, giving the wrapper's results, with a
fake kernel (torch.compile fullgraph), an autograd kernel, and never registered over a real torch_npu.

Installing the shim is permanent for a process, so each case runs in a child process."""
from test.compat.test_shim import _run

# One child for every call: each mirrored function through torch.ops.npu against its wrapper, on the samples of the
# signature parity test (a process group argument becomes its name: the schema's `str hcom` / `str group_ep`).
CALLS = """
import torch
from torch_ops_transformer import compat
from torch_ops_transformer._internal import args as _args
from torch_ops_transformer.compat import npu_ops
compat.install()
from test.compat.test_signature_parity import SAMPLES

expected = sorted(npu_ops.mirrored_schemas())
assert sorted(npu_ops.registered()) == expected, (npu_ops.registered(), expected)
assert len(expected) >= 40

def named(v):
    if isinstance(v, torch.distributed.ProcessGroup):
        return v.group_name
    if isinstance(v, torch.Tensor):
        return v.clone()
    if isinstance(v, (list, tuple)):
        return type(v)(named(x) for x in v)
    return v

def same(a, b, where):
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.shape == b.shape and a.dtype == b.dtype, where
        if a.dtype.is_floating_point:
            torch.testing.assert_close(a, b, rtol=0, atol=0, equal_nan=True, msg=where)
        else:
            assert torch.equal(a, b), where
    elif isinstance(a, (list, tuple)):
        assert isinstance(b, (list, tuple)) and len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            same(x, y, f"{where}[{i}]")
    else:
        assert a == b, (where, a, b)

for name in expected:  # upstream's schema line, unchanged
    schema = str(getattr(torch.ops.npu, name).default._schema)
    assert schema == "npu::" + str(torch._C.parse_schema(npu_ops.mirrored_schemas()[name])), schema

# world_size: upstream's schema wants an int of 2..32; the one-rank samples pass None (ours: the group's size), which
# the schema refuses. Both calls then give the same rule for world_size=1.
ONE_RANK = ("npu_all_gather_base_mm", "npu_mm_reduce_scatter_base", "npu_all_gather_quant_mm")
for name in ONE_RANK:
    args, kwargs = SAMPLES[name]()
    args = args[:3] + (1,) + args[4:]
    for fn in (_args.TORCH_NPU_API[name], getattr(torch.ops.npu, name)):
        try:
            fn(*args, **kwargs)
            raise AssertionError(name)
        except RuntimeError as e:
            assert "argument 'world_size' must be one of [2, 4, 8, 16, 32" in str(e), e
    print("ok", name, "(the world_size rule)")

for name in expected:
    if name in ONE_RANK:
        continue
    args, kwargs = SAMPLES[name]()
    args, kwargs = named(args), {k: named(v) for k, v in kwargs.items()}
    mine_args, mine_kwargs = named(args), {k: named(v) for k, v in kwargs.items()}
    torch.manual_seed(0)
    want = _args.TORCH_NPU_API[name](*args, **kwargs)
    torch.manual_seed(0)
    got = getattr(torch.ops.npu, name)(*mine_args, **mine_kwargs)
    same(got, want, name)
    same(mine_args, args, name + " (arguments after the call: in-place results)")
    print("ok", name)
if torch.distributed.is_initialized():
    torch.distributed.destroy_process_group()
"""


def test_every_mirrored_function_is_an_npu_operator_with_the_wrappers_results():
    out = _run(CALLS).stdout
    assert out.count("ok ") >= 40


COMPILE = """
import torch, torch_npu
from torch._dynamo.testing import CompileCounterWithBackend

def f(q, k, v, x, cos, sin, key, value, key_cache, value_cache, slots):
    out = torch.ops.npu.npu_fusion_attention(q, k, v, 2, "BSND", scale=0.25)[0]
    y = torch.ops.npu.npu_rotary_mul(x, cos, sin)
    torch.ops.npu.npu_scatter_pa_kv_cache(key, value, key_cache, value_cache, slots, cache_mode="Norm")
    return out * 2, torch.ops.npu.npu_swiglu(y, -1), key_cache.sum()

def inputs():
    torch.manual_seed(0)
    return (torch.randn(1, 4, 2, 8), torch.randn(1, 4, 2, 8), torch.randn(1, 4, 2, 8), torch.randn(1, 3, 2, 8),
            torch.randn(1, 3, 1, 8), torch.randn(1, 3, 1, 8), torch.randn(3, 2, 8), torch.randn(3, 2, 8),
            torch.zeros(2, 4, 2, 8), torch.zeros(2, 4, 2, 8), torch.tensor([0, 5, 6], dtype=torch.int32))

want_in, got_in = inputs(), inputs()
want = f(*want_in)
counter = CompileCounterWithBackend("aot_eager")
got = torch.compile(f, fullgraph=True, backend=counter)(*got_in)
assert counter.frame_count == 1
graph = str(counter.graphs[0].code)
for op in ("npu_fusion_attention", "npu_rotary_mul", "npu_scatter_pa_kv_cache", "npu_swiglu"):
    assert f"torch.ops.npu.{op}" in graph, (op, graph)
for a, b in zip(got, want):
    torch.testing.assert_close(a, b, rtol=0, atol=0)
torch.testing.assert_close(got_in[8], want_in[8], rtol=0, atol=0)  # the in-place cache write
torch.testing.assert_close(got_in[9], want_in[9], rtol=0, atol=0)

# inductor, on the simulated npu device
dev = [t.npu() for t in inputs()]
got = torch.compile(f, fullgraph=True)(*dev)
for a, b in zip(got, want):
    torch.testing.assert_close(a.cpu(), b, rtol=1e-6, atol=1e-6)
assert torch.equal(dev[8].cpu(), want_in[8])

# autograd: the gradient of the wrapper (our ops' backward)
x = torch.randn(1, 3, 2, 8, requires_grad=True)
cos, sin = torch.randn(1, 3, 1, 8), torch.randn(1, 3, 1, 8)
g = torch.randn(1, 3, 2, 8)
(dx,) = torch.autograd.grad(torch.ops.npu.npu_rotary_mul(x, cos, sin), x, g)
(want_dx,) = torch.autograd.grad(torch_npu.npu_rotary_mul(x, cos, sin), x, g)
torch.testing.assert_close(dx, want_dx, rtol=0, atol=0)
for op, args in ((torch.ops.npu.npu_rotary_mul.default, (x.detach(), cos, sin)),
                 (torch.ops.npu.npu_swiglu.default, (torch.randn(3, 8), -1))):
    torch.library.opcheck(op, args)
print("compiled")
"""


def test_npu_operators_compile_fullgraph_without_graph_breaks_and_differentiate():
    assert "compiled" in _run(COMPILE).stdout


REAL = """
import sys, types, torch
real = types.ModuleType("torch_npu")  # stands for a real torch_npu, already imported
sys.modules["torch_npu"] = real
from torch_ops_transformer import compat
from torch_ops_transformer.compat import npu_ops
assert compat.install() is real
assert npu_ops.register() is False and npu_ops.registered() == []
assert not hasattr(torch.ops.npu, "npu_rotary_mul") and not hasattr(torch.ops.npu, "npu_fusion_attention")
print("untouched")
"""


def test_never_registered_when_a_real_torch_npu_is_loaded():
    assert "untouched" in _run(REAL, shim_on_path=False).stdout


NEW_FUNCTION = """
import torch
from torch_ops_transformer import compat
from torch_ops_transformer._internal import args as _args

# A function added to the mirrored list and implemented (as another family's merge would): an operator at install.
compat.upstream_functions()["mirrored"].append("npu_example_double(Tensor x, *, float alpha=2.) -> Tensor")

@_args.torch_npu_api
def npu_example_double(x, *, alpha=2.0):
    return x * alpha

compat.install()
x = torch.arange(3.0)
assert torch.equal(torch.ops.npu.npu_example_double(x, alpha=3.0), x * 3)
assert "float alpha=2." in str(torch.ops.npu.npu_example_double.default._schema)
print("picked up")
"""


def test_the_registration_follows_the_mirrored_list():
    assert "picked up" in _run(NEW_FUNCTION, shim_on_path=False).stdout


def test_doc_example_runs():
    import re
    from pathlib import Path
    from test.common.checkout import ROOT
    text = Path(ROOT, "docs", "torch_npu_compat.md").read_text()
    section = text.split("## `torch.ops.npu`", 1)[1].split("\n## ", 1)[0]
    (code,) = re.findall(r"```python\n(.*?)```", section, re.S)
    _run(code, shim_on_path=False)


def test_never_registered_when_a_real_torch_npu_imports(tmp_path):
    """An installed torch_npu that imports (through the shim's PYTHONPATH directory, which defers to it)."""
    from test.compat.test_shim import _fake_torch_npu
    site = _fake_torch_npu(tmp_path, "REAL = True\n")
    assert "deferred" in _run("""
        import torch, torch_npu
        from torch_ops_transformer.compat import npu_ops
        assert getattr(torch_npu, "REAL", False) and npu_ops.registered() == []
        assert not hasattr(torch.ops.npu, "npu_rotary_mul")
        print("deferred")
        """, extra_path=[site]).stdout
