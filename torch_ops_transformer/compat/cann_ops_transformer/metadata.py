"""The `*_metadata` functions of cann_ops_transformer: on the NPU they split the work of the matching operator
over the AI cores (start and end batch, head and block per core) and the operator reads that split. Our CPU
kernels schedule their own work, so the stand-in checks the arguments as the operator would and returns a tensor
of upstream's shape and dtype (int32 [1024]; [64] for the KL loss) that holds no split: zeros. The operators accept
it, and any other tensor or None, and ignore it."""
import torch

from . import _common as c

_SIZE = 1024
_KL_SIZE = 64


def _heads(op: str, num_heads_q, num_heads_k, head_dim, k_name: str) -> None:
    c.int_in(op, "num_heads_q", num_heads_q, 1, 2**31 - 1)
    c.int_in(op, k_name, num_heads_k, 1, 2**31 - 1)
    c.int_in(op, "head_dim", head_dim, 1, 2**31 - 1)
    if num_heads_q % num_heads_k:
        raise ValueError(f"{op}: argument 'num_heads_q' ({num_heads_q}) must be a multiple of '{k_name}' "
                         f"({num_heads_k})")


def _optional(value, default):
    return default if value is None else value


def _placeholder(size: int) -> torch.Tensor:
    return torch.zeros(size, dtype=torch.int32)


def _indexer_checks(op, num_heads_q, num_heads_k, head_dim, topk, layout_q, layout_k, mask_mode, cmp_ratio):
    _heads(op, num_heads_q, num_heads_k, head_dim, "num_heads_k")
    c.int_in(op, "topk", topk, 1, 8192)
    c.choice(op, "layout_q", _optional(layout_q, "BSND"), c.LAYOUTS_Q)
    c.choice(op, "layout_k", _optional(layout_k, "BSND"), ("BSND", "TND", "PA_BBND"))
    c.choice(op, "mask_mode", _optional(mask_mode, 0), (0, 3))
    c.int_in(op, "cmp_ratio", _optional(cmp_ratio, 1), 1, 128)


def lightning_indexer_metadata(num_heads_q, num_heads_k, head_dim, topk, *, cu_seqlens_q=None, cu_seqlens_k=None,
                               seqused_q=None, seqused_k=None, cmp_residual_k=None, batch_size=0, max_seqlen_q=-1,
                               max_seqlen_k=-1, layout_q="BSND", layout_k="BSND", mask_mode=0, cmp_ratio=1):
    """cann_ops_transformer.lightning_indexer_metadata: int32 [1024], the stand-in's placeholder (module doc)."""
    _indexer_checks("cann_ops_transformer.lightning_indexer_metadata", num_heads_q, num_heads_k, head_dim, topk,
                    layout_q, layout_k, mask_mode, cmp_ratio)
    return _placeholder(_SIZE)


def quant_lightning_indexer_metadata(num_heads_q, num_heads_k, head_dim, topk, quant_mode, *, cu_seqlens_q=None,
                                     cu_seqlens_k=None, seqused_q=None, seqused_k=None, cmp_residual_k=None,
                                     batch_size=0, max_seqlen_q=-1, max_seqlen_k=-1, layout_q="BSND",
                                     layout_k="BSND", mask_mode=0, cmp_ratio=1):
    """cann_ops_transformer.quant_lightning_indexer_metadata: int32 [1024], the stand-in's placeholder."""
    op = "cann_ops_transformer.quant_lightning_indexer_metadata"
    _indexer_checks(op, num_heads_q, num_heads_k, head_dim, topk, layout_q, layout_k, mask_mode, cmp_ratio)
    c.choice(op, "quant_mode", quant_mode, (1, 2, 4))
    return _placeholder(_SIZE)


