"""prompt_flash_attention, fused_infer_attention_score and attention_update against a float64 reference:
layouts (incl. BNSD_BSND, TND) x GQA x ragged per-batch lengths (incl. 0 and 1) x dtypes x sparse modes x masks /
pse_shift; padded rows; FIA lse; merging halves; gradients; torch.compile; one test per bad-input rule."""
import math

import pytest
import torch

import torch_ops_transformer as tot
from test.inference.prefill_cases import DTYPES, MAX, TOL, make_inputs, reference

OPS = torch.ops.npu_fa
LAYOUTS = ("BSH", "BSND", "BNSD", "BNSD_BSND", "TND")
Q_LENS, KV_LENS = [9, 0, 1], [11, 5, 0]   # ragged: a full sequence, an empty query, a single query with no keys


def _pfa(args, layout, N1, scale, **kw):
    a = dict(args)
    q, k, v = a.pop("query"), a.pop("key"), a.pop("value")
    return OPS.prompt_flash_attention(q, k, v, num_heads=N1, scale_value=scale, input_layout=layout, **a, **kw)


def _close(out, ref, dtype):
    tol = TOL[dtype]
    torch.testing.assert_close(out.double(), ref, atol=tol, rtol=tol)


@pytest.mark.asan
@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("mode", [0, 3])
def test_layouts_gqa_ragged(layout, dtype, mode):
    dt = DTYPES[dtype]
    args, bnsd, lens = make_inputs(layout, dtype=dt, q_lens=Q_LENS, kv_lens=KV_LENS)
    scale = 0.25
    out = _pfa(args, layout, 4, scale, sparse_mode=mode)
    ref, _ = reference(bnsd, lens, layout, scale, mode=mode)
    assert out.dtype == dt and out.shape == ref.shape
    _close(out, ref, dt)


@pytest.mark.asan
@pytest.mark.parametrize("layout", ["BSND", "BNSD_BSND", "BSH"])
def test_padded_rows_are_zeros(layout):
    args, bnsd, lens = make_inputs(layout, q_lens=[4, 0, 1], kv_lens=[11, 3, 2])
    for _ in range(2):  # the output is freshly allocated each call; never stale memory
        out = _pfa(args, layout, 4, 0.3)
        ref, _ = reference(bnsd, lens, layout, 0.3)
        seq_axis = 2 if layout == "BNSD" else 1
        assert torch.all(out.narrow(seq_axis, 4, 5) == 0)
        assert torch.all(out[1] == 0) and not torch.isnan(out).any()
        _close(out, ref, torch.float32)


MASKS = (None, "SS", "B1SS", "BNSS", "BSS", "11SS")
# modes 0 (with and without a mask, several bands), 1 (mask only); 2-4 generate their pattern (no mask)
MODE_CASES = ([(0, pre, nxt, m) for pre, nxt in ((MAX, 0), (3, 2), (2, -1)) for m in MASKS]
              + [(1, MAX, MAX, m) for m in MASKS[1:]]
              + [(2, MAX, MAX, None), (3, MAX, MAX, None), (4, 3, 1, None), (4, 2, 0, None)])


@pytest.mark.parametrize("mode,pre,nxt,mask", MODE_CASES)
def test_sparse_modes_and_masks(mode, pre, nxt, mask):
    """Ragged lengths with every mask shape ([Sq,Skv], [B,1,..], [B,N,..], [B,Sq,Skv], [1,1,..]) and band."""
    args, bnsd, lens = make_inputs("BSND", q_lens=[9, 6, 1], kv_lens=[11, 8, 4])
    g = torch.Generator().manual_seed(3)
    shapes = {"SS": (9, 11), "B1SS": (3, 1, 9, 11), "BNSS": (3, 4, 9, 11), "BSS": (3, 9, 11), "11SS": (1, 1, 9, 11)}
    m = None
    if mask:
        m = torch.rand(shapes[mask], generator=g) < 0.3
        m[..., 2, :] = True  # a fully masked row: zeros, never NaN
    out = _pfa(args, "BSND", 4, 0.3, atten_mask=m, sparse_mode=mode, pre_tokens=pre, next_tokens=nxt)
    ref, _ = reference(bnsd, lens, "BSND", 0.3, mask=m, pre=pre, nxt=nxt, mode=mode)
    assert not torch.isnan(out).any()
    _close(out, ref, torch.float32)


