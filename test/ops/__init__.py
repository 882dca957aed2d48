"""Suites over every op: torch.library.opcheck with the cases of each family's *_cases.py module."""
