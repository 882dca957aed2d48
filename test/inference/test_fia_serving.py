"""npu_fused_infer_attention_score(_v2) as serving engines call it (vLLM-Ascend's attention backend and the like):
paged prefill with any query length per sequence (chunked prefill, mixed prefill/decode batches), sliding windows
(sparse_mode 4 with pre_tokens/next_tokens) on every path, and learnable sinks (gpt-oss) in prefill, decode and paged
calls. Every case is checked against a float64 reference written here in plain PyTorch, independent of the package:

  one softmax per (sequence, head, query row); a sequence's query rows are the LAST Lq of its Lk positions (row i sits
  at position Lk - Lq + i); sparse_mode 3 keeps keys j <= pos, sparse_mode 4 keeps pos - pre <= j <= pos + next,
  sparse_mode 0 without a mask keeps every key; a sink adds exp(sink[n]) to the denominator only.
"""
import math
from typing import List, Optional

import pytest
import torch

import torch_ops_transformer as tot
from test.common.tiers import pairwise

MAX = 2147483647
N1, N2, D = 4, 2, 16
SCALE = 0.25
CAUSAL = torch.ones(2048, 2048, dtype=torch.bool).triu(1)    # the optimised mask of sparse_modes 2-4


# ---------------------------------------------------------------------------------------------------------------
# Reference (float64, per sequence)
# ---------------------------------------------------------------------------------------------------------------

def ref_sequence(q, k, v, mode, pre=MAX, nxt=MAX, sink=None):
    """q [Lq, N1, D], k/v [Lk, N2, D] -> out [Lq, N1, D] float64, lse [Lq, N1] (with the sink's term)."""
    q, k, v = q.double(), k.double(), v.double()
    lq, lk = q.shape[0], k.shape[0]
    g = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
    s = torch.einsum("qnd,knd->nqk", q, k) * SCALE
    pos = torch.arange(lq)[:, None] + (lk - lq)
    j = torch.arange(lk)[None, :]
    if mode == 0:
        vis = torch.ones(lq, lk, dtype=torch.bool)
    elif mode == 3:
        vis = j <= pos
    elif mode == 4:
        vis = (j >= pos - pre) & (j <= pos + nxt)
    else:
        raise ValueError(mode)
    s = s.masked_fill(~vis, -math.inf)
    if sink is not None:
        s = torch.cat([s, sink.double().view(-1, 1, 1).expand(-1, lq, 1)], -1)
    lse = torch.logsumexp(s, -1)                                    # [N1, Lq]
    p = torch.exp(s - lse[..., None]).nan_to_num(0.0)
    if sink is not None:
        p = p[..., :-1]
    out = torch.einsum("nqk,knd->qnd", p, v)
    return out, lse.transpose(0, 1)


