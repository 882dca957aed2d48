"""prompt_flash_attention and fused_infer_attention_score prefill on the simulated npu device: the FlashAttention
forward Ascend C kernel (through the CPU runtime) against the float64 reference of test/inference/prefill_cases.py
and the CPU backend. Run by test_prefill.py through runner_worker.py (the device is already enabled here).

The grid runs with CPU fallbacks refused, so it proves the kernel ran: layouts BSH / BSND / BNSD / BNSD_BSND, GQA,
fp32 / fp16 / bf16, sparse modes 0-4 with and without masks, query and key lengths that are not multiples of the
tiles; per-batch lengths (one launch per sequence), also on paged caches; every shape of atten_mask the ops take
(2-D, 3-D [B or 1, Sq, Skv], 4-D with or without batch and head axes; the compressed 2048x2048 mask of modes 2-4).
Calls the kernel does not take (TND, pse_shift, int8 caches) run the CPU kernel and give its result.
"""
import torch

from test.common.reference import check_tolerance
from test.inference.prefill_cases import MAX, TOL, make_inputs, reference, to_layout
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


# ---- every atten_mask shape of modes 0 / 1 ------------------------------------------------------------------------
# (The 2048x2048 compressed mask of modes 2-4 is in case_sparse_modes_and_masks and the per-batch / paged cases.)
MASK_SHAPES = {  # name -> shape for (B, N1, Sq, Skv)
    "SS": lambda b, n, sq, skv: (sq, skv),
    "BSS": lambda b, n, sq, skv: (b, sq, skv),
    "1SS": lambda b, n, sq, skv: (1, sq, skv),
    "B1SS": lambda b, n, sq, skv: (b, 1, sq, skv),
    "BNSS": lambda b, n, sq, skv: (b, n, sq, skv),
    "11SS": lambda b, n, sq, skv: (1, 1, sq, skv),
    "1NSS": lambda b, n, sq, skv: (1, n, sq, skv),
}


def _shaped_mask(kind, b, n, sq, skv, seed=0):
    """A random bool mask (True = masked out) of the named shape, its row 1 fully masked (zeros, never NaN)."""
    g = torch.Generator().manual_seed(seed)
    m = torch.rand(MASK_SHAPES[kind](b, n, sq, skv), generator=g) < 0.3
    m[..., 1, :] = True
    return m


def _as_4d(mask):
    """The same mask as [B or 1, N or 1, Sq, Skv] (how the ops read a 2-D / 3-D one)."""
    return mask[None, None] if mask.dim() == 2 else mask[:, None] if mask.dim() == 3 else mask


def _check_mask_call(what, call, ref_kw, bnsd, lens, layout, dtype, mask):
    """call(device, mask) on npu (fallbacks refused) against float64, the CPU op and the same call with the mask as
    an equivalent 4-D tensor (the kernel must read both alike)."""
    with no_fallback(True):
        out = call(NPU, mask)
        out4 = call(NPU, _as_4d(mask))
    assert out.device.type == NPU and out.dtype == dtype, what
    ref64, _ = reference(bnsd, lens, layout, SCALE, mask=mask, **ref_kw)
    same, _ = reference(bnsd, lens, layout, SCALE, mask=mask, dtype=dtype, **ref_kw)
    check_tolerance(what, out.cpu(), ref64, same)
    cpu = call("cpu", mask)
    torch.testing.assert_close(out.cpu(), cpu, rtol=TOL[dtype], atol=TOL[dtype], msg=what)
    assert torch.equal(out.cpu(), out4.cpu()), f"{what}: differs from its 4-D form"


def _check_mask_shape(fused, kind, layout, dtype, mode, pre=MAX, nxt=0, q_lens=None, kv_lens=None):
    B, N1, Sq, Skv = 2, 4, 19, 37
    args, bnsd, lens = make_inputs(layout, B=B, N1=N1, N2=2, Sq=Sq, Skv=Skv, D=16, dtype=dtype, q_lens=q_lens,
                                   kv_lens=kv_lens, seed=len(kind))
    kw = dict(num_heads=N1, num_key_value_heads=2, input_layout=layout, sparse_mode=mode, pre_tokens=pre,
              next_tokens=nxt)

    def call(device, mask):
        if fused:
            return OPS.fused_infer_attention_score(**_on(args, device), **kw, atten_mask=mask.to(device),
                                                   scale=SCALE)[0]
        return OPS.prompt_flash_attention(**_on(args, device), **kw, atten_mask=mask.to(device), scale_value=SCALE)

    what = f"{'fia' if fused else 'pfa'} mask {kind} {layout} {dtype} mode {mode} pre {pre} next {nxt} lens {lens}"
    mask = _shaped_mask(kind, B, N1, Sq, Skv, seed=mode)
    _check_mask_call(what, call, dict(pre=pre, nxt=nxt, mode=mode), bnsd, lens, layout, dtype, mask)


