"""Which parts of a model are sharded across ranks (DTensor parameters).

Why this matters: arithmetic on a DTensor (FSDP2's ``fully_shard``, DTensor tensor parallel)
issues collectives. A rank that measures alone while its peers train makes a collective its
peers never join: gloo aborts the process, NCCL hangs until its watchdog. A part of the model
that only collective measurement can read must never be touched by a rank measuring alone.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

__all__ = ["is_dtensor", "sharded_tensors"]


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
