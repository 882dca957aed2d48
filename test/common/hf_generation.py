"""transformers' own greedy generation and teacher-forced logits, the reference of the tests that run a Hugging Face
model's token mixers on our ops (test/integrations/test_hf_deepseek_mla.py, _deepseek_v32.py, _qwen3_next.py)."""
import torch


def hf_run(model, prompt, new_tokens):
    """transformers alone on one prompt: (new tokens, per-step logits [new_tokens, V], prefill hidden states)."""
    with torch.no_grad():
        ids = torch.tensor([prompt])
        hidden = model(ids, output_hidden_states=True).hidden_states
        out = model.generate(ids, do_sample=False, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                             pad_token_id=0, output_logits=True, return_dict_in_generate=True)
    return out.sequences[0, len(prompt):].tolist(), torch.cat(out.logits), [h[0] for h in hidden]


def hf_forced(model, prompt, tokens):
    """transformers' logits of each generation step when `tokens` are the generated ones (teacher forcing: a causal
    model's, and a causal indexer's, view of a position does not depend on later tokens), and its prefill hidden
    states."""
    with torch.no_grad():
        ids = torch.tensor([prompt + tokens[:-1]])
        out = model(ids, output_hidden_states=True)
    n = len(prompt)
    return out.logits[0, n - 1:], [h[0, :n] for h in out.hidden_states]


def runner_steps(runner, prompts, new_tokens):
    """Greedy prefill / decode through one of our paged runners (kv_cache.runner.PagedModelRunner): (tokens,
    per-step logits [new_tokens, V] per prompt, prefill hidden states packed [1, T, H] per layer). The sequences are
    freed."""
    seq_ids, logits = runner.prefill(prompts, output_hidden_states=True)
    hidden = runner.last_outputs.hidden_states
    tokens, step_logits = [[] for _ in prompts], [[] for _ in prompts]
    for step in range(new_tokens):
        nxt = logits.argmax(-1).tolist()
        for b, t in enumerate(nxt):
            tokens[b].append(t)
            step_logits[b].append(logits[b])
        if step + 1 < new_tokens:
            logits = runner.decode(seq_ids, nxt)
    runner.free(seq_ids)
    return tokens, [torch.stack(s) for s in step_logits], hidden