def case_every_mask_shape_runs_the_kernel():
    """2-D, 3-D and 4-D masks, with and without batch / head axes, in modes 0 (with a band) and 1: the kernel reads
    each as the CPU op does (a 3-D [B, Sq, Skv] mask is per batch, shared by the heads)."""
    for i, kind in enumerate(MASK_SHAPES):
        layout = ("BNSD", "BSND", "BSH", "BNSD_BSND")[i % 4]
        dtype = (torch.float32, torch.float16, torch.bfloat16)[i % 3]
        _check_mask_shape(False, kind, layout, dtype, 0, pre=9, nxt=4)
        _check_mask_shape(True, kind, layout, torch.float32, 1)


def case_every_mask_shape_with_per_batch_lengths():
    """Sequences shorter than the padded tensors (one launch per sequence): each launch gets its sequence's slice of
    the mask, whatever its shape."""
    for i, kind in enumerate(MASK_SHAPES):
        _check_mask_shape(i % 2 == 0, kind, ("BSND", "BNSD")[i % 2], torch.float32, i % 2, q_lens=[19, 7],
                          kv_lens=[30, 37])


def case_torch_npu_fia_causal_3d_mask_example():
    """torch_npu's documented FIA prefill example with a (1, Q_S, KV_S) bool mask built by tril, computed literally
    with CANN's polarity (True = masked out, so the last row sees no key and is zero)."""
    q = torch.randn(1, 2, 16, 64, generator=torch.Generator().manual_seed(3)).to(torch.float16)
    mask = torch.tril(torch.ones(16, 16, dtype=torch.bool))[None]
    lens = ([16], [16])
    with no_fallback(True):
        out, _ = OPS.fused_infer_attention_score(q.to(NPU), q.to(NPU), q.to(NPU), atten_mask=mask.to(NPU),
                                                 num_heads=2, input_layout="BNSD", scale=0.125)
    ref64, _ = reference((q, q, q), lens, "BNSD", 0.125, mask=mask, pre=MAX, nxt=MAX)
    same, _ = reference((q, q, q), lens, "BNSD", 0.125, mask=mask, pre=MAX, nxt=MAX, dtype=torch.float16)
    check_tolerance("torch_npu FIA example 3", out.cpu(), ref64, same)
    cpu, _ = OPS.fused_infer_attention_score(q, q, q, atten_mask=mask, num_heads=2, input_layout="BNSD", scale=0.125)
    torch.testing.assert_close(out.cpu(), cpu, rtol=TOL[torch.float16], atol=TOL[torch.float16])


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

    def call(device, atten_mask=None):
        if atten_mask is not None:
            args["atten_mask"] = atten_mask
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


def _check_paged_mask(kind, layout, mode, lens, seed=0):
    """A paged prefill call (Sq = 7) with a mask of the named shape, its last dim covering the longest sequence
    (indexed by key position), fallbacks refused."""
    from test.inference import test_fia_paged as P

    sq = 7
    mask = _shaped_mask(kind, P.B, P.N1, sq, P.S, seed=seed)
    call = _paged_call(layout, sq, lens, sparse_mode=mode, pre_tokens=MAX, next_tokens=MAX)
    what = f"paged mask {kind} {layout} mode {mode} lens {lens}"
    _check_mask_call(what, lambda device, m: call(device, m)[0], dict(mode=mode, pre=MAX, nxt=MAX), P._inputs(sq),
                     ([sq] * P.B, lens), layout, torch.float32, mask)


def case_paged_prefill_every_mask_shape():
    """A paged prefill call with a mask of every shape: the gathered keys and the sliced mask run on the kernel,
    once (equal lengths) or per sequence."""
    for i, kind in enumerate(MASK_SHAPES):
        _check_paged_mask(kind, ("BSH", "BSND", "BNSD")[i % 3], i % 2, [37, 37] if i % 2 else [20, 37], seed=i)


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
