"""Render the source tree into docs/architecture.md, or check that the listing there is current.

    python -m tools.doc_tree          # rewrite the block between the tree markers of docs/architecture.md
    python -m tools.doc_tree --check  # exit 1 if the block differs from the tree (test/tools runs this)

Each line is a tracked file or folder with the first sentence of its own header comment or docstring, so the
listing explains itself and cannot drift from the files: moving, adding or removing a file changes it. Test
folders are listed without their files (their conftest.py docstring describes them).
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from typing import Dict, List, Optional

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOC = os.path.join(ROOT, "docs", "architecture.md")
BEGIN, END = "<!-- tree:begin (python -m tools.doc_tree) -->", "<!-- tree:end -->"
# Folders shown without their files: their contents are many small files described by the folder itself.
COLLAPSED = ("test/", "docs/", "ascendc/cpu_runtime/include/ascendc_cpu/", "ascendc/tests/", ".ci/")
MAX_DESC = 96


def tracked_files(root: str = ROOT) -> List[str]:
    """Files under version control (a clean checkout's view; build outputs and caches never appear)."""
    out = subprocess.run(["git", "ls-files"], cwd=root, capture_output=True, text=True, check=True).stdout
    return sorted(p for p in out.splitlines() if os.path.exists(os.path.join(root, p)))


def _first_sentence(text: str) -> str:
    text = " ".join(text.split())
    m = re.match(r"(.+?)\.(\s|$)", text)
    s = m.group(1) if m else text
    return s if len(s) <= MAX_DESC else s[:MAX_DESC - 1].rstrip() + "…"


def describe(path: str) -> str:
    """The first sentence of a file's docstring (Python) or leading // or # comment block (C++, YAML, shell)."""
    try:
        with open(path, encoding="utf-8") as f:
            head = f.read(4000)
    except (OSError, UnicodeDecodeError):
        return ""
    if path.endswith(".py"):
        # (a docstring longer than the head read: its first sentence is all that is needed)
        m = re.match(r'\s*(?:#[^\n]*\n\s*)*[rb]?("""|\'\'\')(.*?)(?:\1|\Z)', head, re.S)
        return _first_sentence(m.group(2)) if m else ""
    if path.endswith(".md"):
        m = re.search(r"^#\s+(.+)$", head, re.M)
        return m.group(1).strip() if m else ""
    marker = "//" if path.endswith((".cpp", ".h")) else "#"
    lines = []
    for line in head.splitlines():
        s = line.strip()
        if s.startswith("#!") or (not lines and not s):
            continue
        if not s.startswith(marker) or s.startswith("#include") or s.startswith("#pragma"):
            if lines:
                break
            continue
        lines.append(s[len(marker):].strip())
    return _first_sentence(" ".join(lines)) if lines else ""


def _folder_description(folder: str, files: List[str]) -> str:
    for name in ("__init__.py", "conftest.py", "README.md"):
        p = folder + name
        if p in files:
            d = describe(os.path.join(ROOT, p))
            if d:
                return d
    return ""


def render(files: List[str]) -> str:
    """The tree as indented lines, folders first, each with its description."""
    children: Dict[str, List[str]] = {}
    for f in files:
        parts = f.split("/")
        for i in range(len(parts)):
            parent = "/".join(parts[:i]) + ("/" if i else "")
            node = "/".join(parts[:i + 1]) + ("/" if i < len(parts) - 1 else "")
            children.setdefault(parent, [])
            if node not in children[parent]:
                children[parent].append(node)
    lines: List[str] = []

    def walk(folder: str, depth: int) -> None:
        nodes = sorted(children.get(folder, []), key=lambda n: (not n.endswith("/"), n))
        for node in nodes:
            name = node[len(folder):]
            is_dir = node.endswith("/")
            if is_dir:
                desc = _folder_description(node, files)
            else:  # a package's __init__ already describes its folder
                desc = "" if name == "__init__.py" else describe(os.path.join(ROOT, node))
            label = "  " * depth + name
            lines.append(f"{label:<52} {desc}".rstrip() if desc else label)
            if is_dir and not node.startswith(COLLAPSED):
                walk(node, depth + 1)
            elif is_dir and node in COLLAPSED:
                sub = sorted({c[len(node):].split("/")[0] + "/" for c in files
                              if c.startswith(node) and "/" in c[len(node):]})
                for s in sub:
                    d = _folder_description(node + s, files)
                    label = "  " * (depth + 1) + s
                    lines.append(f"{label:<52} {d}".rstrip() if d else label)

    walk("", 0)
    return "\n".join(lines)


def block(files: Optional[List[str]] = None) -> str:
    return f"{BEGIN}\n```\n{render(files or tracked_files())}\n```\n{END}"


def current_doc() -> str:
    with open(DOC, encoding="utf-8") as f:
        return f.read()


def updated_doc(text: str, new_block: str) -> str:
    if BEGIN not in text or END not in text:
        raise SystemExit(f"{DOC}: the tree markers are missing ({BEGIN} ... {END})")
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    return head + new_block + tail


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m tools.doc_tree", description=__doc__.splitlines()[0])
    p.add_argument("--check", action="store_true", help="exit 1 if docs/architecture.md's tree is stale")
    args = p.parse_args(argv)
    text = current_doc()
    new = updated_doc(text, block())
    if args.check:
        if new != text:
            print("stale: docs/architecture.md tree listing (run `python -m tools.doc_tree`)")
            return 1
        return 0
    if new != text:
        with open(DOC, "w", encoding="utf-8") as f:
            f.write(new)
        print("wrote docs/architecture.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