def _mla_checks(op, num_heads_q, num_heads_kv, head_dim, cmp_ratio, ori_mask_mode, cmp_mask_mode, layout_q,
                layout_kv):
    _heads(op, num_heads_q, num_heads_kv, head_dim, "num_heads_kv")
    c.int_in(op, "cmp_ratio", _optional(cmp_ratio, 1), 1, 128)
    c.choice(op, "ori_mask_mode", _optional(ori_mask_mode, 0), (0, 3, 4))
    c.choice(op, "cmp_mask_mode", _optional(cmp_mask_mode, 0), (0, 3))
    c.choice(op, "layout_q", _optional(layout_q, "BSND"), c.LAYOUTS_Q)
    c.choice(op, "layout_kv", _optional(layout_kv, "BSND"), ("BSND", "TND", "PA_BBND"))


def sparse_flash_mla_metadata(num_heads_q, num_heads_kv, head_dim, *, cu_seqlens_q=None, cu_seqlens_ori_kv=None,
                              cu_seqlens_cmp_kv=None, seqused_q=None, seqused_ori_kv=None, seqused_cmp_kv=None,
                              cmp_residual_kv=None, ori_topk_length=None, cmp_topk_length=None, batch_size=0,
                              max_seqlen_q=0, max_seqlen_ori_kv=0, max_seqlen_cmp_kv=0, ori_topk=0, cmp_topk=0,
                              cmp_ratio=1, ori_mask_mode=0, cmp_mask_mode=0, ori_win_left=-1, ori_win_right=-1,
                              layout_q="BSND", layout_kv="BSND", has_ori_kv=True, has_cmp_kv=True):
    """cann_ops_transformer.sparse_flash_mla_metadata: int32 [1024], the stand-in's placeholder."""
    _mla_checks("cann_ops_transformer.sparse_flash_mla_metadata", num_heads_q, num_heads_kv, head_dim, cmp_ratio,
                ori_mask_mode, cmp_mask_mode, layout_q, layout_kv)
    return _placeholder(_SIZE)


def sparse_flash_mla_grad_metadata(num_heads_q, num_heads_kv, head_dim, *, cu_seqlens_q=None,
                                   cu_seqlens_ori_kv=None, cu_seqlens_cmp_kv=None, seqused_q=None,
                                   seqused_ori_kv=None, seqused_cmp_kv=None, cmp_residual_kv=None,
                                   ori_topk_length=None, cmp_topk_length=None, batch_size=None, max_seqlen_q=None,
                                   max_seqlen_ori_kv=None, max_seqlen_cmp_kv=None, ori_topk=None, cmp_topk=None,
                                   cmp_ratio=None, ori_mask_mode=0, cmp_mask_mode=0, ori_win_left=-1,
                                   ori_win_right=-1, layout_q="BSND", layout_kv="BSND", has_ori_kv=True,
                                   has_cmp_kv=True):
    """cann_ops_transformer.sparse_flash_mla_grad_metadata: int32 [1024], the stand-in's placeholder."""
    _mla_checks("cann_ops_transformer.sparse_flash_mla_grad_metadata", num_heads_q, num_heads_kv, head_dim,
                cmp_ratio, ori_mask_mode, cmp_mask_mode, layout_q, layout_kv)
    return _placeholder(_SIZE)


def sparse_lightning_indexer_kl_loss_grad_metadata(num_heads_q, num_heads_k, head_dim, *, cu_seqlens_q=None,
                                                   cu_seqlens_k=None, seqused_q=None, seqused_k=None,
                                                   cmp_residual_k=None, batch_size=None, max_seqlen_q=None,
                                                   max_seqlen_k=None, topk=None, layout_q=None, layout_k=None,
                                                   mask_mode=None, cmp_ratio=None):
    """cann_ops_transformer.sparse_lightning_indexer_kl_loss_grad_metadata: int32 [64], the stand-in's
    placeholder."""
    op = "cann_ops_transformer.sparse_lightning_indexer_kl_loss_grad_metadata"
    _indexer_checks(op, num_heads_q, num_heads_k, head_dim, 1 if topk is None else topk, layout_q, layout_k,
                    mask_mode, cmp_ratio)
    return _placeholder(_KL_SIZE)
