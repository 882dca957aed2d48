"""flash_attention_score_grad on the simulated npu device (Ascend C backward kernel), run by
test_attention_grad.py through runner.run_cases.

Each case runs the CPU forward op, moves its inputs and outputs (attention_in, softmax_max/sum) to the npu, calls
torch.ops.npu_fa.flash_attention_score_grad there, and checks dq/dk/dv — and the CPU grad op's — against a float64
reference with the tolerance rule (test/common/reference.py). Sizes are tiny: the CPU runtime executes scalar C++."""
import math

import torch

from test.common.reference import MAX_TOKENS, check_tolerance, reference_with_grads

OPS = torch.ops.npu_fa


def _bnsd_shape(layout, b, n, s, d):
    return {"BNSD": (b, n, s, d), "BSND": (b, s, n, d), "BSH": (b, s, n * d), "SBH": (s, b, n * d)}[layout]


def _grad_case(dtype=torch.float16, layout="BNSD", b=1, n1=2, n2=None, s1=37, s2=None, d=16, mask=None,
               sparse_mode=0, pre_tokens=MAX_TOKENS, next_tokens=MAX_TOKENS, pse=None, keep_prob=1.0, seed=7):
    n2 = n2 or n1
    s2 = s2 or s1
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(_bnsd_shape(layout, b, n1, s1, d), generator=g).to(dtype)
    k = torch.randn(_bnsd_shape(layout, b, n2, s2, d), generator=g).to(dtype)
    v = torch.randn(_bnsd_shape(layout, b, n2, s2, d), generator=g).to(dtype)
    dy = torch.randn(q.shape, generator=g).to(dtype)
    scale = 1.0 / math.sqrt(d)
    kw = dict(atten_mask=mask, scale=scale, keep_prob=keep_prob, pre_tokens=pre_tokens, next_tokens=next_tokens,
              sparse_mode=sparse_mode)
    out, smax, ssum, _, seed_out, offset_out = OPS.flash_attention_score(q, k, v, n1, layout, pse=pse, **kw)
    grad_kw = dict(kw, pse=pse, softmax_max=smax, softmax_sum=ssum, attention_in=out, seed=seed_out,
                   offset=offset_out)
    cpu = OPS.flash_attention_score_grad(q, k, v, dy, n1, layout, **grad_kw)
    npu = [t.cpu() for t in _on_npu_grad(q, k, v, dy, n1, layout, grad_kw)]
    return (q, k, v, dy, n1, layout, kw), cpu, npu


def _on_npu_grad(q, k, v, dy, n1, layout, grad_kw):
    to = {name: (t.to("npu") if isinstance(t, torch.Tensor) else t) for name, t in grad_kw.items()}
    res = OPS.flash_attention_score_grad(q.to("npu"), k.to("npu"), v.to("npu"), dy.to("npu"), n1, layout, **to)
    for t in res:
        assert t.device.type == "npu", t.device
    return res


def _check(setup, cpu, npu, label):
    q, k, v, dy, n1, layout, kw = setup
    ref_kw = dict(kw, head_num=n1, input_layout=layout)
    _, _, ref = reference_with_grads({"query": q, "key": k, "value": v}, dy, torch.float64, **ref_kw)
    _, _, same = reference_with_grads({"query": q, "key": k, "value": v}, dy, None, **ref_kw)
    for i, name in enumerate(("query", "key", "value")):
        assert npu[i].shape == cpu[i].shape and npu[i].dtype == cpu[i].dtype, (name, npu[i].shape, cpu[i].shape)
        check_tolerance(f"[{label}] npu d{name}", npu[i], ref[name], same[name])
        check_tolerance(f"[{label}] cpu d{name}", cpu[i], ref[name], same[name])
    assert npu[3].numel() == 0 and cpu[3].numel() == 0


def _run(label, **kw):
    setup, cpu, npu = _grad_case(**kw)
    _check(setup, cpu, npu, label)


# ---- dtypes and tails (S not a multiple of the tile; S = 1) ----

