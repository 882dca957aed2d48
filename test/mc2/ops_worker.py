"""One rank of the MC2 multi-process tests (launched by test/mc2/test_ops.py through torch_ops_transformer._internal.spawn,
with the repository root on PYTHONPATH).

    python test/mc2/ops_worker.py <rank> <world_size> <port> <scenario>

Every rank builds the same seeded "full" tensors of all ranks, so float64 references need no communication; the
float32 baselines are the unfused computations (torch.distributed collective, then matmul). Prints MC2-OK at the
end of a passing scenario; expected errors are printed as `MC2-RAISED <type>: <message>` lines.
"""
import datetime
import os
import sys
import warnings

import torch
import torch.distributed as dist
import torch.nn.functional as F

import torch_ops_transformer as tot
from test.common.reference import check_tolerance
from torch_ops_transformer.mc2.tensor_parallel import TensorParallelMLP, shard_sequence

OPS = torch.ops.npu_fa
warnings.filterwarnings("ignore", category=FutureWarning)  # dist.*_tensor deprecation notices on every call
RANK, W = int(sys.argv[1]), int(sys.argv[2])
GROUP = ""


def full(seed, *shape, dtype=torch.float64):
    """The same tensor on every rank (seeded), from which each rank takes its part."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=torch.float64).to(dtype)


def leaf(t, dtype=torch.float32):
    return t.to(dtype).clone().requires_grad_(True)


# ---------------------------------------------------------------- unfused baselines (same dtype, real collectives)

def gather_rows(x):
    out = x.new_empty(W * x.shape[0], *x.shape[1:])
    dist.all_gather_into_tensor(out, x.contiguous())
    return out


def reduce_scatter_rows(x):
    out = x.new_empty(x.shape[0] // W, *x.shape[1:])
    dist.reduce_scatter_tensor(out, x.contiguous())
    return out


def all_reduce(x):
    x = x.clone()
    dist.all_reduce(x)
    return x


def add_bias(t, b):
    return t if b is None else t + b


# ---------------------------------------------------------------- per-op checks

def check_all_gather_matmul(m, k, n, chunks, with_bias, gather_output, dtype=torch.float32, seed=1):
    tag = f"all_gather_matmul m={m} k={k} n={n} chunks={chunks} bias={with_bias} gather_output={gather_output} {dtype}"
    X1, X2, B = full(seed, W, m, k), full(seed + 1, W, k, n), full(seed + 2, W, n)
    DY = full(seed + 3, W, W * m, n)
    x1, x2 = leaf(X1[RANK], dtype), leaf(X2[RANK], dtype)
    b = leaf(B[RANK], dtype) if with_bias else None
    out, gathered = OPS.all_gather_matmul(x1, x2, GROUP, W, b, 0, gather_output, chunks)
    out.backward(DY[RANK].to(dtype))
    # float64 reference from the full data
    ref = add_bias(X1.reshape(W * m, k) @ X2[RANK], B[RANK] if with_bias else None)
    same = add_bias(gather_rows(x1.detach()) @ x2.detach(), b.detach() if with_bias else None)
    check_tolerance(tag + " out", out, ref, same)
    if gather_output:
        assert torch.equal(gathered, X1.reshape(W * m, k).to(dtype)), tag + ": gather_out is not AllGather(x1)"
    else:
        assert gathered.numel() == 0, tag + ": gather_out must be empty when gather_output=False"
    # backward: dx1 = ReduceScatter(dY x2ᵀ), dx2 = gathered(x1)ᵀ dY, dbias = column sums of dY
    dx1_ref = sum(DY[q] @ X2[q].T for q in range(W))[RANK * m:(RANK + 1) * m]
    dy = DY[RANK].to(dtype)
    check_tolerance(tag + " dx1", x1.grad, dx1_ref, reduce_scatter_rows(dy @ x2.detach().T))
    check_tolerance(tag + " dx2", x2.grad, X1.reshape(W * m, k).T @ DY[RANK],
                    gather_rows(x1.detach()).T @ dy)
    if with_bias:
        check_tolerance(tag + " dbias", b.grad, DY[RANK].sum(0), dy.sum(0))


def check_matmul_reduce_scatter(m, k, n, chunks, with_bias, dtype=torch.float32, seed=11):
    tag = f"matmul_reduce_scatter m={m} k={k} n={n} chunks={chunks} bias={with_bias} {dtype}"
    X1, X2, B = full(seed, W, m, k), full(seed + 1, W, k, n), full(seed + 2, n)
    local = m // W
    DY = full(seed + 3, W, local, n)
    x1, x2 = leaf(X1[RANK], dtype), leaf(X2[RANK], dtype)
    b = leaf(B, dtype) if with_bias else None
    out = OPS.matmul_reduce_scatter(x1, x2, GROUP, W, b, chunks)
    out.backward(DY[RANK].to(dtype))
    rows = slice(RANK * local, (RANK + 1) * local)
    ref = add_bias(sum(X1[q] @ X2[q] for q in range(W))[rows], B if with_bias else None)
    same = add_bias(reduce_scatter_rows(x1.detach() @ x2.detach()), b.detach() if with_bias else None)
    check_tolerance(tag + " out", out, ref, same)
    G = DY.reshape(m, n)  # AllGather(dY)
    g_same = gather_rows(DY[RANK].to(dtype))
    check_tolerance(tag + " dx1", x1.grad, G @ X2[RANK].T, g_same @ x2.detach().T)
    check_tolerance(tag + " dx2", x2.grad, X1[RANK].T @ G, x1.detach().T @ g_same)
    if with_bias:  # the replicated bias gets the group total
        check_tolerance(tag + " dbias", b.grad, G.sum(0), g_same.sum(0))


def check_matmul_all_reduce(lead, k, n, chunks, with_bias, dtype=torch.float32, seed=21, with_x3=False):
    tag = f"matmul_all_reduce lead={lead} k={k} n={n} chunks={chunks} bias={with_bias} x3={with_x3} {dtype}"
    X1, X2, B = full(seed, W, *lead, k), full(seed + 1, W, k, n), full(seed + 2, n)
    X3 = full(seed + 4, W, *lead, n)  # each rank's addend before the reduction
    DY = full(seed + 3, *lead, n)  # a loss every rank computes alike
    x1, x2 = leaf(X1[RANK], dtype), leaf(X2[RANK], dtype)
    b = leaf(B, dtype) if with_bias else None
    x3 = leaf(X3[RANK], dtype) if with_x3 else None
    out = OPS.matmul_all_reduce(x1, x2, GROUP, b, chunks, x3)
    out.backward(DY.to(dtype))
    ref = add_bias(sum(X1[q] @ X2[q] + (X3[q] if with_x3 else 0) for q in range(W)), B if with_bias else None)
    product = x1.detach() @ x2.detach() + (x3.detach() if with_x3 else 0)
    same = add_bias(all_reduce(product), b.detach() if with_bias else None)
    check_tolerance(tag + " out", out, ref, same)
    dy = DY.to(dtype)
    check_tolerance(tag + " dx1", x1.grad, DY @ X2[RANK].T, dy @ x2.detach().T)
    check_tolerance(tag + " dx2", x2.grad, X1[RANK].reshape(-1, k).T @ DY.reshape(-1, n),
                    x1.detach().reshape(-1, k).T @ dy.reshape(-1, n))
    if with_bias:
        check_tolerance(tag + " dbias", b.grad, DY.reshape(-1, n).sum(0), dy.reshape(-1, n).sum(0))
    if with_x3:
        assert torch.equal(x3.grad, dy), tag + ": dx3 must be dout"


def rms_norm(h, gamma, eps):
    return h * torch.rsqrt(h.square().mean(-1, keepdim=True) + eps) * gamma


def check_add_rms_norm(lead, k, n, chunks, with_bias, seed=31, with_x3=False):
    tag = f"matmul_all_reduce_add_rms_norm lead={lead} chunks={chunks} bias={with_bias} x3={with_x3}"
    X1, X2, B = full(seed, W, *lead, k), full(seed + 1, W, k, n), full(seed + 2, n)
    R, GAMMA = full(seed + 3, *lead, n), full(seed + 4, n)
    X3 = full(seed + 5, W, *lead, n)
    f32 = torch.float32
    b = B.to(f32) if with_bias else None
    x3 = X3[RANK].to(f32) if with_x3 else None
    y, normed = OPS.matmul_all_reduce_add_rms_norm(X1[RANK].to(f32), X2[RANK].to(f32), R.to(f32), GAMMA.to(f32),
                                                   GROUP, b, 1e-6, chunks, x3)
    h_ref = add_bias(sum(X1[q] @ X2[q] + (X3[q] if with_x3 else 0) for q in range(W)),
                     B if with_bias else None) + R
    h_same = add_bias(all_reduce(X1[RANK].to(f32) @ X2[RANK].to(f32) + (x3 if with_x3 else 0)), b) + R.to(f32)
    check_tolerance(tag + " y", y, h_ref, h_same)
    check_tolerance(tag + " norm_out", normed, rms_norm(h_ref, GAMMA, 1e-6), rms_norm(h_same, GAMMA.to(f32), 1e-6))


def run_opcheck():
    """torch.library.opcheck's schema, autograd-registration and fake-tensor tests inside the real group."""
    utils = ("test_schema", "test_autograd_registration", "test_faketensor")
    x1, x2, b = torch.randn(4, 6, requires_grad=True), torch.randn(6, 5, requires_grad=True), torch.randn(5)
    cases = [
        (OPS.all_gather_matmul, (x1, x2, GROUP, W, b, 0, True, 2)),
        (OPS.all_gather_matmul, (x1, x2, GROUP, W, None, 0, False, 1)),
        (OPS.all_gather_matmul_grad, (torch.randn(4 * W, 5), x1.detach(), x2.detach(), torch.empty(0, 6), GROUP, W,
                                      b, 2)),
        (OPS.matmul_reduce_scatter, (torch.randn(2 * W, 6, requires_grad=True), x2, GROUP, W, b, 2)),
        (OPS.matmul_reduce_scatter_grad, (torch.randn(2, 5), torch.randn(2 * W, 6), x2.detach(), GROUP, W, b, 1)),
        (OPS.matmul_all_reduce, (torch.randn(2, 3, 6, requires_grad=True), x2, GROUP, b, 2)),
        (OPS.matmul_all_reduce, (torch.randn(2, 3, 6, requires_grad=True), x2, GROUP, b, 2,
                                 torch.randn(2, 3, 5, requires_grad=True))),
        (OPS.matmul_all_reduce_grad, (torch.randn(2, 3, 5), torch.randn(2, 3, 6), x2.detach(), b)),
        (OPS.matmul_all_reduce_grad, (torch.randn(2, 3, 5), torch.randn(2, 3, 6), x2.detach(), b,
                                      torch.randn(2, 3, 5))),
        (OPS.matmul_all_reduce_add_rms_norm, (torch.randn(4, 6), x2.detach(), torch.randn(4, 5), torch.randn(5),
                                              GROUP, b, 1e-6, 2)),
    ]
    for op, args in cases:
        torch.library.opcheck(op.default, args, test_utils=utils)


