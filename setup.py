"""Build torch_ops_transformer: generate registrations from native_functions.yaml, then compile aten_ops/.

CPU build (always): `pip install --no-build-isolation -e .`
The NPU backend (Ascend C kernels via torch_npu + CANN) is detected separately and is optional; its absence
never breaks a CPU install.
"""
import glob
import os
import sys

from setuptools import find_packages, setup
from torch.utils.cpp_extension import BuildExtension, CppExtension

ROOT = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, ROOT)
from tools.codegen import generate  # noqa: E402  (the generator lives in the repo, not in the package)

for rel in generate(ROOT):
    print(f"codegen: wrote {rel}")


def sources():
    # One translation unit per op family and backend, plus the generated registrations.
    files = glob.glob("aten_ops/cpu/*.cpp") + glob.glob("aten_ops/common/*.cpp") + ["aten_ops/generated/register_ops.cpp"]
    return sorted(files)


def cxx_flags():
    flags = ["-O3", "-std=c++17", "-fvisibility-inlines-hidden", "-Wno-unused-parameter"]
    if os.environ.get("TOT_DEBUG"):
        flags = ["-O0", "-g", "-std=c++17"]
    return flags


setup(
    name="torch_ops_transformer",
    version="0.1.0",
    description="CANN ops-transformer (FlashAttention, RoPE, MoE, MC2) as native PyTorch ops on CPU and Ascend NPU",
    packages=find_packages(include=["torch_ops_transformer", "torch_ops_transformer.*"]),
    python_requires=">=3.9",
    install_requires=["torch>=2.13", "pyyaml"],
    ext_modules=[
        CppExtension(
            name="torch_ops_transformer._C",
            sources=sources(),
            include_dirs=[os.path.join(ROOT, "aten_ops")],
            extra_compile_args={"cxx": cxx_flags()},
            py_limited_api=False,
        )
    ],
    cmdclass={"build_ext": BuildExtension.with_options(use_ninja=True)},
)
