"""The generator (tools/codegen): checked-in files are fresh, the YAML model rejects bad entries, and every wrapper
it writes applies the device rule (host_tensors excepted) and, for written tensors, the overlap rule."""
import textwrap

import pytest

from tools.codegen import gen_cpp, gen_python
from tools.codegen.main import stale_files
from tools.codegen.model import SpecError, load

VALID = """
- func: my_op(Tensor x, Tensor? y=None, int n=1) -> (Tensor out, Tensor aux)
  doc: test op
  dispatch:
    CPU: my_op_cpu
  fake: pkg.fake:my_op
  autograd:
    backward: my_op_grad(x, grad_out, n=n)
    differentiable_outputs: [out]
    gradients: {x: 0}
- func: my_op_grad(Tensor x, Tensor dy, int n=1) -> Tensor
  dispatch:
    CPU: my_op_grad_cpu
  fake: pkg.fake:my_op_grad
- func: knob(int v=0) -> int[]
  dispatch:
    CatchAll: knob_impl
  opcheck: false
"""


def _write(tmp_path, text: str) -> str:
    path = tmp_path / "native_functions.yaml"
    path.write_text(textwrap.dedent(text))
    return str(path)


def _load_with(tmp_path, old: str, new: str):
    assert old in VALID
    return load(_write(tmp_path, VALID.replace(old, new)))


def test_checked_in_generated_files_are_fresh():
    assert stale_files() == [], "run `python -m tools.codegen` and commit the result"


def test_valid_yaml_loads(tmp_path):
    specs = load(_write(tmp_path, VALID))
    assert [s.name for s in specs] == ["my_op", "my_op_grad", "knob"]
    assert specs[0].autograd.gradients == {"x": 0} and specs[0].opcheck and not specs[2].opcheck


@pytest.mark.parametrize("old,new,message", [
    ("-> (Tensor out, Tensor aux)", "-> (Tensor out, Tensr aux)", "invalid schema"),
    ("CPU: my_op_grad_cpu", "CUDA: my_op_grad_cpu", "dispatch key 'CUDA'"),
    ("  fake: pkg.fake:my_op_grad\n", "", "need a 'fake:' kernel"),
    ("my_op_grad(x, grad_out, n=n)", "my_op_grad(x, grad_out, n=width)", "'width'"),
    ("my_op_grad(x, grad_out, n=n)", "my_op_grad(x, grad_out, m=n)", "no argument 'm'"),
    ("my_op_grad(x, grad_out, n=n)", "missing_op(x, grad_out)", "'missing_op' is not declared"),
    ("gradients: {x: 0}", "gradients: {n: 0}", "not a tensor input"),
    ("differentiable_outputs: [out]", "differentiable_outputs: [nope]", "'nope'"),
    ("CatchAll: knob_impl", "CPU: knob_impl", "CatchAll"),
    ("  doc: test op\n", "  doc: test op\n  colour: red\n", "unknown keys"),
    ("gradients: {x: 0}", "gradients: {x: 0}\n    saved_only_with: {x: n}", "not an optional tensor input"),
    ("gradients: {x: 0}", "gradients: {x: 0}\n    saved_only_with: {y: x}", "'y', which is not a tensor input the"),
    ("gradients: {x: 0}", "gradients: {x: 0}\n    no_gradient: [x]", "'x', which is not a tensor input without"),
], ids=["bad_schema", "unknown_dispatch_key", "missing_fake", "backward_unknown_argument",
        "backward_unknown_keyword", "unknown_backward_op", "gradient_for_non_tensor", "unknown_output",
        "no_tensors_without_catchall", "unknown_entry_key", "saved_only_with_non_optional_condition",
        "saved_only_with_unsaved_tensor", "no_gradient_for_a_differentiable_input"])
def test_model_rejects(tmp_path, old, new, message):
    with pytest.raises(SpecError, match=message):
        _load_with(tmp_path, old, new)


def test_saved_only_with_saves_a_stand_in_without_the_condition(tmp_path):
    """autograd.saved_only_with {x: y}: x is saved when y is given, else a storage-free stand-in of its shape."""
    import torch

    from torch_ops_transformer._library.generated.registrations import _stand_in

    specs = _load_with(tmp_path, "gradients: {x: 0}", "gradients: {x: 0}\n    saved_only_with: {x: y}")
    text = gen_python.render(specs)["torch_ops_transformer/_library/generated/registrations.py"]
    assert "ctx.save_for_backward(x if y is not None else _stand_in(x))" in text
    t = torch.randn(3, 4, dtype=torch.float64)
    stand_in = _stand_in(t)
    assert stand_in.shape == t.shape and stand_in.dtype == t.dtype and stand_in.untyped_storage().nbytes() == 8


def test_model_rejects_duplicates(tmp_path):
    with pytest.raises(SpecError, match="declared twice"):
        load(_write(tmp_path, VALID + VALID.split("- func: my_op_grad")[0]))  # my_op a second time


PRIVATEUSE1 = """
- func: dev_op(Tensor a, Tensor? b, Tensor c, int k=0) -> Tensor
  dispatch:
    CPU: dev_op_cpu
    PrivateUse1: dev_op_npu
  fake: pkg.fake:dev_op
"""


