"""The NaN and infinity policy of every attention path (docs/attention.md, "NaN and infinities"), against a float64
reference in plain PyTorch.

Paths: flash_attention_score (BNSD and TND; its backward in test_backward_*), prompt_flash_attention,
fused_infer_attention_score (contiguous, and paged through both of its routes, with and without softmax_lse),
incre_flash_attention (contiguous and paged) and the SDPA override (eager and torch.compile). Each poison case puts a
NaN or an infinity somewhere and names the rows that must turn NaN; every other row must equal the reference.

The reference follows the math of softmax(scale·QKᵀ + pse, masked -> -inf)·V in float64, with the policy's two
choices: a row whose scores are all -inf (every key masked, by mask, band, lengths or a -inf pse) is 0, and a key a
row does not see contributes nothing to it (its value row is never multiplied in, so a NaN there cannot reach the
row). Cases keep NaN value rows where every row of their head sees them or where no row reads them: inside a
computed tile a masked key's value is multiplied by P = 0 in the P·V product, and 0·NaN is NaN (as in PyTorch's math).
Small tiles (attention_tile_config) make the CPU forward kernel run its online softmax over several key tiles.
"""
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor

import torch_ops_transformer as tot

OPS = torch.ops.npu_fa
NAN, INF = float("nan"), float("inf")
MAX = 2147483647
B, N1, N2, SKV, D = 2, 4, 2, 300, 16
BLOCK = 16                              # paged cache block size
TOL = {torch.float32: 1e-4, torch.bfloat16: 2e-2}


@pytest.fixture(autouse=True)
def small_tiles():
    """Several key tiles per row in the CPU forward/backward kernels (the decode kernel's tiles are 32 keys)."""
    OPS.attention_tile_config(16, 32)
    yield
    OPS.attention_tile_config(-1, -1)


# ----------------------------------------------------------------------------------------------------------------
# the problem and its float64 reference
# ----------------------------------------------------------------------------------------------------------------
@dataclass
class Problem:
    q: Tensor                      # [B, N1, Sq, D]
    k: Tensor                      # [B, N2, Skv, D]
    v: Tensor
    scale: float = 0.25
    q_lens: Optional[List[int]] = None    # per batch (None: full)
    kv_lens: Optional[List[int]] = None
    mask: Optional[Tensor] = None  # bool [B, 1, Sq, Skv], True = masked out
    pse: Optional[Tensor] = None   # float [B, N1, Sq, Skv], added after scaling
    causal: bool = False           # top-left: key j visible from row i when j <= i

    @property
    def sq(self) -> int:
        return self.q.shape[2]

    def lens(self):
        return self.q_lens or [self.sq] * B, self.kv_lens or [SKV] * B


def make_problem(sq: int, dtype=torch.float32) -> Problem:
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(B, n, s, D, generator=g).to(dtype) for n, s in ((N1, sq), (N2, SKV), (N2, SKV)))
    return Problem(q, k, v)


def visible(pb: Problem) -> Tensor:
    """Bool [B, 1, Sq, Skv]: key j visible from row i (lengths, causal band, mask); padded rows see nothing."""
    i = torch.arange(pb.sq).view(-1, 1)
    j = torch.arange(SKV).view(1, -1)
    q_lens, kv_lens = pb.lens()
    vis = torch.stack([(i < q_lens[b]) & (j < kv_lens[b]) for b in range(B)]).unsqueeze(1)
    if pb.causal:
        vis = vis & (j <= i)
    if pb.mask is not None:
        vis = vis & ~pb.mask
    return vis