class Batch:
    """Per-sequence q [Lq, N1, D] and k/v [Lk, N2, D] with the query rows at the end of each sequence."""

    def __init__(self, q_lens: List[int], kv_lens: List[int], dtype=torch.float32, seed=0):
        g = torch.Generator().manual_seed(seed)
        self.q_lens, self.kv_lens = list(q_lens), list(kv_lens)
        self.q = [torch.randn(lq, N1, D, generator=g).to(dtype) for lq in q_lens]
        self.k = [torch.randn(lk, N2, D, generator=g).to(dtype) for lk in kv_lens]
        self.v = [torch.randn(lk, N2, D, generator=g).to(dtype) for lk in kv_lens]
        self.dtype = dtype

    def reference(self, mode, pre=MAX, nxt=MAX, sink=None):
        return [ref_sequence(q, k, v, mode, pre, nxt, sink) for q, k, v in zip(self.q, self.k, self.v)]

    # ---- query / contiguous key layouts ----
    def tnd(self, which):
        return torch.cat(getattr(self, which), 0)

    def dense(self, which, layout, pad):
        """[B, pad, N, D] zero-padded at the end, then in `layout`."""
        ts = getattr(self, which)
        x = torch.zeros(len(ts), pad, ts[0].shape[1], D, dtype=self.dtype)
        for b, t in enumerate(ts):
            x[b, :t.shape[0]] = t
        return to_layout(x, layout)

    # ---- paged cache ----
    def paged(self, which, block_size, cache_layout, seed=1):
        """(cache, block_table): blocks of every sequence scattered over a shuffled pool (NaN in unused blocks and
        past each sequence's end, so a read outside the sequence shows); cache (nb, bs, N2*D) or (nb, N2, bs, D)."""
        ts = getattr(self, which)
        per = [max(1, -(-t.shape[0] // block_size)) for t in ts]
        total = sum(per) + 2
        perm = torch.randperm(total, generator=torch.Generator().manual_seed(seed))
        cache = torch.full((total, block_size, N2, D), math.nan, dtype=self.dtype)
        table = torch.zeros(len(ts), max(per) + 1, dtype=torch.int32)   # a spare column: never read
        nxt = 0
        for b, t in enumerate(ts):
            for i in range(per[b]):
                blk = int(perm[nxt]); nxt += 1
                table[b, i] = blk
                rows = t[i * block_size:(i + 1) * block_size]
                cache[blk, :rows.shape[0]] = rows
        if cache_layout == "3d":
            return cache.reshape(total, block_size, N2 * D), table
        if cache_layout == "4d_bsnd":                     # PagedKVCache's default (num_blocks, block_size, N2, D)
            return cache, table
        return cache.transpose(1, 2).contiguous(), table


def to_layout(x, layout):
    """[B, S, N, D] -> BSND / BNSD / BSH."""
    if layout == "BSND":
        return x.contiguous()
    if layout == "BNSD":
        return x.transpose(1, 2).contiguous()
    if layout == "BSH":
        return x.reshape(x.shape[0], x.shape[1], -1).contiguous()
    raise ValueError(layout)


def from_layout(out, layout):
    """The op's output -> [B, S, N1, D]."""
    if layout == "BNSD":
        return out.transpose(1, 2)
    if layout == "BSH":
        return out.view(out.shape[0], out.shape[1], N1, -1)
    return out


def check(name, got, want, dtype):
    """The project's rule: max|ours - ref64| <= 2 * max|same-dtype PyTorch - ref64| + 1e-5; for fp32 the
    same-dtype error is taken as the fp32 rounding of the reference (plus the additive slack)."""
    want = want.double()
    err = (got.double() - want).abs()
    bound = 2 * (want.to(dtype).double() - want).abs().max().item() + (1e-5 if dtype == torch.float32 else 2e-2)
    assert not torch.isnan(got).any(), f"{name}: NaN in the result"
    assert err.max().item() <= bound, f"{name}: max error {err.max().item():.3g} > {bound:.3g}"


def compare(batch, out, lse, refs, layout, lse_flag, pad=None):
    """Compares FIA's (out, lse) in `layout` with the per-sequence references."""
    if layout == "TND":
        check("out", out, torch.cat([r[0] for r in refs]), batch.dtype)
        if lse_flag:
            want = torch.cat([r[1] for r in refs])[..., None]
            finite = torch.isfinite(want)
            assert (torch.isinf(lse) == ~finite).all()
            check("lse", lse[finite], want[finite], torch.float32)
        else:
            assert lse.numel() == 0
        return
    o = from_layout(out, layout)
    for b, (ro, rl) in enumerate(refs):
        lq = ro.shape[0]
        check(f"out[{b}]", o[b, :lq], ro, batch.dtype)
        assert (o[b, lq:] == 0).all(), "rows past a sequence's query length must be zero"
        if lse_flag:                                   # [B, N1, Sq, 1]
            check(f"lse[{b}]", lse[b, :, :lq, 0].transpose(0, 1), rl, torch.float32)
    if not lse_flag:
        assert lse.numel() == 0


def fia(batch, layout, *, paged, mode, pre=MAX, nxt=MAX, lse=False, block_size=16, cache_layout="3d", sink=None,
        v2=False):
    """Calls npu_fused_infer_attention_score(_v2) the way a serving engine does. Dense layouts pad the queries to
    the longest one and pass per-batch lengths; TND passes cumulative query ends and (paged) per-sequence KV lengths
    or (contiguous) cumulative KV ends."""
    mask = CAUSAL if mode in (2, 3, 4) else None
    tnd = layout == "TND"
    if tnd:
        q = batch.tnd("q")
        q_lens = torch.tensor(batch.q_lens).cumsum(0).tolist()
    else:
        pad = max(batch.q_lens)
        q = batch.dense("q", layout, pad)
        q_lens = batch.q_lens
    if paged:
        k, table = batch.paged("k", block_size, cache_layout)
        v, _ = batch.paged("v", block_size, cache_layout)
        kv_lens = batch.kv_lens
        extra = dict(block_table=table, block_size=block_size)
    else:
        if tnd:
            k, v = batch.tnd("k"), batch.tnd("v")
            kv_lens = torch.tensor(batch.kv_lens).cumsum(0).tolist()
        else:
            k, v = (batch.dense(w, layout, max(batch.kv_lens)) for w in ("k", "v"))
            kv_lens = batch.kv_lens
        extra = {}
    if v2 or sink is not None:
        return tot.npu_fused_infer_attention_score_v2(
            q, k, v, atten_mask=mask, actual_seq_qlen=q_lens, actual_seq_kvlen=kv_lens, num_query_heads=N1,
            num_key_value_heads=N2, softmax_scale=SCALE, pre_tokens=pre, next_tokens=nxt, input_layout=layout,
            sparse_mode=mode, return_softmax_lse=lse, learnable_sink=sink, **extra)
    return tot.npu_fused_infer_attention_score(
        q, k, v, atten_mask=mask, actual_seq_lengths=q_lens, actual_seq_lengths_kv=kv_lens, num_heads=N1,
        num_key_value_heads=N2, scale=SCALE, pre_tokens=pre, next_tokens=nxt, input_layout=layout, sparse_mode=mode,
        softmax_lse_flag=lse, **extra)


# ---------------------------------------------------------------------------------------------------------------
# 1. Paged prefill: any query length per sequence, mixed batches, block sizes, both cache layouts
# ---------------------------------------------------------------------------------------------------------------

# q_lens, kv_lens: chunked prefill (a chunk after cached tokens), a whole prompt, decode rows, mixed.
BATCHES = {
    "decode": ([1, 1, 1], [17, 33, 5]),
    "prefill": ([7, 12], [7, 12]),
    "chunked": ([5, 9], [21, 40]),
    "mixed": ([1, 6, 1, 11], [19, 30, 2, 11]),
}


# A dense one-token query is the decode branch (test_decode_branch_*), so the decode batch runs in TND only.
PAGED_PREFILL = [(batch, layout) for batch in BATCHES for layout in ("TND", "BSND", "BNSD", "BSH")
                 if layout == "TND" or max(BATCHES[batch][0]) > 1]


@pytest.mark.parametrize("cache_layout", ["3d", "4d", "4d_bsnd"])
@pytest.mark.parametrize("batch,layout", PAGED_PREFILL)
def test_paged_prefill_causal(batch, layout, cache_layout):
    q_lens, kv_lens = BATCHES[batch]
    b = Batch(q_lens, kv_lens)
    for lse in (False, True):
        out, l = fia(b, layout, paged=True, mode=3, lse=lse, cache_layout=cache_layout)
        compare(b, out, l, b.reference(3), layout, lse)


@pytest.mark.parametrize("block_size", [16, 32, 48, 128, 512])
@pytest.mark.parametrize("cache_layout", ["3d", "4d"])
def test_paged_prefill_block_sizes(block_size, cache_layout):
    # lengths that cross block boundaries for every block size (and fill a 512 block exactly once)
    b = Batch([1, 40, 3], [600, 512, 70], seed=3)
    out, lse = fia(b, "TND", paged=True, mode=3, lse=True, block_size=block_size, cache_layout=cache_layout)
    compare(b, out, lse, b.reference(3), "TND", True)
    out, lse = fia(b, "BSND", paged=True, mode=3, block_size=block_size, cache_layout=cache_layout)
    compare(b, out, lse, b.reference(3), "BSND", False)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_paged_prefill_low_precision(dtype):
    b = Batch(*BATCHES["mixed"], dtype=dtype, seed=5)
    out, lse = fia(b, "TND", paged=True, mode=3, lse=True, cache_layout="4d")
    compare(b, out, lse, b.reference(3), "TND", True)


@pytest.mark.parametrize("layout", ["TND", "BSND"])
def test_paged_full_attention_mode0(layout):
    """Non-causal (encoder-decoder / DCP decode): sparse_mode 0 without a mask sees every key of the sequence."""
    b = Batch([3, 1], [9, 20], seed=6)
    out, lse = fia(b, layout, paged=True, mode=0, lse=True)
    compare(b, out, lse, b.reference(0), layout, True)


def test_paged_zero_kv_length_row():
    """A sequence with no keys on this rank (context-parallel decode): zeros and lse -inf, never NaN."""
    b = Batch([1, 1], [12, 0], seed=7)
    out, lse = fia(b, "TND", paged=True, mode=0, lse=True)
    compare(b, out, lse, b.reference(0), "TND", True)


def test_int8_optimised_mask():
    """vLLM-Ascend builds the 2048x2048 causal mask as int8 (triu ones); it means what the bool mask means."""
    b = Batch(*BATCHES["mixed"], seed=8)
    q = b.tnd("q")
    k, table = b.paged("k", 16, "3d")
    v, _ = b.paged("v", 16, "3d")
    kw = dict(actual_seq_lengths=torch.tensor(b.q_lens).cumsum(0).tolist(), actual_seq_lengths_kv=b.kv_lens,
              block_table=table, block_size=16, num_heads=N1, num_key_value_heads=N2, scale=SCALE,
              input_layout="TND", sparse_mode=3)
    out8, _ = tot.npu_fused_infer_attention_score(q, k, v, atten_mask=CAUSAL.to(torch.int8), **kw)
    out, _ = tot.npu_fused_infer_attention_score(q, k, v, atten_mask=CAUSAL, **kw)
    torch.testing.assert_close(out8, out, rtol=0, atol=0)


# ---------------------------------------------------------------------------------------------------------------
# 2. Sliding windows: sparse_mode 4 on every path
# ---------------------------------------------------------------------------------------------------------------

WINDOWS = [(0, 0), (1, 0), (4, 0), (3, 2), (MAX, 0)]   # (pre_tokens, next_tokens); (MAX, 0) = causal


@pytest.mark.parametrize("batch,paged,layout,window", pairwise(
    batch=["decode", "chunked", "mixed"], paged={"contiguous": False, "paged": True},
    layout=["TND", "BSND", "BNSD", "BSH"], window={f"pre{min(w[0], 99)}_next{w[1]}": w for w in WINDOWS}))
def test_sliding_window(batch, paged, layout, window):
    pre, nxt = window
    b = Batch(*BATCHES[batch], seed=11)
    refs = b.reference(4, pre, nxt)
    for lse in (False, True):
        out, l = fia(b, layout, paged=paged, mode=4, pre=pre, nxt=nxt, lse=lse,
                     cache_layout="4d" if layout == "BNSD" else "3d")
        compare(b, out, l, refs, layout, lse)


@pytest.mark.parametrize("layout", ["BSND", "BNSD", "BSH"])
def test_decode_branch_window_is_not_dropped(layout):
    """A one-token dense query with sparse_mode 4 and a window that hides keys: the window applies (a full-attention
    answer here would be silently wrong for a sliding-window model)."""
    b = Batch([1, 1], [30, 9], seed=12)
    for paged in (False, True):
        for lse in (False, True):
            out, l = fia(b, layout, paged=paged, mode=4, pre=4, nxt=0, lse=lse)
            compare(b, out, l, b.reference(4, 4, 0), layout, lse)
            full = b.reference(0)
            assert not torch.allclose(from_layout(out, layout)[0, :1].double(), full[0][0], atol=1e-3)


def test_decode_branch_window_without_mask():
    """torch_npu documents the decode branch without the optimised mask; sparse_mode 4 there needs none."""
    b = Batch([1, 1], [30, 9], seed=13)
    q = b.dense("q", "BSND", 1)
    k, v = (b.dense(w, "BSND", 30) for w in ("k", "v"))
    out, _ = tot.npu_fused_infer_attention_score(q, k, v, actual_seq_lengths_kv=b.kv_lens, num_heads=N1,
                                                 num_key_value_heads=N2, scale=SCALE, input_layout="BSND",
                                                 sparse_mode=4, pre_tokens=4, next_tokens=0)
    compare(b, out, torch.empty(0), b.reference(4, 4, 0), "BSND", False)


def test_decode_branch_keeps_upstream_rules_for_other_modes():
    """Modes 0-3 at a one-token dense query keep torch_npu's rule: pre/next_tokens ignored (mode 0 with a mask and
    next_tokens=0 would otherwise hide all but the first key), modes 2/3 with their mask = full attention."""
    b = Batch([1, 1], [30, 9], seed=14)
    full = b.reference(0)
    q = b.dense("q", "BSND", 1)
    k, v = (b.dense(w, "BSND", 30) for w in ("k", "v"))
    kw = dict(actual_seq_lengths_kv=b.kv_lens, num_heads=N1, num_key_value_heads=N2, scale=SCALE,
              input_layout="BSND")
    for mode in (2, 3):
        out, _ = tot.npu_fused_infer_attention_score(q, k, v, atten_mask=CAUSAL, sparse_mode=mode, **kw)
        compare(b, out, torch.empty(0), full, "BSND", False)
    mask = torch.zeros(2, 1, 1, 30, dtype=torch.bool)
    out, _ = tot.npu_fused_infer_attention_score(q, k, v, atten_mask=mask, sparse_mode=0, pre_tokens=0,
                                                 next_tokens=0, **kw)
    compare(b, out, torch.empty(0), full, "BSND", False)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_sliding_window_low_precision(dtype):
    b = Batch(*BATCHES["mixed"], dtype=dtype, seed=15)
    for layout in ("TND", "BSND"):
        out, lse = fia(b, layout, paged=True, mode=4, pre=4, nxt=0, lse=True)
        compare(b, out, lse, b.reference(4, 4, 0), layout, True)


def test_sliding_window_v2_is_v1():
    b = Batch(*BATCHES["mixed"], seed=16)
    for layout in ("TND", "BSH"):
        o1, l1 = fia(b, layout, paged=True, mode=4, pre=3, nxt=0, lse=True)
        o2, l2 = fia(b, layout, paged=True, mode=4, pre=3, nxt=0, lse=True, v2=True)
        torch.testing.assert_close(o1, o2, rtol=0, atol=0)
        torch.testing.assert_close(l1, l2, rtol=0, atol=0)


# ---------------------------------------------------------------------------------------------------------------
# 3. Learnable sinks (FIA v2, TND): prefill, decode, paged, with and without a window
# ---------------------------------------------------------------------------------------------------------------

SINK = torch.tensor([-1.0, 0.0, 2.5, 6.0])


@pytest.mark.parametrize("window", [(MAX, 0), (4, 0)], ids=["causal", "window4"])
@pytest.mark.parametrize("paged", [False, True], ids=["contiguous", "paged"])
@pytest.mark.parametrize("batch", ["prefill", "decode", "chunked", "mixed"])
def test_learnable_sink(batch, paged, window):
    pre, nxt = window
    b = Batch(*BATCHES[batch], seed=21)
    mode = 3 if pre == MAX else 4
    refs = b.reference(mode, pre, nxt, sink=SINK)
    for lse in (False, True):
        out, l = fia(b, "TND", paged=paged, mode=mode, pre=pre, nxt=nxt, lse=lse, sink=SINK,
                     cache_layout="4d" if paged else "3d")
        compare(b, out, l, refs, "TND", lse)


def test_learnable_sink_bf16_paged():
    b = Batch(*BATCHES["mixed"], dtype=torch.bfloat16, seed=22)
    sink = SINK.to(torch.bfloat16)
    out, lse = fia(b, "TND", paged=True, mode=4, pre=4, nxt=0, lse=True, sink=sink)
    compare(b, out, lse, b.reference(4, 4, 0, sink=sink), "TND", True)


def test_learnable_sink_row_without_keys():
    """A sequence with no keys: the sink is the only term of its softmax, so the output is 0 and lse = sink."""
    b = Batch([1, 1], [10, 0], seed=23)
    out, lse = fia(b, "TND", paged=True, mode=0, lse=True, sink=SINK)
    assert (out[1] == 0).all()
    torch.testing.assert_close(lse[1, :, 0], SINK)
    compare(b, out[:1], lse[:1], b.reference(0, sink=SINK)[:1], "TND", True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_learnable_sink_decode_reads_the_cache_in_place(dtype):
    """A decode-only TND batch with a sink (gpt-oss decoding) runs the decode op on the paged cache, which adds the
    sink to each row's denominator: no gather of the used blocks. A sequence without keys gives zeros."""
    b = Batch([1, 1, 1], [40, 0, 17], dtype=dtype, seed=24)
    sink = SINK.to(dtype)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        out, lse = fia(b, "TND", paged=True, mode=3, sink=sink, cache_layout="4d")
    names = {e.name for e in prof.events()}
    assert "npu_fa::incre_flash_attention" in names and "npu_fa::gather_pa_kv_cache" not in names, sorted(names)
    assert (out[1] == 0).all() and lse.numel() == 0
    compare(b, out, lse, b.reference(3, sink=sink), "TND", False)


def test_decode_op_learnable_sink_rules():
    q, k = torch.randn(2, 1, 4, 8), torch.randn(2, 6, 2, 8)
    kw = dict(num_heads=4, num_key_value_heads=2, input_layout="BSND", scale_value=0.3)
    with pytest.raises(ValueError, match=r"'learnable_sink' must have shape \[N1=4\]"):
        torch.ops.npu_fa.incre_flash_attention(q, k, k, learnable_sink=torch.zeros(2), **kw)
    with pytest.raises(TypeError, match="'learnable_sink' must be floating point"):
        torch.ops.npu_fa.incre_flash_attention(q, k, k, learnable_sink=torch.zeros(4, dtype=torch.int32), **kw)
    # -inf adds nothing; NaN makes the rows NaN (as the prefill kernels)
    plain = torch.ops.npu_fa.incre_flash_attention(q, k, k, **kw)
    none = torch.ops.npu_fa.incre_flash_attention(q, k, k, learnable_sink=torch.full((4,), float("-inf")), **kw)
    torch.testing.assert_close(none, plain, atol=0, rtol=0)
    nan = torch.ops.npu_fa.incre_flash_attention(q, k, k, learnable_sink=torch.full((4,), float("nan")), **kw)
    assert torch.isnan(nan).all()


# ---------------------------------------------------------------------------------------------------------------
# The optimised mask: verified once per tensor, again after an in-place change; bad masks are named
# ---------------------------------------------------------------------------------------------------------------

def _tnd_call(mask, mode=3, **kw):
    b = Batch([1, 3], [9, 5], seed=31)
    return tot.npu_fused_infer_attention_score(
        b.tnd("q"), b.tnd("k"), b.tnd("v"), atten_mask=mask, actual_seq_lengths=[1, 4], actual_seq_lengths_kv=[9, 14],
        num_heads=N1, num_key_value_heads=N2, scale=SCALE, input_layout="TND", sparse_mode=mode, **kw)


def test_optimised_mask_change_is_seen():
    mask = CAUSAL.clone()
    _tnd_call(mask)
    _tnd_call(mask)                                       # recognised: passes the op no mask
    mask[0, 1] = False                                    # in place: verified again, and rejected
    with pytest.raises(ValueError, match="atten_mask.*2048x2048"):
        _tnd_call(mask)


def test_decode_branch_window_rejects_a_non_optimised_mask():
    b = Batch([1, 1], [30, 9], seed=32)
    q = b.dense("q", "BSND", 1)
    k, v = (b.dense(w, "BSND", 30) for w in ("k", "v"))
    with pytest.raises(ValueError, match=r"sparse_mode=4 needs argument 'atten_mask'.*got shape \[2, 1, 1, 30\]"):
        tot.npu_fused_infer_attention_score(q, k, v, atten_mask=torch.zeros(2, 1, 1, 30, dtype=torch.bool),
                                            actual_seq_lengths_kv=b.kv_lens, num_heads=N1, num_key_value_heads=N2,
                                            scale=SCALE, input_layout="BSND", sparse_mode=4, pre_tokens=4)


@pytest.mark.parametrize("layout", ["TND", "BSND"])
@pytest.mark.parametrize("block_size", [16, 64])
def test_window_reads_only_the_blocks_it_needs(layout, block_size):
    """With a window, the blocks wholly before it are never read: block_table entries there may be invalid (-1,
    as an engine that frees blocks which left the window leaves them), and the result still equals the reference."""
    b = Batch([1, 4, 1], [200, 150, 9], seed=41)
    pre = 20
    q = b.tnd("q") if layout == "TND" else b.dense("q", layout, 4)
    k, table = b.paged("k", block_size, "3d")
    v, _ = b.paged("v", block_size, "3d")
    for row, (lq, lk) in enumerate(zip(b.q_lens, b.kv_lens)):
        table[row, :max(0, lk - lq - pre) // block_size] = -1
    q_lens = torch.tensor(b.q_lens).cumsum(0).tolist() if layout == "TND" else b.q_lens
    for lse in (False, True):
        out, l = tot.npu_fused_infer_attention_score(
            q, k, v, atten_mask=CAUSAL, block_table=table, block_size=block_size, actual_seq_lengths=q_lens,
            actual_seq_lengths_kv=b.kv_lens, num_heads=N1, num_key_value_heads=N2, scale=SCALE, input_layout=layout,
            sparse_mode=4, pre_tokens=pre, next_tokens=0, softmax_lse_flag=lse)
        compare(b, out, l, b.reference(4, pre, 0), layout, lse)


@pytest.mark.parametrize("cache_layout", ["3d", "4d", "4d_bsnd"])
@pytest.mark.parametrize("mode", [0, 3])
def test_tnd_decode_reads_the_cache_in_place(mode, cache_layout):
    """A decode-only TND batch (one token per sequence, no lse / sink / window) runs the decode op on the cache in
    place, without gathering; same answer as the reference, also for a sequence without keys."""
    b = Batch([1, 1, 1], [40, 0, 17], seed=51)

    def run():
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            out, lse = fia(b, "TND", paged=True, mode=mode, cache_layout=cache_layout)
        return out, lse, {e.name for e in prof.events()}

    out, lse, ops = run()
    compare(b, out, lse, b.reference(mode), "TND", False)
    if hasattr(torch.ops.npu_fa, "incre_flash_attention"):
        assert "npu_fa::incre_flash_attention" in ops and "npu_fa::gather_pa_kv_cache" not in ops
