"""Check that every relative Markdown link in README.md and docs/*.md resolves to a file (and heading) in the repo.

    python tools/check_doc_links.py        # prints broken links, exit status 1 if there are any
"""
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)


def anchors(md: pathlib.Path) -> set:
    """GitHub-style heading anchors of a Markdown file."""
    out = set()
    for line in FENCE.sub("", md.read_text(encoding="utf-8")).splitlines():
        if line.startswith("#"):
            text = line.lstrip("#").strip().lower()
            text = re.sub(r"[^\w\- ]", "", text).replace(" ", "-")
            out.add(text)
    return out


def broken(md: pathlib.Path):
    text = FENCE.sub("", md.read_text(encoding="utf-8"))
    for target in LINK.findall(text):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto: — not a repository file
            continue
        path, _, anchor = target.partition("#")
        dest = (md.parent / path).resolve() if path else md
        if not dest.exists() or ROOT not in dest.parents and dest != ROOT:
            yield f"{md.relative_to(ROOT)}: {target} (no such file in the repository)"
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            yield f"{md.relative_to(ROOT)}: {target} (no heading #{anchor})"


def main() -> int:
    files = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    bad = [b for md in files for b in broken(md)]
    for b in bad:
        print(b)
    print(f"{len(files)} files checked, {len(bad)} broken links")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
