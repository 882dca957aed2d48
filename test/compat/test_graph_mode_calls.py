"""The FIA calling conventions of NPU graph capture, as serving engines use them through torch_npu:
`_npu_fused_infer_attention_score(_v2)_get_max_workspace(...)` then `npu_fused_infer_attention_score(_v2).out(...,
workspace=ws, out=[attention_out, softmax_lse])` into preallocated tensors. Same results as the plain call."""
import pytest
import torch

import torch_ops_transformer as tot
from torch_ops_transformer.inference import api as inference

T, N, N2, D, BLOCK = 5, 4, 2, 16, 16


def _paged_tnd():
    torch.manual_seed(0)
    q = torch.randn(T, N, D, dtype=torch.bfloat16)
    kc = torch.randn(4, BLOCK, N2 * D, dtype=torch.bfloat16)
    vc = torch.randn(4, BLOCK, N2 * D, dtype=torch.bfloat16)
    return dict(query=q, key=kc, value=vc, block_table=torch.tensor([[0, 1], [2, 3]], dtype=torch.int32),
                input_layout="TND", block_size=BLOCK, actual_seq_lengths=[2, 5], actual_seq_lengths_kv=[20, 30],
                num_key_value_heads=N2, num_heads=N, scale=D ** -0.5, sparse_mode=0)


@pytest.mark.parametrize("lse", [False, True])
def test_out_variant_writes_the_plain_results(lse):
    kw = _paged_tnd()
    ws = inference._npu_fused_infer_attention_score_get_max_workspace(**kw)
    assert ws.device == kw["query"].device
    want, want_lse = tot.npu_fused_infer_attention_score(**kw, softmax_lse_flag=lse)
    out, lse_buf = torch.empty_like(kw["query"]), torch.empty(T, dtype=torch.bfloat16)  # vLLM's buffers
    got = tot.npu_fused_infer_attention_score.out(**kw, softmax_lse_flag=lse, workspace=ws, out=[out, lse_buf])
    assert got[0] is out and got[1] is lse_buf
    torch.testing.assert_close(out, want, rtol=0, atol=0)
    if lse:  # resized to the lse's shape and cast to the buffer's dtype
        torch.testing.assert_close(lse_buf, want_lse.to(torch.bfloat16), rtol=0, atol=0)
    else:
        assert lse_buf.shape == (T,)


def test_v2_out_variant_and_keyword_results():
    kw = _paged_tnd()
    v2 = dict(kw, num_query_heads=kw.pop("num_heads"), softmax_scale=kw.pop("scale"),
              actual_seq_qlen=kw.pop("actual_seq_lengths"), actual_seq_kvlen=kw.pop("actual_seq_lengths_kv"))
    for name in ("num_heads", "scale", "actual_seq_lengths", "actual_seq_lengths_kv"):
        v2.pop(name, None)
    ws = inference._npu_fused_infer_attention_score_v2_get_max_workspace(**v2)
    want, want_lse = tot.npu_fused_infer_attention_score_v2(**v2, return_softmax_lse=True)
    out, lse_buf = torch.empty_like(want), torch.empty(0)
    tot.npu_fused_infer_attention_score_v2.out(**v2, return_softmax_lse=True, workspace=ws, attention_out=out,
                                               softmax_lse=lse_buf)
    torch.testing.assert_close(out, want, rtol=0, atol=0)
    torch.testing.assert_close(lse_buf, want_lse, rtol=0, atol=0)


def test_shim_exposes_them():
    from torch_ops_transformer import compat
    torch_npu = compat.module()
    assert torch_npu.npu_fused_infer_attention_score.out is tot.npu_fused_infer_attention_score.out
    assert callable(torch_npu._npu_fused_infer_attention_score_v2_get_max_workspace)


def test_bad_results_arguments():
    kw = _paged_tnd()
    fia = tot.npu_fused_infer_attention_score
    with pytest.raises(ValueError, match="'attention_out' must have the result's shape"):
        fia.out(**kw, out=[torch.empty(T, N, D + 1, dtype=torch.bfloat16), torch.empty(1)])
    with pytest.raises(ValueError, match="'out' must be a list of two tensors"):
        fia.out(**kw, out=[torch.empty(T, N, D, dtype=torch.bfloat16)])
    with pytest.raises(TypeError, match="'softmax_lse' must be a tensor"):
        fia.out(**kw, attention_out=torch.empty(T, N, D, dtype=torch.bfloat16))
    with pytest.raises(TypeError, match="'workspace' must be a tensor"):
        fia.out(**kw, workspace=3, out=[torch.empty(T, N, D, dtype=torch.bfloat16), torch.empty(1)])
    with pytest.raises(TypeError):  # an argument the API does not have, as upstream
        inference._npu_fused_infer_attention_score_get_max_workspace(**kw, no_such_argument=1)
