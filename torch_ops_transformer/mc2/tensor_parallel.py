"""Tensor-parallel Linear layers on the MC2 ops (sequence-parallel style, as Megatron-LM's sequence parallelism).

Activations between blocks are sharded along the sequence (first) dimension: rank r holds rows
[r*S/W, (r+1)*S/W) of an [S, ..., hidden] tensor. ColumnParallelLinear all-gathers the sequence while multiplying
by its shard of output features (all_gather_matmul); RowParallelLinear multiplies its shard of input features and
reduce-scatters the sum back to sequence shards (matmul_reduce_scatter). An MLP is

    ColumnParallelLinear(h, f) -> activation -> RowParallelLinear(f, h)

with one all-gather in and one reduce-scatter out, both overlapped with the matmuls, in forward and backward.
"""
from typing import Optional

import torch
import torch.distributed as dist
from torch import nn

OPS = torch.ops.npu_fa


def _group(group: Optional["dist.ProcessGroup"]):
    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError("tensor_parallel: torch.distributed is not initialised; call init_process_group() first")
    return group if group is not None else dist.group.WORLD


def _split(total: int, world: int, what: str) -> int:
    if total % world:
        raise ValueError(f"tensor_parallel: {what} ({total}) must be divisible by the group size ({world})")
    return total // world


def shard_sequence(x: torch.Tensor, group: Optional["dist.ProcessGroup"] = None) -> torch.Tensor:
    """This rank's sequence shard (rows along dim 0) of a full [S, ...] tensor."""
    g = _group(group)
    rows = _split(x.shape[0], g.size(), "the sequence length (dim 0)")
    r = dist.get_rank(g)
    return x[r * rows:(r + 1) * rows]


class _ShardedLinear(nn.Module):
    """A Linear whose [out, in] weight is split over the group; subclasses say which axis and how to multiply."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True,
                 group: Optional["dist.ProcessGroup"] = None, chunks: int = 0, device=None, dtype=None):
        super().__init__()
        self.group = _group(group)
        self.world_size = self.group.size()
        self.in_features, self.out_features, self.chunks = in_features, out_features, chunks
        weight_shape, bias_len = self._local_shapes()
        kw = {"device": device, "dtype": dtype}
        self.weight = nn.Parameter(torch.empty(*weight_shape, **kw))
        self.bias = nn.Parameter(torch.zeros(bias_len, **kw)) if bias else None
        nn.init.kaiming_uniform_(self.weight, a=5 ** 0.5)

    @classmethod
    def from_linear(cls, linear: nn.Linear, group: Optional["dist.ProcessGroup"] = None, chunks: int = 0):
        """This rank's shard of a full nn.Linear (same on every rank: e.g. built from one seed)."""
        layer = cls(linear.in_features, linear.out_features, linear.bias is not None, group, chunks,
                    linear.weight.device, linear.weight.dtype)
        with torch.no_grad():
            layer._copy_shard(linear, dist.get_rank(layer.group))
        return layer


class ColumnParallelLinear(_ShardedLinear):
    """y = AllGather_seq(x) @ W_rᵀ + b_r: input sequence-sharded [s, ..., in], output [W*s, ..., out / W].

    weight is this rank's rows of the full [out, in] weight (output features r*out/W ...)."""

    def _local_shapes(self):
        local = _split(self.out_features, self.world_size, "out_features")
        return (local, self.in_features), local

    def _copy_shard(self, linear: nn.Linear, r: int) -> None:
        rows = self.weight.shape[0]
        self.weight.copy_(linear.weight[r * rows:(r + 1) * rows])
        if linear.bias is not None:
            self.bias.copy_(linear.bias[r * rows:(r + 1) * rows])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lead = x.shape[:-1]
        out, _ = OPS.all_gather_matmul(x.reshape(-1, x.shape[-1]), self.weight.t(), self.group.group_name,
                                       self.world_size, self.bias, 0, False, self.chunks)
        return out.view(self.world_size * lead[0], *lead[1:], out.shape[-1])

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features} "
                f"({self.weight.shape[0]} on this rank), world_size={self.world_size}")


class RowParallelLinear(_ShardedLinear):
    """y = ReduceScatter_seq(x @ W_rᵀ) + b: input [S, ..., in / W] (this rank's features), output sequence-sharded
    [S / W, ..., out]. weight is this rank's columns of the full [out, in] weight; the bias is replicated (its
    gradient is the group total, so replicas stay equal)."""

    def _local_shapes(self):
        local = _split(self.in_features, self.world_size, "in_features")
        return (self.out_features, local), self.out_features

    def _copy_shard(self, linear: nn.Linear, r: int) -> None:
        cols = self.weight.shape[1]
        self.weight.copy_(linear.weight[:, r * cols:(r + 1) * cols])
        if linear.bias is not None:
            self.bias.copy_(linear.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lead = x.shape[:-1]
        seq = _split(lead[0], self.world_size, "the sequence length (dim 0) of the input")
        out = OPS.matmul_reduce_scatter(x.reshape(-1, x.shape[-1]), self.weight.t(), self.group.group_name,
                                        self.world_size, self.bias, self.chunks)
        return out.view(seq, *lead[1:], out.shape[-1])

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features} ({self.weight.shape[1]} on this rank), "
                f"out_features={self.out_features}, world_size={self.world_size}")


class TensorParallelMLP(nn.Module):
    """fc2(activation(fc1(x))) with fc1 column-parallel and fc2 row-parallel: sequence-sharded in and out."""

    def __init__(self, fc1: ColumnParallelLinear, fc2: RowParallelLinear, activation: Optional[nn.Module] = None):
        super().__init__()
        self.fc1, self.fc2 = fc1, fc2
        self.activation = activation if activation is not None else nn.GELU()

    @classmethod
    def from_linears(cls, fc1: nn.Linear, fc2: nn.Linear, activation: Optional[nn.Module] = None,
                     group: Optional["dist.ProcessGroup"] = None, chunks: int = 0) -> "TensorParallelMLP":
        """Shards a single-process MLP's two Linears (identical on every rank) over the group."""
        return cls(ColumnParallelLinear.from_linear(fc1, group, chunks),
                   RowParallelLinear.from_linear(fc2, group, chunks), activation)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.activation(self.fc1(x)))


__all__ = ["ColumnParallelLinear", "RowParallelLinear", "TensorParallelMLP", "shard_sequence"]