def case_fp16_s37():
    _run("fp16 s37", dtype=torch.float16)


def case_bf16_s37():
    _run("bf16 s37", dtype=torch.bfloat16)


def case_fp32_s37():
    _run("fp32 s37", dtype=torch.float32)


def case_fp32_s1():
    _run("fp32 s1", dtype=torch.float32, s1=1, d=8)


def case_fp16_s130_two_key_blocks():
    _run("fp16 s130", dtype=torch.float16, n1=1, s1=130, d=16)


def case_fp32_sq_ne_skv_head_dim_24():
    _run("fp32 20x45 d24", dtype=torch.float32, s1=20, s2=45, d=24)


# ---- layouts and GQA ----

def case_gqa_4_heads_2_kv_bsnd():
    _run("gqa 4/2 BSND", dtype=torch.float16, layout="BSND", n1=4, n2=2, s1=21)


def case_gqa_4_heads_1_kv_bsh():
    _run("gqa 4/1 BSH", dtype=torch.bfloat16, layout="BSH", n1=4, n2=1, s1=19)


def case_sbh_batch2():
    _run("SBH b2", dtype=torch.float32, layout="SBH", b=2, n1=2, s1=13, s2=17)


# ---- masks and sparse modes ----

def _bool_mask(shape, seed=3):
    g = torch.Generator().manual_seed(seed)
    m = torch.rand(shape, generator=g) < 0.3
    m[..., 2, :] = True  # a fully masked row: softmax_max -inf, sum 0 -> zero gradients
    return m


def case_bool_mask_2d_fp32():
    _run("mask [S1,S2] fp32", dtype=torch.float32, s1=23, s2=29, mask=_bool_mask((23, 29)))


def case_bool_mask_b1ss_gqa_fp16():
    _run("mask [B,1,S1,S2] gqa fp16", dtype=torch.float16, b=2, n1=4, n2=2, s1=17, s2=19,
         mask=_bool_mask((2, 1, 17, 19)))


def case_uint8_mask_bnss_bf16():
    _run("mask [B,N,S1,S2] uint8 bf16", dtype=torch.bfloat16, n1=2, s1=12, s2=12,
         mask=_bool_mask((1, 2, 12, 12)).to(torch.uint8))


def case_causal_mode2_fp16():
    _run("causal 2 fp16", dtype=torch.float16, s1=20, s2=33, sparse_mode=2)


def case_causal_mode3_rows_without_keys_fp32():
    # bottom-right causal with S1 > S2: the first S1 - S2 rows see no key
    _run("causal 3 fp32", dtype=torch.float32, s1=33, s2=20, sparse_mode=3)


def case_causal_mode3_gqa_bf16():
    _run("causal 3 gqa bf16", dtype=torch.bfloat16, n1=4, n2=1, s1=18, s2=26, sparse_mode=3)


def case_band_mode4_fp32():
    _run("band 4 fp32", dtype=torch.float32, s1=24, s2=24, sparse_mode=4, pre_tokens=5, next_tokens=2)


def case_mode0_tokens_and_mask_fp16():
    _run("mode 0 pre/next + mask fp16", dtype=torch.float16, s1=16, s2=16, pre_tokens=4, next_tokens=0,
         mask=_bool_mask((16, 16)))


# ---- combinations the kernel leaves to the CPU kernel (simulated device only): same results as the CPU op ----

def _same_as_cpu(label, **kw):
    _, cpu, npu = _grad_case(**kw)
    for i, name in enumerate(("dq", "dk", "dv", "dpse")):
        assert torch.equal(npu[i], cpu[i]), f"[{label}] {name}: npu fallback differs from the CPU op"


def case_fallback_pse():
    pse = torch.randn(1, 2, 9, 9, generator=torch.Generator().manual_seed(1))
    _same_as_cpu("pse", dtype=torch.float32, s1=9, pse=pse)


def case_fallback_dropout():
    _same_as_cpu("dropout", dtype=torch.float16, s1=11, keep_prob=0.8)


