"""Argument checks shared by MC2Optimizer and MC2DistributedDataParallel (errors name the argument)."""
import torch.distributed as dist


def require_process_group(api: str, process_group):
    """Return the process group to use, or raise if torch.distributed is not initialised."""
    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError(
            f"{api}: torch.distributed is not initialised; call torch.distributed.init_process_group(...) "
            "(backend 'gloo' on CPU, 'hccl' on Ascend, 'nccl' on CUDA) before creating it"
        )
    if process_group is None:
        return dist.group.WORLD
    if not isinstance(process_group, dist.ProcessGroup):
        raise TypeError(f"{api}: process_group must be a torch.distributed.ProcessGroup or None, "
                        f"got {type(process_group).__name__}")
    return process_group


def check_bucket_cap_mb(api: str, bucket_cap_mb, allow_none: bool):
    if bucket_cap_mb is None and allow_none:
        return
    if isinstance(bucket_cap_mb, bool) or not isinstance(bucket_cap_mb, (int, float)) or not bucket_cap_mb > 0:
        raise ValueError(f"{api}: bucket_cap_mb must be a positive number of megabytes, got {bucket_cap_mb!r}")
