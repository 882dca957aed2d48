"""Build torch_ops_transformer: generate registrations from native_functions.yaml, then compile aten_ops/.

CPU build (always), as in README "Setup":
    pip install torch==2.13.0 ninja pyyaml "setuptools>=64" wheel && pip install --no-build-isolation -e ".[all]"
--no-build-isolation builds against the torch already installed (an isolated build would download another torch);
this file imports torch, setuptools and (through tools/codegen) yaml, so those must be installed first.
The NPU backend (Ascend C kernels via torch_npu + CANN) is detected by tools/cann_build.py and is optional; its
absence never breaks a CPU install (TOT_CANN=0 skips it, TOT_CANN=1 requires it; docs/ascendc_cann_build.md).

AddressSanitizer build (docs/sanitizers.md; `python -m tools.asan` builds it and runs the tests against it):
    TOT_SANITIZE=address python setup.py build_ext --force
compiles every translation unit with -fsanitize=address into build/asan/ (objects, per-ISA objects and
build/asan/lib/torch_ops_transformer/_C*.so); the package's own _C*.so and build/isa_objects are not touched. The
package loads that library instead of its own when TOT_EXTENSION names it.
"""
import concurrent.futures
import glob
import hashlib
import os
import subprocess
import sys
import sysconfig

import torch
from setuptools import find_packages, setup
from torch.utils.cpp_extension import BuildExtension, CppExtension, include_paths

ROOT = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, ROOT)
from tools import cann_build as cann  # noqa: E402  (build helpers live in the repo, not in the package)
from tools.codegen import generate  # noqa: E402

# TOT_SANITIZE=address: the AddressSanitizer build, in its own directory (module docstring).
SANITIZE = os.environ.get("TOT_SANITIZE", "")
SANITIZER_DIR = os.path.join(ROOT, "build", "asan")
if SANITIZE not in ("", "address"):
    sys.exit(f"setup.py: TOT_SANITIZE={SANITIZE!r} is not supported (only 'address')")
if SANITIZE and "build_ext" not in sys.argv[1:]:
    # pip (install, -e, wheel) would put the instrumented library into the package or a wheel.
    sys.exit("setup.py: TOT_SANITIZE is set; the sanitizer build is `TOT_SANITIZE=address python setup.py build_ext "
             "--force` (or `python -m tools.asan`). Unset TOT_SANITIZE for pip install.")

for rel in generate(ROOT):
    print(f"codegen: wrote {rel}")


# Per-instruction-set kernels: every `*_isa.cpp` is compiled once per entry with the flags ATen uses for the same
# capability, into objects linked into _C (as objects, not an archive, so the linker keeps their static registrations);
# ops call them through the stubs of aten_ops/cpu/isa_dispatch.h.
ISA_FLAGS = {
    "DEFAULT": [],
    "AVX2": ["-mavx2", "-mfma", "-mf16c", "-mbmi2"],
    "AVX512": ["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq", "-mfma", "-mf16c", "-mbmi2"],
}


def isa_variants():
    """The ISAs to compile the *_isa.cpp for. Release: all of them (the library runs on any x86-64 CPU). Sanitizer
    build: DEFAULT and the one this CPU selects (torch.backends.cpu.get_cpu_capability(), which honours
    ATEN_CPU_CAPABILITY) — the instrumented library only runs here, and a stub falls back to the next lower copy that
    is registered, so e.g. ATEN_CPU_CAPABILITY=avx2 on an AVX-512 machine runs the DEFAULT copy."""
    if not SANITIZE:
        return dict(ISA_FLAGS)
    best = torch.backends.cpu.get_cpu_capability()
    return {isa: flags for isa, flags in ISA_FLAGS.items() if isa in ("DEFAULT", best)}


def extension_kwargs():
    """Sources and flags of _C. One translation unit per op family and backend (CPU kernels, the simulated npu device,
    the PrivateUse1 glue, host tiling) plus the generated registrations. The Ascend C kernels are compiled by g++
    against the CPU runtime, or, when tools/cann_build.py detects CANN + torch_npu, by CANN's toolchain into a
    kernel library launched on the NPU stream (docs/ascendc_cann_build.md). Detection failures print one line and
    leave the CPU build as it is."""
    build = None if SANITIZE else cann.detect()  # the sanitizer build is of the CPU backend
    if build is None:
        return cann.extension_kwargs(ROOT)
    kernels = cann.build_kernels(build, ROOT, os.path.join(ROOT, "build", "cann"))
    cann.copy_kernel_library(kernels, os.path.join(ROOT, "torch_ops_transformer"))
    return cann.extension_kwargs(ROOT, build, kernels)


