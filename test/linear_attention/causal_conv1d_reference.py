"""Plain-PyTorch references of the causal conv1d ops, token by token, in the dtype of their inputs (float64 inputs
give the float64 reference, half-precision inputs the "torch in the same dtype" result of the tolerance rule).

The fused op, per sequence: the padded sequence is the cached rows of its line followed by its tokens; token t reads
padded rows offset+t .. offset+t+K-1; the line keeps the last state_len padded rows. Written from the operator's
documented formulas, independently of the kernels."""
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor


def _ints(t: Optional[Tensor]):
    return None if t is None else [int(v) for v in t.reshape(-1).tolist()]


def _sequences(x: Tensor, query_start_loc: Optional[Tensor]):
    """(start, length) of every sequence, and x as [tokens, dim]."""
    if x.dim() == 3:
        b, L, d = x.shape
        return [(i * L, L) for i in range(b)], x.reshape(b * L, d)
    q = _ints(query_start_loc)
    return [(q[i], q[i + 1] - q[i]) for i in range(len(q) - 1)], x


def _completed_block_starts(computed: int, length: int, block: int, n_fill: int):
    """Positions (in the sequence after its offset) of the K-1 rows that end each block this call completes."""
    to_boundary = block - computed % block
    tail = (length - to_boundary) % block
    last_full = length - tail - (block if tail == 0 else 0)
    return [last_full - (n_fill - c - 1) * block for c in range(n_fill)]


def fused_causal_conv1d(x: Tensor, weight: Tensor, conv_states: Tensor, *, query_start_loc=None, cache_indices=None,
                        initial_state_mode=None, bias=None, num_accepted_tokens=None, activation="None",
                        pad_slot_id=-1, residual_connection=0, num_computed_tokens=None,
                        block_idx_first_scheduled_token=None, block_idx_last_scheduled_token=None,
                        initial_state_idx=None, block_size=128, conv_mode="default", untouched=0.0):
    """(y, new conv_states): y of x's shape (rows no sequence computes hold `untouched`, or x's value when
    untouched is None), conv_states a new tensor."""
    seqs, x2 = _sequences(x, query_start_loc)
    states = conv_states.clone()
    K, C = weight.shape[0], conv_states.shape[1]
    y = x2.clone() if untouched is None else torch.full_like(x2, untouched)
    ci = cache_indices
    apc = ci is not None and ci.dim() == 2
    accepted, computed = _ints(num_accepted_tokens), _ints(num_computed_tokens)
    has_state = _ints(initial_state_mode)
    for b, (start, length) in enumerate(seqs):
        if apc:
            read = int(ci[b, int(initial_state_idx[b])])
            write = int(ci[b, int(block_idx_last_scheduled_token[b])])
        else:
            read = write = b if ci is None else int(ci[b])
        if read == pad_slot_id:
            continue
        tokens = x2[start:start + length]
        if (computed is not None and computed[b] == 0) or (has_state is not None and has_state[b] == 0):
            offset, prefix = 0, torch.zeros(K - 1, x.shape[-1], dtype=x.dtype)
        else:
            offset = C - (K - 1) if accepted is None else accepted[b] - 1
            prefix = states[read, :offset + K - 1].clone()
        padded = torch.cat([prefix, tokens], 0)
        kept = min(C, padded.shape[0])
        states[write, C - kept:] = padded[padded.shape[0] - kept:]
        if apc:
            first = int(block_idx_first_scheduled_token[b])
            n_fill = int(block_idx_last_scheduled_token[b]) - first
            for c, at in enumerate(_completed_block_starts(computed[b], length, block_size, n_fill)):
                states[int(ci[b, first + c]), C - (K - 1):] = padded[offset + at:offset + at + K - 1]
        reset = min(max(K - 1 - computed[b], 0), length) if conv_mode == "pangu" else 0
        for t in range(length):
            acc = weight[0] * padded[offset + t]
            for k in range(1, K):
                acc = acc + weight[k] * padded[offset + t + k]
            if bias is not None:
                acc = acc + bias
            if activation in ("silu", "swish"):
                acc = F.silu(acc)
            if t < reset:
                acc = torch.zeros_like(acc)
            if residual_connection:
                acc = acc + tokens[t]
            y[start + t] = acc
    return y.reshape(x.shape), states


def masked_causal_conv1d(input: Tensor, weight: Tensor, mask: Optional[Tensor] = None) -> Tensor:
    """out[s] = sum_k weight[k] * input[s-(W-1-k)] (zero before the start), zeroed where mask [B, S] is False."""
    S, W = input.shape[0], weight.shape[0]
    rows = []
    for s in range(S):
        acc = torch.zeros_like(input[0])
        for k in range(W):
            src = s - (W - 1 - k)
            if src >= 0:
                acc = acc + weight[k] * input[src]
        if mask is not None:
            acc = acc * mask[:, s, None].to(acc.dtype)
        rows.append(acc)
    return torch.stack(rows) if rows else input.clone()


def masked_causal_conv1d_backward(grad_output: Tensor, input: Tensor, weight: Tensor, mask: Optional[Tensor] = None):
    """(grad_input, grad_weight) by autograd through the float64 reference."""
    inp = input.detach().double().requires_grad_()
    w = weight.detach().double().requires_grad_()
    out = masked_causal_conv1d(inp, w, mask)
    gi, gw = torch.autograd.grad(out, (inp, w), grad_output.double(), allow_unused=True)
    return (torch.zeros_like(inp) if gi is None else gi), (torch.zeros_like(w) if gw is None else gw)
