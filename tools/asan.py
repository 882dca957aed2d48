"""Run the index, stride and zero-size tests against an AddressSanitizer build of the extension (docs/sanitizers.md).

    python -m tools.asan                          # build (incrementally), then pytest -m asan
    python -m tools.asan test/rope -k positions   # extra pytest arguments narrow the selection
    python -m tools.asan test/moe -m "not slow"   # a later -m replaces the marker: any test under ASan
    python -m tools.asan --build-only             # or --no-build to reuse build/asan as it is

The build is `TOT_SANITIZE=address python setup.py build_ext --force` (setup.py: every translation unit and the
per-ISA objects with -fsanitize=address -O1 -g1, into build/asan/; the package's own _C*.so is not touched).
--force only makes setuptools relink; ninja and the per-ISA object cache recompile what changed. The tests then
import this checkout's package with TOT_EXTENSION pointing at the instrumented library, and with libasan preloaded:
Python is not instrumented, and the ASan runtime must be in the process before anything allocates. Exit status: the
build's, else pytest's, else 1 if any process (pytest or a subprocess a test starts) wrote an ASan report.
"""
from __future__ import annotations

import argparse
import glob
import os
import shlex
import shutil
import subprocess
import sys
import time
from typing import Dict, List, Optional

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUILD_DIR = os.path.join(ROOT, "build", "asan")  # setup.py's SANITIZER_DIR
LIBRARY_GLOB = os.path.join(BUILD_DIR, "lib", "torch_ops_transformer", "_C*.so")
REPORT_DIR = os.path.join(BUILD_DIR, "reports")
MARKER = "asan"

# detect_leaks=0: CPython and torch keep interned objects, caches and singletons until exit without freeing them;
#   LeakSanitizer would report thousands of those and none of ours (the extension's tensors are refcounted by torch).
# abort_on_error=1: a report ends the process with SIGABRT, so the test (or the subprocess a test runs) fails at
#   the first error instead of running on with corrupted memory.
# log_path: every process writes its report to a file (pytest captures stderr, a subprocess test keeps only a
#   tail); they are printed at the end. The pid is appended to the name.
# (ASan's link-order check needs no option: libasan comes first in LD_PRELOAD.)
ASAN_OPTIONS = ["detect_leaks=0", "abort_on_error=1", f"log_path={os.path.join(REPORT_DIR, 'asan')}"]


def preload() -> List[str]:
    """The ASan runtime of the compiler that builds the extension, and its C++ runtime (`c++ -print-file-name`).
    libstdc++ is preloaded too: python does not link it, and ASan's __cxa_throw interceptor looks the real function
    up once at startup — without libstdc++ there, the first C++ exception (every rejected argument) ends the process
    with "CHECK failed: ... real___cxa_throw"."""
    cxx = os.environ.get("CXX", "c++")
    paths = []
    for name in ("libasan.so", "libstdc++.so"):
        path = subprocess.run([cxx, f"-print-file-name={name}"], capture_output=True, text=True,
                              check=True).stdout.strip()
        if not os.path.isabs(path) or not os.path.exists(path):
            raise SystemExit(f"asan: {cxx} has no {name} (install the compiler's sanitizer runtime, e.g. libasan8)")
        paths.append(os.path.realpath(path))
    return paths


def library() -> Optional[str]:
    found = sorted(glob.glob(LIBRARY_GLOB))
    return found[0] if found else None


def _progress(line: str) -> Optional[str]:
    """A short line for a per-ISA object, a ninja step ("[3/36] <source>") or the link; None for the rest."""
    if line.startswith("isa: compiling"):
        return line.strip()
    if line.startswith("[") and " -c " in line:
        source = line.split(" -o ")[0].split()[-1]
        return f"{line.split()[0]} {os.path.relpath(source, ROOT)}"
    if " -shared " in line:
        return "linking " + os.path.relpath(line.split(" -o ")[-1].split()[0], ROOT)
    return None


def build() -> int:
    """The incremental ASan build; the full log goes to build/asan/build.log, progress lines to stdout."""
    os.makedirs(BUILD_DIR, exist_ok=True)
    log_path = os.path.join(BUILD_DIR, "build.log")
    env = dict(os.environ, TOT_SANITIZE="address")
    cmd = [sys.executable, "setup.py", "build_ext", "--force"]
    print(f"asan: {shlex.join(cmd)} with TOT_SANITIZE=address (log: {os.path.relpath(log_path, ROOT)})", flush=True)
    tail: List[str] = []
    with open(log_path, "w", encoding="utf-8") as log:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                errors="replace")
        for line in proc.stdout:
            log.write(line)
            tail = (tail + [line])[-60:]
            progress = _progress(line)
            if progress:
                print("asan:   " + progress, flush=True)
        rc = proc.wait()
    if rc != 0:
        sys.stdout.write("".join(tail))
        print(f"asan: build failed (exit status {rc}); full log in {log_path}", flush=True)
    return rc


def environment(lib: str) -> Dict[str, str]:
    env = dict(os.environ)
    env["TOT_EXTENSION"] = lib
    env["LD_PRELOAD"] = " ".join(preload() + ([env["LD_PRELOAD"]] if env.get("LD_PRELOAD") else []))
    # Options given by the caller come last and win.
    env["ASAN_OPTIONS"] = ":".join(ASAN_OPTIONS + ([env["ASAN_OPTIONS"]] if env.get("ASAN_OPTIONS") else []))
    env["PYTHONPATH"] = os.pathsep.join([ROOT] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    return env


def reports() -> List[str]:
    return sorted(glob.glob(os.path.join(REPORT_DIR, "asan.*")))


def run_tests(lib: str, pytest_args: List[str]) -> int:
    shutil.rmtree(REPORT_DIR, ignore_errors=True)
    os.makedirs(REPORT_DIR)
    cmd = [sys.executable, "-m", "pytest", "-m", MARKER, "-q", "-p", "no:cacheprovider", *pytest_args]
    print(f"asan: {shlex.join(cmd)} against {os.path.relpath(lib, ROOT)}", flush=True)
    rc = subprocess.run(cmd, cwd=ROOT, env=environment(lib)).returncode
    found = reports()
    for path in found:
        with open(path, encoding="utf-8", errors="replace") as f:
            print(f"asan: ---- {os.path.relpath(path, ROOT)}\n{f.read()}", flush=True)
    if found:
        print(f"asan: {len(found)} AddressSanitizer report(s) above (kept in {os.path.relpath(REPORT_DIR, ROOT)})")
        return rc or 1
    if rc < 0 or rc > 5:  # pytest itself died (e.g. a signal) without writing a report
        print(f"asan: pytest ended with status {rc}", flush=True)
    return rc


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.asan", description=__doc__.split("\n\n")[0],
                                     epilog="Other arguments are passed to pytest.", allow_abbrev=False)
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--build-only", action="store_true", help="build the ASan extension, run no tests")
    group.add_argument("--no-build", action="store_true", help="test the existing build/asan library")
    args, pytest_args = parser.parse_known_args(argv)
    if not args.no_build:
        start = time.time()
        rc = build()
        print(f"asan: build took {time.time() - start:.0f} s", flush=True)
        if rc != 0:
            return rc
    lib = library()
    if lib is None:
        print(f"asan: no library matches {os.path.relpath(LIBRARY_GLOB, ROOT)}; run without --no-build")
        return 2
    if args.build_only:
        return 0
    start = time.time()
    rc = run_tests(lib, pytest_args)
    print(f"asan: tests took {time.time() - start:.0f} s", flush=True)
    return rc


if __name__ == "__main__":
    sys.exit(main())
