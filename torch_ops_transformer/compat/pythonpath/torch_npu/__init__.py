"""`import torch_npu` through PYTHONPATH=$(python -m torch_ops_transformer.compat --pythonpath): the real torch_npu
when it imports, otherwise torch_ops_transformer's CPU shim (torch_ops_transformer/compat)."""
import sys

from torch_ops_transformer import compat

# install() leaves the real torch_npu or the filled shim in sys.modules["torch_npu"]; the import statement that
# ran this file returns that entry.
compat.install(placeholder=sys.modules[__name__])
