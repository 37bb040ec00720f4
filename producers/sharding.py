"""Which parts of a model are sharded across ranks: DTensors, and Megatron's plain partitions.

Why this matters: arithmetic on a DTensor (FSDP2's ``fully_shard``, DTensor tensor parallel)
issues collectives. A rank that measures alone while its peers train makes a collective its
peers never join: gloo aborts the process, NCCL hangs until its watchdog. A part of the model
that only collective measurement can read must never be touched by a rank measuring alone.

Megatron-core's tensor parallelism shards *plain* tensors: each rank holds its partition, and
only the parameter's attributes say so (``tensor_model_parallel``, ``partition_dim``,
``partition_stride``; ``allreduce=False`` on an expert's own parameters), with the groups in
``megatron.core.parallel_state``. ``plain_shard`` and ``megatron_replicas`` read them, without
importing Megatron (a model that never loaded it has none).
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Iterable
from types import ModuleType
from typing import TYPE_CHECKING, Any, NamedTuple, TypeGuard

import torch

if TYPE_CHECKING:
    from torch.distributed.tensor import DTensor

__all__ = [
    "PlainShard",
    "is_dtensor",
    "local_values",
    "megatron_replicas",
    "plain_shard",
    "sharded_tensors",
]


def is_dtensor(value: Any) -> TypeGuard[DTensor]:
    """True for a ``torch.distributed.tensor.DTensor`` (a parameter or a gradient).

    >>> is_dtensor(torch.zeros(2))
    False
    """
    dtensor = _dtensor_class()
    return dtensor is not None and isinstance(value, dtensor)


@functools.cache
def _dtensor_class() -> type | None:
    """DTensor's class, imported once (an import statement per call costs a few µs, and
    ``is_dtensor`` runs for every parameter at every monitoring step)."""
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # a torch built without distributed support has no DTensor
        return None
    return DTensor


def local_values(tensor: torch.Tensor) -> torch.Tensor:
    """The values this rank holds of ``tensor``, outside autograd: a DTensor's local shard,
    any other tensor itself, detached. Why not ``to_local()``/``detach()``: on a DTensor each
    goes through DTensor's dispatch (about 35 µs a call on CPU), which at a few hundred
    parameters is most of a sharded monitoring step's bookkeeping; the local shard's own
    ``detach`` costs about 1 µs.

    >>> local_values(torch.ones(2, requires_grad=True)).requires_grad
    False
    """
    if is_dtensor(tensor):
        local = getattr(tensor, "_local_tensor", None)  # DTensor's field since torch 2.0
        return (tensor.to_local() if local is None else local).detach()
    return tensor.detach()


class PlainShard(NamedTuple):
    """A plain tensor that is one rank's partition of a whole: the partitions of the ``size``
    ranks of ``group``, concatenated along ``dim`` in group-rank order, are the whole tensor
    (``stride`` 1; Megatron's strided partitions interleave and are not gathered)."""

    group: Any  # a torch.distributed ProcessGroup
    dim: int
    size: int
    stride: int


def sharded_tensors(values: Iterable[Any]) -> bool:
    """True when any of ``values`` (tensors, None, or anything else) is a DTensor or a plain
    partition (``plain_shard``)."""
    return any(is_dtensor(v) or plain_shard(v) is not None for v in values)


def _megatron_state() -> ModuleType | None:
    """``megatron.core.parallel_state`` once Megatron has set up its groups; else None."""
    state = sys.modules.get("megatron.core.parallel_state")
    try:
        if state is not None and state.model_parallel_is_initialized():
            return state
    except Exception:  # a Megatron we do not know: no partitions assumed
        return None
    return None


def _is_expert(tensor: torch.Tensor) -> bool:
    """Megatron marks an expert's own parameters ``allreduce=False``: they are reduced over
    the expert data-parallel group, not the data-parallel one."""
    return getattr(tensor, "allreduce", True) is False


def plain_shard(value: Any) -> PlainShard | None:
    """How ``value`` is partitioned, if it is a Megatron tensor-parallel parameter on a group
    of more than one rank (the expert tensor-parallel group for an expert's own); else None.

    >>> plain_shard(torch.zeros(2)) is None
    True
    """
    if not isinstance(value, torch.Tensor) or not getattr(value, "tensor_model_parallel", False):
        return None
    state = _megatron_state()
    if state is None:
        return None
    if _is_expert(value):
        group = state.get_expert_tensor_parallel_group()
    else:
        group = state.get_tensor_model_parallel_group()
    size = torch.distributed.get_world_size(group)
    if size < 2:
        return None
    # Megatron sets partition_dim on every parameter it marks tensor_model_parallel.
    dim = int(value.partition_dim)  # type: ignore[attr-defined]
    stride = int(getattr(value, "partition_stride", 1))
    return PlainShard(group, dim, size, stride)


def megatron_replicas(tensor: torch.Tensor) -> int | None:
    """On how many ranks a Megatron parameter's local values sit alike; None without Megatron.

    A dense parameter is held alike by its data-parallel (× context-parallel) peers, and by
    its tensor-parallel peers too unless it is partitioned over them (``tensor_model_parallel``).
    An expert's own parameter (``allreduce=False``) is distinct on each expert-parallel rank:
    alike only over the expert data-parallel group (× expert tensor parallel, unless
    partitioned). The whole Σ‖w‖² is then Σ over ranks of ‖local‖² / replicas."""
    state = _megatron_state()
    if state is None:
        return None
    partitioned = bool(getattr(tensor, "tensor_model_parallel", False))
    if _is_expert(tensor):
        alike = state.get_expert_data_parallel_world_size()
        peers = state.get_expert_tensor_parallel_world_size()
    else:
        alike = state.get_data_parallel_world_size(with_context_parallel=True)
        peers = state.get_tensor_model_parallel_world_size()
    return alike * (1 if partitioned else peers)
