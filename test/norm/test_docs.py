"""The examples of docs/norm.md run as they are written."""
import pathlib
import re

import pytest

DOC = pathlib.Path(__file__).resolve().parents[2] / "docs" / "norm.md"
BLOCKS = re.findall(r"^```python\n(.*?)^```", DOC.read_text(encoding="utf-8"), re.S | re.M)


def test_the_doc_has_examples():
    assert len(BLOCKS) >= 3


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_example_runs(index):
    import torch
    torch._dynamo.reset()
    exec(compile(BLOCKS[index], f"docs/norm.md example {index + 1}", "exec"), {"__name__": "docs_example"})
