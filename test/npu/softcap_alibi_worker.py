"""softcap and in-kernel ALiBi (pse_type 2/3) of flash_attention_score(_grad) on the simulated npu device, run by
test_softcap_alibi.py through runner.run_cases.

The Ascend C kernels have no softcap or ALiBi path, so these calls run the CPU kernels on aliases of the npu tensors
(aten_ops/npu/attention/attention.cpp, attention_grad.cpp): every result must be on the npu and equal, bit for bit,
to the same call on CPU tensors, forward and backward.
"""
import torch

import torch_ops_transformer as tot
from test.npu.attention_args_worker import _both, _tensors

OPS = torch.ops.npu_fa


def _op_forward_backward(device, q, k, v, dy, **kw):
    leaves = [t.to(device).requires_grad_() for t in (q, k, v)]
    kw = {n: x.to(device) if isinstance(x, torch.Tensor) else x for n, x in kw.items()}
    res = OPS.flash_attention_score(*leaves, **kw)
    return list(res[:3]) + list(torch.autograd.grad(res[0], leaves, dy.to(device)))


def case_softcap_dense():
    q, k, v, dy = _tensors((2, 9, 4, 16), (2, 11, 2, 16), (2, 11, 2, 16), (2, 9, 4, 16))
    _both(lambda d: _op_forward_backward(d, q, k, v, dy, head_num=4, input_layout="BSND", scale=0.5, softcap=3.0,
                                         sparse_mode=3))


def case_alibi_pse_type2_and_3():
    q, k, v, dy = _tensors((1, 4, 7, 16), (1, 4, 7, 16), (1, 4, 7, 16), (1, 4, 7, 16))
    for pse_type in (2, 3):
        slopes = torch.tensor([[0.5, 0.25, 0.125, 0.0625]])
        _both(lambda d: _op_forward_backward(d, q, k, v, dy, head_num=4, input_layout="BNSD", scale=0.25,
                                             pse=slopes, pse_type=pse_type, q_start_idx=[2], kv_start_idx=[0]))


def case_flash_attn_func_softcap_alibi():
    q, k, v = _tensors((2, 5, 4, 8), (2, 7, 2, 8), (2, 7, 2, 8))
    slopes = torch.rand(4, generator=torch.Generator().manual_seed(1))

    def run(device):
        out, lse, _ = tot.flash_attn_func(q.to(device), k.to(device), v.to(device), causal=True, softcap=5.0,
                                          alibi_slopes=slopes.to(device), return_attn_probs=True)
        return out, lse

    _both(run)


def case_varlen_softcap():
    q, k, v = _tensors((9, 2, 8), (12, 1, 8), (12, 1, 8))
    cu_q, cu_k = torch.tensor([0, 4, 9], dtype=torch.int32), torch.tensor([0, 5, 12], dtype=torch.int32)

    def run(device):
        return (tot.flash_attn_varlen_func(q.to(device), k.to(device), v.to(device), cu_q.to(device),
                                           cu_k.to(device), 5, 7, softcap=2.0, causal=True),)

    _both(run)
