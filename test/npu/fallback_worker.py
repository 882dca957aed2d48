"""TOT_NPU_SIM_NO_FALLBACK on the simulated npu device, run by test_fallback.py through runner_worker.

Every glue file sends the calls its Ascend C kernel does not handle to one helper (aten_ops/npu/host_alias.h,
`fallback_to_cpu`), and the ops with no Ascend C kernel at all run their CPU kernel through the simulated device's
generic path (aten_ops/npu_sim/device.cpp). With the switch at 1 both raise, naming the op and the reason, as a
CANN build does; with it unset they give the CPU op's result. One unsupported case per glue file, plus an op
without a kernel; and the decode glue with a strided (non-contiguous) cache on both paths.
"""
import torch

from test.attention.attention_cases import Case as FaCase, make_inputs
from test.inference.decode_cases import OPS, Case as DecodeCase, build
from test.npu.runner import no_fallback

SWITCH = "TOT_NPU_SIM_NO_FALLBACK"



def _npu(x):
    return x.to("npu") if isinstance(x, torch.Tensor) else x


def _refused(fn, *words):
    with no_fallback(True):
        try:
            fn()
        except RuntimeError as e:
            msg = str(e).split("\n")[0]
            assert SWITCH in msg and all(w in msg for w in words), msg
            return
    raise AssertionError(f"{SWITCH}=1 did not refuse the fallback")


def _allowed_and_equal(fn, cpu_fn):
    with no_fallback(False):
        npu = fn()
    cpu = cpu_fn()
    npu = npu if isinstance(npu, (tuple, list)) else (npu,)
    cpu = cpu if isinstance(cpu, (tuple, list)) else (cpu,)
    for n, c in zip(npu, cpu):
        same = torch.allclose(n.cpu(), c, rtol=0, atol=0, equal_nan=True) if c.is_floating_point() else torch.equal(n.cpu(), c)
        assert n.device.type == "npu" and same, "the fallback differs from the CPU op"


def _fa_pse_args():
    return make_inputs(FaCase(dtype="fp32", layout="BNSD", q_len=9, kv_len=12, pse="BNSS", q_heads=2, kv_heads=1,
                              head_dim=16))


def case_flash_attention_forward():
    args = _fa_pse_args()
    run = lambda: OPS.flash_attention_score(**{k: _npu(v) for k, v in args.items()})  # noqa: E731
    _refused(run, "flash_attention_score", "pse")
    _allowed_and_equal(run, lambda: OPS.flash_attention_score(**args))


def case_flash_attention_backward():
    args = _fa_pse_args()
    q = args["query"].to("npu").requires_grad_()
    rest = {k: _npu(v) for k, v in args.items() if k != "query"}
    with no_fallback(False):
        out = OPS.flash_attention_score(q, **rest)[0]
    _refused(lambda: out.backward(torch.ones_like(out)), "flash_attention_score_grad", "pse")


def _decode_case(**kw):
    base = dict(layout="BSH", batch=2, q_heads=4, kv_heads=2, head_dim=16, kv_len=32, lens=(20, 9))
    base.update(kw)
    return build(DecodeCase(**base))


def case_incre_flash_attention():
    args = _decode_case(mask="BS").args
    run = lambda: OPS.incre_flash_attention(*[_npu(a) for a in args])  # noqa: E731
    _refused(run, "incre_flash_attention", "atten_mask")
    _allowed_and_equal(run, lambda: OPS.incre_flash_attention(*args))


def case_incre_flash_attention_strided_cache():
    # A BNSD cache viewed from a BSND buffer (non-contiguous): the kernel path copies it and runs under the switch;
    # the mask path hands the strided views to the CPU kernel untouched.
    for mask in (None, "B1S"):
        args = list(_decode_case(layout="BNSD", mask=mask).args)
        for i in (1, 2):
            args[i] = args[i].transpose(1, 2).contiguous().transpose(1, 2)
            assert not args[i].is_contiguous()
        cpu = OPS.incre_flash_attention(*args)
        with no_fallback(mask is None):
            npu = OPS.incre_flash_attention(*[_npu(a) for a in args]).cpu()
        assert torch.allclose(npu, cpu, rtol=1e-5, atol=1e-5), (mask, (npu - cpu).abs().max())


