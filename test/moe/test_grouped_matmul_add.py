"""MindSpeed's npu_grouped_matmul_add(_): y[g] += x_g^T @ weight_g over groups of the token dimension, against a
float64 reference under the project's tolerance rule (the same-dtype term: PyTorch's fp32 product of the widened
operands, what upstream's own fp32 golden computes)."""
import pytest
import torch

import torch_ops_transformer as tot
from test.common.reference import check_tolerance
from test.common.doc_examples import run_examples
from test.common.tiers import pairwise


def ref_gmm_add(y, x, w, ends, dtype=torch.float64):
    out = y.to(dtype).reshape(len(ends), x.shape[1], w.shape[1]).clone()
    start = 0
    for g, end in enumerate(ends):
        out[g] += x[start:end].to(dtype).t() @ w[start:end].to(dtype)
        start = end
    return out.reshape(y.shape)


AXES = {"dtype": {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32},
        "group_list_type": (0, 1), "y3d": (False, True), "empty_group": (False, True)}


@pytest.mark.parametrize("dtype,group_list_type,y3d,empty_group", pairwise(**AXES))
def test_grouped_matmul_add_matches_reference(dtype, group_list_type, y3d, empty_group):
    g = torch.Generator().manual_seed(7)
    M, K, N = 96, 24, 40
    counts = [30, 0, 66] if empty_group else [30, 20, 46]
    ends = torch.tensor(counts).cumsum(0).tolist()
    x, w = torch.randn(M, K, generator=g).to(dtype), torch.randn(M, N, generator=g).to(dtype)
    y = torch.randn((3, K, N) if y3d else (3 * K, N), generator=g)
    gl = torch.tensor(ends if group_list_type == 0 else counts)
    ref = ref_gmm_add(y, x, w, ends)
    same = ref_gmm_add(y, x, w, ends, dtype=torch.float32)
    out = tot.npu_grouped_matmul_add(y, x, w, gl, group_list_type=group_list_type)
    check_tolerance("y", out, ref, same)
    y2 = y.clone()
    assert tot.npu_grouped_matmul_add_(y2, x, w, gl, group_list_type=group_list_type) is y2
    assert torch.equal(y2, out)


def test_fp32_accumulation_beats_a_bf16_product():
    """bf16 operands, fp32 y: the result is the fp32 GEMM of the exact (widened) operands, not a product rounded
    to bf16 before the addition."""
    g = torch.Generator().manual_seed(8)
    x, w = torch.randn(512, 16, generator=g).bfloat16(), torch.randn(512, 8, generator=g).bfloat16()
    y = torch.zeros(16, 8)
    out = tot.npu_grouped_matmul_add(y, x, w, torch.tensor([512]))
    exact = x.double().t() @ w.double()
    assert (out.double() - exact).abs().max() < 1e-4
    assert (out.double() - (x.t() @ w).double()).abs().max() > 1e-3  # what a bf16 result would have lost


def test_y_in_the_operands_dtype():
    g = torch.Generator().manual_seed(9)
    x, w = torch.randn(10, 4, generator=g).bfloat16(), torch.randn(10, 3, generator=g).bfloat16()
    y = torch.randn(8, 3, generator=g).bfloat16()
    out = tot.npu_grouped_matmul_add(y, x, w, torch.tensor([4, 10]))
    ref = ref_gmm_add(y, x, w, [4, 10])
    check_tolerance("y", out, ref, ref_gmm_add(y, x, w, [4, 10], dtype=torch.float32).bfloat16())


def test_grouped_matmul_add_compiles_fullgraph():
    def step(y, x, w, gl):
        tot.npu_grouped_matmul_add_(y, x, w, gl)
        return y * 0.5

    x, w, gl = torch.randn(9, 4), torch.randn(9, 3), torch.tensor([5, 9])
    y1, y2 = torch.zeros(8, 3), torch.zeros(8, 3)
    torch.testing.assert_close(torch.compile(step, fullgraph=True)(y1, x, w, gl), step(y2, x, w, gl))
    torch.testing.assert_close(y1, y2)


# ---- bad inputs: one test per rule --------------------------------------------------------------------------------
def _args():
    return torch.zeros(8, 3), torch.randn(9, 4), torch.randn(9, 3), torch.tensor([5, 9])


def test_bad_transpose():
    with pytest.raises(ValueError, match="only transpose_x=True and transpose_weight=False"):
        tot.npu_grouped_matmul_add(*_args(), transpose_weight=True)


def test_bad_group_type():
    with pytest.raises(ValueError, match="argument 'group_type' must be 2"):
        tot.npu_grouped_matmul_add(*_args(), group_type=0)


def test_bad_group_list_type():
    with pytest.raises(ValueError, match="argument 'group_list_type' must be 0 .* or 1"):
        tot.npu_grouped_matmul_add(*_args(), group_list_type=2)


def test_bad_y_shape():
    y, x, w, gl = _args()
    with pytest.raises(ValueError, match=r"argument 'y' must be \[G\*K, N\] = \[8, 3\]"):
        tot.npu_grouped_matmul_add(torch.zeros(4, 3), x, w, gl)


def test_bad_group_list_values():
    y, x, w, _ = _args()
    with pytest.raises(ValueError, match="non-decreasing ends within M = 9"):
        tot.npu_grouped_matmul_add(y, x, w, torch.tensor([6, 5]))
    with pytest.raises(ValueError, match="non-negative counts within M = 9"):
        tot.npu_grouped_matmul_add(y, x, w, torch.tensor([6, 5]), group_list_type=1)


def test_bad_operand_shapes():
    y, x, w, gl = _args()
    with pytest.raises(ValueError, match="must be 2-D with the same M"):
        tot.npu_grouped_matmul_add(y, x, w[:8], gl)


def test_bad_dtypes():
    y, x, w, gl = _args()
    with pytest.raises(TypeError, match="argument 'weight' .* must have the dtype of 'x'"):
        tot.npu_grouped_matmul_add(y, x, w.half(), gl)
    with pytest.raises(TypeError, match="argument 'y' must be Float"):
        tot.npu_grouped_matmul_add(y.double(), x, w, gl)


def test_doc_example_npu_grouped_matmul_add_():
    run_examples("moe.md", "npu_grouped_matmul_add_")
