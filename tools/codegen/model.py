"""Parse and validate native_functions.yaml into OpSpec records.

Every error names the op and the offending key, so a bad YAML edit fails at generation time,
not at import time of the built extension.
"""
from __future__ import annotations

import dataclasses
import re
from typing import Dict, List, Optional, Tuple

import yaml
from torchgen.model import Argument, FunctionSchema

NAMESPACE = "npu_fa"
DISPATCH_KEYS = ("CPU", "PrivateUse1", "CatchAll")
ENTRY_KEYS = {"func", "doc", "dispatch", "fake", "autograd", "opcheck", "host_tensors"}
AUTOGRAD_KEYS = {"backward", "differentiable_outputs", "gradients", "saved_only_with", "no_gradient"}


class SpecError(ValueError):
    pass


@dataclasses.dataclass(frozen=True)
class BackwardCall:
    op: str                      # name of the backward op (an entry of the same file)
    positional: List[str]        # forward names / grad_<output> passed positionally
    keyword: Dict[str, str]      # backward kwarg -> forward name / grad_<output>


@dataclasses.dataclass(frozen=True)
class Autograd:
    backward: BackwardCall
    differentiable_outputs: List[str]
    gradients: Dict[str, int]    # forward input -> index into the backward op's results
    # tensor input -> optional tensor input: the first is saved only when the second is given; otherwise backward
    # gets a stand-in of its shape, dtype and device without its data (so autograd does not keep it alive)
    saved_only_with: Dict[str, str] = dataclasses.field(default_factory=dict)
    # floating tensor inputs the op has no gradient for: one that requires grad is an error at the forward call
    # rather than a gradient that silently stays None
    no_gradient: List[str] = dataclasses.field(default_factory=list)


@dataclasses.dataclass(frozen=True)
class OpSpec:
    schema: FunctionSchema
    schema_str: str
    doc: str
    dispatch: Dict[str, str]
    fake: Optional[str]
    autograd: Optional[Autograd]
    opcheck: bool
    host_tensors: Tuple[str, ...] = ()   # tensor arguments that may stay on the host (CPU) on any device

    @property
    def tensor_arguments(self) -> List[Argument]:
        """Arguments of type Tensor, Tensor? or Tensor[] (the ones the device rule applies to)."""
        return [a for a in self.arguments if a.type.is_tensor_like()]

    @property
    def written_arguments(self) -> List[Argument]:
        """Tensors the op writes in place (annotated Tensor(a!) in the schema)."""
        return [a for a in self.arguments if a.annotation is not None and a.annotation.is_write]

    @property
    def name(self) -> str:
        return str(self.schema.name)

    @property
    def arguments(self) -> List[Argument]:
        return list(self.schema.arguments.flat_all)

    @property
    def return_names(self) -> List[str]:
        return [r.name or f"result{i}" for i, r in enumerate(self.schema.returns)]

    @property
    def has_tensor_arguments(self) -> bool:
        return any(a.type.is_tensor_like() for a in self.arguments)


_CALL_RE = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_]*)\s*\((.*)\)\s*$", re.S)


def _parse_backward_call(op: str, text: str) -> BackwardCall:
    m = _CALL_RE.match(text)
    if not m:
        raise SpecError(f"{op}: autograd.backward must look like 'op(arg, ..., name=arg)'; got {text!r}")
    positional: List[str] = []
    keyword: Dict[str, str] = {}
    for part in (p.strip() for p in m.group(2).split(",")):
        if not part:
            continue
        if "=" in part:
            k, v = (s.strip() for s in part.split("=", 1))
            keyword[k] = v
        elif keyword:
            raise SpecError(f"{op}: positional argument {part!r} after keyword arguments in autograd.backward")
        else:
            positional.append(part)
    return BackwardCall(m.group(1), positional, keyword)


def _validate_schema(op_hint: str, func: str) -> FunctionSchema:
    import torch  # local: the generator must be importable to print usage without torch

    try:
        torch._C.parse_schema(f"{NAMESPACE}::{func}")
        schema = FunctionSchema.parse(func)
    except Exception as e:  # parse errors of either parser
        raise SpecError(f"{op_hint}: invalid schema {func!r}: {e}") from e
    if schema.name.overload_name:
        raise SpecError(f"{op_hint}: overload names are not supported ({schema.name})")
    return schema