def test_default_next_tokens_zero_is_causal_with_mask_full_without():
    args, bnsd, lens = make_inputs("BNSD", Sq=7, Skv=7)
    nomask = torch.zeros(7, 7, dtype=torch.bool)
    causal = _pfa(args, "BNSD", 4, 0.3, atten_mask=nomask)              # band j <= i + 0
    full = _pfa(args, "BNSD", 4, 0.3)                                   # pre/next ignored
    _close(causal, reference(bnsd, lens, "BNSD", 0.3, mode=2)[0], torch.float32)
    _close(full, reference(bnsd, lens, "BNSD", 0.3, mode=1)[0], torch.float32)


@pytest.mark.parametrize("pse", ["BNSS", "1NSS", "BN1S"])
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_pse_shift(pse, dtype):
    dt = DTYPES[dtype]
    args, bnsd, lens = make_inputs("BNSD", dtype=dt, q_lens=[9, 3, 1], kv_lens=[11, 4, 11])
    shape = {"BNSS": (3, 4, 9, 11), "1NSS": (1, 4, 9, 11), "BN1S": (3, 4, 1, 11)}[pse]
    p = torch.randn(shape).to(dt)
    out = _pfa(args, "BNSD", 4, 0.3, pse_shift=p, sparse_mode=3)
    ref, _ = reference(bnsd, lens, "BNSD", 0.3, pse=p, mode=3)
    _close(out, ref, dt)


def test_wrapper_lists_and_num_kv_heads():
    args, bnsd, lens = make_inputs("BSH", q_lens=[5, 2, 9], kv_lens=[3, 11, 1])
    out = tot.npu_prompt_flash_attention(args["query"], args["key"], args["value"], actual_seq_lengths=[5, 2, 9],
                                         actual_seq_lengths_kv=[3, 11, 1], num_heads=4, num_key_value_heads=2,
                                         scale_value=0.3, input_layout="BSH", sparse_mode=3,
                                         atten_mask=torch.ones(2048, 2048, dtype=torch.bool).triu(1))
    _close(out, reference(bnsd, lens, "BSH", 0.3, mode=3)[0], torch.float32)


@pytest.mark.parametrize("layout", ["BSND", "TND", "BNSD_BSND"])
def test_fia_prefill_equals_pfa_and_lse(layout):
    args, bnsd, lens = make_inputs(layout, q_lens=Q_LENS, kv_lens=KV_LENS)
    a = dict(args)
    q, k, v = a.pop("query"), a.pop("key"), a.pop("value")
    causal = torch.ones(1, 2048, 2048, dtype=torch.bool).triu(1)   # torch_npu: modes 2-4 take the optimised mask
    out, lse = tot.npu_fused_infer_attention_score(q, k, v, num_heads=4, scale=0.3, input_layout=layout,
                                                   sparse_mode=3, atten_mask=causal, softmax_lse_flag=True, **a)
    pfa = _pfa(args, layout, 4, 0.3, sparse_mode=3)
    assert torch.equal(out, pfa)
    ref_out, ref_lse = reference(bnsd, lens, layout, 0.3, mode=3)
    _close(out, ref_out, torch.float32)
    assert lse.dtype == torch.float32
    if layout == "TND":
        ref_lse = torch.cat([ref_lse[b, :, :L].transpose(0, 1) for b, L in enumerate(lens[0])])[..., None]
    else:
        ref_lse = ref_lse[..., None]
    assert lse.shape == ref_lse.shape
    torch.testing.assert_close(lse.double(), ref_lse, atol=1e-5, rtol=1e-5)  # -inf where no key / padded
    _, empty = tot.npu_fused_infer_attention_score(q, k, v, num_heads=4, scale=0.3, input_layout=layout, **a)
    assert empty.numel() == 0