def scenario_ops():
    for chunks in (1, 3, 0):
        for with_bias in (False, True):
            check_all_gather_matmul(10, 16, 12, chunks, with_bias, gather_output=with_bias)
            check_matmul_reduce_scatter(12 * W, 16, 10, chunks, with_bias)
            check_matmul_all_reduce((2, 7), 16, 10, chunks, with_bias, with_x3=chunks == 3)
        check_add_rms_norm((3, 5), 16, 24, chunks, with_bias=chunks != 1, with_x3=chunks == 3)
    # larger shapes: the automatic chunk count pipelines here; bf16 uses the same-dtype unfused baseline
    check_all_gather_matmul(256, 96, 64, 0, True, gather_output=False)
    check_matmul_reduce_scatter(256 * W, 64, 96, 0, True)
    check_matmul_all_reduce((512,), 96, 128, 0, True)
    check_all_gather_matmul(33, 16, 8, 4, True, gather_output=True, dtype=torch.bfloat16)
    check_matmul_reduce_scatter(8 * W, 16, 8, 3, True, dtype=torch.bfloat16)
    check_matmul_all_reduce((9,), 16, 8, 2, False, dtype=torch.bfloat16)
    check_wrappers()


def scenario_ops_core():
    """The pipelined and unpipelined paths of every op with bias, forward and backward (the world-size-4 run)."""
    for chunks in (1, 3):
        check_all_gather_matmul(10, 16, 12, chunks, True, gather_output=chunks == 1)
        check_matmul_reduce_scatter(12 * W, 16, 10, chunks, True)
        check_matmul_all_reduce((2, 7), 16, 10, chunks, True)
        check_add_rms_norm((3, 5), 16, 24, chunks, True)


