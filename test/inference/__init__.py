"""Inference attention: prefill (prompt_flash_attention, fused_infer_attention_score, attention_update), decode
(incre_flash_attention) and a decode loop. Case builders: prefill_cases.py, decode_cases.py."""
