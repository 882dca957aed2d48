"""Shared by every family: the float64 references and the tolerance rule (reference.py), the MoE references
(moe_reference.py), and the checkout's root for child processes (checkout.py)."""
