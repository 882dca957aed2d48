"""The Python examples of a documentation section, for the tests that run them: `run_examples(doc, heading)`
executes every ```python block under the `## ` heading that contains `heading` (up to the next `## `), each in a
fresh namespace, and fails if the section has none."""
import pathlib
import re

from test.common.checkout import ROOT


def python_blocks(doc: str, heading: str):
    text = pathlib.Path(ROOT, "docs", doc).read_text(encoding="utf-8")
    sections = re.split(r"^## ", text, flags=re.M)
    section = next(s for s in sections[1:] if heading in s.splitlines()[0])
    return re.findall(r"^```python\n(.*?)^```", section, flags=re.S | re.M)


def run_examples(doc: str, heading: str) -> None:
    blocks = python_blocks(doc, heading)
    assert blocks, f"docs/{doc}: no python example under the heading with {heading!r}"
    for code in blocks:
        exec(compile(code, f"docs/{doc} ({heading})", "exec"), {"__name__": "doc_example"})
