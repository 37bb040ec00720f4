"""The ranks that measure one monitoring step together, and the few collectives they make.

Why collective: in a sharded job no rank holds a layer's whole W_q, W_k (FSDP2 rows, tensor
parallel heads), and each data-parallel rank routes only its own micro-batch. A rank that
measured alone would issue DTensor collectives its peers never join (gloo aborts, NCCL hangs)
and describe one micro-batch. So every rank enters measurement on monitoring steps, in the
same order of collectives:

1. ``agree``: one all-reduce, so that a rank that failed before any gather, or that would
   gather other tensors, makes every rank skip the gathers (no rank is ever left inside a
   collective alone);
2. ``materialize``: each DTensor a spec reads is gathered whole (``full_tensor``), one layer
   at a time, in discovery order; only the layer's owner (layer i → rank i mod W) then
   computes its spectra, so the eigen-solves are spread over the ranks;
3. ``exchange``: one gather of every rank's partial measurement (a few kB of Python floats)
   to the writer(s), who combine them (``partials.combine``).

Which ranks joined is settled once, through the process group's store: a Monitor built on
rank 0 only (peers without one) must not wait in a collective forever, so it measures alone
and refuses what only the group could read.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import pickle
import time
from itertools import count
from typing import Any

import torch

from .layouts import AttentionSpec, LatentPath, RouterSpec
from .sharding import is_dtensor

__all__ = ["Peers", "gathers_of", "materialize", "square_sum"]

log = logging.getLogger("foreshock.monitor")

_MONITORS = count()  # the n-th Monitor built in this process joins the n-th group key
_FIELDS = {
    AttentionSpec: ("q_weight", "k_weight", "q_bias", "k_bias", "q_scale", "k_scale"),
    RouterSpec: ("weight", "bias"),
    LatentPath: ("weight", "scale", "bias"),
}


class Peers:
    """This rank's place among the ranks that measure together (the default process group)."""

    def __init__(self, rank: int, world: int) -> None:
        self.rank, self.world = rank, world
        self.bytes_received = 0  # gathered shards and partials, over this Monitor's life

    @classmethod
    def join(cls, timeout_s: float) -> Peers | None:
        """The group, once every rank has built its Monitor; None (measure alone) when a peer
        has not within ``timeout_s`` or there is no process group of more than one rank."""
        dist = torch.distributed
        if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
            return None
        rank, world = dist.get_rank(), dist.get_world_size()
        key = f"foreshock/monitor/{next(_MONITORS)}"
        try:
            store = dist.distributed_c10d._get_default_store()
            store.add(key, 1)
            deadline = time.monotonic() + timeout_s
            while store.add(key, 0) < world:  # the count only grows: ranks cannot disagree
                if time.monotonic() > deadline:
                    log.error(
                        "foreshock: not every rank built a Monitor within %.0f s; this rank "
                        "measures alone (sharded parts refused, data statistics of its own "
                        "micro-batch only). Build the Monitor on every rank.",
                        timeout_s,
                    )
                    return None
                time.sleep(0.05)
        except Exception as exc:  # no store reachable: never block the job for monitoring
            log.error("foreshock: ranks could not join (%r); measuring alone", exc)
            return None
        return cls(rank, world)

    def owner(self, index: int) -> int:
        """The rank that computes the ``index``-th measured part (layer or router)."""
        return index % self.world

    def agree(self, ok: bool, plan: list[tuple[str, int]]) -> bool:
        """True on every rank iff every rank is ok and has the same ``plan`` — the specs it
        will read, by name, with their gather counts (pipeline stages holding other layers
        disagree, and then no rank gathers). One all-reduce of three numbers."""
        digest = hashlib.sha1(repr(plan).encode()).digest()
        signature = float(int.from_bytes(digest[:6], "big"))  # 48 bits: exact in float64
        flags = torch.tensor([0.0 if ok else 1.0, signature, -signature], dtype=torch.float64)
        torch.distributed.all_reduce(flags, op=torch.distributed.ReduceOp.MAX)
        return flags[0].item() == 0 and flags[1].item() == -flags[2].item()

    def exchange(self, part: Any, to_all: bool) -> list[Any] | None:
        """Every rank's ``part``, in rank order, on rank 0 (or on all ranks with ``to_all``)."""
        dist = torch.distributed
        if to_all:
            parts: list[Any] = [None] * self.world
            dist.all_gather_object(parts, part)
        else:
            parts = [None] * self.world if self.rank == 0 else None
            dist.gather_object(part, parts, dst=0)
        if parts is not None:
            self.bytes_received += sum(len(pickle.dumps(p)) for p in parts) - len(
                pickle.dumps(part)
            )
        return parts

    def materialize(self, spec: Any) -> Any:
        """``materialize(spec)``, counting the bytes this rank received."""
        self.bytes_received += sum(_missing_bytes(t) for t in _dtensors(spec))
        return materialize(spec)


def _dtensors(spec: Any) -> list[torch.Tensor]:
    found = [getattr(spec, f) for f in _FIELDS[type(spec)] if is_dtensor(getattr(spec, f))]
    if isinstance(spec, AttentionSpec):
        for latent in (spec.q_latent, spec.k_latent):
            found += _dtensors(latent) if latent is not None else []
    return found


def _missing_bytes(tensor: torch.Tensor) -> int:
    """Bytes of a DTensor this rank does not hold: what gathering it whole brings in."""
    whole = tensor.numel() * tensor.element_size()
    return whole - tensor.to_local().numel() * tensor.element_size()


def gathers_of(spec: Any) -> int:
    """How many DTensors reading ``spec`` gathers (every rank must agree on it)."""
    return len(_dtensors(spec))


def materialize(spec: Any) -> Any:
    """``spec`` with each DTensor field gathered whole (a collective: every rank calls it)."""
    changes: dict[str, Any] = {}
    with torch.no_grad():
        for field in _FIELDS[type(spec)]:
            value = getattr(spec, field)
            if is_dtensor(value):
                changes[field] = value.full_tensor()
        if isinstance(spec, AttentionSpec):
            for field in ("q_latent", "k_latent"):
                latent = getattr(spec, field)
                if latent is not None and gathers_of(latent):
                    changes[field] = materialize(latent)
    return dataclasses.replace(spec, **changes) if changes else spec


def _replicas(tensor: torch.Tensor, world: int) -> int:
    """On how many ranks the same local values sit. A DTensor: its mesh's replicated
    dimensions, times the ranks outside its mesh (FSDP over tensor parallel: a parameter
    sharded on the data-parallel sub-mesh alone is held alike by every tensor-parallel peer).
    A plain tensor in a group is taken as replicated on every rank (DDP, tensor parallel's
    unsharded parameters)."""
    if not is_dtensor(tensor):
        return world
    mesh = tensor.device_mesh
    replicas = max(world // mesh.size(), 1)
    for dim, placement in enumerate(tensor.placements):
        if placement.is_replicate():
            replicas *= mesh.size(dim)
    return replicas


def square_sum(tensors: list[torch.Tensor], world: int) -> torch.Tensor | None:
    """This rank's share of Σ‖t‖² (float32): its local values divided by their replica count,
    so that the sum of every rank's share is the global sum of squares, each value once."""
    if not tensors:
        return None
    local = [t.to_local() if is_dtensor(t) else t for t in tensors]
    weights = [1.0 / _replicas(t, world) for t in tensors]
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