@pytest.mark.asan
def test_fia_paged_lse_equals_contiguous():
    """softmax_lse with block_table: the used blocks are gathered and the prefill path gives out and lse (masks,
    bands and sparse modes with block_table: test_fia_paged.py)."""
    B, N1, N2, D, bs = 2, 4, 2, 16, 16
    g = torch.Generator().manual_seed(6)
    for layout in ("BSH", "BNSD"):
        if layout == "BSH":
            cache = torch.randn(6, bs, N2 * D, generator=g)
            q = torch.randn(B, 1, N1 * D, generator=g)
        else:
            cache = torch.randn(6, N2, bs, D, generator=g)
            q = torch.randn(B, N1, 1, D, generator=g)
        bt = torch.tensor([[5, 2, -1], [1, -1, -1]], dtype=torch.int32)   # -1: unused slots are never read
        lens = [23, 16]
        out, lse = tot.npu_fused_infer_attention_score(q, cache, cache, block_table=bt, block_size=bs,
                                                       actual_seq_lengths_kv=lens, num_heads=N1, scale=0.3,
                                                       num_key_value_heads=N2, input_layout=layout,
                                                       softmax_lse_flag=True)
        used = [[5, 2], [1, 0]]
        if layout == "BSH":
            k = torch.stack([cache[u].flatten(0, 1) for u in used])                     # [B, 32, N2*D]
        else:
            k = torch.stack([cache[u].transpose(0, 1).flatten(1, 2) for u in used])     # [B, N2, 32, D]
        ref_out, ref_lse = tot.npu_fused_infer_attention_score(q, k, k, actual_seq_lengths_kv=lens, num_heads=N1,
                                                               scale=0.3, num_key_value_heads=N2,
                                                               input_layout=layout, softmax_lse_flag=True)
        assert lse.shape == (B, N1, 1, 1)
        torch.testing.assert_close(out, ref_out)
        torch.testing.assert_close(lse, ref_lse)
        if hasattr(OPS, "incre_flash_attention"):
            dec, _ = tot.npu_fused_infer_attention_score(q, cache, cache, block_table=bt, block_size=bs,
                                                         actual_seq_lengths_kv=lens, num_heads=N1, scale=0.3,
                                                         num_key_value_heads=N2, input_layout=layout)
            torch.testing.assert_close(dec, out, atol=2e-5, rtol=2e-5)


@pytest.mark.asan
@pytest.mark.skipif(not hasattr(torch.ops.npu_fa, "incre_flash_attention"), reason="decode op not in this build")
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_fia_paged_decode_equals_contiguous_prefill(dtype):
    dt = DTYPES[dtype]
    B, N1, N2, D, bs = 2, 4, 2, 16, 16
    g = torch.Generator().manual_seed(5)
    cache_k = torch.randn(5, bs, N2 * D, generator=g).to(dt)
    cache_v = torch.randn(5, bs, N2 * D, generator=g).to(dt)
    bt = torch.tensor([[3, 1], [0, 4]], dtype=torch.int32)
    lens = [20, 5]
    q = torch.randn(B, 1, N1 * D, generator=g).to(dt)
    out, lse = tot.npu_fused_infer_attention_score(q, cache_k, cache_v, block_table=bt, block_size=bs,
                                                   actual_seq_lengths_kv=lens, num_heads=N1,
                                                   num_key_value_heads=N2, scale=0.3, input_layout="BSH")
    assert lse.numel() == 0 and out.shape == q.shape
    k = torch.stack([cache_k[bt[b].long()].flatten(0, 1) for b in range(B)])   # [B, 32, N2*D], valid up to lens
    v = torch.stack([cache_v[bt[b].long()].flatten(0, 1) for b in range(B)])
    ref = OPS.prompt_flash_attention(q, k, v, actual_seq_lengths_kv=torch.tensor(lens), num_heads=N1,
                                     num_key_value_heads=N2, scale_value=0.3, input_layout="BSH")
    tol = TOL[dt]
    torch.testing.assert_close(out.float(), ref.float(), atol=tol, rtol=tol)


