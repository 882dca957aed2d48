"""The shim's torch_npu.testing (what torch_npu's own tests import) and tools/upstream_tests.py, which runs such
test files unchanged."""
import textwrap
import unittest

import numpy as np
import pytest
import torch

from torch_ops_transformer.compat import testing


class _Case(testing.TestCase):
    def runTest(self):  # noqa: N802
        pass


def _passes(x, y, **kw) -> bool:
    try:
        _Case().assertRtolEqual(x, y, **kw)
        return True
    except AssertionError:
        return False


def test_rtol_equal_criterion():
    x = torch.ones(10000)
    assert _passes(x, x + 5e-5)                       # every element within prec absolutely
    assert _passes(x * 1000, x * 1000.05)             # every element within prec relatively
    y = x.clone()
    y[:1] += 1.0
    assert _passes(x, y)                              # 1 outlier <= size * prec
    y[:2] += 1.0
    assert not _passes(x, y)                          # 2 outliers > size * prec
    assert _passes(x.half(), (x + 5e-4).half())       # float16: prec16
    assert not _passes(x, x.double())                 # dtypes must match
    assert not _passes(x, torch.ones(5))              # shapes must match
    assert not _passes(torch.tensor([float("nan"), 1.0]), torch.tensor([1.0, 1.0]))  # NaN positions
    assert _passes([x, x], [x, x])
    assert _passes(x.bfloat16(), x.bfloat16())        # bfloat16 (no numpy dtype) compared in float32
    assert not _passes(x.bfloat16(), (x * 2).bfloat16())


def test_format_cast_keeps_logical_values():
    x = torch.randn(4, 4)
    assert testing.npu_format_cast(x, 2) is x and testing.get_npu_format(x) == 2
    nz = testing.npu_format_cast(x, 29)  # a storage format: same logical values, a new tensor, tagged
    assert torch.equal(nz, x) and nz.data_ptr() != x.data_ptr() and testing.get_npu_format(nz) == 29
    with pytest.raises(ValueError, match="'acl_format'.*got 28"):
        testing.npu_format_cast(x, 28)
    cpu, dev = testing.create_common_tensor([np.float32, 2, (3, 4)], -1, 1, device="cpu")
    assert torch.equal(cpu, dev) and cpu.dtype == torch.float32 and bool((cpu >= -1).all() and (cpu < 1).all())


def test_supported_devices_and_multi_npu_skips():
    @testing.SupportedDevices(["Ascend910B"])
    def a2():
        return "ran"

    @testing.SupportedDevices(["Ascend950"])
    def other():
        return "ran"

    assert a2() == "ran"
    with pytest.raises(unittest.SkipTest):
        other()
    # Not enabled in this process: no npu device, so a multi-NPU test skips (test/npu/multi_device_worker.py runs
    # one with TOT_NPU_SIM_DEVICES=2).
    with pytest.raises(unittest.SkipTest, match="needs 2 NPUs; the simulated npu device has 0"):
        testing.skipIfUnsupportMultiNPU(2)(lambda: "ran")()


def test_upstream_tests_tool_counts_a_test_file_written_for_torch_npu(tmp_path, capsys):
    from tools import upstream_tests

    folder = tmp_path / "test" / "test_custom_ops"
    folder.mkdir(parents=True)
    (folder / "test_npu_rotary_mul.py").write_text(textwrap.dedent("""
        import torch, torch_npu
        from torch_npu.testing.testcase import TestCase, run_tests
        from torch_npu.testing.common_utils import SupportedDevices

        class TestRotary(TestCase):
            def test_matches(self):
                x, c, s = torch.randn(1, 2, 2, 8), torch.randn(1, 2, 1, 8), torch.randn(1, 2, 1, 8)
                x1, x2 = x.chunk(2, -1)
                golden = x * c + torch.cat((-x2, x1), -1) * s
                self.assertRtolEqual(golden, torch_npu.npu_rotary_mul(x.npu(), c.npu(), s.npu()).cpu())

            def test_wrong(self):
                self.assertRtolEqual(torch.zeros(3), torch.ones(3))

            @SupportedDevices(["Ascend950"])
            def test_other_soc(self):
                pass

        if __name__ == "__main__":
            run_tests()
        """))
    (folder / "test_unrelated.py").write_text("def test_x():\n    assert False\n")
    upstream_tests.main(["--op-plugin", str(tmp_path)])
    out = capsys.readouterr().out
    assert "test/test_custom_ops/test_npu_rotary_mul.py: 1 passed, 1 failed, 1 skipped" in out, out
    assert "test_unrelated" not in out and "total: 1 passed, 1 failed, 0 not implemented, 1 skipped, 0 error" in out


def test_supported_devices_runs_any_soc_with_tot_any_soc(monkeypatch):
    monkeypatch.setenv("TOT_ANY_SOC", "1")
    assert testing.SupportedDevices(["Ascend950"])(lambda: "ran")() == "ran"


def test_upstream_tests_tool_unskips_by_word_and_soc(tmp_path, capsys):
    from tools import upstream_tests

    folder = tmp_path / "test" / "test_custom_ops"
    folder.mkdir(parents=True)
    (folder / "test_npu_rotary_mul.py").write_text(textwrap.dedent("""
        import unittest
        import torch, torch_npu
        from torch_npu.testing.testcase import TestCase, run_tests
        from torch_npu.testing.common_utils import SupportedDevices

        class TestRotary(TestCase):
            @unittest.skip("Skip test_npu_rotary_mul now")
            @SupportedDevices(["Ascend950"])
            def test_written_not_enabled(self):
                x, c, s = torch.randn(1, 2, 2, 8), torch.randn(1, 2, 1, 8), torch.randn(1, 2, 1, 8)
                x1, x2 = x.chunk(2, -1)
                golden = x * c + torch.cat((-x2, x1), -1) * s
                self.assertRtolEqual(golden, torch_npu.npu_rotary_mul(x.npu(), c.npu(), s.npu()).cpu())

            @unittest.skip("kept")
            def test_kept_skipped(self):
                pass

        if __name__ == "__main__":
            run_tests()
        """))
    upstream_tests.main(["--op-plugin", str(tmp_path), "--unskip", "now", "--any-soc"])
    out = capsys.readouterr().out
    assert "test/test_custom_ops/test_npu_rotary_mul.py: 1 passed, 1 skipped" in out, out
