"""Mutation testing of the test tiers: apply deliberate one-line bugs one at a time and check the tests catch them.

    python -m tools.mutants                       # every mutant, against the default and the full tier
    python -m tools.mutants --tier default        # only the default tier (README's test command)
    python -m tools.mutants rope-sign moe-topk    # some mutants (ids from --list)
    python -m tools.mutants --list

The mutants (tools/mutants_catalog.py) are applied to a copy of this checkout in build/mutants/tree (synchronised
file by file, so uncommitted work is included and unchanged files keep their timestamps; the checkout itself is never
modified). The copy is built in place once (the per-ISA objects are copied from this checkout's build: they are keyed
by content); a mutant of a C++ source, the op schema or the code generator is rebuilt incrementally. For each mutant
and tier, pytest runs the mutant's `tests` with TOT_TEST_TIER set, stopping at the first failure: a failing run kills
the mutant. First the unmutated copy must pass every selection, else a "kill" would mean nothing.

The report (stdout and build/mutants/report.md) has one row per mutant; the exit status is 1 when a mutant the full
tier kills survives the default tier ("lost"), or the baseline fails.
"""
from __future__ import annotations

import argparse
import filecmp
import os
import shutil
import subprocess
import sys
import time
from typing import Dict, List, Optional

from tools.mutants_catalog import MUTANTS
from tools.mutants_model import Mutant

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORK = os.path.join(ROOT, "build", "mutants")
TREE = os.path.join(WORK, "tree")
TIERS = ("default", "full")
TEST_TIMEOUT_S = 1200


def log(msg: str) -> None:
    print(f"mutants: {msg}", flush=True)


# ---- the copy ------------------------------------------------------------------------------------------------------
def checkout_files() -> List[str]:
    """Tracked and untracked-but-not-ignored files of this checkout (what a commit of the work would hold)."""
    out = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, capture_output=True,
                         check=True).stdout.decode()
    return [p for p in out.split("\0") if p and os.path.isfile(os.path.join(ROOT, p))]


def sync_tree() -> None:
    """Make the copy's sources equal to the checkout's; only differing files are written (ninja rebuilds by time)."""
    os.makedirs(TREE, exist_ok=True)
    written = 0
    for rel in checkout_files():
        src, dst = os.path.join(ROOT, rel), os.path.join(TREE, rel)
        if os.path.exists(dst) and filecmp.cmp(src, dst, shallow=False):
            continue
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        shutil.copyfile(src, dst)
        written += 1
    isa_src, isa_dst = os.path.join(ROOT, "build", "isa_objects"), os.path.join(TREE, "build", "isa_objects")
    if os.path.isdir(isa_src):
        os.makedirs(isa_dst, exist_ok=True)
        for name in os.listdir(isa_src):
            if not os.path.exists(os.path.join(isa_dst, name)):
                shutil.copy2(os.path.join(isa_src, name), isa_dst)
    log(f"copy in {os.path.relpath(TREE, ROOT)}: {written} file(s) updated")


def build() -> bool:
    """Incremental in-place build of the copy; the log goes to build/mutants/build.log."""
    with open(os.path.join(WORK, "build.log"), "a", encoding="utf-8") as f:
        rc = subprocess.run([sys.executable, "setup.py", "build_ext", "--inplace"], cwd=TREE, stdout=f,
                            stderr=subprocess.STDOUT).returncode
    return rc == 0


def run_tests(tests, tier: str) -> tuple:
    """(returncode, seconds, tail of the output) of pytest over `tests` in the copy, in one tier."""
    env = {k: v for k, v in os.environ.items() if k not in ("TOT_NPU_SIM", "TOT_EXTENSION")}
    env["TOT_TEST_TIER"] = tier
    env["PYTHONPATH"] = TREE
    start = time.time()
    try:
        proc = subprocess.run([sys.executable, "-m", "pytest", *tests, "-x", "-q", "-p", "no:cacheprovider"],
                              cwd=TREE, env=env, capture_output=True, text=True, timeout=TEST_TIMEOUT_S)
        rc, out = proc.returncode, proc.stdout + proc.stderr
    except subprocess.TimeoutExpired:
        rc, out = -1, f"timed out after {TEST_TIMEOUT_S} s"
    return rc, time.time() - start, out[-3000:]


# ---- one mutant ----------------------------------------------------------------------------------------------------
class Applied:
    """Context manager: the mutant's edit in the copy, undone on exit."""

    def __init__(self, mutant: Mutant):
        self.path = os.path.join(TREE, mutant.path)
        self.mutant = mutant

    def __enter__(self):
        with open(self.path, encoding="utf-8") as f:
            self.original = f.read()
        count = self.original.count(self.mutant.old)
        if count != 1:
            raise SystemExit(f"mutant {self.mutant.id}: `old` occurs {count} times in {self.mutant.path}, not once")
        with open(self.path, "w", encoding="utf-8") as f:
            f.write(self.original.replace(self.mutant.old, self.mutant.new))
        return self

    def __exit__(self, *exc):
        with open(self.path, "w", encoding="utf-8") as f:
            f.write(self.original)


