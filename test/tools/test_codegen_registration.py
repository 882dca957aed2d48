"""What the dispatcher sees is generated or registered in C++: the simulated-device op list is a generated C++
array (no list handed back from Python), and the npu FlashAttention tile override is an op of the YAML."""
import os

import pytest
import torch

import torch_ops_transformer  # noqa: F401  (loads the extension)
from tools.codegen import gen_cpp
from tools.codegen.main import ROOT
from tools.codegen.model import load
from torch_ops_transformer._library.generated import registrations


def test_simulated_npu_ops_are_a_generated_cpp_array():
    specs = load(os.path.join(ROOT, "native_functions.yaml"))
    header = gen_cpp.render(specs)["aten_ops/generated/simulated_npu_ops.h"]
    names = gen_cpp.simulated_npu_cpu_kernel_ops(specs)
    assert names == [s.name for s in specs if "CPU" in s.dispatch and "PrivateUse1" not in s.dispatch]
    assert f"std::array<const char*, {len(names)}> kSimulatedNpuCpuKernelOps" in header
    assert all(f'    "{n}",' in header for n in names)
    assert not hasattr(registrations, "SIMULATED_NPU_CPU_KERNEL_OPS")


def test_ops_registry_fields_are_named():
    info = registrations.OPS["flash_attention_score"]
    assert info.dispatch_keys == ("CPU", "PrivateUse1") and info.differentiable and info.opcheck
    assert registrations.OPS["npu_attention_tile_config"].dispatch_keys == ("CatchAll",)


def test_npu_attention_tile_config_sets_keeps_and_resets():
    op = torch.ops.npu_fa.npu_attention_tile_config
    try:
        assert op(64, 128) == [64, 128]
        assert op() == [64, 128]  # 0 keeps the current values
        assert op(-1, 0) == [0, 128]  # -1 returns to the automatic choice
    finally:
        op(-1, -1)
    assert op() == [0, 0]
    with pytest.raises(ValueError, match="s1_block"):
        op(-2, 0)
    with pytest.raises(ValueError, match="s2_block"):
        op(0, 70000)