def check_wrappers():
    """torch_npu-style wrappers: hcom as a group name or a ProcessGroup, world_size optional."""
    x1, x2, b = torch.randn(4, 6), torch.randn(6, 5), torch.randn(5)
    out, g = tot.npu_all_gather_base_mm(x1, x2, GROUP, W, bias=b)
    out2, _ = tot.npu_all_gather_base_mm(x1, x2, dist.group.WORLD, bias=b, chunks=2)
    torch.testing.assert_close(out, out2)
    torch.testing.assert_close(out, gather_rows(x1) @ x2 + b)
    rs = tot.npu_mm_reduce_scatter_base(torch.randn(2 * W, 6), x2, dist.group.WORLD)
    assert rs.shape == (2, 5)
    # torch_npu's all-reduce ops add the bias on every rank, inside the reduction
    ar = tot.npu_mm_all_reduce_base(x1, x2, GROUP, bias=b)
    torch.testing.assert_close(ar, all_reduce(x1 @ x2 + b))
    residual, gamma = torch.randn(4, 5), torch.rand(5)
    y, normed = tot.npu_mm_all_reduce_add_rms_norm(x1, x2, residual, gamma, GROUP, bias=b)
    h = all_reduce(x1 @ x2 + b) + residual
    torch.testing.assert_close(y, h)
    torch.testing.assert_close(normed, rms_norm(h, gamma, 1e-6))


