"""The optional CANN build of the NPU backend, used by setup.py (docs/ascendc_cann_build.md).

With a CANN toolkit and an importable torch_npu, the Ascend C kernels in ascendc/kernels/**/*_kernel.cpp are compiled
by CANN's `ascendc` CMake flow (bisheng for the AI Core, one `aclrtlaunch_<kernel>.h` launcher per kernel) into a
shared library, and the PyTorch glue in aten_ops/npu is compiled with -DTOT_WITH_CANN against torch_npu and ACL, so
the kernels run on the NPU stream. Without them the CPU build of setup.py is unchanged.

Detection never raises: each failure becomes one printed line and the CPU build goes on. `TOT_CANN=0` skips
detection, `TOT_CANN=1` makes a failed detection an error. The functions take their environment (env dict,
filesystem root, subprocess runner) as arguments so test/tools/test_cann_build.py drives them with fake toolkits.
"""
import dataclasses
import glob
import json
import os
import shutil
import subprocess
import sys
from typing import Callable, Dict, List, Optional, Sequence

# Where CANN installs, in the order CANN's own set_env.sh / samples look.
ENV_VARS = ("ASCEND_HOME_PATH", "ASCEND_TOOLKIT_HOME")
DEFAULT_TOOLKIT = "/usr/local/Ascend/ascend-toolkit/latest"
# ascendc.cmake (defines ascendc_library) moved between CANN releases.
ASCENDC_CMAKE_SUBDIRS = ("compiler/tikcpp/ascendc_kernel_cmake", "tools/tikcpp/ascendc_kernel_cmake")
# AI Core architecture per SoC family (bisheng --cce-aicore-arch). Our tiling targets Ascend 910B (arch 2201).
SOC_ARCH = (("Ascend910B", "dav-c220"), ("Ascend910_93", "dav-c220"))
DEFAULT_SOC = "Ascend910B1"
KERNEL_LIBRARY = "tot_ascendc_kernels"
UMBRELLA_HEADER = "tot_aclrtlaunch_all.h"
CPU_RUNTIME_SOURCE = "ascendc/cpu_runtime/src/runtime.cpp"


class CannUnavailable(Exception):
    """Why the CANN build cannot run here (one line, printed by setup.py before the CPU build)."""


@dataclasses.dataclass(frozen=True)
class Toolkit:
    root: str        # the CANN package, e.g. /usr/local/Ascend/ascend-toolkit/latest
    cmake_dir: str   # folder of ascendc.cmake
    source: str      # where it was found: an env var name or "default path"

    @property
    def include_dir(self) -> str:
        return os.path.join(self.root, "include")

    @property
    def lib_dir(self) -> str:
        return os.path.join(self.root, "lib64")


@dataclasses.dataclass(frozen=True)
class TorchNpu:
    root: str                      # the torch_npu package folder
    version: str
    soc: Optional[str] = None      # torch_npu.npu.get_device_name(0) when a device answers

    @property
    def include_dirs(self) -> List[str]:
        # torch_npu ships its headers (torch_npu/csrc/...) and a copy of the ACL headers it was built with.
        return [os.path.join(self.root, "include"), os.path.join(self.root, "include", "third_party", "acl", "inc")]

    @property
    def lib_dir(self) -> str:
        return os.path.join(self.root, "lib")


@dataclasses.dataclass(frozen=True)
class CannBuild:
    toolkit: Toolkit
    torch_npu: TorchNpu
    soc: str
    arch: str


# ---------------------------------------------------------------------------------------------------------------
# detection
# ---------------------------------------------------------------------------------------------------------------
def _ascendc_cmake_dir(root: str) -> Optional[str]:
    for sub in ASCENDC_CMAKE_SUBDIRS:
        path = os.path.join(root, sub)
        if os.path.isfile(os.path.join(path, "ascendc.cmake")):
            return path
    return None


def find_toolkit(env: Dict[str, str]) -> Toolkit:
    """The CANN toolkit named by ASCEND_HOME_PATH / ASCEND_TOOLKIT_HOME, else the default install path."""
    candidates = [(env[v], v) for v in ENV_VARS if env.get(v)] + [(DEFAULT_TOOLKIT, "default path")]
    tried = []
    for root, source in candidates:
        if not os.path.isdir(root):
            tried.append(f"{root} ({source}: no such directory)")
            continue
        cmake_dir = _ascendc_cmake_dir(root)
        if cmake_dir is None:
            tried.append(f"{root} ({source}: no ascendc.cmake under {' or '.join(ASCENDC_CMAKE_SUBDIRS)})")
            continue
        if not os.path.isfile(os.path.join(root, "include", "acl", "acl.h")):
            tried.append(f"{root} ({source}: no include/acl/acl.h)")
            continue
        return Toolkit(root=os.path.abspath(root), cmake_dir=cmake_dir, source=source)
    raise CannUnavailable("no CANN toolkit found: " + "; ".join(tried))


