"""`import cann_ops_transformer` through PYTHONPATH=$(python -m torch_ops_transformer.compat --pythonpath): the real
cann_ops_transformer when it imports, otherwise torch_ops_transformer's stand-in
(torch_ops_transformer/compat/cann_ops_transformer)."""
import sys

from torch_ops_transformer.compat import cann_ops_transformer as _stand_in

# install() leaves the real package or the filled stand-in in sys.modules["cann_ops_transformer"]; the import
# statement that ran this file returns that entry.
_stand_in.install(placeholder=sys.modules[__name__])
