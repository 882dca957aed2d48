"""The documentation describes this tree: the generated tree listing in docs/architecture.md is current, every
relative link in README.md and docs/ resolves, and nothing points at material a user of the repository lacks."""
import pathlib
import re
import subprocess
import sys

from test.common.checkout import ROOT
from tools import check_doc_links, doc_tree

# Phrases that would refer to material outside the repository (dropout and RNG seeds are fine).
OUTSIDE = re.compile(r"seed article|the seed's|seed (scenario|table)|\bissue [0-9]+|/work/|shared/reference", re.I)


def test_architecture_tree_is_current():
    text = doc_tree.current_doc()
    assert doc_tree.updated_doc(text, doc_tree.block()) == text, "run `python -m tools.doc_tree`"


def test_tree_lists_every_family_folder():
    listing = doc_tree.render(doc_tree.tracked_files())
    for family in ("attention/", "inference/", "rope/", "moe/"):
        assert listing.count(family) >= 4, family  # common, cpu, ascendc/kernels, test


def test_doc_links_resolve():
    md_files = [pathlib.Path(ROOT, "README.md"), *sorted(pathlib.Path(ROOT, "docs").glob("*.md"))]
    bad = [b for f in md_files for b in check_doc_links.broken(f)]
    assert bad == []


def test_no_reference_to_material_outside_the_repository():
    files = subprocess.run(["git", "ls-files", "*.py", "*.md", "*.cpp", "*.h", "*.yaml"], cwd=ROOT,
                           capture_output=True, text=True, check=True).stdout.split()
    hits = []
    for rel in files:
        if rel == "test/tools/test_docs.py":
            continue
        with open(f"{ROOT}/{rel}", encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                if OUTSIDE.search(line):
                    hits.append(f"{rel}:{n}: {line.strip()}")
    assert hits == []


def test_doc_tree_check_command():
    res = subprocess.run([sys.executable, "-m", "tools.doc_tree", "--check"], cwd=ROOT, capture_output=True,
                         text=True)
    assert res.returncode == 0, res.stdout + res.stderr