# Run in a child process: importing torch_npu initialises ACL and may abort; the build process must survive that.
_PROBE = r"""
import json, os
import torch_npu
soc = None
try:
    if torch_npu.npu.is_available():
        soc = torch_npu.npu.get_device_name(0)
except Exception:
    pass
print(json.dumps({"root": os.path.dirname(os.path.abspath(torch_npu.__file__)),
                  "version": getattr(torch_npu, "__version__", "unknown"), "soc": soc}))
"""


def probe_torch_npu(python: str = sys.executable, run: Callable = subprocess.run, env=None,
                    timeout: float = 120.0) -> TorchNpu:
    """`import torch_npu` in a subprocess; its package folder, version and (if a device answers) SoC name."""
    try:
        proc = run([python, "-c", _PROBE], capture_output=True, text=True, timeout=timeout, env=env)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise CannUnavailable(f"could not run {python} to import torch_npu: {e}") from e
    if proc.returncode != 0:
        last = (proc.stderr or "").strip().splitlines()[-1:] or [f"exit status {proc.returncode}"]
        raise CannUnavailable(f"import torch_npu failed: {last[0]}")
    try:
        info = json.loads(proc.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError) as e:
        raise CannUnavailable(f"import torch_npu printed no usable answer: {proc.stdout[-200:]!r}") from e
    return TorchNpu(root=info["root"], version=str(info["version"]), soc=info.get("soc"))


def aicore_arch(soc: str) -> str:
    """bisheng's --cce-aicore-arch for a SoC; only the 910B family, which our tiling targets, is accepted."""
    for prefix, arch in SOC_ARCH:
        if soc.startswith(prefix):
            return arch
    raise CannUnavailable(f"SOC_VERSION {soc!r} is not supported: the kernels' tiling targets Ascend910B* "
                          "(set SOC_VERSION=Ascend910B1..B4)")


def choose_soc(env: Dict[str, str], torch_npu: TorchNpu) -> str:
    """SOC_VERSION from the environment, else the device torch_npu reports, else Ascend910B1."""
    return env.get("SOC_VERSION") or torch_npu.soc or DEFAULT_SOC


def detect(env: Optional[Dict[str, str]] = None, python: str = sys.executable, run: Callable = subprocess.run,
           log: Callable[[str], None] = print) -> Optional[CannBuild]:
    """The CANN build to do, or None for the CPU build (after printing one line saying why)."""
    env = dict(os.environ if env is None else env)
    mode = env.get("TOT_CANN", "auto")
    if mode == "0":
        log("cann: TOT_CANN=0, building the CPU backend only")
        return None
    try:
        toolkit = find_toolkit(env)
        torch_npu = probe_torch_npu(python, run, env)
        soc = choose_soc(env, torch_npu)
        build = CannBuild(toolkit, torch_npu, soc, aicore_arch(soc))
    except CannUnavailable as e:
        if mode == "1":
            raise
        log(f"cann: {e}; building the CPU backend only (the simulated npu device still works)")
        return None
    log(f"cann: CANN at {toolkit.root} ({toolkit.source}), torch_npu {torch_npu.version}, SOC_VERSION {soc} "
        f"({build.arch}): compiling the Ascend C kernels for the NPU")
    return build


# ---------------------------------------------------------------------------------------------------------------
# the kernel library: the `ascendc` CMake flow
# ---------------------------------------------------------------------------------------------------------------
def kernel_sources(root: str) -> List[str]:
    """Ascend C device sources (relative to root): compiled by bisheng, never by the host compiler."""
    found = glob.glob(os.path.join(root, "ascendc", "kernels", "**", "*_kernel.cpp"), recursive=True)
    return sorted(os.path.relpath(f, root) for f in found)