def reference(pb: Problem, grad: bool = False):
    """(out [B, N1, Sq, vD], lse [B, N1, Sq]) in float64, and the leaves when `grad` (q, k, v, pse)."""
    leaves = [t.detach().double().requires_grad_(grad) for t in (pb.q, pb.k, pb.v)]
    pse = pb.pse.detach().double().requires_grad_(grad) if pb.pse is not None else None
    q, k, v = leaves
    k = k.repeat_interleave(N1 // N2, 1)
    v = v.repeat_interleave(N1 // N2, 1)
    s = pb.scale * q @ k.transpose(-1, -2)
    if pse is not None:
        s = s + pse
    s = s.masked_fill(~visible(pb), -INF)
    live = s.detach() != -INF                        # NaN and +inf scores are live: they make the row NaN
    m = s.detach().amax(-1, keepdim=True)            # NaN if a score is; a shift softmax does not depend on
    shift = m.masked_fill(m == -INF, 0.0)            # rows without a live score: exp(-inf) = 0, no NaN gradient
    e = torch.where(live, torch.exp(s - shift), 0.0)
    l = e.sum(-1, keepdim=True)
    p = torch.where(live, e / l, 0.0)                # a masked key's weight is 0 even in a NaN row
    out = (p.unsqueeze(-1) * v.unsqueeze(2)).where(live.unsqueeze(-1), 0.0).sum(-2)
    empty = ~live.any(-1, keepdim=True)
    out = out.masked_fill(empty, 0.0)
    lse = (m + l.detach().log()).masked_fill(empty, -INF).squeeze(-1)
    return out, lse.detach(), leaves + [pse]


def assert_policy(got: Tensor, want: Tensor, dtype, what=""):
    """Same NaN pattern; the other entries equal the reference within the dtype's tolerance."""
    got, want = got.detach().double(), want.detach().double()
    assert got.shape == want.shape, (what, got.shape, want.shape)
    bad = got.isnan() != want.isnan()
    assert not bad.any(), (f"{what}: NaN pattern differs at {bad.nonzero()[:8].tolist()} "
                           f"(ours NaN: {got.isnan().sum()}, reference NaN: {want.isnan().sum()})")
    fin = ~want.isnan()
    torch.testing.assert_close(got[fin], want[fin], atol=TOL[dtype], rtol=TOL[dtype], msg=what)


# ----------------------------------------------------------------------------------------------------------------
# the paths: each runs one op on the problem and returns out as [B, N1, Sq, vD] (and the lse when it has one)
# ----------------------------------------------------------------------------------------------------------------
def _lens_tensor(lens):
    return None if lens is None else torch.tensor(lens)


def run_fas(pb: Problem):
    mode, nxt = (0, 0) if pb.causal and pb.mask is not None else (2 if pb.causal else 0, MAX)
    out, smax, ssum = OPS.flash_attention_score(
        pb.q, pb.k, pb.v, N1, "BNSD", pse=pb.pse, atten_mask=pb.mask, scale=pb.scale, next_tokens=nxt,
        sparse_mode=mode, pse_type=0)[:3]
    return out, (smax[..., 0] + ssum[..., 0].log())


def run_fas_tnd(pb: Problem):
    q_lens, kv_lens = pb.lens()
    pack = lambda t, lens: torch.cat([t[b, :, :n].transpose(0, 1) for b, n in enumerate(lens)])  # noqa: E731
    out = OPS.flash_attention_score(pack(pb.q, q_lens), pack(pb.k, kv_lens), pack(pb.v, kv_lens), N1, "TND",
                                    actual_seq_qlen=torch.tensor(q_lens).cumsum(0),
                                    actual_seq_kvlen=torch.tensor(kv_lens).cumsum(0), scale=pb.scale,
                                    sparse_mode=2 if pb.causal else 0)[0]
    full = pb.q.new_zeros(B, N1, pb.sq, D)
    for b, (start, n) in enumerate(zip([0] + list(torch.tensor(q_lens).cumsum(0)[:-1]), q_lens)):
        full[b, :, :n] = out[int(start):int(start) + n].transpose(0, 1)
    return full, None


def _prefill_kwargs(pb: Problem):
    """Masks and bands of the prefill ops: mask alone (mode 0, next MAX), causal alone (mode 2), both (mode 0,
    next 0)."""
    if pb.causal:
        mode, nxt = (0, 0) if pb.mask is not None else (2, MAX)
    else:
        mode, nxt = 0, MAX
    return dict(atten_mask=pb.mask, pse_shift=pb.pse, actual_seq_lengths=_lens_tensor(pb.q_lens),
                actual_seq_lengths_kv=_lens_tensor(pb.kv_lens), num_heads=N1, num_key_value_heads=N2,
                input_layout="BNSD", sparse_mode=mode, next_tokens=nxt)


def run_pfa(pb: Problem):
    return OPS.prompt_flash_attention(pb.q, pb.k, pb.v, scale_value=pb.scale, **_prefill_kwargs(pb)), None


def run_fia(pb: Problem):
    out, lse = OPS.fused_infer_attention_score(pb.q, pb.k, pb.v, scale=pb.scale, softmax_lse_flag=True,
                                               **_prefill_kwargs(pb))
    return out, lse[..., 0]


def paged_cache(t: Tensor):
    """[B, N2, Skv, D] -> ((num_blocks, N2, BLOCK, D) cache, block_table), the blocks in shuffled order."""
    nb = SKV // BLOCK + (SKV % BLOCK > 0)
    pad = torch.zeros(B, N2, nb * BLOCK - SKV, D, dtype=t.dtype)
    blocks = torch.cat([t, pad], 2).view(B, N2, nb, BLOCK, D).permute(0, 2, 1, 3, 4).reshape(B * nb, N2, BLOCK, D)
    perm = torch.randperm(B * nb, generator=torch.Generator().manual_seed(1))
    cache = torch.empty_like(blocks)
    cache[perm] = blocks
    return cache, perm.view(B, nb).to(torch.int32)


def run_fia_paged(pb: Problem, lse_flag: bool):
    kc, table = paged_cache(pb.k)
    vc, _ = paged_cache(pb.v)
    kw = _prefill_kwargs(pb)
    kw["actual_seq_lengths_kv"] = torch.tensor(pb.lens()[1])
    out, lse = OPS.fused_infer_attention_score(pb.q, kc, vc, block_table=table, block_size=BLOCK, scale=pb.scale,
                                               softmax_lse_flag=lse_flag, **kw)
    return out, (lse[..., 0] if lse_flag else None)


def _decode_kwargs(pb: Problem):
    mask = None if pb.mask is None else pb.mask[:, :, 0, :]                  # (B, 1, S): per batch
    return dict(atten_mask=mask, pse_shift=pb.pse, actual_seq_lengths=torch.tensor(pb.lens()[1]), num_heads=N1,
                scale_value=pb.scale, input_layout="BNSD", num_key_value_heads=N2)


def run_ifa(pb: Problem):
    return OPS.incre_flash_attention(pb.q, pb.k, pb.v, **_decode_kwargs(pb)), None


def run_ifa_paged(pb: Problem):
    kc, table = paged_cache(pb.k)
    vc, _ = paged_cache(pb.v)
    return OPS.incre_flash_attention(pb.q, kc, vc, block_table=table, block_size=BLOCK, **_decode_kwargs(pb)), None


def sdpa_args(pb: Problem):
    """F.scaled_dot_product_attention's arguments: bool mask True = keep, or a float mask carrying pse and -inf."""
    if pb.pse is not None:
        mask = pb.pse.masked_fill(pb.mask, -INF) if pb.mask is not None else pb.pse
    else:
        mask = None if pb.mask is None else ~pb.mask
    return dict(attn_mask=mask, is_causal=pb.causal and mask is None, scale=pb.scale, enable_gqa=True)


def run_sdpa(pb: Problem):
    with tot.sdpa_override():
        return F.scaled_dot_product_attention(pb.q, pb.k, pb.v, **sdpa_args(pb)), None


@dataclass(frozen=True)
class Path:
    run: Callable
    sq: tuple = (6, 1)          # query lengths it takes
    lens: bool = True           # per-batch lengths
    mask: bool = True
    pse: bool = True
    causal: bool = True


PATHS: Dict[str, Path] = {
    "flash_attention_score": Path(run_fas, lens=False),
    "flash_attention_score_TND": Path(run_fas_tnd, mask=False, pse=False),
    "prompt_flash_attention": Path(run_pfa),
    "fused_infer_attention_score": Path(run_fia),
    "fia_paged": Path(lambda pb: run_fia_paged(pb, False)),
    "fia_paged_lse": Path(lambda pb: run_fia_paged(pb, True)),
    "incre_flash_attention": Path(run_ifa, sq=(1,), causal=False),
    "ifa_paged": Path(run_ifa_paged, sq=(1,), causal=False),
    "sdpa_override": Path(run_sdpa, lens=False),
}


# ----------------------------------------------------------------------------------------------------------------
# poison cases: each edits the problem; which rows turn NaN follows from the reference
# ----------------------------------------------------------------------------------------------------------------
def _mask(pb: Problem) -> Tensor:
    if pb.mask is None:
        pb.mask = torch.zeros(B, 1, pb.sq, SKV, dtype=torch.bool)
    return pb.mask


def query_nan(pb):                 # that row only
    pb.q[0, 1, -1, 3] = NAN


def query_inf(pb):                 # +-inf scores: exp(inf - inf) is NaN in the math
    pb.q[1, 2, 0, 0] = INF


def key_nan_masked_for_some(pb):   # rows that mask key 40 stay finite, rows that see it are NaN
    pb.k[:, 1, 40, 2] = NAN
    _mask(pb)[0, 0, :(pb.sq + 1) // 2, 40] = True


def key_nan_late_tile(pb):         # finite tiles first, then a NaN score: the running max must keep the NaN
    pb.k[0, 0, 250, 0] = NAN


def value_nan(pb):                 # every row of kv head 0 of batch 0 sees key 7
    pb.v[0, 0, 7, 5] = NAN


def unread_nan(pb):                # keys past a sequence's length and padded query rows are never read
    pb.kv_lens = [200, SKV]
    pb.k[0, :, 200:] = NAN
    pb.v[0, :, 210] = INF
    if pb.sq > 1:
        pb.q_lens = [pb.sq - 1, pb.sq]
        pb.q[0, :, pb.sq - 1] = NAN


def pse_nonfinite(pb):             # NaN / +inf pse: NaN row; all -inf: a masked row (0); NaN where masked: unused
    g = torch.Generator().manual_seed(3)
    pb.pse = torch.randn(B, N1, pb.sq, SKV, generator=g)
    pb.pse[0, 1, -1, 11] = NAN
    pb.pse[1, 3, 0, 20] = INF
    pb.pse[1, 0, 0, :] = -INF
    pb.pse[0, 2, 0, 40] = NAN
    _mask(pb)[0, 0, 0, 40] = True


def fully_masked_nan_query(pb):    # every key masked: 0, whatever the query holds
    _mask(pb)[1, 0, 0, :] = True
    pb.q[1, :, 0, :] = NAN


def causal_future_key_nan(pb):     # rows before key 3 do not see it (top-left causal)
    pb.causal = True
    pb.k[0, 0, 3, 1] = NAN


def huge_scale(pb):                # scale 1e30: a one-hot softmax, finite
    pb.scale = 1e30


CASES = {  # name -> (edit, needs)
    "query_nan": (query_nan, ()),
    "query_inf": (query_inf, ()),
    "key_nan_masked_for_some": (key_nan_masked_for_some, ("mask",)),
    "key_nan_late_tile": (key_nan_late_tile, ()),
    "value_nan": (value_nan, ()),
    "unread_nan": (unread_nan, ("lens",)),
    "pse_nonfinite": (pse_nonfinite, ("pse", "mask")),
    "fully_masked_nan_query": (fully_masked_nan_query, ("mask",)),
    "causal_future_key_nan": (causal_future_key_nan, ("causal", "sq>1")),
    "huge_scale": (huge_scale, ()),
}


def _combos():
    for pname, path in PATHS.items():
        for cname, (_, needs) in CASES.items():
            for sq in path.sq:
                if "sq>1" in needs and sq == 1:
                    continue
                if all(getattr(path, n) for n in needs if n != "sq>1"):
                    yield pytest.param(pname, cname, sq, id=f"{pname}-{cname}-sq{sq}")


@pytest.mark.parametrize("path,case,sq", list(_combos()))
def test_policy(path, case, sq):
    pb = make_problem(sq)
    CASES[case][0](pb)
    want, want_lse, _ = reference(pb)
    got, lse = PATHS[path].run(pb)
    assert_policy(got, want, torch.float32, f"{path} {case}")
    if lse is not None:  # NaN for rows with a NaN score, -inf for rows that see nothing (a NaN value leaves it)
        _check_lse(lse, want_lse, f"{path} {case}")


def _check_lse(lse: Tensor, want: Tensor, what: str):
    lse = lse.double()
    assert torch.equal(lse.isnan(), want.isnan()), f"{what}: lse NaN pattern"
    assert torch.equal(lse == -INF, want == -INF), f"{what}: lse -inf pattern"
    fin = torch.isfinite(want)
    torch.testing.assert_close(lse[fin], want[fin], atol=1e-4, rtol=1e-4, msg=what)


@pytest.mark.parametrize("path", ["flash_attention_score", "fia_paged", "incre_flash_attention", "sdpa_override"])
@pytest.mark.parametrize("case", ["query_nan", "key_nan_late_tile", "pse_nonfinite", "huge_scale"])
def test_policy_bf16(path, case):
    if case == "pse_nonfinite" and not PATHS[path].pse:
        pytest.skip("no pse")
    pb = make_problem(1 if path == "incre_flash_attention" else 6, torch.bfloat16)
    CASES[case][0](pb)
    got, _ = PATHS[path].run(pb)
    assert got.dtype == torch.bfloat16
    assert_policy(got, reference(pb)[0], torch.bfloat16, f"{path} {case} bf16")


# ----------------------------------------------------------------------------------------------------------------
# flash_attention_score's statistics and backward
# ----------------------------------------------------------------------------------------------------------------
def test_softmax_statistics_of_nan_and_empty_rows():
    """A NaN row has NaN softmax_max/sum; a row that sees no key keeps max -inf, sum 0 (lse -inf)."""
    pb = make_problem(6)
    fully_masked_nan_query(pb)
    query_nan(pb)
    _, smax, ssum = OPS.flash_attention_score(pb.q, pb.k, pb.v, N1, "BNSD", atten_mask=pb.mask, scale=0.25)[:3]
    assert smax[0, 1, -1].isnan().all() and ssum[0, 1, -1].isnan().all()
    assert (smax[1, :, 0] == -INF).all() and (ssum[1, :, 0] == 0).all()
    finite = torch.ones(B, N1, 6, dtype=torch.bool)
    finite[0, 1, -1] = finite[1, :, 0] = False
    assert torch.isfinite(smax[finite]).all() and (ssum[finite] > 0).all()


@pytest.mark.parametrize("case", ["query_nan", "query_inf", "key_nan_late_tile", "value_nan", "pse_nan"])
def test_backward_matches_float64_autograd(case):
    """dq, dk, dv (and dpse) are NaN exactly where the float64 autograd of the math is (no masks here: a masked pair
    inside a computed tile multiplies 0 by a NaN in the matrix products, in the math as in the kernels)."""
    pb = make_problem(6)
    if case == "pse_nan":
        pb.pse = torch.randn(B, N1, 6, SKV, generator=torch.Generator().manual_seed(4))
        pb.pse[1, 2, 3, 100] = NAN
    else:
        CASES[case][0](pb)
    out, _, leaves = reference(pb, grad=True)
    dy = torch.randn(out.shape, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    used = [t for t in leaves if t is not None]
    want = torch.autograd.grad(out, used, dy)
    inputs = [t.detach().clone().requires_grad_() for t in (pb.q, pb.k, pb.v)]
    pse = pb.pse.clone().requires_grad_() if pb.pse is not None else None
    got_out = OPS.flash_attention_score(*inputs, N1, "BNSD", pse=pse, scale=pb.scale, pse_type=0)[0]
    got = torch.autograd.grad(got_out, inputs + ([pse] if pse is not None else []), dy.float())
    for name, g, w in zip(("dq", "dk", "dv", "dpse"), got, want):
        assert_policy(g, w, torch.float32, f"{case} {name}")


# ----------------------------------------------------------------------------------------------------------------
# the SDPA override against PyTorch itself
# ----------------------------------------------------------------------------------------------------------------
def _sdpa_case(case: str, sq: int):
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, s, 8, generator=g) for s in (sq, 6, 6))
    mask = torch.randn(sq, 6, generator=g)
    if case == "mask_nan":
        mask[-1, 3] = NAN
    elif case == "mask_pos_inf":
        mask[0, 2] = INF
    elif case == "mask_neg_inf_row":
        mask[0, :] = -INF
    elif case == "key_nan":
        k[1, 0, 4, 0] = NAN
    elif case == "value_nan":
        v[0, 2, 3, 5] = NAN
    return q, k, v, mask


SDPA_CASES = ["mask_nan", "mask_pos_inf", "mask_neg_inf_row", "key_nan", "value_nan"]


@pytest.mark.parametrize("sq", [5, 1])
@pytest.mark.parametrize("case", SDPA_CASES)
def test_sdpa_override_matches_pytorch(case, sq):
    """Float attn_mask with NaN / +inf / a -inf row, NaN keys and values: our kernels give PyTorch's answer (its NaN
    pattern, the rest within tolerance), on the prefill and the decode route, with nothing sent back to PyTorch."""
    q, k, v, mask = _sdpa_case(case, sq)
    want = torch._C._nn.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    before = sum(n for r, n in tot.integrations.sdpa.route_counts.items() if r.startswith("fallback"))
    with tot.sdpa_override():
        got = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    assert sum(n for r, n in tot.integrations.sdpa.route_counts.items() if r.startswith("fallback")) == before
    assert_policy(got, want, torch.float32, case)


@pytest.mark.parametrize("case", ["mask_nan", "key_nan", "value_nan", "query_nan"])
def test_sdpa_override_gradients_match_pytorch_math(case):
    """Gradients through the override (flash_attention_score's backward) are NaN where PyTorch's math backend's are."""
    q, k, v, mask = _sdpa_case(case, 5)
    if case == "query_nan":
        q[0, 1, 4, 3] = NAN
    mask = mask if case.startswith("mask") else None
    leaves = [t.clone().double().requires_grad_() for t in (q, k, v)]
    with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.MATH):
        want_out = F.scaled_dot_product_attention(*leaves, attn_mask=None if mask is None else mask.double())
    want = torch.autograd.grad(want_out, leaves, torch.ones_like(want_out))
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    with tot.sdpa_override():
        out = F.scaled_dot_product_attention(*leaves, attn_mask=mask)
    got = torch.autograd.grad(out, leaves, torch.ones_like(out))
    assert_policy(out, want_out, torch.float32, f"{case} out")
    for name, g, w in zip(("dq", "dk", "dv"), got, want):
        assert_policy(g, w, torch.float32, f"{case} {name}")


def test_sdpa_override_query_nan_follows_the_math():
    """A NaN in a query row: that row is NaN (PyTorch's math backend; its fused CPU kernel returns 0 for some rows)."""
    q, k, v, _ = _sdpa_case("", 5)
    q[0, 0, 2, 3] = NAN
    with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.MATH):
        want = F.scaled_dot_product_attention(q.double(), k.double(), v.double())
    with tot.sdpa_override():
        got = F.scaled_dot_product_attention(q, k, v)
    assert_policy(got, want, torch.float32, "query nan")