def _parse_entry(index: int, entry: dict) -> OpSpec:
    hint = f"entry #{index}"
    if not isinstance(entry, dict) or "func" not in entry:
        raise SpecError(f"{hint}: every entry needs a 'func:' schema")
    unknown = set(entry) - ENTRY_KEYS
    if unknown:
        raise SpecError(f"{hint}: unknown keys {sorted(unknown)}; allowed: {sorted(ENTRY_KEYS)}")
    schema = _validate_schema(hint, entry["func"])
    name = str(schema.name)
    dispatch = dict(entry.get("dispatch") or {})
    if not dispatch:
        raise SpecError(f"{name}: 'dispatch' must name at least one kernel")
    for key, fn in dispatch.items():
        if key not in DISPATCH_KEYS:
            raise SpecError(f"{name}: dispatch key {key!r} is not one of {DISPATCH_KEYS}")
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", str(fn)):
            raise SpecError(f"{name}: kernel name {fn!r} for {key} is not a C++ identifier")
    if "CatchAll" in dispatch and len(dispatch) > 1:
        raise SpecError(f"{name}: CatchAll excludes other dispatch keys")
    has_tensors = any(a.type.is_tensor_like() for a in schema.arguments.flat_all)
    if "CatchAll" not in dispatch and not has_tensors:
        raise SpecError(f"{name}: an op without tensor arguments must use the CatchAll dispatch key")
    fake = entry.get("fake")
    if has_tensors and not fake:
        raise SpecError(f"{name}: ops with tensor arguments need a 'fake:' kernel (torch.compile requires it)")
    if fake is not None and not re.fullmatch(r"[\w.]+:\w+", fake):
        raise SpecError(f"{name}: 'fake' must be 'module:function'; got {fake!r}")
    autograd = None
    if entry.get("autograd"):
        ag = entry["autograd"]
        unknown = set(ag) - AUTOGRAD_KEYS
        if unknown or "backward" not in ag:
            raise SpecError(f"{name}: autograd needs 'backward' and allows only {sorted(AUTOGRAD_KEYS)}")
        autograd = Autograd(
            backward=_parse_backward_call(name, ag["backward"]),
            differentiable_outputs=list(ag.get("differentiable_outputs") or []),
            gradients={str(k): int(v) for k, v in (ag.get("gradients") or {}).items()},
            saved_only_with={str(k): str(v) for k, v in (ag.get("saved_only_with") or {}).items()},
            no_gradient=[str(n) for n in (ag.get("no_gradient") or [])],
        )
    return OpSpec(schema, entry["func"], " ".join(str(entry.get("doc", "")).split()), dispatch, fake,
                  autograd, bool(entry.get("opcheck", True)), _host_tensors(name, schema, entry))


def _host_tensors(name: str, schema: FunctionSchema, entry: dict) -> Tuple[str, ...]:
    host = entry.get("host_tensors") or []
    tensors = {a.name: a for a in schema.arguments.flat_all if a.type.is_tensor_like()}
    for h in host:
        if h not in tensors:
            raise SpecError(f"{name}: host_tensors names {h!r}, which is not a tensor argument of the op")
        if tensors[h].annotation is not None and tensors[h].annotation.is_write:
            raise SpecError(f"{name}: host_tensors cannot name {h!r}, a tensor the op writes")
    if host and len(host) == len(tensors):
        raise SpecError(f"{name}: host_tensors cannot name every tensor argument (the op needs one on its device)")
    return tuple(host)


def _check_autograd(spec: OpSpec, by_name: Dict[str, OpSpec]) -> None:
    ag = spec.autograd
    if ag is None:
        return
    kwonly = [a.name for a in spec.schema.arguments.flat_kwarg_only if a.type.is_tensor_like()]
    if kwonly:
        raise SpecError(f"{spec.name}: differentiable ops cannot take keyword-only tensors ({kwonly}); "
                        f"torch.library.register_autograd requires them positional (drop the '*')")
    bw = by_name.get(ag.backward.op)
    if bw is None:
        raise SpecError(f"{spec.name}: backward op {ag.backward.op!r} is not declared in the YAML")
    inputs = {a.name: a for a in spec.arguments}
    outputs = spec.return_names
    known = set(inputs) | set(outputs) | {f"grad_{o}" for o in outputs}
    for value in ag.backward.positional + list(ag.backward.keyword.values()):
        if value not in known:
            raise SpecError(f"{spec.name}: autograd.backward uses {value!r}, which is not an input, "
                            f"an output or grad_<output> of the op")
    bw_args = {a.name for a in bw.arguments}
    for k in ag.backward.keyword:
        if k not in bw_args:
            raise SpecError(f"{spec.name}: backward op {bw.name} has no argument {k!r}")
    n_pos = len(list(bw.schema.arguments.flat_positional))
    if len(ag.backward.positional) > n_pos:
        raise SpecError(f"{spec.name}: {len(ag.backward.positional)} positional arguments for {bw.name}, "
                        f"which takes {n_pos}")
    for o in ag.differentiable_outputs:
        if o not in outputs:
            raise SpecError(f"{spec.name}: differentiable output {o!r} is not an output ({outputs})")
    for name, cond in ag.saved_only_with.items():
        if name not in inputs or not inputs[name].type.is_tensor_like() or name not in ag.backward.positional + \
                list(ag.backward.keyword.values()):
            raise SpecError(f"{spec.name}: saved_only_with names {name!r}, which is not a tensor input the "
                            f"backward uses")
        if cond not in inputs or str(inputs[cond].type) != "Tensor?":
            raise SpecError(f"{spec.name}: saved_only_with conditions {name!r} on {cond!r}, which is not an "
                            f"optional tensor input (Tensor?)")
    for name in ag.no_gradient:
        if name not in inputs or not inputs[name].type.is_tensor_like() or name in ag.gradients:
            raise SpecError(f"{spec.name}: no_gradient names {name!r}, which is not a tensor input without a gradient")
    for inp, idx in ag.gradients.items():
        if inp not in inputs or not inputs[inp].type.is_tensor_like():
            raise SpecError(f"{spec.name}: gradient given for {inp!r}, which is not a tensor input")
        if not 0 <= idx < len(bw.schema.returns):
            raise SpecError(f"{spec.name}: gradient index {idx} for {inp!r} is out of range for {bw.name}")


def load(path: str) -> List[OpSpec]:
    with open(path, encoding="utf-8") as f:
        entries = yaml.safe_load(f) or []
    if not isinstance(entries, list):
        raise SpecError(f"{path}: the top level must be a list of op entries")
    specs = [_parse_entry(i, e) for i, e in enumerate(entries)]
    by_name: Dict[str, OpSpec] = {}
    for s in specs:
        if s.name in by_name:
            raise SpecError(f"{s.name}: declared twice")
        by_name[s.name] = s
    for s in specs:
        _check_autograd(s, by_name)
    return specs
