"""Ported: op-plugin test/test_base_ops/test_prompt_flash_attention.py and
test/test_custom_ops/test_prompt_flash_attention.py (torch_npu.npu_prompt_flash_attention).

Upstream cases:
- test_base_ops TestPromptFlashAttetion.test_op_exec: BNSD fp16 [1, 32, 2048, 128], scale_value = 1/0.0078125,
  pre_tokens = next_tokens = 65535, sparse_mode 0; golden softmax(q·kᵀ/0.0078125)·v, assertRtolEqual.
  -> ported (test_base_ops_op_exec).
- test_custom_ops TestPromptFlashAttention.test_npu_prompt_flash_attention: the same call with scale 1/sqrt(128).
  -> ported (test_custom_ops_npu_prompt_flash_attention).
Both are ported with S = 256 instead of 2048 (the plain-PyTorch fp16 golden alone takes minutes on a CPU at 2048; the
kernel tiles the same way at 256). The golden's math is upstream's (scores, clamp at the dtype's minimum, softmax
in fp32, cast to the query's dtype, times V). Upstream evaluates it in fp16; with scale 128 the fp16 scores (|s| ~
10³, ulp 2-4) reorder near-tied keys of ~1% of the rows, which an fp32-accumulating kernel cannot match within
assertRtolEqual's 0.1% budget, so assertRtolEqual compares against the same formula evaluated in fp32 and cast to
fp16, and the fp16 evaluation serves as torch_same_dtype in the project's float64 rule.

Not in upstream's files (the torch_npu behaviour this port relies on): sequence lengths as a python list, a CPU
tensor or a tensor on the inputs' device (and npu lengths next to CPU inputs), a longer length list cut to B, the
quantisation arguments (quant_scale2 / quant_offset2: int8 output against upstream's formula on the float64
attention; deq_scale1 / quant_scale1 / deq_scale2 with a float query and quant_offset2 without quant_scale2 ->
ValueError naming them; full quantisation itself: test/inference/test_quant_attention.py), and the reserved
padding_mask.
"""
import math

import pytest
import torch

from test.common.reference import check_tolerance
from test.torch_npu.common import DEVICE, on_cpu, to_device, torch_npu
from test.torch_npu.rtol import assert_rtol_equal
from test.torch_npu.test_npu_fused_infer_attention_score import check_int8_output


def _golden(q, k, v, scale, dtype=None):
    """Upstream's golden for BNSD (no mask), evaluated in `dtype` (default: the inputs')."""
    dtype = dtype or q.dtype
    q, k, v = (t.to(dtype) for t in (q, k, v))
    scores = torch.matmul(q, k.transpose(2, 3)) * scale
    scores = torch.max(scores, torch.full((1, 1), torch.finfo(dtype).min, dtype=dtype))
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(dtype)
    return torch.matmul(probs, v)


def _check(out, q, k, v, scale):
    out = on_cpu(out)
    assert out.shape == q.shape and out.dtype == q.dtype
    assert_rtol_equal(_golden(q, k, v, scale, torch.float32).to(q.dtype), out)
    check_tolerance("npu_prompt_flash_attention", out, _golden(q, k, v, scale, torch.float64), _golden(q, k, v, scale))


def _qkv(shape=(1, 32, 256, 128), dtype=torch.float16, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(shape, generator=g).to(dtype) for _ in range(3)]


def test_base_ops_op_exec():
    q, k, v = _qkv()
    out = torch_npu.npu_prompt_flash_attention(*to_device(q, k, v), num_heads=32, input_layout="BNSD",
                                               scale_value=1 / 0.0078125, pre_tokens=65535, next_tokens=65535,
                                               sparse_mode=0)
    _check(out, q, k, v, 1 / 0.0078125)


def test_custom_ops_npu_prompt_flash_attention():
    q, k, v = _qkv(seed=1)
    scale = 1.0 / math.sqrt(128)
    out = torch_npu.npu_prompt_flash_attention(*to_device(q, k, v), num_heads=32, input_layout="BNSD",
                                               scale_value=scale, pre_tokens=65535, next_tokens=65535)
    _check(out, q, k, v, scale)


# ---- beyond upstream's files: length forms and documented errors ----------------------------------------------

def _padded_reference(q, k, v, scale, q_lens, kv_lens):
    """BNSD attention per sequence on its first q_lens[b] queries / kv_lens[b] keys; padded rows are zeros."""
    out = torch.zeros(q.shape[:3] + (v.shape[-1],), dtype=torch.float64)
    for b, (lq, lk) in enumerate(zip(q_lens, kv_lens)):
        if lq and lk:
            s = q[b, :, :lq].double() @ k[b, :, :lk].double().transpose(1, 2) * scale
            out[b, :, :lq] = torch.softmax(s, -1) @ v[b, :, :lk].double()
    return out


