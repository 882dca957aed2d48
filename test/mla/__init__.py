"""The MLA latent path: mla_prolog and the MLAAttention building block."""
