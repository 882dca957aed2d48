"""Build and run the torch-free C++ programs under ascendc/ (kernel host programs, tiling unit tests, runtime
fault tests) against the CPU runtime, the way a CANN CPU-debug build would: g++ + tikicpulib.h. Binaries are cached
under build/ascendc_programs keyed by the content of every source and header involved."""
import glob
import hashlib
import os
import subprocess

from test.common.checkout import ROOT

RUNTIME = os.path.join(ROOT, "ascendc", "cpu_runtime")
INCLUDES = [os.path.join(RUNTIME, "include"), os.path.join(ROOT, "ascendc", "kernels"), os.path.join(ROOT, "ascendc")]
FLAGS = ["-std=c++17", "-O1", "-g", "-pthread", "-Wall", "-Wno-unused-parameter", "-Wno-unused-variable"]


def _digest(paths, flags):
    h = hashlib.sha1(" ".join(flags).encode())
    headers = sorted(glob.glob(os.path.join(ROOT, "ascendc", "**", "*.h"), recursive=True))
    for p in sorted(paths) + headers:
        with open(p, "rb") as f:
            h.update(p.encode() + f.read())
    return h.hexdigest()[:12]


def build(name, sources, flags=()):
    """Compile sources (paths relative to the repo root) + the runtime into one program; returns its path."""
    paths = [os.path.join(ROOT, s) for s in sources] + [os.path.join(RUNTIME, "src", "runtime.cpp")]
    all_flags = FLAGS + list(flags)
    out_dir = os.path.join(ROOT, "build", "ascendc_programs")
    os.makedirs(out_dir, exist_ok=True)
    exe = os.path.join(out_dir, f"{name}-{_digest(paths, all_flags)}")
    if not os.path.exists(exe):
        cmd = [os.environ.get("CXX", "g++"), *all_flags, *[f"-I{i}" for i in INCLUDES], *paths, "-o", exe + ".tmp"]
        res = subprocess.run(cmd, capture_output=True, text=True)
        if res.returncode != 0:
            raise AssertionError(f"compiling {name} failed:\n{' '.join(cmd)}\n{res.stderr[-6000:]}")
        os.replace(exe + ".tmp", exe)
    return exe


def run(exe, *args, timeout=300):
    """Run a built program; returns CompletedProcess (text)."""
    return subprocess.run([exe, *map(str, args)], capture_output=True, text=True, timeout=timeout)


# The last line of a test program under ascendc/tests that passed (ascendc/tests/test_main.h), with exit status 0.
PASSED = "ALL TESTS PASSED"


def passed(res):
    lines = res.stdout.strip().splitlines()
    return res.returncode == 0 and lines[-1:] == [PASSED]


def assert_passed(res):
    """Fails with the program's output unless it exited 0 with PASSED as its last line."""
    assert passed(res), f"exit {res.returncode}\n{res.stdout[-4000:]}\n{res.stderr[-4000:]}"
