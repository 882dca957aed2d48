"""The generated pieces that let C++ code pass calls on without spelling argument lists: for every op with tensors,
`call_<op>(const <Op>Args&)` (aten_ops/generated/op_calls.h: the op through the dispatcher with its typed signature,
looked up once) and `<Op>Values` (op_args.h: the arguments held by value with the schema's defaults, to replace some
by name). Outside aten_ops/generated no code looks one of our ops up in the dispatcher or builds an argument struct
positionally."""
import os
import re

import pytest

from tools.codegen import gen_cpp
from tools.codegen.main import ROOT, render_all
from tools.codegen.model import load

SPECS = [s for s in load(os.path.join(ROOT, "native_functions.yaml")) if "CatchAll" not in s.dispatch]
FILES = render_all()
ARGS_H = FILES["aten_ops/generated/op_args.h"]
CALLS_H = FILES["aten_ops/generated/op_calls.h"]


def _block(text: str, start: str) -> str:
    """The text from `start` to the next line that is a lone `}` or `};`."""
    i = text.index(start)
    return text[i:re.compile(r"^\}\;?$", re.M).search(text, i).end()]


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.name)
def test_every_op_has_a_typed_dispatcher_call(spec):
    fn = _block(CALLS_H, f"inline {gen_cpp.return_type(spec.schema)} call_{spec.name}("
                         f"const {gen_cpp.args_struct(spec)}& a) {{")
    assert f'findSchemaOrThrow("npu_fa::{spec.name}", "")' in fn
    assert "static const auto op =" in fn, "the handle is looked up once"
    params = ", ".join(gen_cpp._arg_type(spec.name, a) for a in spec.arguments)
    assert f".typed<{gen_cpp.return_type(spec.schema)}({params})>()" in fn, "the kernels' unboxed signature"
    assert f"return op.call({', '.join('a.' + a.name for a in spec.arguments)});" in fn


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.name)
def test_every_op_has_an_owning_copy_of_its_arguments(spec):
    args, vals = gen_cpp.args_struct(spec), gen_cpp.values_struct(spec)
    body = _block(ARGS_H, f"struct {vals} {{")
    members = re.findall(r"^  [\w:<>, ]+? (\w+)(?: = [^;]+|\{\})?;$", body, re.M)
    assert members == [a.name for a in spec.arguments], "every argument, in schema order"
    assert not re.search(r"&\s*\w+;", body), "members are values, not references"
    assert f"  {vals}() = default;" in body and f"  explicit {vals}(const {args}& a)" in body
    assert f"  {args} args() const {{ return {args}{{" in body


def test_values_keep_the_schema_defaults():
    fa = _block(ARGS_H, "struct FlashAttentionScoreValues {")
    for member in ("int64_t pre_tokens = 2147483647;", "double keep_prob = 1.0;", "std::string softmax_layout = \"\";",
                   "std::optional<at::Tensor> sink;", "bool alibi_bottom_right = false;",
                   "std::optional<std::vector<int64_t>> q_start_idx;", "at::Tensor query;", "int64_t head_num{};"):
        assert f"  {member}\n" in fa, member


def test_register_ops_compiles_every_call():
    assert '#include "op_calls.h"' in FILES["aten_ops/generated/register_ops.cpp"]


# ---- no hand-written dispatcher lookups of our ops, no positional argument structs outside aten_ops/generated ----

def _sources():
    for base, _, files in os.walk(os.path.join(ROOT, "aten_ops")):
        if os.path.relpath(base, ROOT).startswith(os.path.join("aten_ops", "generated")):
            continue
        for f in files:
            if f.endswith((".cpp", ".h")):
                path = os.path.join(base, f)
                yield os.path.relpath(path, ROOT), open(path, encoding="utf-8").read()


def test_no_hand_typed_dispatcher_call_of_our_ops():
    lookup = re.compile(r"(findOp|findSchemaOrThrow|findSchema)\s*\(\s*(c10::OperatorName\s*\(\s*)?\"npu_fa::")
    typed = re.compile(r"(\.|->)typed<")
    offenders = [path for path, text in _sources() if lookup.search(text) or typed.search(text)]
    assert offenders == [], f"call npu_fa ops through the generated call_<op> (op_calls.h): {offenders}"


def test_no_argument_struct_built_positionally():
    names = "|".join(gen_cpp.args_struct(s) for s in SPECS)
    built = re.compile(rf"\b({names})\s*(\w+\s*)?\{{")
    offenders = [f"{path}: {m.group(0)}" for path, text in _sources() for m in built.finditer(text)
                 if not text[:m.start()].rstrip().endswith("struct")]
    assert offenders == [], ("copy a call with <Op>Values and replace fields by name, or build the other op's "
                             f"<Op>Values field by field: {offenders}")
