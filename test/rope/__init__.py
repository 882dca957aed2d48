"""Rotary position embedding ops and wrappers. Case builders: rope_cases.py."""
