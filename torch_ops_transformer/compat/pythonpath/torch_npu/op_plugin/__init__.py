"""torch_npu.op_plugin of the torch_npu shim: only `atb._atb_ops`."""