def cmake_lists(root: str, kernels: Sequence[str]) -> str:
    """CMakeLists.txt of the kernel library: ascendc.cmake's ascendc_library compiles every kernel for the AI Core
    (cube and vector parts of MIX kernels separately, then links them) and generates aclrtlaunch_<kernel>.h."""
    files = "\n".join(f"    {os.path.join(root, k)}" for k in kernels)
    return f"""cmake_minimum_required(VERSION 3.16)
project(tot_ascendc_kernels LANGUAGES CXX)
# Written by tools/cann_build.py; SOC_VERSION and ASCEND_CANN_PACKAGE_PATH come from the command line.
set(RUN_MODE "npu")
include(${{ASCENDC_CMAKE_DIR}}/ascendc.cmake)
ascendc_library({KERNEL_LIBRARY} SHARED
{files}
)
ascendc_include_directories({KERNEL_LIBRARY} PRIVATE {os.path.join(root, "ascendc", "kernels")})
ascendc_compile_options({KERNEL_LIBRARY} PRIVATE -O2)
"""


def cmake_commands(build: CannBuild, source_dir: str, build_dir: str, jobs: int) -> List[List[str]]:
    """Configure and build the kernel library."""
    return [
        ["cmake", "-S", source_dir, "-B", build_dir, "-DCMAKE_BUILD_TYPE=Release",
         f"-DSOC_VERSION={build.soc}", f"-DASCEND_CANN_PACKAGE_PATH={build.toolkit.root}",
         f"-DASCENDC_CMAKE_DIR={build.toolkit.cmake_dir}"],
        ["cmake", "--build", build_dir, "--parallel", str(jobs)],
    ]


def bisheng_check_command(build: CannBuild, root: str, kernel: str, out_obj: str) -> List[str]:
    """One kernel through bisheng alone (a quick compile check, `python -m tools.cann_build --check`); the CMake
    flow above runs the real per-core-type compiles and the launcher generation."""
    tk = build.toolkit.root
    tikcpp = os.path.join(os.path.dirname(build.toolkit.cmake_dir), "tikcfw")
    return [os.path.join(tk, "compiler", "ccec_compiler", "bin", "bisheng"), "-x", "cce",
            f"--cce-aicore-arch={build.arch}", "--cce-aicore-only", "-O2", "-std=c++17",
            f"-I{tikcpp}", f"-I{os.path.join(tikcpp, 'impl')}", f"-I{os.path.join(tikcpp, 'interface')}",
            f"-I{os.path.join(tk, 'include')}", f"-I{os.path.join(root, 'ascendc', 'kernels')}",
            "-c", os.path.join(root, kernel), "-o", out_obj]


def launcher_header_dirs(build_dir: str) -> List[str]:
    """Folders holding the generated aclrtlaunch_<kernel>.h (their place differs between CANN releases)."""
    found = glob.glob(os.path.join(build_dir, "**", "aclrtlaunch_*.h"), recursive=True)
    return sorted({os.path.dirname(f) for f in found})


def write_umbrella_header(build_dir: str, out_dir: str) -> str:
    """tot_aclrtlaunch_all.h including every generated launcher; ascendc_launch.h includes it with TOT_WITH_CANN,
    so a glue file needs no per-kernel include."""
    headers = sorted(os.path.basename(f) for d in launcher_header_dirs(build_dir)
                     for f in glob.glob(os.path.join(d, "aclrtlaunch_*.h")))
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, UMBRELLA_HEADER)
    lines = ["// Generated by tools/cann_build.py: every aclrtlaunch_<kernel>.h of the CANN kernel build.",
             "#pragma once"] + [f'#include "{h}"' for h in headers]
    with open(path, "w") as fh:
        fh.write("\n".join(lines) + "\n")
    return path


def find_kernel_library(build_dir: str) -> str:
    found = glob.glob(os.path.join(build_dir, "**", f"lib{KERNEL_LIBRARY}.so"), recursive=True)
    if not found:
        raise RuntimeError(f"cann: the CMake build in {build_dir} produced no lib{KERNEL_LIBRARY}.so")
    return sorted(found)[0]


def build_kernels(build: CannBuild, root: str, build_dir: str, run: Callable = subprocess.run,
                  jobs: Optional[int] = None) -> Dict[str, object]:
    """Compile the kernels; returns {"library": path, "include_dirs": [...]} for the extension. An error here
    is real (CANN was found), so it raises with the command; TOT_CANN=0 builds the CPU backend instead."""
    kernels = kernel_sources(root)
    if not kernels:
        raise RuntimeError("cann: no ascendc/kernels/**/*_kernel.cpp to compile")
    source_dir = os.path.join(build_dir, "cmake_project")
    os.makedirs(source_dir, exist_ok=True)
    with open(os.path.join(source_dir, "CMakeLists.txt"), "w") as fh:
        fh.write(cmake_lists(root, kernels))
    cmake_build_dir = os.path.join(build_dir, "cmake_build")
    for cmd in cmake_commands(build, source_dir, cmake_build_dir, jobs or os.cpu_count() or 2):
        print("cann: " + " ".join(cmd), flush=True)
        if run(cmd).returncode != 0:
            raise RuntimeError(f"cann: `{' '.join(cmd)}` failed (set TOT_CANN=0 to build the CPU backend only)")
    umbrella_dir = os.path.join(build_dir, "include")
    write_umbrella_header(cmake_build_dir, umbrella_dir)
    return {"library": find_kernel_library(cmake_build_dir),
            "include_dirs": [umbrella_dir] + launcher_header_dirs(cmake_build_dir)}


