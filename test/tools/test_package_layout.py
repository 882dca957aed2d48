"""The Python package's shape, checked from its source: family packages named like aten_ops/cpu/<family>/, no import
cycles, function-local imports only where they defer something (and say what), and the old module paths alive."""
import ast
import importlib
import pathlib
import warnings

import pytest
import yaml

from torch_ops_transformer._internal import aliases

ROOT = pathlib.Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "torch_ops_transformer"
NAME = PACKAGE.name
FAMILIES = sorted(p.name for p in (ROOT / "aten_ops" / "cpu").iterdir() if p.is_dir())
ROLES = ("integrations", "npu_sim", "compat", "oracle", "bench")
PRIVATE = ("_internal", "_library")


def _modules():
    """{dotted name: path} of every Python module of the package (the shims' placeholder packages excluded: they
    are imported as torch_npu / flash_attn, not as part of the package)."""
    out = {}
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(ROOT).with_suffix("")
        if "pythonpath" in str(rel):
            continue
        parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
        out[".".join(parts)] = path
    return out


MODULES = _modules()


def _resolve(module: str, is_package: bool, node) -> list:
    """The package modules an import statement loads: the named ones and, for `from X import name`, X.name when it
    is a module; plus the packages on the way (importing a.b.c runs a/__init__ and a/b/__init__)."""
    if isinstance(node, ast.Import):
        targets = [a.name for a in node.names]
    else:
        base = module if is_package else module.rsplit(".", 1)[0]
        if node.level:
            base = ".".join(base.split(".")[: len(base.split(".")) - (node.level - 1)])
            origin = f"{base}.{node.module}" if node.module else base
        else:
            origin = node.module or ""
        targets = [f"{origin}.{a.name}" if f"{origin}.{a.name}" in MODULES else origin for a in node.names]
    found = set()
    for t in targets:
        parts = t.split(".")
        for i in range(2, len(parts) + 1):  # the parents (not the root: it is always imported first) and t
            if ".".join(parts[:i]) in MODULES:
                found.add(".".join(parts[:i]))
        if t == NAME:
            found.add(NAME)
    own_parents = {module.rsplit(".", i)[0] for i in range(1, module.count(".") + 1)}
    return sorted(found - own_parents - {module})


def _imports():
    """{module: [(import node, inside a function?)]}"""
    out = {}
    for name, path in MODULES.items():
        tree = ast.parse(path.read_text(), str(path))
        local = {id(n) for f in ast.walk(tree) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
                 for n in ast.walk(f) if isinstance(n, (ast.Import, ast.ImportFrom))}
        out[name] = [(n, id(n) in local) for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))]
    return out


IMPORTS = _imports()


def _graph():
    return {m: {t for node, _ in nodes for t in _resolve(m, MODULES[m].name == "__init__.py", node)}
            for m, nodes in IMPORTS.items()}


def _cycles(graph):
    """The strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_cycles():
    """Every import counts, the function-local ones too: a cycle held apart by a deferred import is still a cycle."""
    assert _cycles(_graph()) == []


def test_the_cycle_check_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_function_local_imports_say_what_they_defer():
    """An import inside a function defers an optional dependency or a heavy import, and says which with a `# lazy:`
    comment on its line or above its block of imports; everything else is imported at the top of the module."""
    silent = []
    for name, nodes in IMPORTS.items():
        lines = MODULES[name].read_text().splitlines()
        for node, local in nodes:
            if not local:
                continue
            first = node.lineno - 1
            while first > 0 and lines[first - 1].strip().startswith(("from ", "import ")):
                first -= 1  # the block of imports this one belongs to
            if not any("# lazy:" in line for line in lines[max(first - 1, 0): node.end_lineno]):
                silent.append(f"{MODULES[name].relative_to(ROOT)}:{node.lineno}: {ast.unparse(node)}")
    assert silent == []


def test_top_level_holds_only_packages_and_the_entry_points():
    files = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert files == ["__init__.py", "__main__.py"]
    packages = sorted(p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file())
    assert packages == sorted(FAMILIES + list(ROLES) + list(PRIVATE))


def _fake_modules(family):
    """A family's fake-kernel modules: fake.py, or fake_<part>.py per part of a family whose parts are separate."""
    return sorted(p.stem for p in (PACKAGE / family).glob("fake*.py"))


@pytest.mark.parametrize("family", FAMILIES)
def test_each_family_is_a_package_with_its_fake_kernels(family):
    assert (PACKAGE / family / "__init__.py").is_file()
    assert _fake_modules(family)
    assert (ROOT / "test" / family).is_dir()


def test_yaml_fake_kernels_live_in_their_family_package():
    entries = yaml.safe_load((ROOT / "native_functions.yaml").read_text())
    modules = {e["fake"].split(":")[0] for e in entries if e.get("fake")}
    assert modules == {f"{NAME}.{family}.{m}" for family in FAMILIES for m in _fake_modules(family)}


def test_init_only_re_exports():
    """The package's __init__ defines no op wrappers of its own: imports, the lazy Inductor/HF entry points, __all__,
    and the one startup function."""
    tree = ast.parse((PACKAGE / "__init__.py").read_text())
    functions = sorted(n.name for n in tree.body if isinstance(n, ast.FunctionDef))
    assert functions == ["__getattr__", "_startup", "compile_lowering", "disable_compile_lowering",
                         "enable_compile_lowering"]
    assert not [n for n in tree.body if isinstance(n, ast.ClassDef)]


def _old_paths():
    return sorted(f"{NAME}.{old}" for old in aliases.OLD_PATHS)


@pytest.mark.parametrize("old", _old_paths())
def test_old_module_paths_still_import_with_a_deprecation_warning(old):
    new = aliases.new_path(old)
    if new is not None and new.endswith(".hf"):
        pytest.importorskip("transformers")
    with pytest.warns(DeprecationWarning, match="moved"):
        module = importlib.import_module(old)
    if new is not None:
        assert module is importlib.import_module(new)  # the same object: monkeypatching the old path still works


def test_old_module_names_are_attributes_of_the_package_too(monkeypatch):
    import sys

    import torch_ops_transformer as tot

    if "fa2_padding" in vars(tot):  # bound by an earlier import of the old path (hasattr would warn: not that)
        monkeypatch.delattr(tot, "fa2_padding")
    monkeypatch.delitem(sys.modules, f"{NAME}.fa2_padding", raising=False)
    with pytest.warns(DeprecationWarning, match="torch_ops_transformer.fa2_padding moved to"):
        padding = tot.fa2_padding
    assert padding is importlib.import_module(f"{NAME}.compat.bert_padding")
    assert tot.tuning is importlib.import_module(f"{NAME}.attention.tuning")  # in __all__: no warning
    with pytest.raises(AttributeError, match="no attribute 'no_such_module'"):
        tot.no_such_module  # noqa: B018


def test_the_package_imports_without_warnings_from_its_own_old_paths(tmp_path):
    """Nothing inside the package (or its tests) uses an old path: importing every module warns nothing."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        for name in sorted(MODULES):
            if name.endswith(".hf") or name.endswith("inductor_lowering"):
                continue  # imports transformers / Inductor: covered by their own tests
            importlib.import_module(name)
