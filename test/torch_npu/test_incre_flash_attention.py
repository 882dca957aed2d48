"""Ported: op-plugin test/test_base_ops/test_incre_flash_attention.py and
test/test_custom_ops/test_incre_flash_attention.py (torch_npu.npu_incre_flash_attention).

Upstream cases:
- test_base_ops TestIncreFlashAttention.test_op_exec: q BNSD fp16 [1, 32, 1, 128], k/v [1, 32, 2048, 128], all
  turned into BSH ([1, 1, 4096] and [1, 2048, 4096]); num_heads 32, scale 1/sqrt(128); golden
  softmax(q·kᵀ·scale)·v in BNSD reshaped to [1, 1, 4096], assertRtolEqual. -> ported (test_base_ops_op_exec).
- test_custom_ops TestIncreFlashAttention.test_npu_incre_flash_attention: the same call and golden.
  -> ported (test_custom_ops_npu_incre_flash_attention).
Ported at upstream's shapes and dtype; the golden's math is upstream's (scores, clamp at the dtype's minimum,
softmax in fp32, cast to fp16, times V), compared with assertRtolEqual's rule, and the project's float64 rule.

Not in upstream's files (torch_npu behaviour this port relies on): actual_seq_lengths as a python list, a CPU tensor
or a tensor on the inputs' device, for a contiguous and a paged cache; kv_padding_size as an int, a CPU tensor or a
device tensor; npu lengths next to CPU inputs; the quantisation arguments: quant_scale2 / quant_offset2 (int8
output) against upstream's formula on the float64 attention, quant_offset2 without quant_scale2 and the
full-quantisation factors (dequant_scale1 / quant_scale1 / dequant_scale2: an int8 query, which upstream's
incre_flash_attention does not take) -> ValueError naming them.
"""
import math

import pytest
import torch

from test.common.reference import check_tolerance
from test.torch_npu.common import DEVICE, on_cpu, to_device, torch_npu
from test.torch_npu.rtol import assert_rtol_equal
from test.torch_npu.test_npu_fused_infer_attention_score import check_int8_output


def _bnsd_to_bsh(t):
    return t.transpose(1, 2).reshape(t.shape[0], t.shape[2], -1)


def _golden(q, k, v, head_dim, hidden, dtype=None):
    """Upstream's golden on BNSD inputs, output [1, 1, hidden], evaluated in `dtype` (default: the inputs')."""
    dtype = dtype or q.dtype
    q, k, v = (t.to(dtype) for t in (q, k, v))
    scores = torch.matmul(q, k.transpose(2, 3)) * (1.0 / math.sqrt(head_dim))
    scores = torch.max(scores, torch.full((1, 1), torch.finfo(dtype).min, dtype=dtype))
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(dtype)
    return torch.matmul(probs, v).transpose(1, 2).reshape(1, 1, hidden)


def _run_upstream_case(seed):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(1, 32, 1, 128, generator=g).half()
    k = torch.randn(1, 32, 2048, 128, generator=g).half()
    v = torch.randn(1, 32, 2048, 128, generator=g).half()
    out = torch_npu.npu_incre_flash_attention(*to_device(_bnsd_to_bsh(q), _bnsd_to_bsh(k), _bnsd_to_bsh(v)),
                                              num_heads=32, input_layout="BSH", scale_value=1.0 / math.sqrt(128))
    out = on_cpu(out)
    assert out.shape == (1, 1, 4096) and out.dtype == torch.float16
    assert_rtol_equal(_golden(q, k, v, 128, 4096), out)
    check_tolerance("npu_incre_flash_attention", out, _golden(q, k, v, 128, 4096, torch.float64),
                    _golden(q, k, v, 128, 4096))


def test_base_ops_op_exec():
    _run_upstream_case(seed=0)


def test_custom_ops_npu_incre_flash_attention():
    _run_upstream_case(seed=1)


# ---- beyond upstream's files: length forms, padding, errors ---------------------------------------------------

LENGTH_FORMS = {
    "list": lambda x: list(x),
    "cpu_int64": lambda x: torch.tensor(x, dtype=torch.int64),
    "cpu_int32": lambda x: torch.tensor(x, dtype=torch.int32),
    "device": lambda x: to_device(torch.tensor(x, dtype=torch.int64)),
}


def _decode_reference(q, k, v, scale, starts, lens):
    """BNSD decode: query b attends to cache positions [starts[b], starts[b] + lens[b]); float64."""
    out = torch.zeros(q.shape[:3] + (v.shape[-1],), dtype=torch.float64)
    for b, (s0, n) in enumerate(zip(starts, lens)):
        if n:
            s = q[b].double() @ k[b, :, s0:s0 + n].double().transpose(1, 2) * scale
            out[b] = torch.softmax(s, -1) @ v[b, :, s0:s0 + n].double()
    return out


def _inputs(seed=0, B=3, N=2, S=40, D=16):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(B, N, 1, D, generator=g), torch.randn(B, N, S, D, generator=g),
            torch.randn(B, N, S, D, generator=g))


