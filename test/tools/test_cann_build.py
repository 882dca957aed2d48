"""tools/cann_build.py, the optional CANN build of setup.py: detection against fake toolkit folders and a fake
`import torch_npu` subprocess, the CMake / bisheng commands, the extension's sources and flags per build, and the
TOT_WITH_CANN branch of aten_ops/npu/ascendc_launch.h compiled against stand-in CANN / torch_npu headers. The real
toolchain cannot run here (docs/ascendc_cann_build.md says how to verify it on a machine with CANN)."""
import json
import os
import subprocess
import sysconfig
import types

import pytest

from test.common.checkout import ROOT
from tools import cann_build as cann


def fake_toolkit(base, layout="compiler"):
    """A folder shaped like a CANN install: ascendc.cmake and include/acl/acl.h."""
    cmake_dir = base / layout / "tikcpp" / "ascendc_kernel_cmake"
    cmake_dir.mkdir(parents=True)
    (cmake_dir / "ascendc.cmake").write_text("# fake\n")
    (base / "include" / "acl").mkdir(parents=True)
    (base / "include" / "acl" / "acl.h").write_text("// fake\n")
    return base


def fake_run(returncode=0, info=None, stderr=""):
    """A subprocess.run stand-in for the torch_npu probe; records the command."""
    calls = []

    def run(cmd, **kw):
        calls.append(cmd)
        out = json.dumps(info or {"root": "/site/torch_npu", "version": "2.13.0", "soc": None})
        return types.SimpleNamespace(returncode=returncode, stdout=out + "\n", stderr=stderr)

    run.calls = calls
    return run


@pytest.fixture(autouse=True)
def no_default_toolkit(monkeypatch, tmp_path):
    # This machine has no /usr/local/Ascend, but never depend on it: point the default somewhere empty.
    monkeypatch.setattr(cann, "DEFAULT_TOOLKIT", str(tmp_path / "no_default_install"))


# ---- detection ----

def test_toolkit_from_ascend_home_path(tmp_path):
    tk = cann.find_toolkit({"ASCEND_HOME_PATH": str(fake_toolkit(tmp_path / "cann"))})
    assert tk.root == str(tmp_path / "cann") and tk.source == "ASCEND_HOME_PATH"
    assert tk.cmake_dir.endswith("compiler/tikcpp/ascendc_kernel_cmake")
    assert tk.include_dir == str(tmp_path / "cann" / "include") and tk.lib_dir.endswith("lib64")


def test_toolkit_env_order_and_older_layout(tmp_path):
    older = fake_toolkit(tmp_path / "older", layout="tools")
    env = {"ASCEND_HOME_PATH": str(tmp_path / "missing"), "ASCEND_TOOLKIT_HOME": str(older)}
    tk = cann.find_toolkit(env)
    assert tk.source == "ASCEND_TOOLKIT_HOME" and tk.cmake_dir.endswith("tools/tikcpp/ascendc_kernel_cmake")


def test_toolkit_default_path(tmp_path, monkeypatch):
    monkeypatch.setattr(cann, "DEFAULT_TOOLKIT", str(fake_toolkit(tmp_path / "latest")))
    assert cann.find_toolkit({}).source == "default path"


