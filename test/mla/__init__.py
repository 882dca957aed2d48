"""Paged KV cache helpers. Case builders: kv_cache_cases.py."""
