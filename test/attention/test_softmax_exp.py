"""The softmax exponent of the CPU attention kernels (aten_ops/cpu/softmax_exp.h): 2^y as a fitted polynomial times
a power of two built in the exponent bits. The probabilities themselves are observed through an identity value
matrix (out = P), so the documented error bound and the exact zeros are checked end to end, in the kernel's own
loop, on whichever instruction-set path the machine runs."""
import pytest
import torch

import torch_ops_transformer  # noqa: F401  (registers torch.ops.npu_fa)

OPS = torch.ops.npu_fa


def probabilities(scores: torch.Tensor, dtype=torch.float32, mask=None) -> torch.Tensor:
    """P of one query row whose raw scores are `scores` (scale 1): q = e0, k[j] = scores[j]·e0, V = I."""
    nk = scores.numel()
    q = torch.zeros(1, 1, 1, nk, dtype=torch.float64)
    q[..., 0] = 1
    k = torch.zeros(1, 1, nk, nk, dtype=torch.float64)
    k[0, 0, :, 0] = scores
    v = torch.eye(nk, dtype=torch.float64).view(1, 1, nk, nk)
    out = OPS.flash_attention_score(q.to(dtype), k.to(dtype), v.to(dtype), 1, "BNSD", atten_mask=mask,
                                    scale=1.0)[0]
    return out.view(nk).double()


def test_fp32_probabilities_within_the_documented_bound():
    # Score gaps over the whole range exp reaches in fp32 (down to -86, P ~ 2^-124), every fractional position.
    g = torch.Generator().manual_seed(0)
    scores = -torch.rand(64, generator=g, dtype=torch.float64) * 86
    scores[0] = 0.0
    scores = scores.float().double()  # the fp32 scores the kernel sees
    got = probabilities(scores)
    want = torch.softmax(scores, 0)
    seen = want > 1e-30
    rel = ((got - want).abs() / want)[seen]
    # 5.1e-7 for the polynomial and a few ulp for the fp32 sum and division, plus the fp32 rounding of the
    # exponent y = (s - m)·scale·log2(e) and of the constant log2(e): |y|·2^-23, i.e. 2·|s - m|·2^-24 relative
    # in P (any fp32 exponent of a gap this wide carries it).
    bound = 1.5e-6 + 2 * scores.abs()[seen] * 2.0 ** -24
    assert (rel <= bound).all(), (rel / bound).max().item()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_masked_and_underflowing_keys_are_exactly_zero(dtype):
    # Gap 90: 2^(-90·log2 e) = 2^-129.8 < 2^-127, documented as exactly 0; gap 10 stays positive.
    scores = torch.tensor([0.0, -10.0, -90.0, -200.0, 0.5, -1.0], dtype=torch.float64)
    mask = torch.zeros(1, 1, 1, 6, dtype=torch.bool)
    mask[..., 5] = True  # masked: the kernel sees -inf
    got = probabilities(scores, dtype, mask)
    assert got[2] == 0 and got[3] == 0 and got[5] == 0
    assert (got[[0, 1, 4]] > 0).all()


def test_row_maximum_alone_gives_probability_one():
    # Every other key underflows: the maximum's exponent is exactly 0, so P = 1 exactly (and l = 1).
    scores = torch.tensor([-500.0, 3.0, -400.0, -1000.0], dtype=torch.float64)
    got = probabilities(scores)
    assert got.tolist() == [0.0, 1.0, 0.0, 0.0]


@pytest.fixture
def small_tiles():
    """Key tiles of 32 (query tiles of 16), so one row crosses several tiles; one thread, so a short query is not
    split along the keys (flash-decoding would give each tile its own partial state)."""
    threads = torch.get_num_threads()
    OPS.attention_tile_config(16, 32)
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
    OPS.attention_tile_config(-1, -1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_running_maximum_across_tiles(small_tiles, dtype):
    # Tile by tile the row maximum rises a little (P is computed against the stale maximum, settled at the end),
    # jumps (the two-pass update with a rescale), falls, and jumps far: every branch of the one-pass softmax.
    g = torch.Generator().manual_seed(1)
    offsets = [0.0, 3.0, 20.0, 21.0, -50.0, 80.0, 82.0, 400.0, 401.0]
    nk, d, rows, scale = 32 * len(offsets), 16, 5, 0.5
    target = torch.cat([o + torch.rand(32, generator=g, dtype=torch.float64) * 4 for o in offsets])
    q = torch.zeros(1, 1, rows, d, dtype=torch.float64)
    q[..., 0] = torch.linspace(1.0, 0.5, rows, dtype=torch.float64)  # rows see the same ranking at other scales
    k = torch.randn(1, 1, nk, d, generator=g, dtype=torch.float64) * 0.1
    k[0, 0, :, 0] = target
    v = torch.randn(1, 1, nk, d, generator=g, dtype=torch.float64)
    q, k, v = (t.to(dtype) for t in (q, k, v))
    out, smax, ssum = OPS.flash_attention_score(q, k, v, 1, "BNSD", scale=scale)[:3]
    s = (q.double() @ k.double().transpose(-1, -2)) * scale
    m = s.amax(-1)
    l = (s - m[..., None]).exp().sum(-1)
    want = torch.softmax(s, -1) @ v.double()
    out_tol = {torch.float32: 1e-5, torch.bfloat16: 2e-2, torch.float16: 2e-3}[dtype]
    assert (out.double() - want).abs().max().item() < out_tol
    assert (smax[..., 0].double() - m).abs().max().item() <= 1e-6 * m.abs().max().item()
    assert ((ssum[..., 0].double() - l) / l).abs().max().item() < 1e-5
