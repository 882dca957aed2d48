"""Private helpers shared by the families and the role packages (no public API; no imports of other subpackages):

- `args` — argument conversion and checks, the exception policy, the torch_npu API registry;
- `layout` — attention layouts (BSH, SBH, BSND, BNSD, TND) and their dimensions;
- `optional` — optional dependencies: one-line errors and the CLI wrapper;
- `spawn` — child processes and free ports for the multi-process tools;
- `real_torch_npu` — is a real torch_npu here? (it always wins over the shim and the simulated device);
- `version` — the package version;
- `aliases` — the old dotted module paths, kept importable with a DeprecationWarning.
"""
