"""Each rank's share of the global Σ‖w‖² and Σ‖g‖²: every value counted once over the job.

Why: under data, tensor, expert or pipeline parallelism the same values sit on several ranks
(replicas) and the whole parameter is spread over others (shards). A rank sums the squares of
the values it holds, divided by how many ranks hold those same values; the shares' sum over
all ranks (gathered with the partial records, :mod:`~foreshock.producers.partials`) is then the
global sum of squares, whatever the layout.
"""

from __future__ import annotations

import torch

from .sharding import is_dtensor, local_values, megatron_replicas

__all__ = ["square_sum"]


def _replicas(tensor: torch.Tensor, holders: int) -> int:
    """On how many ranks the same local values sit, given how many ranks hold a parameter of
    this name (``holders``: every rank under DDP, FSDP or tensor parallel; a stage's ranks
    under pipeline parallelism). A DTensor: its mesh's replicated dimensions, times the
    holders outside its mesh (FSDP over tensor parallel: a parameter sharded on the
    data-parallel sub-mesh alone is held alike by every tensor-parallel peer). A Megatron
    parameter: as its attributes and groups say (``sharding.megatron_replicas``: a
    tensor-parallel partition or an expert's own parameter counts once). Any other plain
    tensor: replicated on every holder (DDP, tensor parallel's unsharded parameters, a
    pipeline stage's data-parallel replicas). Alone (``holders`` 1): once."""
    if holders == 1:
        return 1
    if not is_dtensor(tensor):
        return megatron_replicas(tensor) or holders
    mesh = tensor.device_mesh
    replicas = max(holders // mesh.size(), 1)
    for dim, placement in enumerate(tensor.placements):
        if placement.is_replicate():
            replicas *= mesh.size(dim)
    return replicas


def square_sum(
    tensors: list[torch.Tensor], holders: list[int], params: list[torch.Tensor] | None = None
) -> torch.Tensor | None:
    """This rank's share of Σ‖t‖² (float32): its local values divided by their replica count,
    so that the sum of every rank's share is the global sum of squares, each value once.
    ``holders``: per tensor, how many ranks hold its parameter (``_replicas``). ``params``:
    the parameters the tensors belong to (a gradient or a detached copy does not carry
    Megatron's partition attributes); default the tensors themselves."""
    if not tensors:
        return None
    local = [local_values(t) for t in tensors]
    layouts = tensors if params is None else params
    weights = [1.0 / _replicas(t, n) for t, n in zip(layouts, holders, strict=True)]
    device = local[0].device
    by_device: dict[torch.device, list[int]] = {}
    for i, t in enumerate(local):
        by_device.setdefault(t.device, []).append(i)
    total = torch.zeros((), device=device, dtype=torch.float32)
    for indices in by_device.values():
        norms = torch._foreach_norm([local[i] for i in indices], 2, dtype=torch.float32)
        w = torch.tensor([weights[i] for i in indices], device=norms[0].device)
        total = total + (torch.stack(norms).square() * w).sum().to(device)
    return total