LENGTH_FORMS = {
    "list": lambda x: list(x),
    "cpu_int64": lambda x: torch.tensor(x, dtype=torch.int64),
    "cpu_int32": lambda x: torch.tensor(x, dtype=torch.int32),
    "device": lambda x: to_device(torch.tensor(x, dtype=torch.int64)),
}


@pytest.mark.parametrize("form", list(LENGTH_FORMS))
def test_sequence_lengths_as_list_cpu_or_device_tensor(form):
    q, k, v = _qkv((3, 2, 12, 16), torch.float32, seed=2)
    q_lens, kv_lens = [5, 12, 1], [7, 3, 12]
    make = LENGTH_FORMS[form]
    out = torch_npu.npu_prompt_flash_attention(*to_device(q, k, v), num_heads=2, input_layout="BNSD",
                                               scale_value=0.25, actual_seq_lengths=make(q_lens),
                                               actual_seq_lengths_kv=make(kv_lens))
    assert out.device.type == DEVICE
    ref = _padded_reference(q, k, v, 0.25, q_lens, kv_lens)
    torch.testing.assert_close(on_cpu(out).double(), ref, atol=1e-5, rtol=1e-5)


def test_longer_length_list_is_cut_to_the_batch():
    # Upstream: "length >= batch: the first batch entries are used".
    q, k, v = _qkv((2, 2, 8, 16), torch.float32, seed=3)
    args = dict(num_heads=2, input_layout="BNSD", scale_value=0.25)
    long = torch_npu.npu_prompt_flash_attention(*to_device(q, k, v), actual_seq_lengths=[4, 8, 1, 2],
                                                actual_seq_lengths_kv=[6, 8, 8], **args)
    exact = torch_npu.npu_prompt_flash_attention(*to_device(q, k, v), actual_seq_lengths=[4, 8],
                                                 actual_seq_lengths_kv=[6, 8], **args)
    assert torch.equal(on_cpu(long), on_cpu(exact))


@pytest.mark.skipif(DEVICE != "npu", reason="npu length tensors next to CPU inputs need the npu device")
def test_npu_lengths_with_cpu_inputs():
    q, k, v = _qkv((2, 2, 8, 16), torch.float32, seed=4)
    lens = to_device(torch.tensor([3, 8]))
    out = torch_npu.npu_prompt_flash_attention(q, k, v, num_heads=2, input_layout="BNSD", scale_value=0.25,
                                               actual_seq_lengths=lens, actual_seq_lengths_kv=lens)
    assert out.device.type == "cpu"
    torch.testing.assert_close(out.double(), _padded_reference(q, k, v, 0.25, [3, 8], [3, 8]), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", ["deq_scale1", "quant_scale1", "deq_scale2", "quant_scale2", "quant_offset2"])
def test_quantisation_arguments(name):
    q, k, v = _qkv((1, 2, 4, 16), torch.float16)
    call = lambda **kw: torch_npu.npu_prompt_flash_attention(*to_device(q, k, v), num_heads=2,  # noqa: E731
                                                             input_layout="BNSD", scale_value=0.25, **kw)
    if name == "quant_scale2":
        # int8 output, per-tensor with an offset: saturate(round(y · scale + offset)), y the float64 attention
        scale, offset = torch.tensor([90.0]), torch.tensor([-3.0])
        ref64 = _padded_reference(q, k, v, 0.25, [4], [4])
        float_err = float((on_cpu(call()).double() - ref64).abs().max())
        check_int8_output(call(quant_scale2=to_device(scale), quant_offset2=to_device(offset)), ref64, scale,
                          offset, float_err)
        return
    # an offset needs its scale; the full-quantisation factors need an int8 query, key and value
    with pytest.raises(ValueError, match=f"'{name}'"):
        call(**{name: to_device(torch.ones(1))})


def test_reserved_padding_mask_and_bad_values_raise_argument_errors():
    q, k, v = to_device(*_qkv((1, 2, 4, 16), torch.float16))
    with pytest.raises(RuntimeError, match="padding_mask"):   # torch_npu's exception type
        torch_npu.npu_prompt_flash_attention(q, k, v, padding_mask=q, num_heads=2, input_layout="BNSD")
    with pytest.raises(ValueError, match="input_layout"):     # this project's
        torch_npu.npu_prompt_flash_attention(q, k, v, num_heads=2, input_layout="SBH")
    with pytest.raises(ValueError, match="actual_seq_lengths"):
        torch_npu.npu_prompt_flash_attention(q, k, v, num_heads=2, input_layout="BNSD", actual_seq_lengths=[5])
