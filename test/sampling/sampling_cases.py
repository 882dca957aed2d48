"""opcheck cases of the sampling ops."""
import torch


def _top_k_top_p(dtype=torch.float32, with_p=True, with_k=True):
    def make():
        logits = torch.randn(3, 40).to(dtype)
        p = torch.tensor([0.9, 0.5, 0.0]).to(dtype) if with_p else None
        k = torch.tensor([5, 40, 1], dtype=torch.int32) if with_k else None
        return (logits, p, k), {}
    return make


OPCHECK_CASES = {
    "top_k_top_p": {
        "k_and_p": _top_k_top_p(),
        "k_only_bf16": _top_k_top_p(torch.bfloat16, with_p=False),
        "p_only": _top_k_top_p(with_k=False),
    },
}