# ---- attention_update ----

@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_attention_update_two_halves_equal_full(dtype):
    dt = DTYPES[dtype]
    args, bnsd, lens = make_inputs("BNSD", dtype=dt, B=2, Sq=6, Skv=16)
    q, k, v = args["query"], args["key"], args["value"]
    m = torch.rand(6, 16) < 0.3
    m[1, :8] = True   # row 1 sees nothing in the first half: partial lse -inf
    m[2, :] = True    # row 2 sees nothing at all
    parts = []
    for sl in (slice(0, 8), slice(8, 16)):
        parts.append(OPS.fused_infer_attention_score(q, k[:, :, sl], v[:, :, sl], atten_mask=m[:, sl].contiguous(),
                                                     num_heads=4, scale=0.3, input_layout="BNSD", sparse_mode=1,
                                                     softmax_lse_flag=True))
    assert torch.isinf(parts[0][1][:, :, 1]).all()
    out, lse = tot.attention_update([p[1] for p in parts], [p[0] for p in parts])
    ref, ref_lse = reference(bnsd, lens, "BNSD", 0.3, mask=m, mode=1)
    assert not torch.isnan(out).any() and not torch.isnan(lse).any()
    _close(out, ref, dt)
    torch.testing.assert_close(lse.double(), ref_lse[..., None], atol=1e-5, rtol=1e-5)  # FIA's [B,N,Sq,1] kept
    assert torch.all(out[:, :, 2] == 0) and torch.isinf(lse[:, :, 2]).all()


def test_attention_update_gradcheck_float64():
    g = torch.Generator().manual_seed(2)
    lse = torch.randn(3, 2, 4, generator=g, dtype=torch.float64)
    lse[1, 0, 0] = -math.inf
    out = torch.randn(3, 2, 4, 5, generator=g, dtype=torch.float64)
    lse.requires_grad_()
    out.requires_grad_()
    assert torch.autograd.gradcheck(OPS.attention_update, (lse, out))


@pytest.mark.asan
def test_attention_update_all_empty_row_has_zero_grads():
    # finite differences cannot see through lse = -inf - (-inf); check the analytic result: exact zeros, no NaN
    lse = torch.full((2, 3), -math.inf)
    lse[:, 0] = torch.tensor([0.5, -1.0])
    lse = lse.requires_grad_()
    out = torch.randn(2, 3, 4).requires_grad_()
    res, L = OPS.attention_update(lse, out)
    assert torch.isinf(L[1:]).all() and torch.all(res[1:] == 0)
    (res.sum() + L[0]).backward()
    assert torch.all(lse.grad[:, 1:] == 0) and torch.all(out.grad[:, 1:] == 0)
    assert not torch.isnan(lse.grad).any() and not torch.isnan(out.grad).any()


def test_attention_update_grad_float32_matches_autograd_reference():
    g = torch.Generator().manual_seed(4)
    lse = torch.randn(2, 3, 7, generator=g).requires_grad_()
    out = torch.randn(2, 3, 7, 8, generator=g).requires_grad_()
    res, L = OPS.attention_update(lse, out)
    go, gl = torch.randn_like(res), torch.randn_like(L)
    (res * go).sum().add((L * gl).sum()).backward()
    l64, o64 = lse.detach().double().requires_grad_(), out.detach().double().requires_grad_()
    L64 = torch.logsumexp(l64, 0)
    r64 = (torch.exp(l64 - L64)[..., None] * o64).sum(0)
    (r64 * go.double()).sum().add((L64 * gl.double()).sum()).backward()
    torch.testing.assert_close(lse.grad.double(), l64.grad, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out.grad.double(), o64.grad, atol=1e-5, rtol=1e-5)


# ---- torch.compile ----

