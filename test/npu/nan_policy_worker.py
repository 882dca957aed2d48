"""The NaN policy (docs/attention.md, "NaN and infinities") on the simulated npu device, run by test_nan_policy.py
through runner.run_cases: the Ascend C FlashAttention forward and backward kernels and the decode kernel give the
float64 reference's NaN pattern and values, with the poison cases of test/attention/test_nan_policy.py.

Only argument combinations the Ascend C kernels run themselves are used (no pse, no per-batch lengths for
flash_attention_score; no mask or pse for the decode kernel); the others run the CPU kernels, tested on CPU."""
import torch

from test.attention.test_nan_policy import (BLOCK, CASES, N1, N2, Problem, assert_policy, make_problem, paged_cache,
                                            reference)

OPS = torch.ops.npu_fa
MAX = 2147483647


def _npu(t):
    return t.to("npu") if isinstance(t, torch.Tensor) else t


def _flash(pb: Problem) -> torch.Tensor:
    mode, nxt = (0, 0) if pb.causal and pb.mask is not None else (2 if pb.causal else 0, MAX)
    out = OPS.flash_attention_score(_npu(pb.q), _npu(pb.k), _npu(pb.v), N1, "BNSD", atten_mask=_npu(pb.mask),
                                    scale=pb.scale, next_tokens=nxt, sparse_mode=mode)[0]
    assert out.device.type == "npu"
    return out.cpu()


def _decode(pb: Problem, paged: bool) -> torch.Tensor:
    lens = torch.tensor(pb.lens()[1])
    k, v, extra = pb.k, pb.v, {}
    if paged:
        (k, table), (v, _) = paged_cache(pb.k), paged_cache(pb.v)
        extra = dict(block_table=_npu(table), block_size=BLOCK)
    out = OPS.incre_flash_attention(_npu(pb.q), _npu(k), _npu(v), actual_seq_lengths=_npu(lens), num_heads=N1,
                                    scale_value=pb.scale, input_layout="BNSD", num_key_value_heads=N2, **extra)
    return out.cpu()


FLASH_CASES = ["query_nan", "query_inf", "key_nan_masked_for_some", "key_nan_late_tile", "value_nan",
               "fully_masked_nan_query", "causal_future_key_nan", "huge_scale"]
DECODE_CASES = ["query_nan", "query_inf", "key_nan_late_tile", "value_nan", "unread_nan", "huge_scale"]


def _each(cases, sqs, run):
    for name in cases:
        for sq in sqs:
            if "sq>1" in CASES[name][1] and sq == 1:
                continue
            pb = make_problem(sq)
            CASES[name][0](pb)
            assert_policy(run(pb), reference(pb)[0], torch.float32, f"{name} sq={sq}")


def case_flash_attention_forward():
    _each(FLASH_CASES, (6, 1), _flash)


def case_decode_contiguous():
    _each(DECODE_CASES, (1,), lambda pb: _decode(pb, False))


def case_decode_paged():
    _each(DECODE_CASES, (1,), lambda pb: _decode(pb, True))


def case_flash_attention_backward():
    """dq, dk, dv of the Ascend C backward kernel: NaN exactly where float64 autograd of the math is. (Not an inf
    query: the math's dk then has 0·inf = NaN from pairs the row does not see, which the CPU runtime's cube model
    skips as zero products; the policy leaves such 0·NaN products open.)"""
    for name in ("query_nan", "key_nan_late_tile", "value_nan"):
        pb = make_problem(6)
        CASES[name][0](pb)
        out, _, leaves = reference(pb, grad=True)
        dy = torch.randn(out.shape, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
        want = torch.autograd.grad(out, leaves[:3], dy)
        q, k, v = (_npu(t) for t in (pb.q, pb.k, pb.v))
        fwd, smax, ssum = OPS.flash_attention_score(q, k, v, N1, "BNSD", scale=pb.scale)[:3]
        got = OPS.flash_attention_score_grad(q, k, v, _npu(dy.float()), N1, "BNSD", softmax_max=smax,
                                             softmax_sum=ssum, attention_in=fwd, scale=pb.scale)[:3]
        for label, g, w in zip(("dq", "dk", "dv"), got, want):
            assert g.device.type == "npu"
            assert_policy(g.cpu(), w, torch.float32, f"{name} {label}")

