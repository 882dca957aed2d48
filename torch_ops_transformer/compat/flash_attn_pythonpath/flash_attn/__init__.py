"""`import flash_attn` through PYTHONPATH=$(python -m torch_ops_transformer.compat.flash_attn --pythonpath): the real
flash_attn when it is installed and imports, otherwise torch_ops_transformer's CPU shim
(torch_ops_transformer/compat/flash_attn.py)."""
import sys

from torch_ops_transformer.compat import flash_attn as _shim

# install() leaves the real flash_attn or the filled shim in sys.modules["flash_attn"]; the import statement that ran
# this file returns that entry.
_shim.install(placeholder=sys.modules[__name__])
