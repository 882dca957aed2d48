"""flash_attention_score on the simulated npu device — the Ascend C kernel (ascendc/kernels/flash_attention) run by
the CPU runtime — against the CPU backend of the same op and a float64 reference.

Each `case_*` runs in a child process with the npu device enabled (test_attention.py via runner).
Rule for attention_out: max|npu - ref64| <= 2 * max(max|cpu_op - ref64|, max|torch_same_dtype - ref64|) + 1e-5;
softmax_max / softmax_sum must equal the CPU op's up to fp32 rounding (-inf / 0 for rows that see no key).
Sizes are tiny: the runtime executes every vector lane as scalar C++.
"""
import ctypes

import torch

from test.attention.attention_cases import Case, dy_like, make_inputs, reference_kwargs
from test.common.reference import attention_reference, max_abs_err, reference_with_grads

OPS = torch.ops.npu_fa
SMALL = dict(batch=1, q_heads=4, kv_heads=2, head_dim=40)


def _lib():
    from torch_ops_transformer._library.loader import extension_cdll

    return extension_cdll()  # the already loaded extension: same globals as the op


def _on_npu(args):
    return {k: (v.to("npu") if isinstance(v, torch.Tensor) else v) for k, v in args.items()}


def _run_both(case, blocks=(0, 0)):
    """(args, cpu outputs, npu outputs moved to cpu), the npu run with forced kernel tile sizes."""
    args = make_inputs(case)
    cpu = OPS.flash_attention_score(**args)
    OPS.npu_attention_tile_config(*blocks)
    try:
        npu = OPS.flash_attention_score(**_on_npu(args))
    finally:
        OPS.npu_attention_tile_config(-1, -1)
    assert all(t.device.type == "npu" for t in npu), [t.device for t in npu]
    return args, cpu, [t.cpu() for t in npu]


def _check_out(label, args, cpu_out, npu_out):
    assert npu_out.dtype == cpu_out.dtype and npu_out.shape == cpu_out.shape, (npu_out.dtype, npu_out.shape)
    assert not torch.isnan(npu_out.float()).any(), f"{label}: NaN"
    kw = reference_kwargs(args, None)
    q, k, v, pse = args["query"], args["key"], args["value"], args.get("pse")
    ref64, _ = attention_reference(q, k, v, pse=pse, compute_dtype=torch.float64, **kw)
    same, _ = attention_reference(q, k, v, pse=pse, compute_dtype=None, **kw)
    err = max_abs_err(npu_out, ref64)
    base = max(max_abs_err(cpu_out, ref64), max_abs_err(same, ref64))
    assert err <= 2 * base + 1e-5, f"{label}: max|npu - ref64| = {err:.3e} > 2 * {base:.3e} + 1e-5"


def _check_stats(label, cpu, npu):
    for name, c, n in (("softmax_max", cpu[1], npu[1]), ("softmax_sum", cpu[2], npu[2])):
        assert n.dtype == torch.float32 and n.shape == c.shape, (name, n.dtype, n.shape, c.shape)
        assert torch.equal(torch.isinf(n), torch.isinf(c)), f"{label}: {name} -inf rows differ"
        fin = torch.isfinite(c)
        torch.testing.assert_close(n[fin], c[fin], rtol=2e-4, atol=2e-4, msg=lambda m: f"{label} {name}: {m}")


def _compare(case, blocks=(0, 0)):
    args, cpu, npu = _run_both(case, blocks)
    label = f"{case} blocks={blocks}"
    _check_out(label, args, cpu[0], npu[0])
    _check_stats(label, cpu, npu)
    return cpu, npu


# ---- dtypes x tails (S1/S2 not multiples of the tiles), GQA / MQA ----

def case_fp16_gqa_tails_auto_tiles():
    _compare(Case(dtype="fp16", layout="BNSD", q_len=37, kv_len=130, **SMALL))


def case_bf16_gqa_tails_small_forced_tiles():
    _compare(Case(dtype="bf16", layout="BNSD", q_len=37, kv_len=70, **SMALL), blocks=(16, 64))


