"""Code generator: native_functions.yaml -> C++ dispatcher registrations and Python fake/autograd wiring.

Entry points: `python -m tools.codegen` (write), `python -m tools.codegen --check` (fail if stale).
setup.py calls `generate()` before compiling, so a build always uses fresh output.
"""
from .main import generate, render_all  # noqa: F401
