"""Property-based tests (hypothesis): random valid shapes, layouts, lengths, masks, block tables and routings of
every family against the float64 references of test.common and the family folders, round trips of the routing and
paged-cache ops, and adversarial index arguments. Strategies and the example budget: strategies.py."""
