"""The ranks that measure one monitoring step together, and the few collectives they make.

Why collective: in a sharded job no rank holds a layer's whole W_q, W_k (FSDP2 rows, tensor
parallel heads), and each data-parallel rank routes only its own micro-batch. A rank that
measured alone would issue DTensor collectives its peers never join (gloo aborts, NCCL hangs)
and describe one micro-batch. So every rank enters measurement on monitoring steps, in the
same order of collectives:

1. ``agree``: one all-reduce, so that a rank that failed before any gather, or that would
   gather other tensors, makes every rank skip the gathers (no rank is ever left inside a
   collective alone);
2. ``materialize``: each DTensor a spec reads is gathered whole to the layer's owner
   (layer i → rank i mod W), one layer at a time, in discovery order; the owner alone
   computes its spectra, so the eigen-solves and the snapshots are spread over the ranks;
3. ``exchange``: one gather of every rank's partial measurement (a few kB of Python floats)
   to the writer(s), who combine them (``partials.combine``).

FSDP1 (``FullyShardedDataParallel``: Lightning's ``FSDPStrategy``) holds no DTensors: its
parameters are views into each rank's shard of a flat parameter outside forward. There every
rank enters ``whole_parameters`` around its whole measurement (``summon_full_params``, an
all-gather, on every rank in the same order), so the specs read whole plain tensors and step 2
gathers nothing.

Which ranks joined is settled once, through the process group's store: a Monitor built on
rank 0 only (peers without one) must not wait in a collective forever, so it measures alone
and refuses what only the group could read.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import logging
import pickle
import time
from collections.abc import Iterator
from itertools import count
from typing import Any

import torch
from torch import nn

from .layouts import AttentionSpec, LatentPath, RouterSpec
from .sharding import is_dtensor

__all__ = ["Peers", "gathers_of", "square_sum", "whole_parameters"]

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
        # FSDP1 roots wrapping the monitored model from outside (Lightning's FSDPStrategy wraps
        # the LightningModule): ``whole_parameters`` must summon from the root, see there
        self.roots: list[nn.Module] = []
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

    def materialize(self, spec: Any, owner: int) -> Any:
        """``spec`` read whole on rank ``owner`` (None on the others). A collective: every
        rank calls it for every spec, in the same order. A DTensor sharded along one mesh
        dimension that spans the job (FSDP2, 1-D tensor parallel) is gathered to the owner
        alone; any other layout (2-D meshes, HSDP) is gathered whole on every rank."""
        gathered: dict[int, torch.Tensor | None] = {}  # fused q/k: one tensor, one gather

        def whole(tensor: torch.Tensor) -> torch.Tensor | None:
            if id(tensor) not in gathered:
                to_owner = _gathers_to_one(tensor, self.world)
                if not to_owner or self.rank == owner:
                    self.bytes_received += _missing_bytes(tensor)
                gathered[id(tensor)] = (
                    _gather_to(tensor, owner, self.rank) if to_owner else tensor.full_tensor()
                )
            return gathered[id(tensor)]

        with torch.no_grad():
            read = _replace_dtensors(spec, whole)
        return read if self.rank == owner else None


def _fsdp1_roots(modules: list[nn.Module]) -> list[nn.Module]:
    """The outermost FSDP1 instances in ``modules`` and their submodules, in module order."""
    try:
        from torch.distributed.fsdp import FullyShardedDataParallel
    except ImportError:  # torch without distributed support
        return []
    found: list[nn.Module] = []
    inside: set[int] = set()
    for top in modules:
        for module in top.modules():
            if isinstance(module, FullyShardedDataParallel) and id(module) not in inside:
                found.append(module)
                inside.update(id(m) for m in module.modules())
    return found


@contextlib.contextmanager
def whole_parameters(
    model: nn.Module, roots: list[nn.Module] | tuple[nn.Module, ...] = ()
) -> Iterator[None]:
    """Every FSDP1 parameter of ``model`` whole while inside (its ``roots``, the FSDP1 wrappers
    around it, first); nothing to do for any other model.

    Why: FSDP1 keeps each rank's shard of a flat parameter; outside forward the model's
    parameters are views into that shard (1-D pieces, or empty). ``summon_full_params`` makes
    them the whole tensors, the same ``Parameter`` objects (``use_orig_params=True``, Lightning's
    default), with their whole gradients; ``writeback=False``: measuring never changes the model.
    It is a collective: every rank enters it, in the same order. An instance not yet lazily
    initialised is entered only when it is a root given here: entering a nested instance first
    would make it a root and break the training's own first forward."""
    wrappers = _fsdp1_roots([*roots, model])
    given = {id(r) for r in roots}
    with contextlib.ExitStack() as stack:
        for fsdp in wrappers:
            if fsdp._is_root is None and id(fsdp) not in given and fsdp is not model:
                log.warning("foreshock: FSDP1 wrapper not initialised yet: left sharded")
                continue
            stack.enter_context(
                type(fsdp).summon_full_params(
                    fsdp, writeback=False, with_grads=bool(fsdp._use_orig_params)
                )
            )
        yield


