"""The package version (one place; the root package, the tuning cache key and the torch_npu shim read it)."""
__version__ = "0.1.0"