def test_privateuse1_wrapper_checks_devices(tmp_path):
    text = gen_cpp.render(load(_write(tmp_path, PRIVATEUSE1)))["aten_ops/generated/register_ops.cpp"]
    assert ("at::Tensor dev_op_npu_privateuse1(const at::Tensor& a, const std::optional<at::Tensor>& b, "
            "const at::Tensor& c, int64_t k)") in text
    assert 'npu_fa::DeviceRule rule("dev_op");' in text
    for arg in "abc":
        assert f'rule.device_tensor("{arg}", {arg});' in text
    assert "const c10::DeviceGuard guard(rule.device());" in text
    assert "return npu_fa::dev_op_npu(npu_fa::DevOpArgs{a, b, c, k});" in text
    assert "TORCH_LIBRARY_IMPL(npu_fa, PrivateUse1, m)" in text
    assert 'm.impl("dev_op", TORCH_FN(dev_op_npu_privateuse1));' in text
    assert 'm.impl("dev_op", TORCH_FN(dev_op_cpu_unboxed));' in text
    assert 'm.def("dev_op(Tensor a, Tensor? b, Tensor c, int k=0) -> Tensor", {at::Tag::pt2_compliant_tag});' in text
    header = gen_cpp.render(load(_write(tmp_path, PRIVATEUSE1)))["aten_ops/generated/kernels.h"]
    assert "at::Tensor dev_op_npu(const DevOpArgs& args);" in header
    assert "at::Tensor dev_op_cpu(const DevOpArgs& args);" in header


RULES = """
- func: write_op(Tensor(a!) w1, Tensor(b!) w2, Tensor r, Tensor? lens=None) -> ()
  dispatch:
    CPU: write_op_cpu
  fake: pkg.fake:write_op
  host_tensors: [lens]
"""


def _cpu_wrapper_body(text: str, name: str) -> str:
    start = text.index(f"void {name}_cpu_unboxed(")
    return text[start:text.index("\n}\n", start)]


def test_every_wrapper_applies_the_device_and_overlap_rules(tmp_path):
    """Device rule for every tensor (host_tensors may stay on the CPU), in the CPU wrapper and the fake binding;
    self-overlap for every written tensor and overlap for every (written, other) pair, each pair once."""
    specs = load(_write(tmp_path, RULES))
    body = _cpu_wrapper_body(gen_cpp.render(specs)["aten_ops/generated/register_ops.cpp"], "write_op")
    assert [line.strip() for line in body.splitlines()[1:]] == [
        'npu_fa::DeviceRule rule("write_op");',
        'rule.device_tensor("w1", w1);', 'rule.device_tensor("w2", w2);', 'rule.device_tensor("r", r);',
        'rule.host_tensor("lens", lens);',
        'npu_fa::check_no_self_overlap("write_op", "w1", w1);',
        'npu_fa::check_no_overlap("write_op", "w1", w1, "w2", w2);',
        'npu_fa::check_no_overlap("write_op", "w1", w1, "r", r);',
        'npu_fa::check_no_overlap("write_op", "w1", w1, "lens", lens);',
        'npu_fa::check_no_self_overlap("write_op", "w2", w2);',
        'npu_fa::check_no_overlap("write_op", "w2", w2, "r", r);',
        'npu_fa::check_no_overlap("write_op", "w2", w2, "lens", lens);',
        "return npu_fa::write_op_cpu(npu_fa::WriteOpArgs{w1, w2, r, lens});"]
    py = gen_python.render(specs)["torch_ops_transformer/_library/generated/registrations.py"]
    assert "check_devices('write_op', a._asdict().items(), host=('lens',))" in py


@pytest.mark.parametrize("host,message", [("[nope]", "'nope', which is not a tensor argument"),
                                          ("[w1]", "cannot name 'w1', a tensor the op writes"),
                                          ("[w1, w2, r, lens]", "cannot name 'w1'")])
def test_model_rejects_bad_host_tensors(tmp_path, host, message):
    with pytest.raises(SpecError, match=message):
        load(_write(tmp_path, RULES.replace("[lens]", host)))


def test_cpu_only_yaml_has_no_privateuse1_block(tmp_path):
    text = gen_cpp.render(load(_write(tmp_path, VALID)))["aten_ops/generated/register_ops.cpp"]
    assert "PrivateUse1" not in text and "_privateuse1(" not in text
    assert 'm.def("knob(int v=0) -> int[]", TORCH_FN(npu_fa::knob_impl));' in text


def test_python_registrations_follow_the_yaml(tmp_path):
    text = gen_python.render(load(_write(tmp_path, VALID)))["torch_ops_transformer/_library/generated/registrations.py"]
    assert 'torch.library.register_fake("npu_fa::my_op", _fake_my_op)' in text
    assert "a = MyOpArgs(x, y, n)" in text and "return _fake_kernel('pkg.fake', 'my_op')(a)" in text
    assert 'torch.library.register_autograd("npu_fa::my_op", _backward_my_op, setup_context=_setup_my_op)' in text
    assert "ctx.mark_non_differentiable(aux)" in text
    assert "grads[0] if _needs_grad(ctx, 0) else None,  # x" in text
    assert "register_fake(\"npu_fa::knob\"" not in text
    compile(text, "registrations.py", "exec")
