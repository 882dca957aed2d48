"""Benchmarks: `python -m torch_ops_transformer.bench <table>`; every number is a ratio measured in one process."""
