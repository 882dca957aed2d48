"""MoE: gating and routing ops, grouped_matmul, MOELayer (incl. expert parallel). Case builders: routing_cases.py,
grouped_matmul_cases.py; references in test/common/moe_reference.py."""