@pytest.mark.parametrize("form", list(LENGTH_FORMS))
def test_lengths_forms_contiguous_cache(form):
    q, k, v = _inputs()
    lens = [7, 40, 0]
    out = torch_npu.npu_incre_flash_attention(*to_device(q, k, v), actual_seq_lengths=LENGTH_FORMS[form](lens),
                                              num_heads=2, input_layout="BNSD", scale_value=0.3)
    assert out.device.type == DEVICE
    torch.testing.assert_close(on_cpu(out).double(), _decode_reference(q, k, v, 0.3, [0, 0, 0], lens),
                               atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("form", list(LENGTH_FORMS))
def test_lengths_forms_paged_cache(form):
    q, k, v = _inputs(seed=1, S=48)
    bs, lens = 16, [20, 48, 1]
    # Sequence b's blocks are the physical blocks perm[3b:3b+3] of a (9, 16, N*D) cache.
    perm = torch.randperm(9, generator=torch.Generator().manual_seed(2))
    table = perm.view(3, 3).to(torch.int32)
    kc, vc = (torch.zeros(9, bs, 2 * 16) for _ in range(2))
    for b in range(3):
        for j in range(3):
            kc[perm[3 * b + j]] = _bnsd_to_bsh(k[b:b + 1, :, j * bs:(j + 1) * bs])[0]
            vc[perm[3 * b + j]] = _bnsd_to_bsh(v[b:b + 1, :, j * bs:(j + 1) * bs])[0]
    out = torch_npu.npu_incre_flash_attention(*to_device(_bnsd_to_bsh(q), kc, vc), block_table=to_device(table),
                                              block_size=bs, actual_seq_lengths=LENGTH_FORMS[form](lens),
                                              num_heads=2, input_layout="BSH", scale_value=0.3)
    ref = _decode_reference(q, k, v, 0.3, [0, 0, 0], lens)
    torch.testing.assert_close(on_cpu(out).double(), _bnsd_to_bsh(ref), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("form", ["int", "cpu", "device"])
def test_kv_padding_size_forms(form):
    q, k, v = _inputs(seed=3)
    pad = {"int": 5, "cpu": torch.tensor([5]), "device": to_device(torch.tensor([5]))}[form]
    lens = [7, 35, 0]
    out = torch_npu.npu_incre_flash_attention(*to_device(q, k, v), actual_seq_lengths=lens, kv_padding_size=pad,
                                              num_heads=2, input_layout="BNSD", scale_value=0.3)
    starts = [40 - 5 - n for n in lens]
    torch.testing.assert_close(on_cpu(out).double(), _decode_reference(q, k, v, 0.3, starts, lens),
                               atol=1e-5, rtol=1e-5)


@pytest.mark.skipif(DEVICE != "npu", reason="npu length tensors next to CPU inputs need the npu device")
def test_npu_lengths_and_padding_with_cpu_inputs():
    q, k, v = _inputs(seed=4)
    lens = [7, 35, 2]
    out = torch_npu.npu_incre_flash_attention(q, k, v, actual_seq_lengths=to_device(torch.tensor(lens)),
                                              kv_padding_size=to_device(torch.tensor([5])), num_heads=2,
                                              input_layout="BNSD", scale_value=0.3)
    assert out.device.type == "cpu"
    torch.testing.assert_close(out.double(), _decode_reference(q, k, v, 0.3, [40 - 5 - n for n in lens], lens),
                               atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", ["dequant_scale1", "quant_scale1", "dequant_scale2", "quant_scale2", "quant_offset2"])
def test_quantisation_arguments(name):
    q, k, v = (t.half() for t in _inputs())
    call = lambda **kw: torch_npu.npu_incre_flash_attention(*to_device(q, k, v), num_heads=2,  # noqa: E731
                                                            input_layout="BNSD", scale_value=0.3, **kw)
    if name == "quant_scale2":
        # int8 output, per-channel (N, D) factors with an offset: saturate(round(y · scale + offset))
        g = torch.Generator().manual_seed(5)
        scale, offset = torch.rand(2, 16, generator=g) * 300 - 150, torch.randn(2, 16, generator=g)
        ref64 = _decode_reference(q, k, v, 0.3, [0, 0, 0], [40, 40, 40])
        float_err = float((on_cpu(call()).double() - ref64).abs().max())
        out8 = call(quant_scale2=to_device(scale), quant_offset2=to_device(offset))
        check_int8_output(out8, ref64, scale.view(1, 2, 1, 16), offset.view(1, 2, 1, 16), float_err)
        return
    # an offset needs its scale; the full-quantisation factors need an int8 query, which this op does not take
    with pytest.raises(ValueError, match=f"'{name}'"):
        call(**{name: to_device(torch.ones(1))})


def test_antiquant_needs_an_int8_cache():
    # antiquant_scale / antiquant_offset dequantise int8 key/value (test/inference/test_int8_kv.py); with a
    # floating-point cache they are a bad argument.
    q, k, v = to_device(*_inputs())
    with pytest.raises(ValueError, match="int8 key/value cache"):
        torch_npu.npu_incre_flash_attention(q, k, v, num_heads=2, input_layout="BNSD",
                                            antiquant_scale=to_device(torch.ones(2, 1)))


def test_bad_values_raise_argument_errors():
    q, k, v = to_device(*_inputs())
    with pytest.raises(RuntimeError, match="padding_mask"):
        torch_npu.npu_incre_flash_attention(q, k, v, padding_mask=q, num_heads=2, input_layout="BNSD")
    with pytest.raises(ValueError, match="actual_seq_lengths"):
        torch_npu.npu_incre_flash_attention(q, k, v, num_heads=2, input_layout="BNSD", actual_seq_lengths=[41])
    with pytest.raises(ValueError, match="input_layout"):
        torch_npu.npu_incre_flash_attention(q, k, v, num_heads=2, input_layout="TND")
