"""Fake (meta) kernels of the sampling ops: contiguous outputs like the C++ kernels, plus the shape checks that need
no data (so a bad call fails at trace time, as it does in eager mode)."""
import torch


def top_k_top_p(a):
    op = "top_k_top_p"
    torch._check(a.logits.dim() == 2,
                 lambda: f"{op}: argument 'logits' must be 2-D [batch, vocab]; got shape {tuple(a.logits.shape)}")
    for name, t in (("p", a.p), ("k", a.k)):
        if t is not None:
            torch._check(t.dim() == 1 and t.shape[0] == a.logits.shape[0],
                         lambda: f"{op}: argument '{name}' must be 1-D [batch] (one per row of logits); got shape "
                                 f"{tuple(t.shape)}")
    return a.logits.new_empty(a.logits.shape)
