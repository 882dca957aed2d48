"""Integrations: the SDPA override, torch.compile and its Inductor lowering, the Hugging Face drop-in, the demo
command, the torch_npu / flash-attn style wrappers."""