# ---------------------------------------------------------------------------------------------------------------
# the extension: sources and flags per build
# ---------------------------------------------------------------------------------------------------------------
def host_sources(root: str, with_cann: bool) -> List[str]:
    """Sources of the _C extension (relative to root). Both builds: CPU kernels, the simulated device, the npu glue,
    the host tiling code. CPU build: also the Ascend C kernels and the CPU runtime they run on. CANN build: the
    kernels are device code (build_kernels) and the CPU runtime is left out."""
    def rel(pattern):
        return glob.glob(os.path.join(root, pattern), recursive=True)

    files = rel("aten_ops/cpu/**/*.cpp") + rel("aten_ops/common/**/*.cpp") + rel("aten_ops/npu_sim/*.cpp")
    files += rel("aten_ops/npu/**/*.cpp") + rel("ascendc/kernels/**/*.cpp")
    files = [os.path.relpath(f, root) for f in files]
    files = [f for f in files if not f.endswith("_isa.cpp")]
    if with_cann:
        files = [f for f in files if not f.endswith("_kernel.cpp")]
    else:
        files.append(CPU_RUNTIME_SOURCE)
    return sorted(files) + ["aten_ops/generated/register_ops.cpp"]


def extension_kwargs(root: str, build: Optional[CannBuild] = None,
                     kernels: Optional[Dict[str, object]] = None) -> Dict[str, object]:
    """Keyword arguments for setup.py's CppExtension (sources, include/library dirs, macros, link flags)."""
    includes = [os.path.join(root, "aten_ops"), os.path.join(root, "ascendc", "kernels")]
    if build is None:
        # The CPU runtime provides kernel_operator.h / tikicpulib.h; never on the CANN include path.
        return {"sources": host_sources(root, False),
                "include_dirs": [includes[0], os.path.join(root, "ascendc", "cpu_runtime", "include"), includes[1]],
                "define_macros": [], "library_dirs": [], "libraries": [], "extra_link_args": [], "package_data": []}
    lib = str(kernels["library"])
    lib_dirs = [os.path.dirname(lib), build.toolkit.lib_dir, build.torch_npu.lib_dir]
    return {"sources": host_sources(root, True),
            "include_dirs": includes + list(kernels["include_dirs"]) + [build.toolkit.include_dir]
            + build.torch_npu.include_dirs,
            "define_macros": [("TOT_WITH_CANN", "1")],
            "library_dirs": lib_dirs,
            "libraries": [KERNEL_LIBRARY, "ascendcl", "torch_npu"],
            # $ORIGIN: the kernel library is copied next to _C (copy_kernel_library); the others stay installed.
            "extra_link_args": ["-Wl,-rpath,$ORIGIN"] + [f"-Wl,-rpath,{d}" for d in lib_dirs[1:]],
            # installed with the package (a non-editable install copies package files, not the build folder)
            "package_data": [os.path.basename(lib)]}


def copy_kernel_library(kernels: Dict[str, object], package_dir: str) -> str:
    """Put lib<kernels>.so next to the extension so its $ORIGIN rpath finds it after installation."""
    os.makedirs(package_dir, exist_ok=True)
    dst = os.path.join(package_dir, os.path.basename(str(kernels["library"])))
    shutil.copy2(str(kernels["library"]), dst)
    return dst


def _main(argv: Sequence[str]) -> int:
    """`python -m tools.cann_build [--check]`: report detection; --check compiles each kernel with bisheng."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    build = detect()
    if build is None:
        return 1
    if "--check" in argv:
        out = os.path.join(root, "build", "cann_check")
        os.makedirs(out, exist_ok=True)
        for k in kernel_sources(root):
            cmd = bisheng_check_command(build, root, k, os.path.join(out, os.path.basename(k) + ".o"))
            print(" ".join(cmd), flush=True)
            if subprocess.run(cmd).returncode != 0:
                return 1
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