def test_toolkit_missing_pieces_are_named(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(cann.CannUnavailable, match="no ascendc.cmake"):
        cann.find_toolkit({"ASCEND_HOME_PATH": str(tmp_path / "empty")})
    tk = fake_toolkit(tmp_path / "noacl")
    os.remove(tk / "include" / "acl" / "acl.h")
    with pytest.raises(cann.CannUnavailable, match="no include/acl/acl.h"):
        cann.find_toolkit({"ASCEND_HOME_PATH": str(tk)})
    with pytest.raises(cann.CannUnavailable, match="no such directory"):
        cann.find_toolkit({})


def test_probe_torch_npu_reads_the_child_answer():
    run = fake_run(info={"root": "/site/torch_npu", "version": "2.13.0.post1", "soc": "Ascend910B3"})
    t = cann.probe_torch_npu("/usr/bin/python3", run)
    assert run.calls[0][:2] == ["/usr/bin/python3", "-c"] and "import torch_npu" in run.calls[0][2]
    assert (t.root, t.version, t.soc) == ("/site/torch_npu", "2.13.0.post1", "Ascend910B3")
    assert t.include_dirs == ["/site/torch_npu/include", "/site/torch_npu/include/third_party/acl/inc"]
    assert t.lib_dir == "/site/torch_npu/lib"


def test_probe_torch_npu_failure_is_one_line():
    run = fake_run(returncode=1, stderr="Traceback...\nModuleNotFoundError: No module named 'torch_npu'\n")
    with pytest.raises(cann.CannUnavailable, match="import torch_npu failed: ModuleNotFoundError"):
        cann.probe_torch_npu("python", run)


def test_probe_torch_npu_really_fails_here():
    # This machine has no torch_npu: the real subprocess probe must say so (and nothing else happens).
    with pytest.raises(cann.CannUnavailable, match="torch_npu"):
        cann.probe_torch_npu()


def test_soc_and_arch():
    t = cann.TorchNpu("/t", "2.13", soc="Ascend910B2")
    assert cann.choose_soc({}, t) == "Ascend910B2"
    assert cann.choose_soc({"SOC_VERSION": "Ascend910B4"}, t) == "Ascend910B4"
    assert cann.choose_soc({}, cann.TorchNpu("/t", "2.13")) == "Ascend910B1"
    assert cann.aicore_arch("Ascend910B3") == "dav-c220"
    assert cann.aicore_arch("Ascend910_9391") == "dav-c220"
    with pytest.raises(cann.CannUnavailable, match="Ascend310P3.*not supported"):
        cann.aicore_arch("Ascend310P3")


def test_detect_falls_back_with_one_line(tmp_path):
    lines = []
    assert cann.detect({}, log=lines.append) is None
    assert len(lines) == 1 and lines[0].startswith("cann: no CANN toolkit found") and "CPU backend" in lines[0]
    lines.clear()
    env = {"ASCEND_HOME_PATH": str(fake_toolkit(tmp_path / "cann"))}
    assert cann.detect(env, run=fake_run(returncode=1, stderr="ImportError: x"), log=lines.append) is None
    assert len(lines) == 1 and "import torch_npu failed" in lines[0]
    lines.clear()
    assert cann.detect(dict(env, SOC_VERSION="Ascend310P3"), run=fake_run(), log=lines.append) is None
    assert len(lines) == 1 and "not supported" in lines[0]


def test_detect_switches(tmp_path):
    lines = []
    env = {"ASCEND_HOME_PATH": str(fake_toolkit(tmp_path / "cann"))}
    run = fake_run()
    assert cann.detect(dict(env, TOT_CANN="0"), run=run, log=lines.append) is None
    assert run.calls == [] and "TOT_CANN=0" in lines[0]
    with pytest.raises(cann.CannUnavailable):
        cann.detect({"TOT_CANN": "1"}, log=lines.append)
    build = cann.detect(env, run=run, log=lines.append)
    assert build.soc == "Ascend910B1" and build.arch == "dav-c220" and build.torch_npu.root == "/site/torch_npu"
    assert "compiling the Ascend C kernels" in lines[-1]


def test_detect_on_this_machine_is_the_cpu_build():
    lines = []
    assert cann.detect(log=lines.append) is None and len(lines) == 1


# ---- commands ----

def _build(tmp_path):
    tk = cann.find_toolkit({"ASCEND_HOME_PATH": str(fake_toolkit(tmp_path / "cann"))})
    return cann.CannBuild(tk, cann.TorchNpu("/site/torch_npu", "2.13"), "Ascend910B2", "dav-c220")


def fake_repo(base):
    for rel in ["ascendc/kernels/rope/rope_kernel.cpp", "ascendc/kernels/rope/rope_tiling.cpp",
                "ascendc/kernels/attention/fa_fwd_kernel.cpp", "ascendc/cpu_runtime/src/runtime.cpp",
                "aten_ops/cpu/rope/ops.cpp", "aten_ops/cpu/rope/kernels_isa.cpp", "aten_ops/common/p.cpp",
                "aten_ops/npu/rope/rope.cpp", "aten_ops/npu_sim/device.cpp", "aten_ops/generated/register_ops.cpp"]:
        (base / rel).parent.mkdir(parents=True, exist_ok=True)
        (base / rel).write_text("\n")
    return base


def test_kernel_sources_and_cmake_project(tmp_path):
    root = fake_repo(tmp_path / "repo")
    kernels = cann.kernel_sources(str(root))
    assert kernels == ["ascendc/kernels/attention/fa_fwd_kernel.cpp", "ascendc/kernels/rope/rope_kernel.cpp"]
    text = cann.cmake_lists(str(root), kernels)
    assert "include(${ASCENDC_CMAKE_DIR}/ascendc.cmake)" in text
    assert f"ascendc_library({cann.KERNEL_LIBRARY} SHARED" in text
    assert str(root / "ascendc/kernels/rope/rope_kernel.cpp") in text and "tiling.cpp" not in text
    assert f"ascendc_include_directories({cann.KERNEL_LIBRARY} PRIVATE {root / 'ascendc' / 'kernels'})" in text


def test_cmake_and_bisheng_commands(tmp_path):
    build = _build(tmp_path)
    configure, make = cann.cmake_commands(build, "/src", "/bld", 3)
    assert configure[:5] == ["cmake", "-S", "/src", "-B", "/bld"]
    assert "-DSOC_VERSION=Ascend910B2" in configure
    assert f"-DASCEND_CANN_PACKAGE_PATH={build.toolkit.root}" in configure
    assert f"-DASCENDC_CMAKE_DIR={build.toolkit.cmake_dir}" in configure
    assert make == ["cmake", "--build", "/bld", "--parallel", "3"]
    cmd = cann.bisheng_check_command(build, "/repo", "ascendc/kernels/rope/rope_kernel.cpp", "/o/rope.o")
    assert cmd[0] == os.path.join(build.toolkit.root, "compiler", "ccec_compiler", "bin", "bisheng")
    assert cmd[1:3] == ["-x", "cce"] and "--cce-aicore-arch=dav-c220" in cmd
    assert f"-I{build.toolkit.root}/compiler/tikcpp/tikcfw" in cmd and "-I/repo/ascendc/kernels" in cmd
    assert cmd[-4:] == ["-c", "/repo/ascendc/kernels/rope/rope_kernel.cpp", "-o", "/o/rope.o"]


def test_launcher_headers_and_umbrella(tmp_path):
    gen = tmp_path / "cmake_build" / "include" / cann.KERNEL_LIBRARY
    gen.mkdir(parents=True)
    for k in ("rope_kernel", "fa_fwd_kernel"):
        (gen / f"aclrtlaunch_{k}.h").write_text("\n")
    assert cann.launcher_header_dirs(str(tmp_path / "cmake_build")) == [str(gen)]
    path = cann.write_umbrella_header(str(tmp_path / "cmake_build"), str(tmp_path / "inc"))
    text = open(path).read()
    assert path.endswith(cann.UMBRELLA_HEADER) and "#pragma once" in text
    assert '#include "aclrtlaunch_fa_fwd_kernel.h"\n#include "aclrtlaunch_rope_kernel.h"' in text


def test_build_kernels_runs_cmake_and_collects_outputs(tmp_path):
    root = fake_repo(tmp_path / "repo")
    build = _build(tmp_path)
    out = tmp_path / "out"
    calls = []

    def run(cmd, **kw):  # stands in for cmake: the build step "produces" the library and a launcher header
        calls.append(cmd)
        if cmd[1] == "--build":
            gen = out / "cmake_build" / "include" / cann.KERNEL_LIBRARY
            gen.mkdir(parents=True)
            (gen / "aclrtlaunch_rope_kernel.h").write_text("\n")
            (out / "cmake_build" / f"lib{cann.KERNEL_LIBRARY}.so").write_text("elf")
        return types.SimpleNamespace(returncode=0)

    k = cann.build_kernels(build, str(root), str(out), run=run, jobs=2)
    assert [c[:2] for c in calls] == [["cmake", "-S"], ["cmake", "--build"]]
    assert (out / "cmake_project" / "CMakeLists.txt").exists()
    assert k["library"] == str(out / "cmake_build" / f"lib{cann.KERNEL_LIBRARY}.so")
    assert k["include_dirs"][0] == str(out / "include") and (out / "include" / cann.UMBRELLA_HEADER).exists()
    dst = cann.copy_kernel_library(k, str(tmp_path / "pkg"))
    assert open(dst).read() == "elf"


def test_build_kernels_failure_names_the_command(tmp_path):
    root = fake_repo(tmp_path / "repo")
    with pytest.raises(RuntimeError, match="cmake -S .* failed .*TOT_CANN=0"):
        cann.build_kernels(_build(tmp_path), str(root), str(tmp_path / "out"),
                           run=lambda cmd, **kw: types.SimpleNamespace(returncode=2))


def test_extension_sources_and_flags_per_build(tmp_path):
    root = str(fake_repo(tmp_path / "repo"))
    cpu = cann.extension_kwargs(root)
    assert "ascendc/cpu_runtime/src/runtime.cpp" in cpu["sources"]
    assert "ascendc/kernels/rope/rope_kernel.cpp" in cpu["sources"]
    assert not any(s.endswith("_isa.cpp") for s in cpu["sources"])
    assert cpu["sources"][-1] == "aten_ops/generated/register_ops.cpp"
    assert os.path.join(root, "ascendc", "cpu_runtime", "include") in cpu["include_dirs"]
    assert cpu["define_macros"] == [] and cpu["libraries"] == []

    build = _build(tmp_path)
    kernels = {"library": "/bld/libtot_ascendc_kernels.so", "include_dirs": ["/bld/include", "/bld/gen"]}
    npu = cann.extension_kwargs(root, build, kernels)
    assert "ascendc/cpu_runtime/src/runtime.cpp" not in npu["sources"]
    assert not any(s.endswith("_kernel.cpp") for s in npu["sources"])
    assert {"ascendc/kernels/rope/rope_tiling.cpp", "aten_ops/npu/rope/rope.cpp"} <= set(npu["sources"])
    assert not any("cpu_runtime" in d for d in npu["include_dirs"])
    assert {"/bld/include", "/bld/gen", build.toolkit.include_dir, "/site/torch_npu/include"} <= set(
        npu["include_dirs"])
    assert npu["define_macros"] == [("TOT_WITH_CANN", "1")]
    assert npu["libraries"] == [cann.KERNEL_LIBRARY, "ascendcl", "torch_npu"]
    assert npu["library_dirs"] == ["/bld", build.toolkit.lib_dir, "/site/torch_npu/lib"]
    assert "-Wl,-rpath,$ORIGIN" in npu["extra_link_args"]
    assert npu["package_data"] == ["libtot_ascendc_kernels.so"] and cpu["package_data"] == []


def test_setup_uses_the_module():
    text = open(os.path.join(ROOT, "setup.py")).read()
    assert "from tools import cann_build as cann" in text and "cann.detect()" in text


# ---- ascendc_launch.h with TOT_WITH_CANN, against stand-in headers ----

STUB_ACL = """#pragma once
#include <cstdint>
typedef void* aclrtStream;
#define ACL_SUCCESS 0
"""
STUB_STREAM = """#pragma once
#include <acl/acl.h>
namespace c10_npu {
struct NPUStream { aclrtStream stream() const { return nullptr; } };
inline NPUStream getCurrentNPUStream() { return {}; }
}
"""
# What CANN generates per kernel: a launcher taking blockDim, the stream and the kernel's arguments as void*.
STUB_UMBRELLA = """#pragma once
#include <acl/acl.h>
#ifndef ACLRT_LAUNCH_KERNEL
#define ACLRT_LAUNCH_KERNEL(kernel_func) aclrtlaunch_##kernel_func
#endif
extern "C" uint32_t aclrtlaunch_demo_kernel(uint32_t blockDim, aclrtStream stream, void* x, void* workspace,
                                            void* tiling);
"""
GLUE = """#include "npu/ascendc_launch.h"
struct DemoTiling { uint32_t block_dim; uint32_t n; };
void demo(const at::Tensor& x) {
  npu_fa::ascendc::Launch launch("demo");
  DemoTiling tiling{4, 128};
  static_assert(npu_fa::ascendc::kSystemWorkspaceBytes == 16 * 1024 * 1024, "system workspace");
  TOT_ASCENDC_RUN(launch, demo_kernel, tiling.block_dim, 0, launch.Gm(x), launch.Workspace(64, x.options()),
                  launch.Tiling(tiling, x.options()));
}
"""


def test_launch_header_cann_branch_compiles(tmp_path):
    import torch.utils.cpp_extension as ext

    (tmp_path / "acl").mkdir()
    (tmp_path / "acl" / "acl.h").write_text(STUB_ACL)
    stream_dir = tmp_path / "torch_npu" / "csrc" / "core" / "npu"
    stream_dir.mkdir(parents=True)
    (stream_dir / "NPUStream.h").write_text(STUB_STREAM)
    (tmp_path / cann.UMBRELLA_HEADER).write_text(STUB_UMBRELLA)
    (tmp_path / "glue.cpp").write_text(GLUE)
    cmd = [os.environ.get("CXX", "c++"), "-fsyntax-only", "-std=c++17", "-DTOT_WITH_CANN=1",
           f"-I{tmp_path}", f"-I{os.path.join(ROOT, 'aten_ops')}", f"-I{sysconfig.get_paths()['include']}"]
    cmd += [f"-I{p}" for p in ext.include_paths()] + [str(tmp_path / "glue.cpp")]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-4000:]