def test_compile_dynamic_lengths_no_recompile(dynamo_reset):
    from torch._dynamo.testing import CompileCounterWithBackend

    cnt = CompileCounterWithBackend("aot_eager")

    def f(q, k, v, ql, kl):
        return OPS.prompt_flash_attention(q, k, v, actual_seq_lengths=ql, actual_seq_lengths_kv=kl, num_heads=4,
                                          scale_value=0.3, input_layout="BSND", sparse_mode=3)

    cf = torch.compile(f, backend=cnt, fullgraph=True, dynamic=True)
    for ql, kl in (([9, 0, 1], [11, 5, 0]), ([3, 9, 2], [4, 11, 11])):
        args, bnsd, lens = make_inputs("BSND", q_lens=ql, kv_lens=kl)
        out = cf(args["query"], args["key"], args["value"], args["actual_seq_lengths"], args["actual_seq_lengths_kv"])
        _close(out, reference(bnsd, lens, "BSND", 0.3, mode=3)[0], torch.float32)
    assert cnt.frame_count == 1


def test_compile_fia_and_attention_update_backward(dynamo_reset):
    def f(q, k, v):
        o1, l1 = OPS.fused_infer_attention_score(q, k[:, :, :5], v[:, :, :5], num_heads=4, scale=0.3,
                                                 input_layout="BNSD", softmax_lse_flag=True)
        o2, l2 = OPS.fused_infer_attention_score(q, k[:, :, 5:], v[:, :, 5:], num_heads=4, scale=0.3,
                                                 input_layout="BNSD", softmax_lse_flag=True)
        return tot.attention_update([l1, l2], [o1, o2])

    args, bnsd, lens = make_inputs("BNSD")
    out, lse = torch.compile(f, backend="aot_eager", fullgraph=True)(args["query"], args["key"], args["value"])
    _close(out, reference(bnsd, lens, "BNSD", 0.3, mode=1)[0], torch.float32)
    lse_in = torch.randn(2, 3, 4).requires_grad_()
    out_in = torch.randn(2, 3, 4, 8).requires_grad_()
    cu = torch.compile(lambda a, b: OPS.attention_update(a, b)[0].sum(), backend="aot_eager", fullgraph=True)
    cu(lse_in, out_in).backward()
    assert lse_in.grad is not None and out_in.grad is not None


# ---- bad inputs: one test per rule ----

def _ok():
    args, _, _ = make_inputs("BSND")
    return args["query"], args["key"], args["value"]


def test_bad_layout_name():
    q, k, v = _ok()
    with pytest.raises(ValueError, match="input_layout"):
        OPS.prompt_flash_attention(q, k, v, num_heads=4, input_layout="SBH")


@pytest.mark.asan
def test_bad_layout_shape_mismatch():
    q, k, v = _ok()
    with pytest.raises(ValueError, match="4-D"):
        OPS.prompt_flash_attention(q.flatten(2), k, v, num_heads=4, input_layout="BSND")


@pytest.mark.asan
def test_bad_lengths_beyond_padded():
    q, k, v = _ok()
    with pytest.raises(ValueError, match=r"\[0, 9\]"):
        OPS.prompt_flash_attention(q, k, v, actual_seq_lengths=torch.tensor([9, 10, 1]), num_heads=4,
                                   input_layout="BSND")


@pytest.mark.asan
def test_bad_negative_lengths():
    q, k, v = _ok()
    with pytest.raises(ValueError, match="actual_seq_lengths_kv"):
        OPS.prompt_flash_attention(q, k, v, actual_seq_lengths_kv=torch.tensor([3, -1, 2]), num_heads=4,
                                   input_layout="BSND")


@pytest.mark.asan
def test_bad_lengths_count():
    q, k, v = _ok()
    with pytest.raises(ValueError, match="one length per batch"):
        OPS.prompt_flash_attention(q, k, v, actual_seq_lengths=torch.tensor([3, 2]), num_heads=4, input_layout="BSND")


def test_bad_heads_not_divisible():
    args, _, _ = make_inputs("BSND", N1=4, N2=3)
    with pytest.raises(ValueError, match="divide"):
        OPS.prompt_flash_attention(args["query"], args["key"], args["value"], num_heads=4, input_layout="BSND")


def test_bad_num_key_value_heads_mismatch():
    q, k, v = _ok()
    with pytest.raises(ValueError, match="num_key_value_heads"):
        OPS.prompt_flash_attention(q, k, v, num_heads=4, num_key_value_heads=1, input_layout="BSND")


