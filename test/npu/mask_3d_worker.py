"""The 3-D atten_mask ([B, Sq, Skv] and [1, Sq, Skv]) of prompt_flash_attention / fused_infer_attention_score on the
simulated npu device, in the few small calls that reach every way the glue hands a mask to the FlashAttention
kernel: one launch for the batch, one launch per sequence (per-batch lengths), a paged cache's gathered keys.
Fallbacks are refused, so the kernel runs. Small enough for the AddressSanitizer subset (test_mask_3d.py); the full
grid of mask shapes is in prefill_worker.py.
"""
import torch

from test.npu import prefill_worker
from test.npu.prefill_worker import _check_mask_shape, _check_paged_mask


def case_one_launch():
    _check_mask_shape(False, "BSS", "BNSD", torch.float16, 0, pre=9, nxt=4)
    _check_mask_shape(True, "1SS", "BSH", torch.float32, 1)


def case_one_launch_per_sequence():
    _check_mask_shape(True, "BSS", "BSND", torch.float32, 1, q_lens=[19, 7], kv_lens=[30, 37])
    _check_mask_shape(False, "1SS", "BNSD", torch.float32, 0, q_lens=[5, 19], kv_lens=[37, 12])


def case_paged_cache():
    _check_paged_mask("BSS", "BSND", 0, [20, 37])
    _check_paged_mask("1SS", "BNSD", 1, [37, 37])


def case_torch_npu_example():
    prefill_worker.case_torch_npu_fia_causal_3d_mask_example()
