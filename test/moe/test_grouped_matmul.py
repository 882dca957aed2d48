"""grouped_matmul against a float64 reference computed group by group (every group type, empty groups, bias,
activations, dtypes with the project's tolerance rule), its gradients, gradcheck, the torch_npu wrapper, compile
without recompiles for new group sizes, and one test per bad-input rule."""
import pytest
import torch

from test.common.moe_reference import act_ref, split_m_ref
from test.common.reference import check_tolerance
from torch_ops_transformer import grouped_matmul, npu_grouped_matmul

GMM = torch.ops.npu_fa.grouped_matmul
DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def _inputs(counts, k, n, dtype, bias=True, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(sum(counts), k, generator=g).to(dtype)
    w = (torch.randn(len(counts), k, n, generator=g) / k ** 0.5).to(dtype)
    b = torch.randn(len(counts), n, generator=g).to(dtype) if bias else None
    return x, w, b


def _leaf(t):
    return None if t is None else t.detach().clone().requires_grad_()


def _run(fn, tensors, dy):
    """Output and gradients of (out * dy).sum() with respect to the non-None tensors."""
    leaves = [_leaf(t) for t in tensors]
    out = fn(*leaves)
    used = [t for t in leaves if t is not None]
    grads = torch.autograd.grad((out * dy.to(out.dtype)).sum(), used)
    return out.detach(), grads


@pytest.mark.asan
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("act", [0, 1, 2, 4, 5])
@pytest.mark.parametrize("list_type", [0, 1])
def test_split_m_forward_and_grads(dtype, act, list_type):
    counts = [5, 0, 17, 1, 0, 9]                                    # empty groups in the middle and at the end
    x, w, b = _inputs(counts, 24, 40, dtype, bias=act != 4)         # one activation runs without bias
    c = torch.tensor(counts)
    group_list = c if list_type == 1 else torch.cumsum(c, 0)
    dy = torch.randn(sum(counts), 40)
    ours, ours_g = _run(lambda x, w, b: grouped_matmul(x, w, group_list, bias=b, group_list_type=list_type,
                                                       activation=act), [x, w, b], dy)
    ref, ref_g = _run(lambda x, w, b: split_m_ref(x, w, b, counts, act, torch.float64), [x, w, b], dy)
    same, same_g = _run(lambda x, w, b: split_m_ref(x, w, b, counts, act, dtype), [x, w, b], dy)
    assert ours.dtype == dtype and ours.shape == (sum(counts), 40)
    check_tolerance("out", ours, ref, same)
    for name, o, r, s in zip(["dx", "dw", "db"], ours_g, ref_g, same_g):
        assert o.dtype == dtype
        check_tolerance(name, o, r, s)


def test_split_m_weight_list_and_fp32_bias_with_bf16():
    counts = [3, 4, 0, 2]
    x, w, b = _inputs(counts, 16, 8, torch.bfloat16)
    b32 = b.float()
    gl = torch.cumsum(torch.tensor(counts), 0)
    (stacked,), _ = GMM([x], [w], [b32], gl, 0, 0, 2)
    (listed,), _ = GMM([x], list(w.unbind(0)), list(b32.unbind(0)), gl, 0, 0, 2)
    torch.testing.assert_close(stacked, listed, rtol=0, atol=0)
    ref = split_m_ref(x, w, b32, counts, 2, torch.float64)
    check_tolerance("out", stacked, ref, split_m_ref(x, w, b32, counts, 2, torch.bfloat16))


@pytest.mark.asan
@pytest.mark.parametrize("act", [0, 2])
def test_lists_independent_products(act):
    g = torch.Generator().manual_seed(1)
    xs = [torch.randn(5, 8, generator=g), torch.randn(2, 3, 4, generator=g), torch.randn(0, 6, generator=g)]
    ws = [torch.randn(8, 6, generator=g), torch.randn(4, 7, generator=g), torch.randn(6, 3, generator=g)]
    bs = [torch.randn(6, generator=g), torch.randn(7, generator=g), torch.randn(3, generator=g)]
    leaves = [_leaf(t) for t in xs + ws + bs]
    outs, _ = GMM(leaves[0:3], leaves[3:6], leaves[6:9], None, -1, 0, act)
    dys = [torch.randn_like(o) for o in outs]
    grads = torch.autograd.grad(sum((o * d).sum() for o, d in zip(outs, dys)), leaves)
    ref_leaves = [t.detach().double().requires_grad_() for t in xs + ws + bs]
    refs = [act_ref(xr @ wr + br, act) for xr, wr, br in zip(ref_leaves[0:3], ref_leaves[3:6], ref_leaves[6:9])]
    ref_grads = torch.autograd.grad(sum((r * d.double()).sum() for r, d in zip(refs, dys)), ref_leaves)
    for o, r in zip(outs, refs):
        assert o.shape == r.shape
        torch.testing.assert_close(o.double(), r, rtol=1e-5, atol=1e-5)
    for i, (gr, rr) in enumerate(zip(grads, ref_grads)):
        torch.testing.assert_close(gr.double(), rr, rtol=1e-5, atol=1e-5, msg=lambda m: f"grad {i}: {m}")


@pytest.mark.asan
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_split_k(dtype):
    counts = [4, 0, 9, 3]                                            # K groups; group 1 is empty -> zeros
    g = torch.Generator().manual_seed(2)
    t = sum(counts)
    x = torch.randn(t, 12, generator=g).to(dtype).t()               # [M=12, K=16] as a transposed view
    w = torch.randn(t, 10, generator=g).to(dtype)
    dy = torch.randn(len(counts), 12, 10)

    def split_k_ref(x, w, dt):
        outs, k0 = [], 0
        for c in counts:
            outs.append(x[:, k0:k0 + c].to(dt) @ w[k0:k0 + c].to(dt))
            k0 += c
        return torch.stack(outs)

    ours, ours_g = _run(lambda x, w: grouped_matmul(x, w, torch.tensor(counts), group_type=2, group_list_type=1),
                        [x, w], dy)
    ref, ref_g = _run(lambda x, w: split_k_ref(x, w, torch.float64), [x, w], dy)
    same, same_g = _run(lambda x, w: split_k_ref(x, w, dtype), [x, w], dy)
    assert ours.shape == (4, 12, 10) and (ours[1] == 0).all()
    check_tolerance("out", ours, ref, same)
    for name, o, r, s in zip(["dx", "dw"], ours_g, ref_g, same_g):
        check_tolerance(name, o, r, s)


def test_split_k_is_the_weight_gradient_of_split_m():
    counts = [6, 0, 3, 7]
    x, w, _ = _inputs(counts, 8, 5, torch.float32, bias=False)
    dy = torch.randn(sum(counts), 5)
    dw = grouped_matmul(x.t(), dy, torch.tensor(counts), group_type=2, group_list_type=1)
    _, (want,) = _run(lambda w: grouped_matmul(x, w, torch.tensor(counts), group_list_type=1), [w], dy)
    torch.testing.assert_close(dw, want)


@pytest.mark.parametrize("group_type,act", [(0, 2), (0, 4), (-1, 5), (2, 0), (0, 1)])
def test_gradcheck(group_type, act):
    g = torch.Generator().manual_seed(3)
    d = dict(dtype=torch.float64, requires_grad=True)
    if group_type == 0:
        x, w, b = torch.randn(7, 4, **d), torch.randn(3, 4, 5, **d), torch.randn(3, 5, **d)
        gl = torch.tensor([2, 2, 7])
        fn = lambda x, w, b: GMM([x], [w], [b], gl, 0, 0, act)[0][0]  # noqa: E731
        args = (x, w, b)
    elif group_type == -1:
        x0, w0, b0 = torch.randn(3, 4, **d), torch.randn(4, 2, **d), torch.randn(2, **d)
        x1, w1 = torch.randn(2, 3, **d), torch.randn(3, 3, **d)
        fn = lambda x0, w0, b0, x1, w1: torch.cat([o.reshape(-1) for o in GMM(  # noqa: E731
            [x0, x1], [w0, w1], [b0, torch.zeros(3, dtype=torch.float64)], None, -1, 0, act)[0]])
        args = (x0, w0, b0, x1, w1)
    else:
        x, w = torch.randn(3, 6, **d), torch.randn(6, 2, **d)
        fn = lambda x, w: GMM([x], [w], [], torch.tensor([2, 2, 6]), 2, 0, 0)[0][0]  # noqa: E731
        args = (x, w)
    if act == 1:  # keep relu away from its kink
        with torch.no_grad():
            args[0].add_(torch.sign(args[0]) * 0.5)
    assert torch.autograd.gradcheck(fn, args)


def test_npu_grouped_matmul_signature():
    counts = [2, 3, 0, 4]
    x, w, b = _inputs(counts, 6, 5, torch.float32)
    gl = torch.cumsum(torch.tensor(counts), 0)
    single = npu_grouped_matmul([x], [w], bias=[b], group_list=gl, split_item=2, group_type=0)
    assert len(single) == 1 and single[0].shape == (9, 5)
    per_group = npu_grouped_matmul([x], [w], bias=[b], group_list=gl.tolist(), split_item=0, group_type=0)
    assert [t.shape[0] for t in per_group] == counts
    torch.testing.assert_close(torch.cat(per_group), single[0])
    lists = npu_grouped_matmul([x[:2], x[2:5]], [w[0], w[1]], bias=[b[0], b[1]], group_type=-1)
    torch.testing.assert_close(torch.cat(lists), single[0][:5])
    with pytest.raises(ValueError, match="'group_type' is required"):  # torch_npu has no default either
        npu_grouped_matmul([x[:2], x[2:5]], [w[0], w[1]])
    with pytest.raises(TypeError, match="'antiquant_scale' need int8 x and weight"):  # float weight
        npu_grouped_matmul([x], [w], group_list=gl, group_type=0, antiquant_scale=[torch.ones(5)])


def test_many_threads_and_one_thread_agree():
    counts = [300, 1, 0, 77, 128]
    x, w, b = _inputs(counts, 64, 96, torch.float32)
    gl = torch.tensor(counts)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = grouped_matmul(x, w, gl, bias=b, group_list_type=1, activation="silu")
    finally:
        torch.set_num_threads(threads)
    many = grouped_matmul(x, w, gl, bias=b, group_list_type=1, activation="silu")
    torch.testing.assert_close(one, many)


def test_inference_mode():
    counts = [3, 5]
    with torch.inference_mode():
        x, w, b = _inputs(counts, 8, 4, torch.float32)
        y = grouped_matmul(x, w, torch.tensor(counts), bias=b, group_list_type=1, activation="relu")
    torch.testing.assert_close(y, split_m_ref(x, w, b, counts, 1, torch.float32))


def test_compile_does_not_recompile_for_new_group_sizes():
    from torch._dynamo.testing import CompileCounterWithBackend

    torch._dynamo.reset()
    counter = CompileCounterWithBackend("aot_eager")
    fn = torch.compile(lambda x, w, gl: grouped_matmul(x, w, gl, group_list_type=1, activation="gelu"),
                       backend=counter, fullgraph=True)
    x, w, _ = _inputs([4, 4, 4], 8, 6, torch.float32, bias=False)
    for counts in ([4, 4, 4], [0, 12, 0], [1, 2, 9]):
        gl = torch.tensor(counts)
        torch.testing.assert_close(fn(x, w, gl), grouped_matmul(x, w, gl, group_list_type=1, activation="gelu"))
    assert counter.frame_count == 1


# ---- Bad input: one test per rule, each message names the argument. ----

def _bad(group_list=None, **over):
    x, w, b = _inputs([2, 3], 4, 5, torch.float32)
    args = dict(x=[x], weight=[w], bias=[b], group_list=torch.tensor([2, 5]) if group_list is None else group_list,
                group_type=0, group_list_type=0, act_type=0)
    args.update(over)
    return args


@pytest.mark.asan
@pytest.mark.parametrize("over,message", [
    (dict(group_list=torch.tensor([3, 2])), "non-decreasing"),
    (dict(group_list=torch.tensor([2, 4])), "sum to 4 but x has 5"),
    (dict(group_list=torch.tensor([2, 4]), group_list_type=1), "sum to 6 but x has 5"),
    (dict(group_list=torch.tensor([-1, 5]), group_list_type=1), "counts\\) must be >= 0"),
    (dict(group_list=torch.tensor([5])), "one entry per group \\(2\\)"),
    (dict(group_list=torch.tensor([2.0, 5.0])), "int64 or int32"),
    (dict(weight=[torch.randn(2, 4, 5, dtype=torch.float64)]), "weight\\[0\\] must have x's dtype"),
    (dict(x=[torch.ones(5, 4, dtype=torch.int32)]), "float32, float16, bfloat16"),
    (dict(weight=[torch.randn(2, 3, 5)]), "expert 0's weight must be \\[K=4"),
    (dict(bias=[torch.randn(2, 6)]), "bias must have shape \\[2, 5\\]"),
    (dict(act_type=3), "act_type must be"),
    (dict(group_type=1), "group_type must be"),
    (dict(group_list_type=2), "group_list_type must be"),
    (dict(group_type=2, bias=[]), "group_type 2 takes weight as a list of one \\[K, N\\]"),
])
def test_bad_input(over, message):
    args = _bad(**over)
    with pytest.raises(RuntimeError, match=message):
        GMM(args["x"], args["weight"], args["bias"], args["group_list"], args["group_type"],
            args["group_list_type"], args["act_type"])


@pytest.mark.asan
def test_bad_input_missing_group_list_and_list_lengths():
    x, w, b = _inputs([2, 3], 4, 5, torch.float32)
    with pytest.raises(RuntimeError, match="group_list is required"):
        GMM([x], [w], [], None, 0, 0, 0)
    with pytest.raises(RuntimeError, match="multiplies x\\[i\\] by weight\\[i\\]; got 2 x and 1 weight"):
        GMM([x, x], [w[0]], [], None, -1, 0, 0)
    with pytest.raises(RuntimeError, match="x\\[1\\] has K=3 but weight\\[1\\] has K=4"):
        GMM([x, x[:, :3]], [w[0], w[1]], [], None, -1, 0, 0)
    with pytest.raises(RuntimeError, match="group_type 2 .* takes no activation"):
        GMM([x.t()], [torch.randn(5, 2)], [], torch.tensor([5]), 2, 0, 1)


def test_npu_grouped_matmul_torch_npu_argument_rules():
    counts = [2, 3, 4]
    x, w, b = _inputs(counts, 6, 5, torch.float32)
    gl = torch.cumsum(torch.tensor(counts), 0)
    base = npu_grouped_matmul([x], [w], group_list=gl, split_item=3, group_type=0)[0]
    # int? arguments: None means the default
    got = npu_grouped_matmul([x], [w], group_list=gl, split_item=None, group_type=0, group_list_type=None,
                             act_type=None)
    assert len(got) == 3 and torch.equal(torch.cat(got), base)
    # a tiling hint and the "same dtype" values of the dtype arguments change nothing
    same = npu_grouped_matmul([x], [w], group_list=gl, split_item=3, group_type=0, tuning_config=[3],
                              output_dtype=6, x_dtype=torch.float32, weight_dtype=6)[0]
    assert torch.equal(same, base)
    with pytest.raises(ValueError, match="'tuning_config'"):
        npu_grouped_matmul([x], [w], group_list=gl, group_type=0, tuning_config=[-1])
    with pytest.raises(TypeError, match="'tuning_config'"):
        npu_grouped_matmul([x], [w], group_list=gl, group_type=0, tuning_config=["16"])
    with pytest.raises(ValueError, match="'group_list_type' 2 .* int8 x"):
        npu_grouped_matmul([x], [w], group_list=gl, group_type=0, group_list_type=2)
    with pytest.raises(ValueError, match="'group_list' must be None with group_type -1"):
        npu_grouped_matmul([x[:2], x[2:]], [w[0], w[1]], group_list=gl[:2], group_type=-1)
    with pytest.raises(ValueError, match="'group_list' is required"):
        npu_grouped_matmul([x], [w], group_type=0, split_item=3)
    # several x with group_type 0 (one group each): a group_list must match their rows
    pieces = list(x.split(counts))
    lists = npu_grouped_matmul(pieces, list(w), group_list=gl, split_item=2, group_type=0)
    torch.testing.assert_close(lists[0], base)
    with pytest.raises(ValueError, match="cumulative row counts"):
        npu_grouped_matmul(pieces, list(w), group_list=torch.tensor([2, 4, 9]), split_item=2, group_type=0)


def test_npu_grouped_matmul_list_group_list():
    """torch_npu's .List overload: a list group_list is cumulative, splits along M and takes no group settings."""
    counts = [2, 3, 4]
    x, w, _ = _inputs(counts, 6, 5, torch.float32)
    ends = torch.cumsum(torch.tensor(counts), 0).tolist()
    want = npu_grouped_matmul([x], [w], group_list=torch.tensor(ends), split_item=3, group_type=0)[0]
    torch.testing.assert_close(npu_grouped_matmul([x], [w], group_list=ends, split_item=3)[0], want)
    with pytest.raises(ValueError, match="'group_list_type'"):
        npu_grouped_matmul([x], [w], group_list=counts, group_list_type=1)
    with pytest.raises(ValueError, match="'act_type'"):
        npu_grouped_matmul([x], [w], group_list=ends, act_type=1)
    with pytest.raises(ValueError, match="'group_type'"):
        npu_grouped_matmul([x], [w], group_list=ends, group_type=2)
    with pytest.raises(ValueError, match="length 1"):
        npu_grouped_matmul([x], [w[:1]], group_list=[9])
