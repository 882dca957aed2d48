"""Importing this module makes code written for CUDA run on the npu device (torch_ops_transformer.compat
.transfer_to_npu says what it changes)."""
from torch_ops_transformer.compat import transfer_to_npu as _transfer

_transfer.apply()