def test_bad_args_are_named_as_the_caller_spells_them():
    """The parser is shared with flash_attention_score; messages must use the inference ops' argument names."""
    q, k, v = _ok()
    with pytest.raises(ValueError, match="'pse_shift' must have shape"):
        OPS.prompt_flash_attention(q, k, v, pse_shift=torch.zeros(1, 4, 2, 2), num_heads=4, input_layout="BSND")
    with pytest.raises(ValueError, match="'num_heads'=3 does not match"):
        OPS.prompt_flash_attention(q, k, v, num_heads=3, input_layout="BSND")
    with pytest.raises(ValueError, match="'scale_value' must be finite"):
        OPS.prompt_flash_attention(q, k, v, num_heads=4, scale_value=float("nan"), input_layout="BSND")
    with pytest.raises(ValueError, match="'scale' must be finite"):
        OPS.fused_infer_attention_score(q, k, v, num_heads=4, scale=float("inf"), input_layout="BSND")
    t = q.flatten(0, 1)
    with pytest.raises(ValueError, match="'actual_seq_lengths'"):
        OPS.prompt_flash_attention(t, k.flatten(0, 1), v.flatten(0, 1), actual_seq_lengths=torch.tensor([5, 3]),
                                   actual_seq_lengths_kv=torch.tensor([t.shape[0]]), num_heads=4, input_layout="TND")


def test_bad_dtype_mismatch():
    q, k, v = _ok()
    with pytest.raises(TypeError, match="one dtype"):
        OPS.prompt_flash_attention(q, k.half(), v, num_heads=4, input_layout="BSND")


def test_bad_padding_mask_and_quant_args():
    q, k, v = _ok()
    with pytest.raises(ValueError, match="padding_mask"):
        OPS.prompt_flash_attention(q, k, v, padding_mask=torch.zeros(1), num_heads=4, input_layout="BSND")
    with pytest.raises(ValueError, match="quant_scale1"):  # full-quantisation factors need an int8 query
        tot.npu_prompt_flash_attention(q, k, v, quant_scale1=torch.ones(1), num_heads=4, input_layout="BSND")


@pytest.mark.asan
def test_bad_attention_update_shapes():
    with pytest.raises(ValueError, match="out"):
        OPS.attention_update(torch.randn(2, 3), torch.randn(2, 4, 8))
    with pytest.raises(TypeError, match="lse"):
        OPS.attention_update(torch.randn(2, 3).half(), torch.randn(2, 3, 8))


@pytest.mark.parametrize("op", ["prompt_flash_attention", "fused_infer_attention_score", "flash_attention_score"])
def test_compressed_mask_in_torch_npus_three_shapes(op):
    """Modes 2-4: the compressed causal mask as [2048,2048], [1,2048,2048] or [1,1,2048,2048] (torch_npu's
    documented shapes) at the op level, with identical results; another leading size or other content is refused."""
    q = torch.randn(1, 2, 16, 8, generator=torch.Generator().manual_seed(0))
    causal = torch.ones(2048, 2048, dtype=torch.bool).triu(1)

    def call(mask):
        if op == "flash_attention_score":
            return OPS.flash_attention_score(q, q, q, 2, "BNSD", atten_mask=mask, sparse_mode=3, scale=0.3)[0]
        if op == "prompt_flash_attention":
            return OPS.prompt_flash_attention(q, q, q, atten_mask=mask, num_heads=2, input_layout="BNSD",
                                              sparse_mode=3, scale_value=0.3)
        return OPS.fused_infer_attention_score(q, q, q, atten_mask=mask, num_heads=2, input_layout="BNSD",
                                               sparse_mode=3, scale=0.3)[0]
    base = call(causal)
    for mask in (causal[None], causal[None, None]):
        assert torch.equal(call(mask), base)
    for bad in (causal[None].expand(2, 2048, 2048), (~causal)[None, None]):
        with pytest.raises(ValueError, match="atten_mask"):
            call(bad)