def case_fp32_mqa_tails_small_forced_tiles():
    _compare(Case(dtype="fp32", layout="BNSD", batch=2, q_heads=4, kv_heads=1, q_len=20, kv_len=100, head_dim=24),
             blocks=(8, 64))


def case_fp16_single_query_row():
    _compare(Case(dtype="fp16", layout="BNSD", q_len=1, kv_len=37, **SMALL))


def case_fp32_value_head_dim_smaller():
    _compare(Case(dtype="fp32", layout="BNSD", q_len=9, kv_len=33, head_dim=32, v_head_dim=20, q_heads=2, kv_heads=2))


# ---- layouts (BSH / SBH / BSND copied to BNSD and back) ----

def case_layout_bsh_fp16():
    _compare(Case(dtype="fp16", layout="BSH", batch=2, q_heads=4, kv_heads=2, q_len=13, kv_len=17, head_dim=16))


def case_layout_sbh_bf16():
    _compare(Case(dtype="bf16", layout="SBH", batch=2, q_heads=4, kv_heads=1, q_len=13, kv_len=17, head_dim=16))


def case_layout_bsnd_fp32_strided_inputs():
    _compare(Case(dtype="fp32", layout="BSND", batch=2, q_heads=2, kv_heads=2, q_len=13, kv_len=17, head_dim=16,
                  strided=True))


# ---- masks: explicit bool / uint8 (with a fully masked row), causal sparse modes 2 and 3, band ----

def case_mask_b1ss_bool_fp16():
    _compare(Case(dtype="fp16", layout="BNSD", q_len=37, kv_len=70, mask="B1SS", batch=2, **{k: v for k, v in SMALL.items() if k != "batch"}),
             blocks=(16, 64))


def case_mask_bnss_uint8_fp32():
    _compare(Case(dtype="fp32", layout="BSND", q_len=11, kv_len=19, mask="BNSS", mask_dtype="uint8", batch=2,
                  q_heads=2, kv_heads=1, head_dim=16))


def case_mask_ss_and_11ss_bf16():
    for mask in ("SS", "11SS"):
        _compare(Case(dtype="bf16", layout="BNSD", q_len=12, kv_len=40, mask=mask, q_heads=2, kv_heads=2, head_dim=16))


def case_causal_top_left_mode2():
    for dtype in ("fp16", "fp32"):
        _compare(Case(dtype=dtype, layout="BSND", q_len=37, kv_len=50, sparse_mode=2, **SMALL), blocks=(16, 64))


def case_causal_bottom_right_mode3_with_empty_rows():
    # Sq > Skv: the first Sq - Skv rows see no key (out 0, max -inf, sum 0).
    cpu, npu = _compare(Case(dtype="fp16", layout="BNSD", q_len=50, kv_len=37, sparse_mode=3, **SMALL),
                        blocks=(16, 64))
    assert torch.isinf(npu[1][:, :, :13]).all() and (npu[2][:, :, :13] == 0).all()
    assert (npu[0][:, :, :13] == 0).all()


def case_causal_compressed_mask_mode3_bf16():
    _compare(Case(dtype="bf16", layout="BSH", q_len=20, kv_len=29, sparse_mode=3, mask="compressed", q_heads=2,
                  kv_heads=1, head_dim=16))


def case_band_mode4_and_mode0_tokens():
    _compare(Case(dtype="fp32", layout="BNSD", q_len=30, kv_len=40, sparse_mode=4, pre_tokens=5, next_tokens=2,
                  q_heads=2, kv_heads=1, head_dim=16), blocks=(8, 64))
    _compare(Case(dtype="fp16", layout="BNSD", q_len=30, kv_len=40, sparse_mode=0, pre_tokens=7, next_tokens=0,
                  mask="SS", q_heads=2, kv_heads=1, head_dim=16), blocks=(8, 64))


