"""Linear attention (Gated DeltaNet): chunk_gated_delta_rule and its backward against the token-by-token recurrence"""
