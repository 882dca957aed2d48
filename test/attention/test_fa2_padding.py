"""flash_attn.bert_padding's helpers (torch_ops_transformer.compat.bert_padding): unpad/pad round trips, the 2.6+ results
(seqused, unused_mask), concatenated samples, gradients, and the padded-batch pattern they serve: unpad q/k/v,
flash_attn_varlen_func, pad the output — against the float64 reference per sequence."""
import torch

import torch_ops_transformer as tot
from test.attention.fa2_reference import attend
from torch_ops_transformer.compat.bert_padding import (index_first_axis, index_put_first_axis, pad_input, unpad_input,
                                               unpad_input_for_concatenated_sequences)


def _mask(lengths, s):
    return (torch.arange(s).view(1, -1) < torch.tensor(lengths).view(-1, 1)).to(torch.int32)


def test_unpad_pad_round_trip():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(3, 5, 2, 4, generator=gen)
    mask = _mask([2, 5, 0], 5)
    packed, indices, cu, max_len, used = unpad_input(x, mask)
    assert packed.shape == (7, 2, 4) and indices.dtype == torch.int64
    assert cu.dtype == torch.int32 and cu.tolist() == [0, 2, 7, 7]
    assert max_len == 5 and isinstance(max_len, int) and used.tolist() == [2, 5, 0]
    assert torch.equal(packed, x.reshape(15, 2, 4)[mask.flatten().bool()])
    back = pad_input(packed, indices, 3, 5)
    assert torch.equal(back, x * mask.view(3, 5, 1, 1))


def test_unused_mask_is_packed_but_not_used():
    x = torch.arange(2 * 4, dtype=torch.float32).view(2, 4, 1)
    mask = _mask([2, 1], 4)
    unused = torch.tensor([[0, 0, 1, 0], [0, 1, 1, 0]], dtype=torch.int32)
    packed, _, cu, max_len, used = unpad_input(x, mask, unused)
    assert cu.tolist() == [0, 3, 6] and max_len == 3 and used.tolist() == [2, 1]
    assert packed.flatten().tolist() == [0, 1, 2, 4, 5, 6]


def test_concatenated_sequences():
    lengths = torch.tensor([[2, 3, 0, 0, 0, 0], [3, 2, 0, 0, 0, 0], [6, 0, 0, 0, 0, 0]])
    x = torch.arange(18, dtype=torch.float32).view(3, 6, 1)
    packed, indices, cu, max_len = unpad_input_for_concatenated_sequences(x, lengths)
    assert cu.tolist() == [0, 2, 5, 8, 10, 16] and max_len == 6
    assert indices.tolist() == [0, 1, 2, 3, 4, 6, 7, 8, 9, 10, 12, 13, 14, 15, 16, 17]
    assert torch.equal(packed.flatten(), x.flatten()[indices])


def test_gradients_flow_through_the_helpers():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(6, 3, generator=gen, dtype=torch.float64, requires_grad=True)
    idx = torch.tensor([4, 0, 2])
    assert torch.autograd.gradcheck(lambda t: index_first_axis(t, idx), (x,))
    v = torch.randn(3, 3, generator=gen, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: index_put_first_axis(t, idx, 6), (v,))


def test_padded_batch_through_varlen():
    gen = torch.Generator().manual_seed(0)
    b, s, n, n2, d = 3, 6, 4, 2, 8
    lengths = [6, 2, 4]
    q = torch.randn(b, s, n, d, generator=gen)
    k = torch.randn(b, s, n2, d, generator=gen)
    v = torch.randn(b, s, n2, d, generator=gen)
    mask = _mask(lengths, s)
    q_p, indices, cu, max_len, _ = unpad_input(q, mask)
    k_p, _, _, _, _ = unpad_input(k, mask)
    v_p, _, _, _, _ = unpad_input(v, mask)
    out = pad_input(tot.flash_attn_varlen_func(q_p, k_p, v_p, cu, cu, max_len, max_len, causal=True), indices, b, s)
    for i, n_i in enumerate(lengths):
        ref, _ = attend(q[i, :n_i].double(), k[i, :n_i].double(), v[i, :n_i].double(), d ** -0.5, causal=True)
        torch.testing.assert_close(out[i, :n_i].double(), ref, atol=1e-5, rtol=1e-5)
        assert not out[i, n_i:].any()