def _with_mask(args, kind, seed=0):
    """args with an atten_mask of the named shape (the op takes [Sq,Skv], [B or 1, N or 1, Sq, Skv]; "BSS" is a 3-D
    mask it rejects), row 1 fully masked."""
    q, n = args["query"], args["head_num"]
    b, sq, skv = q.shape[0], q.shape[2], args["key"].shape[2]  # BNSD
    shape = {"SS": (sq, skv), "11SS": (1, 1, sq, skv), "B1SS": (b, 1, sq, skv), "BNSS": (b, n, sq, skv),
             "1NSS": (1, n, sq, skv), "BSS": (b, sq, skv)}[kind]
    m = torch.rand(shape, generator=torch.Generator().manual_seed(seed)) < 0.3
    m[..., 1, :] = True
    return {**args, "atten_mask": m}


def case_every_mask_shape_runs_the_kernel():
    """Every mask shape the op accepts (and the compressed 2048x2048 mask of modes 2-4) on the kernel, fallbacks
    refused: forward against float64 and the CPU op, gradients through autograd against float64; a 3-D mask is an
    error naming atten_mask, the same on both devices."""
    from test.npu.runner import assert_same_error, no_fallback

    base = make_inputs(Case(dtype="fp32", layout="BNSD", batch=2, q_heads=4, kv_heads=2, q_len=13, kv_len=21,
                            head_dim=16))
    with no_fallback(True):
        for i, kind in enumerate(("SS", "11SS", "B1SS", "BNSS", "1NSS")):
            for mode, pre, nxt in ((0, 6, 2), (1, 2147483647, 2147483647)):
                args = {**_with_mask(base, kind, seed=i), "sparse_mode": mode, "pre_tokens": pre, "next_tokens": nxt}
                npu = [t.cpu() for t in OPS.flash_attention_score(**_on_npu(args))]
                cpu = OPS.flash_attention_score(**args)
                _check_out(f"mask {kind} mode {mode}", args, cpu[0], npu[0])
                _check_stats(f"mask {kind} mode {mode}", cpu, npu)
            _check_grads_against_float64(kind, _with_mask(base, kind, seed=i))
        for mode in (2, 3, 4):
            args = {**base, "sparse_mode": mode, "pre_tokens": 5, "next_tokens": 1,
                    "atten_mask": torch.ones(2048, 2048, dtype=torch.bool).triu(1)}
            npu = [t.cpu() for t in OPS.flash_attention_score(**_on_npu(args))]
            cpu = OPS.flash_attention_score(**args)
            _check_out(f"compressed mode {mode}", args, cpu[0], npu[0])
        bad = _with_mask(base, "BSS")
        assert_same_error(lambda d: OPS.flash_attention_score(**{k: (v.to(d) if isinstance(v, torch.Tensor) else v)
                                                                 for k, v in bad.items()}), "3-D mask")


def _check_grads_against_float64(what, args, dy=None):
    """dq/dk/dv through autograd on npu (forward and backward kernels) within the tolerance rule of float64, as the
    CPU op's; the gradients land on the inputs' device."""
    grads = {}
    for device in ("cpu", "npu"):
        kw = {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in args.items()}
        leaves = [kw[n].detach().requires_grad_(True) for n in ("query", "key", "value")]
        kw.update(query=leaves[0], key=leaves[1], value=leaves[2])
        out = OPS.flash_attention_score(**kw)[0]
        dy = dy_like(out.detach().cpu()) if dy is None else dy
        got = torch.autograd.grad(out, leaves, dy.to(device))
        assert all(g.device.type == device for g in got), [g.device for g in got]
        grads[device] = [g.cpu() for g in got]
    _, _, ref = reference_with_grads({n: args[n] for n in ("query", "key", "value")}, dy, torch.float64,
                                     **reference_kwargs(args, None))
    for i, name in enumerate(("query", "key", "value")):
        err, base = max_abs_err(grads["npu"][i], ref[name]), max_abs_err(grads["cpu"][i], ref[name])
        assert err <= 2 * base + 1e-5, f"{what} d{name}: npu {err:.3e} vs cpu {base:.3e}"


# ---- fallback (CPU kernel on CPU aliases of the npu tensors): pse, dropout, TND ----