def case_moe_gating():
    x = torch.randn(6, 8)
    x[2, 3] = float("nan")
    run = lambda: OPS.moe_gating_top_k_softmax(_npu(x), None, 2)  # noqa: E731
    _refused(run, "moe_gating_top_k_softmax", "NaN")
    _allowed_and_equal(run, lambda: OPS.moe_gating_top_k_softmax(x, None, 2))


def case_rotary_position_embedding():
    x = torch.randn(1, 3, 2, 8)
    cos, sin = torch.randn(1, 3, 1, 8), torch.randn(1, 3, 1, 8)
    run = lambda: OPS.rotary_position_embedding(_npu(x), _npu(cos), _npu(sin), 2)  # noqa: E731
    _refused(run, "rotary_position_embedding", "mode 2")
    _allowed_and_equal(run, lambda: OPS.rotary_position_embedding(x, cos, sin, 2))


def case_sparse_flash_attention():
    from test.sparse_attention.sfa_reference import make_inputs as sfa_inputs
    inp = sfa_inputs(B=1, S1=2, N1=2, Dn=8, Dr=4, S2=6, K=3, dtype=torch.float64)
    args = (inp["query"], inp["key"], inp["value"], inp["sparse_indices"], inp["scale_value"])
    kw = dict(inp["kwargs"], return_softmax_lse=True)
    nkw = {k: _npu(v) for k, v in kw.items()}
    run = lambda: OPS.sparse_flash_attention(*[_npu(a) for a in args], **nkw)  # noqa: E731
    _refused(run, "sparse_flash_attention", "float64")
    _allowed_and_equal(run, lambda: OPS.sparse_flash_attention(*args, **kw))


def case_lightning_indexer():
    from test.sparse_attention.test_lightning_indexer import make_inputs as indexer_inputs
    q, k, w, kw = indexer_inputs("BSND", "BSND", torch.float64, B=1, S1=3, S2=10)
    nkw = {n: _npu(v) for n, v in kw.items()}
    run = lambda: OPS.lightning_indexer(_npu(q), _npu(k), _npu(w), sparse_count=4, return_value=True, **nkw)  # noqa: E731
    _refused(run, "lightning_indexer", "float64")
    _allowed_and_equal(run, lambda: OPS.lightning_indexer(q, k, w, sparse_count=4, return_value=True, **kw))


def case_recurrent_gated_delta_rule():
    from test.linear_attention.test_recurrent_gated_delta_rule import make_inputs as gdr_inputs
    args, kw = gdr_inputs(torch.float64, lens=(2, 1))
    nkw = {n: _npu(v) for n, v in kw.items()}
    run = lambda: OPS.recurrent_gated_delta_rule_functional(*map(_npu, args), **nkw)  # noqa: E731
    _refused(run, "recurrent_gated_delta_rule_functional", "float64")
    _allowed_and_equal(run, lambda: OPS.recurrent_gated_delta_rule_functional(*args, **kw))


def case_fused_causal_conv1d():
    from test.linear_attention.test_causal_conv1d import _inputs as conv_inputs, _qsl
    x, w, st = conv_inputs([3, 2], dtype=torch.float64)
    kw = dict(query_start_loc=_qsl([3, 2]))
    nkw = {n: _npu(v) for n, v in kw.items()}
    run = lambda: OPS.fused_causal_conv1d(_npu(x), _npu(w), _npu(st), **nkw)  # noqa: E731
    _refused(run, "fused_causal_conv1d", "float64")
    _allowed_and_equal(run, lambda: OPS.fused_causal_conv1d(x, w, st.clone(), **kw))


def case_op_without_an_ascendc_kernel():
    x = torch.randn(4, 16)
    run = lambda: OPS.swiglu(_npu(x), -1)  # noqa: E731
    _refused(run, "swiglu", "no Ascend C kernel")
    _allowed_and_equal(run, lambda: OPS.swiglu(x, -1))