def verdict(rc: int) -> str:
    if rc == 0:
        return "survived"
    if rc == 5:
        return "no tests"  # the selection collected nothing in this tier: a catalogue error, reported as such
    return "killed (timeout)" if rc == -1 else "killed"


def run_mutant(mutant: Mutant, tiers, built_clean: List[bool]) -> Dict[str, str]:
    """{tier: verdict} of one mutant. built_clean[0] tracks whether the copy's build matches its sources."""
    with Applied(mutant):
        if mutant.needs_build or not built_clean[0]:
            ok = build()
            built_clean[0] = ok and not mutant.needs_build  # after a build mutant, the restored source needs one
            if not ok:
                return {tier: "does not build" for tier in tiers}
        row = {}
        for tier in tiers:
            rc, seconds, out = run_tests(mutant.tests, tier)
            row[tier] = verdict(rc)
            log(f"  {tier}: {row[tier]} in {seconds:.0f} s")
            if rc == 5:
                log(out)
    return row


# ---- report --------------------------------------------------------------------------------------------------------
def lost(rows: Dict[str, Dict[str, str]]) -> List[str]:
    """Mutants the full tier kills and the default tier does not."""
    return [mid for mid, row in rows.items() if set(TIERS) <= set(row) and row["full"].startswith("killed")
            and not row["default"].startswith("killed")]


def report(rows: Dict[str, Dict[str, str]], tiers) -> str:
    by_id = {m.id: m for m in MUTANTS}
    lines = ["| mutant | layer | family | bug | " + " | ".join(tiers) + " |",
             "|---|---|---|---|" + "---|" * len(tiers)]
    for mid, row in rows.items():
        m = by_id[mid]
        lines.append(f"| `{mid}` | {m.layer} | {m.family} | {m.what} | " + " | ".join(row[t] for t in tiers) + " |")
    lines.append("")
    for tier in tiers:
        killed = sum(row[tier].startswith("killed") for row in rows.values())
        lines.append(f"{tier} tier: {killed}/{len(rows)} killed")
    if set(TIERS) <= set(tiers):
        lines.append(f"lost by the default tier (killed by full, survived default): {len(lost(rows))} "
                     f"{lost(rows) or ''}")
    return "\n".join(lines)


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.mutants", description=__doc__.split("\n\n")[0])
    parser.add_argument("ids", nargs="*", help="mutant ids (default: all)")
    parser.add_argument("--tier", choices=TIERS + ("both",), default="both")
    parser.add_argument("--list", action="store_true", help="list the mutants and exit")
    parser.add_argument("--no-baseline", action="store_true", help="skip the unmutated run (it passed already)")
    args = parser.parse_args(argv)
    if args.list:
        for m in MUTANTS:
            print(f"{m.id:40s} {m.layer:18s} {m.path}\n{'':40s} {m.what}")
        return 0
    unknown = set(args.ids) - {m.id for m in MUTANTS}
    if unknown:
        parser.error(f"unknown mutant id(s): {sorted(unknown)}")
    mutants = [m for m in MUTANTS if not args.ids or m.id in args.ids]
    mutants.sort(key=lambda m: not m.needs_build)  # build mutants first: each restore rides on the next build
    tiers = TIERS if args.tier == "both" else (args.tier,)

    os.makedirs(WORK, exist_ok=True)
    sync_tree()
    log("building the copy (log: build/mutants/build.log)")
    if not build():
        log("the unmutated copy does not build")
        return 1
    if not args.no_baseline:
        selection = sorted({t for m in mutants for t in m.tests})
        for tier in tiers:
            rc, seconds, out = run_tests(selection, tier)
            log(f"baseline ({tier} tier, {len(selection)} paths): exit {rc} in {seconds:.0f} s")
            if rc != 0:
                log(out)
                return 1
    rows, built_clean, start = {}, [True], time.time()
    for i, m in enumerate(mutants, 1):
        log(f"[{i}/{len(mutants)}] {m.id}: {m.what} ({m.path})")
        rows[m.id] = run_mutant(m, tiers, built_clean)
    if not built_clean[0]:
        build()
    text = report(rows, tiers)
    print(text)
    log(f"{len(mutants)} mutant(s) in {time.time() - start:.0f} s")
    with open(os.path.join(WORK, "report.md"), "w", encoding="utf-8") as f:
        f.write(text + "\n")
    return 1 if lost(rows) else 0


if __name__ == "__main__":
    sys.exit(main())