def _check_fallback_equal(case):
    args, cpu, npu = _run_both(case)
    for i, (c, n) in enumerate(zip(cpu, npu)):
        assert torch.equal(c, n), f"{case}: output {i} of the CPU fallback differs from the CPU op"


def case_fallback_pse():
    _check_fallback_equal(Case(dtype="fp16", layout="BNSD", q_len=9, kv_len=12, pse="BNSS", q_heads=2, kv_heads=1,
                               head_dim=16))


def case_fallback_dropout():
    _check_fallback_equal(Case(dtype="fp32", layout="BSND", q_len=9, kv_len=12, keep_prob=0.8, q_heads=2, kv_heads=1,
                               head_dim=16))


def case_fallback_tnd():
    _check_fallback_equal(Case(layout="TND", q_heads=2, kv_heads=1, head_dim=8, seqlens=((3, 0, 4), (2, 5, 1)),
                               sparse_mode=3))


# ---- autograd through npu (forward on the Ascend C kernel), errors, control functions ----

def case_autograd_grads_match_cpu():
    case = Case(dtype="fp32", layout="BSND", q_len=13, kv_len=17, mask="B1SS", **SMALL)
    _check_grads_against_float64("autograd", make_inputs(case))


def case_errors_match_cpu():
    args = make_inputs(Case(dtype="fp16", layout="BNSD", q_len=5, kv_len=7, q_heads=4, kv_heads=3, head_dim=8,
                            batch=1))
    messages = []
    for device in ("cpu", "npu"):
        try:
            OPS.flash_attention_score(**{k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in args.items()})
        except (RuntimeError, ValueError) as e:
            messages.append(str(e).splitlines()[0])
    assert len(messages) == 2 and messages[0] == messages[1] and "N2=3" in messages[0], messages


def case_control_functions_count_only_and_stats():
    lib = _lib()
    args = _on_npu(make_inputs(Case(dtype="fp16", layout="BNSD", batch=1, q_len=20, kv_len=40, q_heads=2,
                                    kv_heads=1, head_dim=16)))
    OPS.flash_attention_score(**args)
    from torch_ops_transformer.bench.npu_perf_model import VALUES_PER_CORE as W  # type, block, then the counters
    stats = (ctypes.c_ulonglong * (W * 80))()
    n = lib.tot_ascendc_last_stats(stats, 80)
    rows = [list(stats[W * i: W * i + W]) for i in range(n)]
    aic = [r for r in rows if r[0] == 0]
    aiv = [r for r in rows if r[0] == 1]
    assert len(aiv) == 2 * len(aic) and aic, rows
    # Cube work = Q·Kᵀ + P·V over the (padded-free) shapes: 2 heads x 20 rows x 40 keys x (16 + 16).
    assert sum(r[4] for r in rows) == 2 * 20 * 40 * 32, sum(r[4] for r in rows)
    assert sum(r[5] for r in aiv) > 0 and sum(r[2] for r in rows) > 0
    # Every Matmul job is one the AIVs asked for: Q·Kᵀ and P·V per (task, key block).
    assert sum(r[9] for r in aic) > 0 and all(r[9] == 0 for r in aiv) and all(r[8] > 0 for r in aiv)
    lib.tot_ascendc_set_count_only(1)
    try:
        OPS.flash_attention_score(**args)
    finally:
        lib.tot_ascendc_set_count_only(0)
    n2 = lib.tot_ascendc_last_stats(stats, 80)
    assert n2 == n and sum(stats[W * i + 4] for i in range(n2)) == 2 * 20 * 40 * 32
    OPS.npu_attention_tile_config(12, 64)
    try:
        OPS.flash_attention_score(**args)
    except RuntimeError as e:
        assert "s1_block 12" in str(e), str(e)
    else:
        raise AssertionError("an invalid forced s1_block was accepted")
    finally:
        OPS.npu_attention_tile_config(-1, -1)



def case_fp32_query_tail_past_auto_tile():
    # S1 = 130 with the automatic 128-row tile: a 2-row tail task.
    _compare(Case(dtype="fp32", layout="BNSD", q_len=130, kv_len=37, q_heads=2, kv_heads=1, head_dim=16, batch=1))
