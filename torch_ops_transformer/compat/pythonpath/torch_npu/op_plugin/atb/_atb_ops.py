"""torch_npu.op_plugin.atb._atb_ops of the torch_npu shim (torch_ops_transformer.compat.atb)."""
from torch_ops_transformer.compat.atb import (_npu_flash_attention, _npu_flash_attention_unpad,  # noqa: F401
                                              _npu_paged_attention, _npu_paged_attention_get_workspace,
                                              _npu_reshape_and_cache, _register_atb_extensions)
