"""Build and run the torch-free C++ programs under ascendc/ (kernel host programs, tiling unit tests, runtime
fault tests) against the CPU runtime, the way a CANN CPU-debug build would: g++ + tikicpulib.h. Objects and
programs are cached under build/ascendc_programs, keyed by the content of every source and header involved."""
import glob
import hashlib
import os
import subprocess
from concurrent.futures import ThreadPoolExecutor

from test.common.checkout import ROOT

RUNTIME = os.path.join(ROOT, "ascendc", "cpu_runtime")
INCLUDES = [os.path.join(RUNTIME, "include"), os.path.join(ROOT, "ascendc", "kernels"), os.path.join(ROOT, "ascendc")]
FLAGS = ["-std=c++17", "-O1", "-g", "-pthread", "-Wall", "-Wno-unused-parameter", "-Wno-unused-variable"]


def _digest(path, flags):
    """Key of one object: the flags, the source and every header under ascendc/ (any of them may be included)."""
    h = hashlib.sha1(" ".join(flags).encode())
    headers = sorted(glob.glob(os.path.join(ROOT, "ascendc", "**", "*.h"), recursive=True))
    for p in [path] + headers:
        with open(p, "rb") as f:
            h.update(os.path.relpath(p, ROOT).encode() + f.read())
    return h.hexdigest()[:12]


def _run_compiler(cmd, what):
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        raise AssertionError(f"compiling {what} failed:\n{' '.join(cmd)}\n{res.stderr[-6000:]}")


def _object(path, flags, out_dir):
    """The object of one source, compiled unless an object with the same key exists (the runtime and the kernel
    sources are shared by several programs: each is compiled once)."""
    obj = os.path.join(out_dir, "obj", f"{os.path.splitext(os.path.basename(path))[0]}-{_digest(path, flags)}.o")
    if not os.path.exists(obj):
        os.makedirs(os.path.dirname(obj), exist_ok=True)
        cxx = os.environ.get("CXX", "g++")
        _run_compiler([cxx, *flags, *[f"-I{i}" for i in INCLUDES], "-c", path, "-o", obj + ".tmp"], path)
        os.replace(obj + ".tmp", obj)
    return obj


def build(name, sources, flags=()):
    """Compile sources (paths relative to the repo root) + the runtime into one program; returns its path. Objects
    are compiled two at a time (the machine's two cores) and cached by content; linking is cheap."""
    paths = [os.path.join(ROOT, s) for s in sources] + [os.path.join(RUNTIME, "src", "runtime.cpp")]
    all_flags = FLAGS + list(flags)
    out_dir = os.path.join(ROOT, "build", "ascendc_programs")
    with ThreadPoolExecutor(max_workers=2) as pool:
        objects = list(pool.map(lambda p: _object(p, all_flags, out_dir), paths))
    exe = os.path.join(out_dir, f"{name}-{hashlib.sha1(' '.join(objects).encode()).hexdigest()[:12]}")
    if not os.path.exists(exe):
        _run_compiler([os.environ.get("CXX", "g++"), *all_flags, *objects, "-o", exe + ".tmp"], name)
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