def scenario_tp():
    """A tensor-parallel MLP (sequence-parallel) equals the single-process MLP: forward, backward, two SGD steps."""
    torch.manual_seed(5)
    S, batch, h, f = 4 * W, 3, 16, 8 * W
    fc1, fc2 = torch.nn.Linear(h, f).double(), torch.nn.Linear(f, h).double()
    ref_mlp = torch.nn.Sequential(fc1, torch.nn.GELU(), fc2)
    tp = TensorParallelMLP.from_linears(fc1, fc2, torch.nn.GELU(), chunks=2)
    X, T = full(41, S, batch, h), full(42, S, batch, h)
    opt_ref = torch.optim.SGD(ref_mlp.parameters(), lr=0.1)
    opt_tp = torch.optim.SGD(tp.parameters(), lr=0.1)
    rows = S // W
    for step in range(2):
        x_ref, x_tp = X.clone().requires_grad_(), shard_sequence(X).clone().requires_grad_()
        y_ref, y_tp = ref_mlp(x_ref), tp(x_tp)
        torch.testing.assert_close(y_tp, shard_sequence(y_ref), rtol=0, atol=1e-10, msg=f"step {step}: forward")
        F.mse_loss(y_ref, T, reduction="sum").backward()
        F.mse_loss(y_tp, shard_sequence(T), reduction="sum").backward()
        torch.testing.assert_close(x_tp.grad, shard_sequence(x_ref.grad), rtol=0, atol=1e-10)
        f_rows = slice(RANK * (f // W), (RANK + 1) * (f // W))
        grads = [(tp.fc1.weight.grad, fc1.weight.grad[f_rows]), (tp.fc1.bias.grad, fc1.bias.grad[f_rows]),
                 (tp.fc2.weight.grad, fc2.weight.grad[:, f_rows]), (tp.fc2.bias.grad, fc2.bias.grad)]
        for i, (ours, ref) in enumerate(grads):
            torch.testing.assert_close(ours, ref, rtol=0, atol=1e-10, msg=f"step {step}: gradient {i}")
        opt_ref.step(), opt_tp.step(), opt_ref.zero_grad(), opt_tp.zero_grad()
    assert y_tp.shape == (rows, batch, h)


def scenario_compile():
    """torch.compile(fullgraph=True) traces the ops through their fake kernels, forward and backward (aot_eager)."""
    def block(x, w1, w2):
        h, _ = OPS.all_gather_matmul(x, w1, GROUP, W, None, 0, False, 2)
        return OPS.matmul_reduce_scatter(torch.relu(h), w2, GROUP, W, None, 2)

    torch.manual_seed(7)
    args = [torch.randn(8, 16), torch.randn(16, 12), torch.randn(12, 16)]
    eager_args = [a.clone().requires_grad_() for a in args]
    compiled_args = [a.clone().requires_grad_() for a in args]
    block(*eager_args).square().sum().backward()
    compiled = torch.compile(block, backend="aot_eager", fullgraph=True)
    compiled(*compiled_args).square().sum().backward()
    for e, c in zip(eager_args, compiled_args):
        torch.testing.assert_close(c.grad, e.grad)


def expect_error(kind, fragments, fn):
    try:
        fn()
    except kind as e:
        msg = str(e)
        missing = [f for f in fragments if f not in msg]
        assert not missing, f"error message lacks {missing}: {msg}"
        print(f"MC2-RAISED {type(e).__name__}: {msg.splitlines()[0]}", flush=True)
        return
    raise AssertionError(f"expected {kind.__name__} containing {fragments}")


def scenario_bad_input():
    """Local argument errors: raised alike on every rank before any communication."""
    x1, x2 = torch.randn(4, 8), torch.randn(8, 5)
    expect_error(ValueError, ["x1's last dim", "x2"], lambda: OPS.all_gather_matmul(x1, torch.randn(6, 5), GROUP, W))
    expect_error(ValueError, ["x1's last dim"], lambda: OPS.matmul_reduce_scatter(x1, torch.randn(6, 5), GROUP, W))
    expect_error(ValueError, ["x1's last dim"], lambda: OPS.matmul_all_reduce(x1, torch.randn(6, 5), GROUP))
    expect_error(ValueError, ["divisible by world_size"],
                 lambda: OPS.matmul_reduce_scatter(torch.randn(2 * W + 1, 8), x2, GROUP, W))
    expect_error(ValueError, ["'group_name'", "no_such_group"],
                 lambda: OPS.all_gather_matmul(x1, x2, "no_such_group", W))
    expect_error(ValueError, ["'hcom'", "no_such_group"], lambda: tot.npu_mm_all_reduce_base(x1, x2, "no_such_group"))
    expect_error(ValueError, ["'world_size'", str(W + 1)], lambda: OPS.all_gather_matmul(x1, x2, GROUP, W + 1))
    expect_error(ValueError, ["x2's dtype"], lambda: OPS.all_gather_matmul(x1, x2.double(), GROUP, W))
    expect_error(ValueError, ["bias"], lambda: OPS.matmul_all_reduce(x1, x2, GROUP, torch.randn(4)))
    expect_error(ValueError, ["x3", "output's shape"],
                 lambda: OPS.matmul_all_reduce(x1, x2, GROUP, None, 0, torch.randn(4, 6)))
    expect_error(ValueError, ["gather_index"], lambda: OPS.all_gather_matmul(x1, x2, GROUP, W, None, 1))
    expect_error(ValueError, ["'chunks'"], lambda: OPS.matmul_all_reduce(x1, x2, GROUP, None, -1))
    expect_error(ValueError, ["reduce_op"], lambda: tot.npu_mm_reduce_scatter_base(x1, x2, GROUP, reduce_op="max"))
    expect_error(ValueError, ["residual"], lambda: OPS.matmul_all_reduce_add_rms_norm(
        x1, x2, torch.randn(4, 6), torch.randn(5), GROUP))


def scenario_mismatch():
    """Ranks disagreeing on dtype / shape / chunks: the validation all-gather makes every rank raise the same error,
    and the group stays usable afterwards."""
    dtype = torch.float32 if RANK == 0 else torch.float64
    expect_error(ValueError, ["disagree on the dtype of x1", "rank 0: Float", "rank 1: Double"],
                 lambda: OPS.all_gather_matmul(torch.randn(4, 8, dtype=dtype), torch.randn(8, 5, dtype=dtype),
                                               GROUP, W))
    rows = 4 if RANK == 0 else 6
    expect_error(ValueError, ["disagree on x1.shape[0]"],
                 lambda: OPS.all_gather_matmul(torch.randn(rows, 8), torch.randn(8, 5), GROUP, W))
    expect_error(ValueError, ["disagree on x2.shape[1]"],
                 lambda: OPS.matmul_reduce_scatter(torch.randn(2 * W, 8), torch.randn(8, 5 + RANK), GROUP, W))
    expect_error(ValueError, ["disagree on argument 'chunks'"],
                 lambda: OPS.matmul_all_reduce(torch.randn(8, 8), torch.randn(8, 5), GROUP, None, 1 + RANK))
    check_matmul_all_reduce((6,), 8, 5, 2, True)  # still in step


def scenario_rank_fails():
    """Rank 1 dies before the op; the others must raise (not hang) well within the process-group timeout."""
    if RANK == 1:
        print("rank 1 exits on purpose", flush=True)
        os._exit(3)
    x1, x2 = torch.randn(64, 32), torch.randn(32, 16)
    expect_error(RuntimeError, [], lambda: [OPS.all_gather_matmul(x1, x2, GROUP, W) for _ in range(20)])


def scenario_mismatch_unvalidated():
    """Validation off and ranks sending different row counts. Observed with gloo: the rank receiving more bytes than
    it expects aborts (gloo::EnforceNotMet in its I/O thread), the other may complete with garbage; no rank hangs.
    This is why validation is on by default."""
    tot.mc2_validation(False)
    rows = 64 if RANK == 0 else 48
    try:
        OPS.all_gather_matmul(torch.randn(rows, 32), torch.randn(32, 16), GROUP, W, None, 0, True, 1)
        print("MC2-COMPLETED-WITHOUT-ERROR", flush=True)
    except RuntimeError as e:
        print(f"MC2-RAISED RuntimeError: {str(e).splitlines()[0]}", flush=True)


SCENARIOS = {"ops": scenario_ops, "ops_core": scenario_ops_core, "tp": scenario_tp, "compile": scenario_compile, "bad_input": scenario_bad_input, "opcheck": run_opcheck,
             "mismatch": scenario_mismatch, "rank_fails": scenario_rank_fails,
             "mismatch_unvalidated": scenario_mismatch_unvalidated}

BREAKS_GROUP = {"rank_fails", "mismatch_unvalidated"}


def main():
    global GROUP
    port, names = sys.argv[3], sys.argv[4].split(",")
    timeout = float(os.environ.get("MC2_TEST_PG_TIMEOUT", "30"))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=RANK, world_size=W,
                            timeout=datetime.timedelta(seconds=timeout))
    GROUP = dist.group.WORLD.group_name
    for name in names:
        SCENARIOS[name]()
        print(f"MC2-OK {name}", flush=True)
    if BREAKS_GROUP & set(names):
        os._exit(0)  # the group is broken on purpose: no orderly teardown is possible
    dist.barrier()  # nobody tears gloo down while a peer still talks to it
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
