"""The compiled library and its generated Python wiring: `loader` loads _C once and registers the fake kernels and
autograd formulas of `generated.registrations` (written by `python -m tools.codegen` from native_functions.yaml)."""
