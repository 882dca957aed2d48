"""torch_npu.op_plugin.atb of the torch_npu shim: only `_atb_ops`."""
