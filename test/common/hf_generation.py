"""transformers' own greedy generation and teacher-forced logits, the reference of the tests that run a Hugging Face
model's attention on our ops (test/integrations/test_hf_deepseek_mla.py, test_hf_deepseek_v32.py)."""
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
