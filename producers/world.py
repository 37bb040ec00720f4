"""Which process this is: its rank and the world size.

The Monitor asks once, at construction. The process group is the truth when it is up; before
``init_process_group`` (a Monitor built early) torchrun's environment says the same; neither
means a single process.
"""

from __future__ import annotations

import os

import torch

__all__ = ["rank_and_world"]


def rank_and_world() -> tuple[int, int]:
    """(rank, world size): the process group's when one is up, else torchrun's environment,
    else (0, 1)."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
