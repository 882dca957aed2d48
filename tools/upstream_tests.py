"""Runs torch_npu's own per-op tests (op-plugin's test/test_custom_ops and test/test_base_ops), unchanged, against
this project through the torch_npu shim, and prints passed/failed/skipped per file.

    python -m tools.upstream_tests --op-plugin PATH [--commit REV] [--only WORD] [--unskip-cann] [--unskip WORD]
                                   [--any-soc] [--devices N] [--timeout S] [-v]

PATH is an op-plugin checkout, or its git directory (then the test files are read at REV, default HEAD). Only the
files that call a function we implement (torch_ops_transformer/compat/torch_npu_functions.yaml, 'mirrored') are run.
Each file runs in its own pytest process with PYTHONPATH=$(python -m torch_ops_transformer.compat --pythonpath):
`import torch_npu` gives the shim, `.npu()` the simulated device, `torch_npu.testing` the shim's test helpers.
`--unskip-cann` also runs the cases upstream disables with `@unittest.skip(...CANN...)` (written for a newer CANN
than its CI had); `--unskip WORD` those whose `@unittest.skip(...)` line contains WORD (cases upstream has written
but not yet enabled), and `--any-soc` the cases `@SupportedDevices` limits to another SoC than the simulated one
(TOT_ANY_SOC=1 for the shim's SupportedDevices). `--devices N` gives the simulated npu device N devices
(TOT_NPU_SIM_DEVICES), so the multi-NPU cases (`skipIfUnsupportMultiNPU(N)`, HCCL worlds of N ranks on gloo) run instead of skipping. Failures that are our NotImplementedError (a function or an argument — quantisation, NZ format —
this project does not implement, named in the message) are counted apart as "not implemented". Nothing of upstream's is copied into this repository; this is a measuring tool
(docs/torch_npu_compat.md).
"""
import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from torch_ops_transformer.compat import PYTHONPATH_DIR, upstream_functions

TEST_DIRS = ("test/test_custom_ops", "test/test_base_ops")
ROOT = Path(__file__).resolve().parent.parent


def _mirrored_names():
    return [line.split("(")[0] for line in upstream_functions()["mirrored"]]


def _test_files(source: Path, commit: str):
    """{relative path: text} of the upstream test files, from a checkout or a git directory."""
    if (source / "test").is_dir():
        return {str(p.relative_to(source)): p.read_text() for d in TEST_DIRS for p in sorted((source / d).glob("*.py"))}
    with tempfile.TemporaryDirectory() as tmp:
        archive = subprocess.run(["git", "--git-dir", str(source), "archive", commit, *TEST_DIRS],
                                 capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", tmp], input=archive, check=True)
        return _test_files(Path(tmp), commit)


def _calls_mirrored(text: str, names) -> bool:
    return any(re.search(rf"\b{re.escape(n)}\s*\(", text) for n in names)


_CANN_SKIP = re.compile(r"^\s*@unittest\.skip\(.*CANN.*\)\s*$", re.M)
_NOT_IMPLEMENTED = " - NotImplementedError: "
_SUMMARY = re.compile(r"(\d+) (passed|failed|skipped|error|errors|xfailed|xpassed)")


def _skip_lines(word: str):
    """The `@unittest.skip(...)` lines that contain `word`."""
    return re.compile(rf"^\s*@unittest\.skip\(.*{re.escape(word)}.*\)\s*$", re.M)


def _run(path: Path, device_env: dict, verbose: bool, timeout: float):
    counts = {"passed": 0, "failed": 0, "not implemented": 0, "skipped": 0, "error": 0}
    try:
        proc = subprocess.run([sys.executable, "-m", "pytest", str(path), "-q", "-p", "no:cacheprovider", "-rfE",
                               "--tb=line"],
                              capture_output=True, text=True, env=device_env, cwd=path.parent, timeout=timeout)
    except subprocess.TimeoutExpired:
        # A file whose cases outlast the budget (upstream's largest shapes on a small CPU) is reported, not counted:
        # its partial output has no summary line to count from.
        counts["timed out"] = 1
        return counts, [f"TIMEOUT after {timeout:.0f} s (no counts for this file; rerun it alone with a larger --timeout)"]
    tail = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else ""
    for number, kind in _SUMMARY.findall(tail):
        counts["error" if kind.startswith("error") else kind if kind in counts else "passed"] += int(number)
    failures = [line for line in proc.stdout.splitlines() if line.startswith(("FAILED", "ERROR"))]
    not_implemented = sum(1 for line in failures if line.startswith("FAILED") and _NOT_IMPLEMENTED in line)
    counts["failed"] -= not_implemented
    counts["not implemented"] += not_implemented
    if verbose:
        print(proc.stdout[-4000:])
    return counts, failures


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--op-plugin", required=True, type=Path, help="op-plugin checkout or git directory")
    parser.add_argument("--commit", default="HEAD")
    parser.add_argument("--only", default=None, help="run only files whose name contains this")
    parser.add_argument("--unskip-cann", action="store_true", help="run the cases upstream skips for its CANN")
    parser.add_argument("--unskip", default=None, metavar="WORD",
                        help="run the cases whose @unittest.skip(...) line contains WORD")
    parser.add_argument("--any-soc", action="store_true",
                        help="run the cases @SupportedDevices limits to another SoC than the simulated one")
    parser.add_argument("--devices", type=int, default=None,
                        help="simulated npu devices per process (TOT_NPU_SIM_DEVICES; default: the environment's, else 1)")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds per test file (default 1800)")
    parser.add_argument("-v", "--verbose", action="store_true")
    args = parser.parse_args(argv)
    names = _mirrored_names()
    files = {n: t for n, t in _test_files(args.op_plugin, args.commit).items()
             if _calls_mirrored(t, names) and (args.only is None or args.only in n)}
    env = {k: v for k, v in os.environ.items() if k != "TOT_NPU_SIM"}
    env["PYTHONPATH"] = os.pathsep.join([str(PYTHONPATH_DIR), str(ROOT)] + [env.get("PYTHONPATH", "")])
    if args.any_soc:
        env["TOT_ANY_SOC"] = "1"
    if args.devices is not None:
        env["TOT_NPU_SIM_DEVICES"] = str(args.devices)
    env["COLUMNS"] = "400"  # pytest cuts the failure reasons of its summary to the terminal width
    total = {"passed": 0, "failed": 0, "not implemented": 0, "skipped": 0, "error": 0, "timed out": 0}
    with tempfile.TemporaryDirectory() as tmp:
        for name, text in sorted(files.items()):
            path = Path(tmp) / name.replace("/", "__")  # one flat folder: no package __init__ needed
            if args.unskip_cann:
                text = _CANN_SKIP.sub("", text)
            if args.unskip:
                text = _skip_lines(args.unskip).sub("", text)
            path.write_text(text)
            counts, failures = _run(path, env, args.verbose, args.timeout)
            for k in total:
                total[k] += counts.get(k, 0)
            print(f"{name}: " + ", ".join(f"{v} {k}" for k, v in counts.items() if v))
            for line in failures:
                print("   ", line.replace(path.name, "")[:300])
    print("total: " + ", ".join(f"{v} {k}" for k, v in total.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
