"""The torch_npu names vLLM-Ascend's source references, and whether the torch_npu shim provides each.

    python -m tools.vllm_ascend_names --repo PATH_TO_VLLM_ASCEND [--commit REV] [--write]

reads every Python file under `vllm_ascend/` of a vLLM-Ascend checkout (a work tree or a bare git directory, at
REV, default HEAD), collects the dotted names rooted at `torch_npu`, `torch.npu` and `torch.ops.npu` (attribute
chains, `import torch_npu.x`, `from torch_npu.x import y`), and classifies each against the installed shim:

- `yes`: the name resolves to something usable;
- `raises`: it resolves to a stub that raises NotImplementedError naming it (a torch_npu function this project does
  not implement, a device feature the simulated npu does not have);
- `no`: it does not resolve (AttributeError / ImportError, as for a name torch_npu does not have).

It prints the table, or with --write replaces the table in docs/torch_npu_compat.md (between the markers below).
`classify()` needs no checkout: test/compat/test_vllm_ascend_names.py holds the committed table to it.
"""
import argparse
import ast
import importlib
import re
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "torch_npu_compat.md"
BEGIN, END = "<!-- vllm-ascend-names:begin -->", "<!-- vllm-ascend-names:end -->"
ROOTS = ("torch_npu", "torch.npu", "torch.ops.npu")
STATUSES = ("yes", "raises", "no")


# ----------------------------------------------------------------------------------------------- extraction

def _dotted(node) -> str:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return ""
    parts.append(node.id)
    return ".".join(reversed(parts))


def _rooted(name: str) -> bool:
    return any(name == r or name.startswith(r + ".") for r in ROOTS)


def names_in_source(source: str) -> set:
    """The torch_npu names one Python source references (maximal attribute chains, imports)."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return set()
    found, inner = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            if id(node) in inner:
                continue
            name = _dotted(node)
            value = node.value
            while isinstance(value, ast.Attribute):  # the chain's inner nodes are not names of their own
                inner.add(id(value))
                value = value.value
            if _rooted(name):
                found.add(name)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if _rooted(a.name))
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0 and _rooted(node.module):
            found.update(f"{node.module}.{a.name}" for a in node.names if a.name != "*")
    # `torch_npu` / `torch.npu` alone (the module itself) is not a name of interest
    return {n for n in found if n not in ROOTS}


def _git(repo: Path, *args) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout


def collect(repo: Path, commit: str = "HEAD", under: str = "vllm_ascend") -> dict:
    """name -> sorted list of the files (under `under`) that reference it, at `commit` of the git repository."""
    files = [f for f in _git(repo, "ls-tree", "-r", "--name-only", commit, "--", under).splitlines()
             if f.endswith(".py")]
    where = defaultdict(set)
    for path in files:
        for name in names_in_source(_git(repo, "show", f"{commit}:{path}")):
            where[name].add(path)
    return {name: sorted(paths) for name, paths in sorted(where.items())}


# ----------------------------------------------------------------------------------------------- classification

def _resolve(name: str):
    import torch

    if name.startswith("torch.ops.npu."):
        op = name.split(".")[3]
        if not hasattr(torch.ops.npu, op):
            raise AttributeError(name)
        obj, rest = getattr(torch.ops.npu, op), name.split(".")[4:]
    elif name.startswith("torch.npu."):
        obj, rest = torch.npu, name.split(".")[2:]
    else:
        parts = name.split(".")
        obj = importlib.import_module("torch_npu")
        path = "torch_npu"
        for part in parts[1:]:
            path = f"{path}.{part}"
            if hasattr(obj, part):
                obj = getattr(obj, part)
                continue
            try:  # a submodule not imported yet
                obj = importlib.import_module(path)
            except ImportError:
                raise AttributeError(name) from None
        return obj
    for part in rest:
        obj = getattr(obj, part)
    return obj


def classify(name: str) -> str:
    """'yes', 'raises' or 'no' for one name, with the torch_npu shim installed in this process."""
    from torch_ops_transformer._internal.real_torch_npu import NOT_IMPLEMENTED_MARK

    try:
        obj = _resolve(name)
    except (AttributeError, ImportError):
        return "no"
    return "raises" if getattr(obj, NOT_IMPLEMENTED_MARK, False) else "yes"


def install_shim() -> None:
    from torch_ops_transformer import compat

    torch_npu = compat.install()
    if not compat.is_shim(torch_npu):
        raise SystemExit("a real torch_npu is loaded: the table describes the shim")


# ----------------------------------------------------------------------------------------------- the doc table

def table(names: dict, commit: str) -> str:
    counts = {s: 0 for s in STATUSES}
    rows = []
    for name, files in names.items():
        status = classify(name)
        counts[status] += 1
        rows.append(f"| `{name}` | {len(files)} | {status} |")
    head = (f"vLLM-Ascend at commit `{commit}`: {len(names)} names, {counts['yes']} provided (`yes`), "
            f"{counts['raises']} raising NotImplementedError (`raises`), {counts['no']} absent (`no`).\n\n"
            "| name | files | provided |\n|---|---|---|\n")
    return head + "\n".join(rows) + "\n"


ROW = re.compile(r"^\| `([^`]+)` \| (\d+) \| (yes|raises|no) \|$")


def table_rows(text: str) -> dict:
    """name -> status, from the table between the markers of `text`."""
    block = text.split(BEGIN, 1)[1].split(END, 1)[0]
    return {m.group(1): m.group(3) for m in map(ROW.match, block.splitlines()) if m}


def write(doc: Path, body: str) -> None:
    text = doc.read_text()
    start, end = text.index(BEGIN) + len(BEGIN), text.index(END)
    doc.write_text(text[:start] + "\n" + body + text[end:])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.vllm_ascend_names", description=__doc__.split("\n\n")[0])
    parser.add_argument("--repo", required=True, type=Path, help="a vLLM-Ascend git checkout or bare repository")
    parser.add_argument("--commit", default="HEAD")
    parser.add_argument("--write", action="store_true", help=f"replace the table in {DOC.relative_to(ROOT)}")
    args = parser.parse_args(argv)
    commit = _git(args.repo, "rev-parse", args.commit).strip()
    names = collect(args.repo, commit)
    install_shim()
    body = table(names, commit)
    if args.write:
        write(DOC, body)
    else:
        sys.stdout.write(body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