def cxx_flags():
    # -fopenmp: ATen's inline at::parallel_for only forks threads when the including file is built with OpenMP
    # (_OPENMP); without it every parallel_for in the extension silently runs on one thread.
    # -g1 overrides the -g of Python's own compile flags: line tables keep backtraces readable, without the variable
    # info that made the library ~50 MB and most of its compile time.
    flags = ["-O3", "-g1", "-std=c++17", "-fvisibility-inlines-hidden", "-Wno-unused-parameter", "-fopenmp"]
    if os.environ.get("TOT_DEBUG"):
        flags = ["-O0", "-g", "-std=c++17", "-fopenmp"]
    if SANITIZE:
        # -O1: ASan's recommended level; -O0 compiles a third faster but leaves at::vec's inline intrinsics as
        # calls, and the kernels run several times slower. -g1: line tables, enough for file:line in the reports,
        # at 60% of the compile time of -g (which adds variable info).
        flags = ["-O1", "-g1", f"-fsanitize={SANITIZE}", "-fno-omit-frame-pointer", "-std=c++17",
                 "-fvisibility-inlines-hidden", "-Wno-unused-parameter", "-fopenmp"]
    return flags


def link_flags():
    # -fopenmp resolves to the libgomp.so.1 torch already loaded.
    return ["-fopenmp"] + ([f"-fsanitize={SANITIZE}"] if SANITIZE else [])


def _headers_digest():
    # The headers an *_isa.cpp can include: CPU kernel headers and the shared validation (not the generated
    # registrations or the npu glue, which change with every op added and would force needless rebuilds).
    h = hashlib.sha1()
    headers = glob.glob(os.path.join(ROOT, "aten_ops", "cpu", "**", "*.h"), recursive=True)
    headers += glob.glob(os.path.join(ROOT, "aten_ops", "common", "**", "*.h"), recursive=True)
    for f in sorted(headers):
        with open(f, "rb") as fh:
            h.update(os.path.relpath(f, ROOT).encode() + fh.read())
    return h.hexdigest()


def build_isa_objects():
    """Compile each *_isa.cpp once per ISA (in parallel); returns the object paths. An object is named by a hash of
    its command (relative paths) and of the source and header contents, so it is reused whenever nothing changed —
    also when build/isa_objects is copied into another checkout."""
    out_dir = os.path.join(SANITIZER_DIR if SANITIZE else os.path.join(ROOT, "build"), "isa_objects")
    os.makedirs(out_dir, exist_ok=True)
    abi = f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}"
    base = [os.environ.get("CXX", "c++"), "-c", "-fPIC", abi, *cxx_flags(), "-Iaten_ops"]
    base += [f"-I{p}" for p in include_paths()] + [f"-I{sysconfig.get_paths()['include']}"]
    jobs = []
    headers = _headers_digest()
    for src in sorted(glob.glob(os.path.join(ROOT, "aten_ops", "**", "*_isa.cpp"), recursive=True)):
        rel = os.path.relpath(src, ROOT)
        stem = os.path.splitext(rel)[0].replace(os.sep, "_")
        with open(src, "rb") as fh:
            content = fh.read()
        for isa, flags in isa_variants().items():
            cmd = base + flags + [f"-DCPU_CAPABILITY={isa}", f"-DCPU_CAPABILITY_{isa}", rel]
            tag = hashlib.sha1(" ".join(cmd).encode() + content + headers.encode()).hexdigest()[:12]
            obj = os.path.join(out_dir, f"{stem}.{isa}.{tag}.o")
            jobs.append((obj, None if os.path.exists(obj) else cmd + ["-o", obj]))

    def run(job):
        obj, cmd = job
        if cmd is not None:
            print(f"isa: compiling {os.path.basename(obj)}", flush=True)
            subprocess.run(cmd, check=True, cwd=ROOT)
        return obj

    with concurrent.futures.ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        return list(pool.map(run, jobs))


# Precompiled header: the torch headers every translation unit includes, parsed once per build instead of once per
# unit (half of a unit's compile time). Every ninja unit gets `-include build/.../pch/torch_headers.h`; GCC uses the
# .gch beside it when it was built with the same flags and otherwise reads the header itself (-Winvalid-pch says so
# in the build log), so a stale or missing .gch costs time, never correctness. The per-ISA objects do not use it
# (their -m flags differ).
PCH_HEADERS = ["ATen/ATen.h", "ATen/Parallel.h", "torch/library.h"]


