"""Which parts of a model are sharded across ranks (DTensor parameters).

Why this matters: arithmetic on a DTensor (FSDP2's ``fully_shard``, DTensor tensor parallel)
issues collectives. A rank that measures alone while its peers train makes a collective its
peers never join: gloo aborts the process, NCCL hangs until its watchdog. A part of the model
that only collective measurement can read must never be touched by a rank measuring alone.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from typing import Any

import torch

__all__ = ["is_dtensor", "megatron_tensor_parallel", "sharded_tensors"]


def is_dtensor(value: Any) -> bool:
    """True for a ``torch.distributed.tensor.DTensor`` (a parameter or a gradient).

    >>> is_dtensor(torch.zeros(2))
    False
    """
    if not isinstance(value, torch.Tensor):
        return False
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # a torch built without distributed support has no DTensor
        return False
    return isinstance(value, DTensor)


def sharded_tensors(values: Iterable[Any]) -> bool:
    """True when any of ``values`` (tensors, None, or anything else) is a DTensor."""
    return any(is_dtensor(v) for v in values)


def megatron_tensor_parallel() -> int:
    """Megatron-core's tensor-parallel size (1 when Megatron is not loaded or not set up).

    Megatron shards attention weights as plain per-rank tensors, not DTensors: each rank holds
    its partition's heads, and nothing in the tensor says so. Until those partitions are
    combined across ranks, a rank must not report its partition as the whole layer."""
    state = sys.modules.get("megatron.core.parallel_state")
    try:
        if state is not None and state.model_parallel_is_initialized():
            return int(state.get_tensor_model_parallel_world_size())
    except Exception:  # a Megatron we do not know: assume no tensor parallelism
        return 1
    return 1