def case_fallback_tnd():
    g = torch.Generator().manual_seed(5)
    q, k, v, dy = (torch.randn(9, 2, 16, generator=g) for _ in range(4))
    lens = torch.tensor([4, 9])
    kw = dict(actual_seq_qlen=lens, actual_seq_kvlen=lens, scale=0.25)
    out, smax, ssum, *_ = OPS.flash_attention_score(q, k, v, 2, "TND", **kw)
    grad_kw = dict(kw, softmax_max=smax, softmax_sum=ssum, attention_in=out)
    cpu = OPS.flash_attention_score_grad(q, k, v, dy, 2, "TND", **grad_kw)
    npu = [t.cpu() for t in _on_npu_grad(q, k, v, dy, 2, "TND", grad_kw)]
    for a, b in zip(npu, cpu):
        assert torch.equal(a, b)


# ---- validation: the CPU op's messages ----

def case_bad_dy_shape_same_message_as_cpu():
    q = torch.randn(1, 2, 8, 16)
    out, smax, ssum, *_ = OPS.flash_attention_score(q, q, q, 2, "BNSD")
    bad = torch.randn(1, 2, 7, 16)
    msgs = []
    for dev in ("cpu", "npu"):
        try:
            OPS.flash_attention_score_grad(q.to(dev), q.to(dev), q.to(dev), bad.to(dev), 2, "BNSD",
                                           softmax_max=smax.to(dev), softmax_sum=ssum.to(dev),
                                           attention_in=out.to(dev))
        except (ValueError, RuntimeError) as e:
            msgs.append(str(e).splitlines()[0])
    assert len(msgs) == 2 and msgs[0] == msgs[1] and "'dy'" in msgs[0], msgs


def case_head_dim_over_kernel_limit_is_a_clear_error():
    q = torch.randn(1, 1, 4, 640)
    out, smax, ssum, *_ = OPS.flash_attention_score(q, q, q, 1, "BNSD")
    n = lambda t: t.to("npu")  # noqa: E731
    try:
        OPS.flash_attention_score_grad(n(q), n(q), n(q), n(q), 1, "BNSD", softmax_max=n(smax), softmax_sum=n(ssum),
                                       attention_in=n(out))
    except ValueError as e:
        assert "flash_attention_score_grad tiling: head dims must be <= 512; got d=640" in str(e), str(e)
    else:
        raise AssertionError("expected a ValueError for d=640")


# ---- end to end: npu forward + autograd backward (through the Ascend C grad kernel) vs CPU ----

def case_autograd_end_to_end_fp16_causal_gqa():
    g = torch.Generator().manual_seed(11)
    q = torch.randn(1, 4, 19, 16, generator=g).half()
    k = torch.randn(1, 2, 23, 16, generator=g).half()
    v = torch.randn(1, 2, 23, 16, generator=g).half()
    dy = torch.randn(1, 4, 19, 16, generator=g).half()
    kw = dict(scale=0.25, sparse_mode=3)
    grads = {}
    for dev in ("cpu", "npu"):
        leaves = [t.detach().clone().to(dev).requires_grad_() for t in (q, k, v)]
        out = OPS.flash_attention_score(*leaves, 4, "BNSD", **kw)[0]
        out.backward(dy.to(dev))
        grads[dev] = [t.grad.cpu() for t in leaves]
        assert all(t.grad.device.type == dev for t in leaves)
    ref_kw = dict(kw, head_num=4, input_layout="BNSD")
    _, _, ref = reference_with_grads({"query": q, "key": k, "value": v}, dy, torch.float64, **ref_kw)
    _, _, same = reference_with_grads({"query": q, "key": k, "value": v}, dy, None, **ref_kw)
    for i, name in enumerate(("query", "key", "value")):
        check_tolerance(f"[autograd] npu d{name}", grads["npu"][i], ref[name], same[name])
        check_tolerance(f"[autograd] cpu d{name}", grads["cpu"][i], ref[name], same[name])
