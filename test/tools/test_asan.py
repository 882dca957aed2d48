"""The AddressSanitizer run (tools/asan.py, docs/sanitizers.md): under it, a bad read by one of our kernels is
reported with the kernel's source line and ends the process (so the instrumented library is the one loaded and its
reports reach the runner); the runner's environment; TOT_EXTENSION; setup.py refusing a sanitizer build via pip."""
import ctypes
import os
import subprocess
import sys
import textwrap

import pytest

from test.common.checkout import ROOT, pythonpath
from tools import asan

UNDER_ASAN = hasattr(ctypes.CDLL(None), "__asan_poison_memory_region")
HAS_LIBASAN = os.path.isabs(subprocess.run([os.environ.get("CXX", "c++"), "-print-file-name=libasan.so"],
                                           capture_output=True, text=True).stdout.strip())


@pytest.mark.asan
@pytest.mark.skipif(not UNDER_ASAN, reason="runs under `python -m tools.asan` (needs the ASan runtime)")
def test_a_poisoned_read_in_a_kernel_is_reported_and_ends_the_process():
    from torch_ops_transformer._library import loader as _ops_loader
    assert _ops_loader._library_path() == os.path.abspath(os.environ["TOT_EXTENSION"])
    code = textwrap.dedent("""
        import ctypes, torch, torch_ops_transformer
        x, cos = torch.randn(1, 4, 2, 16), torch.randn(1, 4, 1, 16)
        ctypes.CDLL(None).__asan_poison_memory_region(ctypes.c_void_p(x.data_ptr()), ctypes.c_size_t(x.nbytes))
        torch.ops.npu_fa.rotary_position_embedding(x, cos, cos, 0)
        print("not reported")
    """)
    # This report is expected: to stderr, not into the runner's report files (which fail the run).
    env = dict(os.environ, ASAN_OPTIONS=os.environ.get("ASAN_OPTIONS", "") + ":log_path=stderr",
               PYTHONPATH=pythonpath())
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode != 0 and "not reported" not in proc.stdout, (proc.returncode, proc.stderr[-3000:])
    assert "AddressSanitizer: use-after-poison" in proc.stderr, proc.stderr[-3000:]
    assert "aten_ops/cpu/rope/ops.cpp:" in proc.stderr, proc.stderr[-3000:]  # symbolized: file and line


@pytest.mark.skipif(not HAS_LIBASAN, reason="the compiler has no libasan")
def test_runner_environment(monkeypatch):
    monkeypatch.setenv("ASAN_OPTIONS", "halt_on_error=0")
    monkeypatch.setenv("LD_PRELOAD", "/opt/mine.so")
    env = asan.environment("/x/_C.so")
    preload = env["LD_PRELOAD"].split()
    assert os.path.basename(preload[0]).startswith("libasan.so") and preload[-1] == "/opt/mine.so"
    assert any(os.path.basename(p).startswith("libstdc++.so") for p in preload)
    options = env["ASAN_OPTIONS"].split(":")
    assert {"detect_leaks=0", "abort_on_error=1"} <= set(options) and options[-1] == "halt_on_error=0"
    assert env["TOT_EXTENSION"] == "/x/_C.so" and env["PYTHONPATH"].split(os.pathsep)[0] == ROOT


def test_progress_lines_of_the_build_log():
    src = os.path.join(ROOT, "aten_ops/cpu/rope/ops.cpp")
    line = f"[3/36] c++ -MMD -MF x.o.d -c -c {src} -o /b/x.o -O1\n"
    assert asan._progress(line) == "[3/36] aten_ops/cpu/rope/ops.cpp"
    assert asan._progress("isa: compiling a.DEFAULT.0123.o\n") == "isa: compiling a.DEFAULT.0123.o"
    assert asan._progress("warning: something\n") is None


def test_tot_extension_names_a_missing_file():
    proc = subprocess.run([sys.executable, "-c", "import torch_ops_transformer"], cwd=ROOT, capture_output=True,
                          text=True, env=dict(os.environ, TOT_EXTENSION="/nonexistent/_C.so",
                                              PYTHONPATH=pythonpath()))
    assert proc.returncode != 0 and "TOT_EXTENSION='/nonexistent/_C.so' is not a file" in proc.stderr, proc.stderr


@pytest.mark.parametrize("value,args,message", [
    ("address", ["egg_info"], "TOT_SANITIZE is set"),         # what pip runs: never a sanitizer build in place
    ("thread", ["build_ext"], "TOT_SANITIZE='thread' is not supported"),
])
def test_setup_refuses_a_sanitizer_build_it_does_not_support(value, args, message):
    proc = subprocess.run([sys.executable, "setup.py", *args], cwd=ROOT, capture_output=True, text=True,
                          env=dict(os.environ, TOT_SANITIZE=value))
    assert proc.returncode != 0 and message in proc.stderr, proc.stdout[-2000:] + proc.stderr[-2000:]