def pch_header():
    out_dir = os.path.join(SANITIZER_DIR if SANITIZE else os.path.join(ROOT, "build"), "pch")
    os.makedirs(out_dir, exist_ok=True)
    header = os.path.join(out_dir, "torch_headers.h")
    text = "#pragma once\n" + "".join(f"#include <{h}>\n" for h in PCH_HEADERS)
    if not os.path.exists(header) or open(header).read() != text:
        with open(header, "w") as f:
            f.write(text)
    return header


class BuildExt(BuildExtension.with_options(use_ninja=True)):
    """torch's ninja build, with the precompiled header; with TOT_SANITIZE, into build/asan/ and never in place."""

    def finalize_options(self):
        super().finalize_options()
        if SANITIZE:
            self.inplace = False
            self.build_lib = os.path.join(SANITIZER_DIR, "lib")
            self.build_temp = os.path.join(SANITIZER_DIR, "temp")

    def build_extension(self, ext):
        # Here torch has added its defines to the unit flags: the header is compiled with exactly the units' flags.
        header = ext.extra_compile_args["cxx"][ext.extra_compile_args["cxx"].index("-include") + 1]
        cflags = self.compiler.compiler_so[1:] + [f"-I{d}" for d in ext.include_dirs + self.include_dirs]
        cmd = [os.environ.get("CXX", "c++"), *cflags, "-x", "c++-header", header, "-o", header + ".gch",
               *[f for f in ext.extra_compile_args["cxx"] if f not in ("-include", header)]]
        key = hashlib.sha1((" ".join(cmd) + torch.__version__).encode()).hexdigest()
        stamp = header + ".key"
        if not (os.path.exists(header + ".gch") and os.path.exists(stamp) and open(stamp).read() == key):
            print("pch: compiling " + os.path.relpath(header + ".gch", ROOT), flush=True)
            if subprocess.run(cmd + ["-w"]).returncode == 0:
                with open(stamp, "w") as f:
                    f.write(key)
            else:  # the units read the header itself
                print("pch: failed; building without a precompiled header", flush=True)
                if os.path.exists(header + ".gch"):
                    os.remove(header + ".gch")
        super().build_extension(ext)


EXT = extension_kwargs()

# Optional dependencies (README "Setup" installs `all`): the test suite; the Hugging Face drop-in and the demo
# (`python -m torch_ops_transformer demo`) with its progress bar; `bench --plot`.
EXTRAS = {
    "test": ["pytest", "pytest-xdist", "expecttest", "numpy", "hypothesis>=6.50"],
    "hf": ["transformers==5.24.0", "tqdm"],
    "plot": ["matplotlib"],
}
EXTRAS["demo"] = EXTRAS["hf"]  # the extra's earlier name
EXTRAS["all"] = sorted({req for reqs in EXTRAS.values() for req in reqs})
# What some of torch_npu's own test files import besides torch_npu (`python -m tools.upstream_tests`); not in `all`:
# nothing of this package needs them.
EXTRAS["upstream"] = ["einops", "ml_dtypes"]

setup(
    name="torch_ops_transformer",
    version="0.1.0",
    description="CANN ops-transformer (FlashAttention, RoPE, MoE, MC2) as native PyTorch ops on CPU and Ascend NPU",
    packages=find_packages(include=["torch_ops_transformer", "torch_ops_transformer.*"]),
    # the CANN kernel library, if built; the torch_npu shim's upstream function list and its PYTHONPATH entry (with
    # the cann_ops_transformer stand-in's, and that stand-in's function list); the flash_attn shim's PYTHONPATH entry.
    package_data={"torch_ops_transformer": EXT["package_data"],
                  "torch_ops_transformer.compat": ["torch_npu_functions.yaml", "pythonpath/torch_npu/__init__.py",
                                                    "pythonpath/cann_ops_transformer/__init__.py",
                                                    "flash_attn_pythonpath/flash_attn/__init__.py"],
                  "torch_ops_transformer.compat.cann_ops_transformer": ["functions.yaml"]},
    python_requires=">=3.9",
    # numpy: torch warns "Failed to initialize NumPy" on every import without it.
    install_requires=["torch>=2.13", "pyyaml", "numpy"],
    extras_require=EXTRAS,
    ext_modules=[
        CppExtension(
            name="torch_ops_transformer._C",
            sources=EXT["sources"],
            include_dirs=EXT["include_dirs"],
            define_macros=EXT["define_macros"],
            library_dirs=EXT["library_dirs"],
            libraries=EXT["libraries"],
            extra_compile_args={"cxx": cxx_flags() + ["-Winvalid-pch", "-include", pch_header()]},
            extra_objects=build_isa_objects(),
            extra_link_args=link_flags() + EXT["extra_link_args"],
            py_limited_api=False,
        )
    ],
    cmdclass={"build_ext": BuildExt},
)
