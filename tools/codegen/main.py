"""Generate every derived file from native_functions.yaml, or check that the checked-in copies are fresh."""
from __future__ import annotations

import argparse
import os
import sys
from typing import Dict

from . import gen_cpp, gen_python
from .model import load

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def render_all(yaml_path: str = os.path.join(ROOT, "native_functions.yaml")) -> Dict[str, str]:
    specs = load(yaml_path)
    files = {}
    files.update(gen_cpp.render(specs))
    files.update(gen_python.render(specs))
    return files


def stale_files(root: str = ROOT) -> list:
    out = []
    for rel, text in render_all(os.path.join(root, "native_functions.yaml")).items():
        path = os.path.join(root, rel)
        if not os.path.exists(path) or open(path, encoding="utf-8").read() != text:
            out.append(rel)
    return out


def generate(root: str = ROOT) -> list:
    """Write the generated files that changed; returns their relative paths."""
    written = []
    for rel in stale_files(root):
        text = render_all(os.path.join(root, "native_functions.yaml"))[rel]
        path = os.path.join(root, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
        written.append(rel)
    return written


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m tools.codegen", description=__doc__)
    p.add_argument("--check", action="store_true", help="exit 1 if any generated file is stale")
    args = p.parse_args(argv)
    if args.check:
        stale = stale_files()
        for rel in stale:
            print(f"stale: {rel} (run `python -m tools.codegen`)")
        return 1 if stale else 0
    for rel in generate():
        print(f"wrote {rel}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
