"""prompt_flash_attention and fused_infer_attention_score prefill on the simulated npu device: the FlashAttention
forward Ascend C kernel (through the CPU runtime) against the float64 reference of test/inference/prefill_cases.py
and the CPU backend. Run by test_prefill.py through runner_worker.py (the device is already enabled here).

The grid runs with CPU fallbacks refused, so it proves the kernel ran: layouts BSH / BSND / BNSD / BNSD_BSND, GQA,
fp32 / fp16 / bf16, sparse modes 0-4 with and without masks, query and key lengths that are not multiples of the
tiles; per-batch lengths (one launch per sequence), also on paged caches. Calls the kernel does not take (TND,
pse_shift, int8 caches) run the CPU kernel and give its result.
"""
import torch

from test.common.reference import check_tolerance
from test.inference.prefill_cases import MAX, make_inputs, reference, to_layout
from test.npu.runner import assert_same_error, no_fallback

OPS = torch.ops.npu_fa
NPU = "npu"
SCALE = 0.3


def _on(d, device):
    return {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in d.items()}


def _mask(mode, sq, skv, b):
    if mode in (2, 3, 4):
        return torch.ones(2048, 2048, dtype=torch.bool).triu(1)  # the compressed mask of modes 2-4
    g = torch.Generator().manual_seed(sq * 100 + skv)
    return torch.rand(b, 1, sq, skv, generator=g) < 0.3


def _pfa(layout, dtype, mode, use_mask, pre=MAX, nxt=0, B=2, N1=4, N2=2, Sq=37, Skv=53, D=32, seed=0):
    args, bnsd, lens = make_inputs(layout, B=B, N1=N1, N2=N2, Sq=Sq, Skv=Skv, D=D, dtype=dtype, seed=seed)
    mask = _mask(mode, Sq, Skv, B) if use_mask else None
    kw = dict(num_heads=N1, num_key_value_heads=N2, scale_value=SCALE, input_layout=layout, sparse_mode=mode,
              pre_tokens=pre, next_tokens=nxt, atten_mask=mask)
    return args, kw, bnsd, lens, mask


def _check_pfa(layout, dtype, mode, use_mask, **shape):
    args, kw, bnsd, lens, mask = _pfa(layout, dtype, mode, use_mask, **shape)
    what = f"pfa {layout} {dtype} mode {mode} mask {use_mask} {shape}"
    out = OPS.prompt_flash_attention(**_on(args, NPU), **_on(kw, NPU))
    assert out.device.type == NPU and out.dtype == dtype, what
    ref64, _ = reference(bnsd, lens, layout, SCALE, mask=mask, pre=kw["pre_tokens"], nxt=kw["next_tokens"], mode=mode)
    same, _ = reference(bnsd, lens, layout, SCALE, mask=mask, pre=kw["pre_tokens"], nxt=kw["next_tokens"], mode=mode,
                        dtype=dtype)
    check_tolerance(what, out.cpu(), ref64, same)
    cpu = OPS.prompt_flash_attention(**args, **kw)
    assert cpu.shape == out.shape, what


def case_layouts_dtypes_gqa():
    with no_fallback(True):
        for layout in ("BSH", "BSND", "BNSD", "BNSD_BSND"):
            for dtype in (torch.float32, torch.float16, torch.bfloat16):
                _check_pfa(layout, dtype, 3, True)


def case_sparse_modes_and_masks():
    with no_fallback(True):
        for mode, use_mask, pre, nxt in [(0, False, MAX, 0), (0, True, MAX, 0), (0, True, 5, 3), (1, True, MAX, 0),
                                         (2, True, MAX, 0), (3, True, MAX, 0), (4, True, 7, 2)]:
            _check_pfa("BNSD", torch.float32, mode, use_mask, pre=pre, nxt=nxt)
            _check_pfa("BSND", torch.float16, mode, use_mask, pre=pre, nxt=nxt, Sq=53, Skv=37, N2=1)


def case_long_sequences_span_several_tiles():
    with no_fallback(True):
        _check_pfa("BSH", torch.bfloat16, 3, True, B=1, N1=2, N2=2, Sq=300, Skv=300, D=64)


