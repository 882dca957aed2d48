"""Build and run the torch-free C++ programs under ascendc/ (kernel host programs, tiling unit tests, runtime
fault tests) against the CPU runtime, the way a CANN CPU-debug build would: g++ + tikicpulib.h. Objects and
programs are cached under build/ascendc_programs, keyed by the content of every source and header involved."""
import glob
import hashlib
import os
import subprocess
import threading
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


# One lock per object path: programs built on parallel threads share the runtime's object, which must be compiled
# once, not by two threads writing the same file.
_OBJECT_LOCKS = {}
_OBJECT_LOCKS_GUARD = threading.Lock()


def _private_tmp(path):
    """A temporary name no other thread or process writes (the result is renamed into place atomically)."""
    return f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"


def _object(path, flags, out_dir):
    """The object of one source, compiled unless an object with the same key exists (the runtime and the kernel
    sources are shared by several programs: each is compiled once)."""
    obj = os.path.join(out_dir, "obj", f"{os.path.splitext(os.path.basename(path))[0]}-{_digest(path, flags)}.o")
    with _OBJECT_LOCKS_GUARD:
        lock = _OBJECT_LOCKS.setdefault(obj, threading.Lock())
    with lock:
        if not os.path.exists(obj):
            os.makedirs(os.path.dirname(obj), exist_ok=True)
            tmp = _private_tmp(obj)
            _run_compiler([os.environ.get("CXX", "g++"), *flags, *[f"-I{i}" for i in INCLUDES], "-c", path, "-o", tmp],
                          path)
            os.replace(tmp, obj)
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
        tmp = _private_tmp(exe)
        _run_compiler([os.environ.get("CXX", "g++"), *all_flags, *objects, "-o", tmp], name)
        os.replace(tmp, exe)
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


def run_program(name, sources, flags=()):
    """Build `sources` into program `name`, run it, fail unless it passed; returns its stdout (for the checks a test
    makes on which cases ran)."""
    res = run(build(name, sources, flags))
    assert_passed(res)
    return res.stdout
