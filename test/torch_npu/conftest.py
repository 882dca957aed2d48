"""torch_npu/: torch_npu's own per-op tests (op-plugin test/test_custom_ops, test/test_base_ops) ported to run
against our wrappers, on the CPU and (test_on_simulated_npu.py) on the simulated npu device. Each file's docstring
lists the upstream cases it covers and why the others cannot apply."""