@pytest.mark.slow
def test_sdpa_override_compiled_matches_pytorch(dynamo_reset):
    """The same under torch.compile(fullgraph=True): our op is in the graph and a NaN in the float mask gives
    PyTorch's NaN rows (values are not inspected in either mode)."""
    def f(q, k, v, m):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=m)

    for case in ("mask_nan", "key_nan", "mask_neg_inf_row"):
        q, k, v, mask = _sdpa_case(case, 5)
        with tot.sdpa_override():
            got = torch.compile(f, fullgraph=True)(q, k, v, mask)
        assert_policy(got, torch._C._nn.scaled_dot_product_attention(q, k, v, attn_mask=mask), torch.float32, case)


# ----------------------------------------------------------------------------------------------------------------
# the scale: the same check in every op
# ----------------------------------------------------------------------------------------------------------------
def _call_with_scale(op: str, scale: float):
    pb = make_problem(1)
    if op == "flash_attention_score":
        return OPS.flash_attention_score(pb.q, pb.k, pb.v, N1, "BNSD", scale=scale)
    if op == "prompt_flash_attention":
        return OPS.prompt_flash_attention(pb.q, pb.k, pb.v, num_heads=N1, input_layout="BNSD", scale_value=scale)
    if op == "fused_infer_attention_score":
        return OPS.fused_infer_attention_score(pb.q, pb.k, pb.v, num_heads=N1, input_layout="BNSD", scale=scale)
    return OPS.incre_flash_attention(pb.q, pb.k, pb.v, num_heads=N1, input_layout="BNSD", num_key_value_heads=N2,
                                     scale_value=scale)


@pytest.mark.parametrize("scale", [NAN, INF, -INF, 1e39])
@pytest.mark.parametrize("op", ["flash_attention_score", "prompt_flash_attention", "fused_infer_attention_score",
                                "incre_flash_attention"])
def test_non_finite_scale_is_rejected_by_every_op(op, scale):
    name = "scale_value" if op in ("prompt_flash_attention", "incre_flash_attention") else "scale"
    with pytest.raises(ValueError, match=rf"{op}: argument '{name}' must be finite"):
        _call_with_scale(op, scale)
