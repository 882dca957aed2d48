"""`PagedModelRunner`: the generation and training loop shared by the runners that put a transformers causal LM on this
package's ops (mla.PagedMLARunner, mla.sparse_attention_runner.PagedDSARunner,
linear_attention.qwen3_next.Qwen3NextRunner).

A subclass swaps the model's token mixers (attention, linear attention) for adapters that read the current step from
the runner (`runner.batch`, `runner.packed`, `runner.cache`) and builds `self.cache`, an object with
`add_sequence() -> seq_id`, `free(seq_id)`, `seq_lens(seq_ids) -> int64 [B]` and `prepare(seq_ids, q_lens) -> batch`
(the step's slots and lengths; the batch has `q_lens`). Each step calls the base model with use_cache=False (the
caches are the runner's), positions restarting at 0 per sequence, so `output_hidden_states=True` works as for
transformers' own forward (`last_outputs`).
"""
from typing import List, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn


def _token_lists(owner: str, name: str, seqs) -> List[List[int]]:
    out = [[int(t) for t in (s.tolist() if isinstance(s, Tensor) else s)] for s in seqs]
    if not out or any(len(s) == 0 for s in out):
        raise ValueError(f"{owner}: argument '{name}' must be a non-empty list of non-empty token lists")
    return out


class PagedModelRunner:
    """Ragged prefill (one packed TND step), batched decode (BSND, one token per sequence), greedy `generate`, and a
    packed differentiable `train_forward` / `lm_loss` for subclasses that define `_train_batch`."""

    _MODEL_EXAMPLE = "a transformers causal LM"

    def __init__(self, model: nn.Module):
        layers = getattr(getattr(model, "model", None), "layers", None)
        if layers is None or not hasattr(model, "lm_head"):
            raise TypeError(f"{type(self).__name__}: argument 'model' must be a transformers causal LM with "
                            f"model.layers and lm_head (e.g. {self._MODEL_EXAMPLE}); got {type(model).__name__}")
        self.model = model
        self.device = next(model.parameters()).device
        self.batch = None
        self.packed = False
        self.last_outputs = None

    def _run(self, ids: Tensor, positions: Tensor, batch, packed: bool, **kwargs) -> Tensor:
        self.batch, self.packed = batch, packed
        try:
            out = self.model.model(input_ids=ids, position_ids=positions, use_cache=False, **kwargs)
        finally:
            self.batch = None
        self.last_outputs = out
        return out.last_hidden_state

    def _packed_ids(self, seqs: List[List[int]]) -> Tuple[Tensor, Tensor]:
        """input_ids [1, T] of the sequences one after another and their positions (restarting at 0 per sequence)."""
        ids = torch.tensor([t for s in seqs for t in s], device=self.device).unsqueeze(0)
        pos = torch.cat([torch.arange(len(s)) for s in seqs]).to(self.device).unsqueeze(0)
        return ids, pos

    @torch.no_grad()
    def prefill(self, prompts: Sequence[Sequence[int]], **kwargs) -> Tuple[List[int], Tensor]:
        """New sequences for `prompts` (lists of token ids, any lengths >= 1), run as one packed TND step; returns
        (seq_ids, logits of each prompt's last token [B, vocab])."""
        prompts = _token_lists(f"{type(self).__name__}.prefill", "prompts", prompts)
        seq_ids = [self.cache.add_sequence() for _ in prompts]
        try:
            batch = self.cache.prepare(seq_ids, [len(p) for p in prompts])
        except Exception:
            for s in seq_ids:
                self.cache.free(s)
            raise
        ids, pos = self._packed_ids(prompts)
        h = self._run(ids, pos, batch, packed=True, **kwargs)[0]
        last = torch.tensor(batch.q_lens).cumsum(0) - 1
        return seq_ids, self.model.lm_head(h[last.to(self.device)])

    @torch.no_grad()
    def decode(self, seq_ids: Sequence[int], tokens: Sequence[int], **kwargs) -> Tensor:
        """One new token per sequence (BSND, S = 1); returns their logits [B, vocab]."""
        seq_ids = list(seq_ids)
        pos = self.cache.seq_lens(seq_ids).to(self.device).unsqueeze(1)  # the new token's position = tokens so far
        batch = self.cache.prepare(seq_ids, [1] * len(seq_ids))
        ids = torch.as_tensor(list(tokens), device=self.device).reshape(-1, 1)
        h = self._run(ids, pos, batch, packed=False, **kwargs)
        return self.model.lm_head(h[:, -1])

    def free(self, seq_ids: Sequence[int]) -> None:
        for s in seq_ids:
            self.cache.free(s)

    @torch.no_grad()
    def generate(self, prompts: Sequence[Sequence[int]], max_new_tokens: int) -> List[List[int]]:
        """Greedy generation of exactly `max_new_tokens` tokens per prompt (no stopping criterion); returns the new
        tokens of each prompt. The sequences' cache entries are freed at the end."""
        seq_ids, logits = self.prefill(prompts)
        out: List[List[int]] = [[] for _ in prompts]
        try:
            for step in range(max_new_tokens):
                nxt = logits.argmax(-1).tolist()
                for b, t in enumerate(nxt):
                    out[b].append(t)
                if step + 1 < max_new_tokens:
                    logits = self.decode(seq_ids, nxt)
        finally:
            self.free(seq_ids)
        return out

    # ---- training: a packed batch without a cache ---------------------------------------------------------------

    def _train_batch(self, cu_seqlens: List[int]):
        """The batch object the adapters read in a training step (cumulative sequence ends)."""
        raise NotImplementedError(f"{type(self).__name__} has no training step (train_forward / lm_loss)")

    def train_forward(self, sequences: Sequence[Sequence[int]], **kwargs) -> Tensor:
        """Logits [T, vocab] of a packed batch of token lists (T = their total length; each sequence attends to
        itself only, positions restart per sequence), differentiable."""
        seqs = _token_lists(type(self).__name__, "sequences", sequences)
        ids, pos = self._packed_ids(seqs)
        cu = torch.tensor([len(s) for s in seqs]).cumsum(0).tolist()
        h = self._run(ids, pos, self._train_batch(cu), packed=True, **kwargs)[0]
        return self.model.lm_head(h)

    def lm_loss(self, sequences: Sequence[Sequence[int]]) -> Tensor:
        """Sum over the sequences of the mean cross entropy of each token's logits against the next token (what
        transformers' `model(ids, labels=ids).loss` is for one sequence)."""
        seqs = [list(s) for s in sequences]
        if any(len(s) < 2 for s in seqs):
            raise ValueError(f"{type(self).__name__}.lm_loss: every sequence needs at least 2 tokens; got lengths "
                             f"{[len(s) for s in seqs]}")
        logits = self.train_forward(seqs)
        loss, start = logits.new_zeros(()), 0
        for s in seqs:
            target = torch.tensor(s[1:], device=logits.device)
            loss = loss + F.cross_entropy(logits[start:start + len(s) - 1].float(), target)
            start += len(s)
        return loss