def case_fia_prefill_out_and_lse():
    with no_fallback(True):
        for layout, dtype in (("BSND", torch.float32), ("BNSD_BSND", torch.bfloat16)):
            args, kw, bnsd, lens, mask = _pfa(layout, dtype, 3, True)
            kw["scale"] = kw.pop("scale_value")
            out, lse = OPS.fused_infer_attention_score(**_on(args, NPU), **_on(kw, NPU), softmax_lse_flag=True)
            ref64, lse64 = reference(bnsd, lens, layout, SCALE, mode=3)
            same, _ = reference(bnsd, lens, layout, SCALE, mode=3, dtype=dtype)
            check_tolerance(f"fia {layout}", out.cpu(), ref64, same)
            cpu_out, cpu_lse = OPS.fused_infer_attention_score(**args, **kw, softmax_lse_flag=True)
            assert lse.shape == cpu_lse.shape and lse.dtype == cpu_lse.dtype
            torch.testing.assert_close(lse.cpu()[..., 0], lse64.float(), rtol=1e-4, atol=1e-4)
            out, lse = OPS.fused_infer_attention_score(**_on(args, NPU), **_on(kw, NPU))
            assert lse.numel() == 0


def case_fully_masked_rows_are_zero_with_lse_minus_inf():
    args, kw, bnsd, lens, _ = _pfa("BNSD", torch.float32, 0, False, Sq=8, Skv=8)
    mask = torch.zeros(2, 1, 8, 8, dtype=torch.bool)
    mask[:, :, 3] = True  # row 3 sees no key
    kw.update(atten_mask=mask, scale=kw.pop("scale_value"))
    with no_fallback(True):
        out, lse = OPS.fused_infer_attention_score(**_on(args, NPU), **_on(kw, NPU), softmax_lse_flag=True)
    cpu_out, cpu_lse = OPS.fused_infer_attention_score(**args, **kw, softmax_lse_flag=True)
    assert torch.all(out.cpu()[:, :, 3] == 0) and torch.all(torch.isneginf(lse.cpu()[:, :, 3]))
    torch.testing.assert_close(out.cpu(), cpu_out, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(lse.cpu(), cpu_lse, rtol=1e-5, atol=1e-5)


def _check_lengths(layout, dtype, mode, q_lens, kv_lens, use_mask=False, pre=MAX, nxt=0, fused=False):
    B, Sq, Skv = len(q_lens), 9, 11
    args, bnsd, lens = make_inputs(layout, B=B, N1=4, N2=2, Sq=Sq, Skv=Skv, D=16, dtype=dtype, q_lens=q_lens,
                                   kv_lens=kv_lens, seed=len(q_lens) + mode)
    mask = _mask(mode, Sq, Skv, B) if use_mask else None
    kw = dict(num_heads=4, num_key_value_heads=2, input_layout=layout, sparse_mode=mode, pre_tokens=pre,
              next_tokens=nxt, atten_mask=mask)
    what = f"lengths {layout} {dtype} mode {mode} mask {use_mask} {q_lens} {kv_lens} fused {fused}"
    ref64, lse64 = reference(bnsd, lens, layout, SCALE, mask=mask, pre=pre, nxt=nxt, mode=mode)
    same, _ = reference(bnsd, lens, layout, SCALE, mask=mask, pre=pre, nxt=nxt, mode=mode, dtype=dtype)
    if fused:
        out, lse = OPS.fused_infer_attention_score(**_on(args, NPU), **_on(kw, NPU), scale=SCALE,
                                                   softmax_lse_flag=True)
        cpu_out, cpu_lse = OPS.fused_infer_attention_score(**args, **kw, scale=SCALE, softmax_lse_flag=True)
        torch.testing.assert_close(lse.cpu(), cpu_lse, rtol=1e-4, atol=1e-4, msg=what)
    else:
        out = OPS.prompt_flash_attention(**_on(args, NPU), **_on(kw, NPU), scale_value=SCALE)
        cpu_out = OPS.prompt_flash_attention(**args, **kw, scale_value=SCALE)
    assert out.shape == cpu_out.shape and out.device.type == NPU, what
    check_tolerance(what, out.cpu(), ref64, same)


def case_per_batch_lengths_launch_once_per_sequence():
    """actual_seq_lengths / actual_seq_lengths_kv shorter than the padded tensors (what serving engines pass):
    one kernel launch per sequence with its own band; padded rows and keyless sequences are zero (lse -inf)."""
    with no_fallback(True):
        for layout in ("BSH", "BSND", "BNSD", "BNSD_BSND"):
            _check_lengths(layout, torch.float32, 3, [9, 4, 7], [11, 6, 7])
        for mode, use_mask, pre, nxt in [(0, False, MAX, 0), (0, True, MAX, 0), (0, True, 3, 2), (2, True, MAX, 0),
                                         (4, True, 4, 1)]:
            _check_lengths("BNSD", torch.float16, mode, [9, 5], [11, 8], use_mask, pre, nxt)
        _check_lengths("BSND", torch.bfloat16, 3, [9, 0, 3], [11, 4, 0], fused=True)
        _check_lengths("BSH", torch.float32, 0, [2, 9], [11, 3], True, fused=True)


def case_what_the_kernel_does_not_take_runs_the_cpu_kernel():
    """TND: the CPU kernel's result (and a refusal naming the reason when CPU fallbacks are refused)."""
    targs, _, _ = make_inputs("TND", B=2, N1=2, N2=2, Sq=5, Skv=6, D=16, q_lens=[5, 2], kv_lens=[6, 3])
    tkw = dict(num_heads=2, scale_value=SCALE, input_layout="TND", sparse_mode=0)
    torch.testing.assert_close(OPS.prompt_flash_attention(**_on(targs, NPU), **tkw).cpu(),
                               OPS.prompt_flash_attention(**targs, **tkw))
    with no_fallback(True):
        try:
            OPS.prompt_flash_attention(**_on(targs, NPU), **tkw)
        except RuntimeError as e:
            assert "TND" in str(e), str(e)
        else:
            raise AssertionError("no refusal with fallbacks off")


def case_bad_input_errors_match_the_cpu_op():
    args, kw, _, _, _ = _pfa("BSND", torch.float32, 0, False, Sq=6, Skv=6)
    bad = [dict(num_heads=3), dict(input_layout="SBH"), dict(sparse_mode=9), dict(inner_precise=7),
           dict(num_key_value_heads=3), dict(scale_value=float("inf"))]
    with no_fallback(True):
        for change in bad:
            assert_same_error(lambda device: OPS.prompt_flash_attention(**_on(args, device), **{**kw, **change}), change)


def case_empty_query():
    args, kw, _, _, _ = _pfa("BNSD", torch.float32, 0, False, B=0, Sq=4, Skv=4)
    with no_fallback(True):
        out = OPS.prompt_flash_attention(**_on(args, NPU), **kw)
    assert out.shape == OPS.prompt_flash_attention(**args, **kw).shape and out.device.type == NPU


# ---- paged caches (block_table) -------------------------------------------------------------------------------------
def _paged_call(layout, sq, kv_lens, dtype=torch.float32, overrides=None, **kw):
    """A fused call on a paged cache (test_fia_paged's layout of blocks, NaN in unused ones), on npu and on CPU;
    `overrides` replaces paging arguments (bad-input cases)."""
    from test.inference import test_fia_paged as P

    q, k, v = P._inputs(sq, dtype)
    caches = [P._paged(t, layout, P.TABLE) for t in (k, v)]
    args = dict(block_table=P.TABLE, block_size=P.BS, actual_seq_lengths_kv=torch.tensor(kv_lens), **kw)
    args.update(overrides or {})

    def call(device):
        on = {k_: (v_.to(device) if isinstance(v_, torch.Tensor) else v_) for k_, v_ in args.items()}
        return OPS.fused_infer_attention_score(to_layout(q, layout).to(device), caches[0].to(device),
                                               caches[1].to(device), num_heads=P.N1, num_key_value_heads=P.N2,
                                               scale=P.SCALE, input_layout=layout, **on)
    return call


def _check_paged_prefill(layout, sq, lens, mode):
    call = _paged_call(layout, sq, lens, sparse_mode=mode, softmax_lse_flag=True)
    with no_fallback(True):
        out, lse = call(NPU)
    ref_out, ref_lse = call("cpu")
    torch.testing.assert_close(out.cpu(), ref_out, rtol=2e-5, atol=2e-5, msg=f"{layout} {sq} {lens}")
    torch.testing.assert_close(lse.cpu(), ref_lse, rtol=2e-5, atol=2e-5, msg=f"{layout} {sq} {lens} lse")


def case_paged_prefill_gathers_blocks_onto_the_kernel():
    """Sq > 1 on a paged cache: the blocks are gathered and the FlashAttention kernel runs (fallbacks refused) —
    once when every sequence has the same length, once per sequence when they differ; out and lse equal the CPU
    op's paged path."""
    for layout in ("BSH", "BSND", "BNSD"):
        for sq, lens, mode in ((37, [37, 37], 3), (9, [40, 40], 0), (16, [48, 48], 2)):
            _check_paged_prefill(layout, sq, lens, mode)
    for layout, sq, lens, mode in (("BSND", 12, [20, 37], 3), ("BNSD", 9, [40, 9], 0), ("BSH", 16, [16, 48], 2)):
        _check_paged_prefill(layout, sq, lens, mode)


def case_paged_decode_runs_the_decode_kernel():
    """One query token on a paged cache: the decode op's Ascend C kernel reads the cache in place (fallbacks
    refused), also for sequences of different lengths."""
    for layout in ("BSH", "BNSD"):
        call = _paged_call(layout, 1, [20, 37])
        with no_fallback(True):
            out, _ = call(NPU)
        ref, _ = call("cpu")
        torch.testing.assert_close(out.cpu(), ref, rtol=2e-5, atol=2e-5, msg=layout)


def case_paged_bad_inputs_raise_the_cpu_ops_errors():
    from test.inference import test_fia_paged as P

    bad = [dict(block_size=0), dict(block_table=P.TABLE.float()), dict(block_table=P.TABLE + 100),
           dict(actual_seq_lengths_kv=torch.tensor([20, 99]))]
    with no_fallback(True):
        for change in bad:
            assert_same_error(_paged_call("BSND", 5, [20, 37], overrides=change), change)


def case_int8_kv_prefill_dequantises_onto_the_kernel():
    """An int8 cache (KV antiquant), contiguous or paged, with more than one query row, or one row with the lse:
    the factors dequantise the keys on the device to the query's dtype, then the kernel runs (per sequence: the
    lengths differ) — against the float64 reference of the dequantised cache (fallbacks refused)."""
    from test.inference import int8_cases as I
    from test.inference.test_int8_kv import _prefill_reference

    cases = [I.Case(layout="BNSD", dtype="bf16", kv_len=80, lens=(80, 33, 5), k_mode=0, v_mode=1, q_heads=4),
             I.Case(layout="BNSD", dtype="fp16", kv_len=80, lens=(80, 33, 5), k_mode=3, v_mode=3, q_heads=4,
                    offset=False),
             I.Case(layout="BNSD", dtype="fp16", kv_len=64, lens=(64, 64, 64), form="stacked", k_mode=1, v_mode=1,
                    q_heads=4),
             # paged int8 caches: the blocks gathered as int8, then dequantised
             I.Case(layout="BNSD", dtype="bf16", kv_len=256, block=128, lens=(256, 100, 1), paged_4d=True, q_heads=4),
             I.Case(layout="BNSD", dtype="fp16", kv_len=256, block=128, lens=(250, 128, 3), form="stacked", k_mode=1,
                    v_mode=1, q_heads=4)]
    for case in cases:
        inp = I.build(case)
        a, dt = inp.args, I.DTYPES[case.dtype]
        for sq in (4, 1):
            q = torch.randn(case.batch, case.q_heads, sq, case.head_dim, generator=torch.Generator().manual_seed(sq))
            q = q.to(dt)
            kw = dict(num_heads=a[8], scale=a[9], input_layout=a[10], num_key_value_heads=a[11],
                      actual_seq_lengths_kv=a[5], softmax_lse_flag=True, **inp.kwargs)
            if case.block:
                kw.update(block_table=a[6], block_size=a[12])
            with no_fallback(True):
                out, lse = OPS.fused_infer_attention_score(q.to(NPU), a[1].to(NPU), a[2].to(NPU), **_on(kw, NPU))
            what = f"int8 {case} Sq={sq}"
            ref, ref_lse = _prefill_reference(q, inp.kd, inp.vd, inp.lens, case.scale, torch.float64)
            same, same_lse = _prefill_reference(q, inp.kd, inp.vd, inp.lens, case.scale, dt)
            check_tolerance(what, out.cpu(), ref, same)
            finite = torch.isfinite(ref_lse)
            assert torch.equal(torch.isfinite(lse.cpu()[..., 0]), finite), what
            check_tolerance(what + " lse", lse.cpu()[..., 0][finite], ref_lse[finite], same_lse[finite])
