"""Shared pieces of the ports of op-plugin's test_npu_dynamic_quant.py and test_npu_dynamic_quant_asymmetric.py:
their inputs (x ~ randn [2, 32, 256]; smooth scales ~ randn, [H] or [64, H] with 64 sorted random group ends, the
last = the row count) and golden functions (float32 math, round half to even, int4 unpacked to int8)."""
import torch

SHAPE = (2, 32, 256)


def inputs(dtype, group_num, seed):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(SHAPE, generator=gen).to(dtype)
    rows = x.numel() // SHAPE[-1]
    if group_num > 1:
        smooth = torch.randn(group_num, SHAPE[-1], generator=gen).to(dtype)
        ends = sorted(torch.randint(0, rows, (group_num,), generator=gen).tolist())
        ends[-1] = rows
        return x, smooth, torch.tensor(ends, dtype=torch.int32)
    return x, torch.randn(SHAPE[-1], generator=gen).to(dtype), None


def smoothed(x, smooth, group_index):
    v = x.float()
    if group_index is None:
        return v if smooth is None else v * smooth.float()
    rows = v.reshape(-1, v.shape[-1]).clone()
    start = 0
    for g, end in enumerate(group_index.tolist()):
        if end > start:
            rows[start:end] = rows[start:end] * smooth[g].float()
        start = max(start, end)
    return rows.view(v.shape)


def int4_to_int8(y):
    """int32 words of 8 int4 values (lowest nibble first) -> int8 values, the layout upstream's test unpacks."""
    b = y.contiguous().view(torch.uint8).reshape(-1, 1)
    low = ((b & 0x0F) << 4).view(torch.int8) >> 4
    high = (b & 0xF0).view(torch.int8) >> 4
    return torch.cat([low, high], dim=-1).reshape(*y.shape[:-1], -1)
