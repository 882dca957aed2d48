"""Training FlashAttention (flash_attention_score and its grad): layout / mask / dropout grid against the float64
reference, gradcheck, argument validation, the reference itself. Case builders: attention_cases.py."""