def _dtensors(spec: Any) -> list[torch.Tensor]:
    found = [getattr(spec, f) for f in _FIELDS[type(spec)] if is_dtensor(getattr(spec, f))]
    if isinstance(spec, AttentionSpec):
        for latent in (spec.q_latent, spec.k_latent):
            found += _dtensors(latent) if latent is not None else []
    return found


def gathers_of(spec: Any) -> int:
    """How many DTensors reading ``spec`` gathers (every rank must agree on it)."""
    return len(_dtensors(spec))


def _missing_bytes(tensor: torch.Tensor) -> int:
    """Bytes of a DTensor this rank does not hold: what gathering it whole brings in."""
    whole = tensor.numel() * tensor.element_size()
    return whole - tensor.to_local().numel() * tensor.element_size()


def _replace_dtensors(spec: Any, whole: Any) -> Any:
    """``spec`` with each DTensor field (latent paths included) replaced by ``whole(field)``."""
    changes: dict[str, Any] = {}
    for field in _FIELDS[type(spec)]:
        value = getattr(spec, field)
        if is_dtensor(value):
            changes[field] = whole(value)
    if isinstance(spec, AttentionSpec):
        for field in ("q_latent", "k_latent"):
            latent = getattr(spec, field)
            if latent is not None and gathers_of(latent):
                changes[field] = _replace_dtensors(latent, whole)
    if not changes:
        return spec
    if any(v is None for v in changes.values()):  # a rank that is not the owner
        return None
    return dataclasses.replace(spec, **changes)


def _gathers_to_one(tensor: torch.Tensor, world: int) -> bool:
    """Whether ``tensor`` can be gathered to one rank: one Shard placement on a 1-D mesh of
    every rank (the same answer on every rank: placements are global)."""
    mesh = tensor.device_mesh
    return (
        mesh.ndim == 1
        and mesh.size() == world
        and tensor.placements[0].is_shard()
        and mesh.mesh.tolist() == list(range(world))
    )


def _gather_to(tensor: torch.Tensor, owner: int, rank: int) -> torch.Tensor | None:
    """The whole of a 1-D-sharded DTensor on ``owner`` (None elsewhere), by one gather.

    Shards follow ``torch.chunk`` along the shard dimension, so the last ranks may hold fewer
    rows (or none): each is padded to the largest for the gather and trimmed after."""
    placement, mesh = tensor.placements[0], tensor.device_mesh
    dim, world, rows = placement.dim, mesh.size(), tensor.shape[placement.dim]
    sizes = [placement.local_shard_size_and_offset(rows, world, r)[0] for r in range(world)]
    local = tensor.to_local()
    pad = [0, 0] * (local.dim() - dim - 1) + [0, max(sizes) - local.shape[dim]]
    padded = torch.nn.functional.pad(local, pad).contiguous()
    buffers = [torch.empty_like(padded) for _ in range(world)] if rank == owner else None
    torch.distributed.gather(padded, buffers, dst=owner, group=mesh.get_group())
    if buffers is None:
        return None
    return torch.cat([b.narrow(dim, 0, n) for b, n in zip(buffers, sizes, strict=True)], dim)


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
