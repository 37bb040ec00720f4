"""The ranks that measure one monitoring step together, and the few collectives they make.

Why collective: in a sharded job no rank holds a layer's whole W_q, W_k (FSDP2 rows, tensor
parallel heads), and each data-parallel rank routes only its own micro-batch. A rank that
measured alone would issue DTensor collectives its peers never join (gloo aborts, NCCL hangs)
and describe one micro-batch. So every rank enters measurement on monitoring steps, in the
same order of collectives:

1. ``schedule``: one all-gather of every rank's plan (its specs by name), so that a rank
   that failed before any gather makes every rank skip the gathers (no rank is ever left
   inside a collective alone), and each spec is read by the ranks that hold it (all of them,
   or a pipeline stage's);
2. ``materialize``: each DTensor a spec reads is gathered whole to the layer's owner
   (the i-th spec of the schedule → its holder i mod its holders' count), one layer at a
   time, in schedule order; the owner alone
   computes its spectra, so the eigen-solves and the snapshots are spread over the ranks.
   A plain tensor partitioned over a process group (Megatron's tensor parallelism,
   ``sharding.plain_shard``) is gathered over the owner's group alone, in partition order,
   and the owner reads the layer with its whole head counts (``_widen``);
3. ``exchange``: one gather of every rank's partial measurement (a few kB of Python floats)
   to the writer(s), who combine them (``partials.combine``).

FSDP1 (``FullyShardedDataParallel``: Lightning's ``FSDPStrategy``) holds no DTensors: its
parameters are views into each rank's shard of a flat parameter outside forward. There every
rank enters ``fsdp1.whole_parameters`` around its whole measurement (``summon_full_params``, an
all-gather, on every rank in the same order), so the specs read whole plain tensors and step 2
gathers nothing.

Which ranks joined is settled once, through the process group's store: a Monitor built on
rank 0 only (peers without one) must not wait in a collective forever, so it measures alone
and refuses what only the group could read.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import logging
import pickle
import time
from collections import Counter
from itertools import count
from typing import TYPE_CHECKING, Any, cast

import torch
from torch import nn

from .layouts import TENSOR_FIELDS, AttentionSpec
from .sharding import PlainShard, is_dtensor, local_values, plain_shard

if TYPE_CHECKING:
    from torch.distributed.tensor import DTensor, Shard

__all__ = ["Peers", "gathers_of"]

log = logging.getLogger("foreshock.monitor")

_MONITORS = count()  # the n-th Monitor built in this process joins the n-th group key


class Peers:
    """This rank's place among the ranks that measure together (the default process group)."""

    def __init__(self, rank: int, world: int) -> None:
        self.rank, self.world = rank, world
        self.holders: Counter[str] | None = None  # parameter name -> ranks holding it
        # FSDP1 roots wrapping the monitored model from outside (Lightning's FSDPStrategy wraps
        # the LightningModule): ``whole_parameters`` must summon from the root, see there
        self.roots: list[nn.Module] = []
        self.bytes_received = 0  # gathered shards and partials, over this Monitor's life
        # each rank's plan digest and the schedule they made, the last time plans travelled
        self._agreed: tuple[list[int], list[tuple[str, list[int]]]] | None = None

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
            together = _settle(store, key, world, timeout_s)
        except Exception as exc:  # no store reachable: never block the job for monitoring
            log.error("foreshock: ranks could not join (%r); measuring alone", exc)
            return None
        if not together:
            log.error(
                "foreshock: not every rank built a Monitor within %.0f s; this rank measures "
                "alone (sharded parts refused, data statistics of its own micro-batch only). "
                "Build the Monitor on every rank.",
                timeout_s,
            )
            return None
        return cls(rank, world)

    def schedule(
        self, ok: bool, plan: list[tuple[str, int]], params: list[str]
    ) -> list[tuple[str, list[int]]]:
        """Every spec any rank holds, in one order, with the ranks that hold it; the same
        list on every rank. Each rank sends its ``plan`` — its specs by name, with how many
        tensors reading each gathers — in one all-gather, so ranks holding other layers
        (pipeline stages) each measure their own and nobody waits on a gather no peer joins.
        Raises on every rank when any rank could not read its specs, or when holders of one
        spec would gather different tensors. On the first call ``params`` (this rank's
        parameter names) also say how many ranks hold each parameter (``holders``).

        A plan rarely changes between monitoring steps, so once plans have travelled the ranks
        first all-gather 16 bytes each, (ok, digest of their plan) (``_plan_digest``): when
        every rank's is what it sent last time, the last schedule stands; otherwise (a rank
        failed, a layer was added) the plans travel whole. Every rank sees every digest, so
        all take the same path."""
        first = self.holders is None
        if self._agreed is not None and self._same_plans(ok, plan, self._agreed[0]):
            return self._agreed[1]
        mine = (ok, plan, params if first else None)
        plans: list[Any] = [None] * self.world
        torch.distributed.all_gather_object(plans, mine)
        if first:
            self.holders = Counter(n for _, _, names in plans for n in names or ())
        self._agreed = None
        if not all(done for done, _, _ in plans):
            raise RuntimeError("a rank could not read its specs: no rank gathers")
        holders: dict[str, list[int]] = {}
        gathers: dict[str, set[int]] = {}
        for rank, (_, rank_plan, _) in enumerate(plans):
            for name, tensors in rank_plan:
                holders.setdefault(name, []).append(rank)
                gathers.setdefault(name, set()).add(tensors)
        split = sorted(name for name, counts in gathers.items() if len(counts) > 1)
        if split:
            raise RuntimeError(f"ranks would read {split[0]} from different tensors: none gathers")
        schedule = list(holders.items())
        self._agreed = ([_plan_digest(rank_plan) for _, rank_plan, _ in plans], schedule)
        return schedule

    def _same_plans(self, ok: bool, plan: list[tuple[str, int]], digests: list[int]) -> bool:
        """Whether every rank is ready with the plan agreed last time (each rank's plan
        ``digests`` then): one all-gather of (ok, digest) per rank, the same answer on every
        rank."""
        c10d = torch.distributed.distributed_c10d
        device = c10d._get_object_coll_device()  # what the object collectives use: CPU, CUDA
        mine = torch.tensor([int(ok), _plan_digest(plan)], dtype=torch.int64, device=device)
        every = [torch.empty_like(mine) for _ in range(self.world)]
        torch.distributed.all_gather(every, mine)
        agreed = torch.tensor([[1, d] for d in digests], dtype=torch.int64)
        return bool((torch.stack(every).cpu() == agreed).all())

    def exchange(self, part: Any, to_all: bool) -> list[Any] | None:
        """Every rank's ``part``, in rank order, on rank 0 (or on all ranks with ``to_all``)."""
        dist = torch.distributed
        parts: list[Any] | None
        if to_all:
            parts = [None] * self.world
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
        alone; any other layout (2-D meshes, HSDP) is gathered whole on every rank. A plain
        partition is gathered to the owner over the owner's own group (the other groups hold
        the same partitions: they gather nothing)."""
        gathered: dict[int, torch.Tensor | None] = {}  # fused q/k: one tensor, one gather

        def whole(tensor: torch.Tensor) -> torch.Tensor | None:
            if id(tensor) in gathered:
                return gathered[id(tensor)]
            shard = plain_shard(tensor)
            if shard is not None:
                gathered[id(tensor)] = self._gather_plain(tensor, shard, owner)
            elif is_dtensor(tensor):
                to_owner = _gathers_to_one(tensor, self.world)
                if not to_owner or self.rank == owner:
                    self.bytes_received += _missing_bytes(tensor)
                gathered[id(tensor)] = (
                    _gather_to(tensor, owner, self.rank) if to_owner else tensor.full_tensor()
                )
            else:  # _replace_sharded passes only DTensors and plain partitions
                raise TypeError(f"not a sharded tensor: {type(tensor).__name__}")
            return gathered[id(tensor)]

        with torch.no_grad():
            read = _replace_sharded(spec, whole)
        return _widen(spec, read) if self.rank == owner else None

    def _gather_plain(self, tensor: torch.Tensor, shard: PlainShard, owner: int) -> Any:
        """The whole of a plain partition on ``owner`` (None elsewhere): one gather over the
        owner's group, partitions concatenated along ``shard.dim`` in group-rank order (equal
        partitions: Megatron divides evenly)."""
        dist = torch.distributed
        if owner not in dist.get_process_group_ranks(shard.group):
            return None  # this rank's group holds the same partitions: the owner's gathers
        local = tensor.detach().contiguous()
        mine = self.rank == owner
        buffers = [torch.empty_like(local) for _ in range(shard.size)] if mine else None
        dist.gather(local, buffers, dst=owner, group=shard.group)
        if buffers is None:
            return None
        self.bytes_received += (shard.size - 1) * local.numel() * local.element_size()
        return torch.cat(buffers, dim=shard.dim)


def _plan_digest(plan: list[tuple[str, int]]) -> int:
    """A signed 64-bit digest of a plan (blake2b of its repr): equal plans, equal digests on
    every rank (``hash()`` of a str is salted per process and would not do).

    >>> _plan_digest([("h.0.attn", 2)]) == _plan_digest([("h.0.attn", 2)])
    True
    >>> _plan_digest([("h.0.attn", 2)]) == _plan_digest([("h.0.attn", 1)])
    False
    """
    raw = hashlib.blake2b(repr(plan).encode(), digest_size=8).digest()
    return int.from_bytes(raw, "little", signed=True)


def _settle(store: Any, key: str, world: int, timeout_s: float) -> bool:
    """Whether every rank measures together: one decision in the store that every rank reads.

    Each rank counts itself in under ``key``; the first rank to see all ``world`` in, or to
    time out, writes the decision once (``compare_set`` on an empty key), and every rank —
    a late one included — follows what was written. A count alone would not do: a rank that
    timed out a moment before the last one arrived would measure alone while the others
    waited for it in a collective."""
    store.add(key, 1)
    decision = f"{key}/decision"
    deadline = time.monotonic() + timeout_s
    while True:
        everyone = store.add(key, 0) >= world
        if everyone or time.monotonic() > deadline or store.check([decision]):
            wanted = "together" if everyone else "alone"
            return store.compare_set(decision, "", wanted) == b"together"
        time.sleep(0.05)


def _is_sharded(value: Any) -> bool:
    return is_dtensor(value) or plain_shard(value) is not None


def _sharded(spec: Any) -> list[torch.Tensor]:
    """The DTensors and plain partitions among ``spec``'s fields (latent paths included)."""
    found = [getattr(spec, f) for f in TENSOR_FIELDS[type(spec)] if _is_sharded(getattr(spec, f))]
    if isinstance(spec, AttentionSpec):
        for latent in (spec.q_latent, spec.k_latent):
            found += _sharded(latent) if latent is not None else []
    return found


def gathers_of(spec: Any) -> int:
    """How many tensors reading ``spec`` gathers (every rank must agree on it). Raises
    ValueError for a partitioned layout that cannot be read whole (``_check_partitions``):
    before any gather, so that the ranks agree to skip."""
    _check_partitions(spec)
    return len(_sharded(spec))


def _out_dim(spec: AttentionSpec) -> int:
    """The output-feature dimension of the stored q/k weights (heads lie along it)."""
    return 1 if spec.transposed else 0


def _check_partitions(spec: Any) -> None:
    """A spec with plain partitions must be a colwise one ``_widen`` can make whole: W_q, W_k
    (and their biases) split over one group along the output dimension, each partition
    holding whole heads in the same layout (Megatron's ``linear_qkv`` under TP ≤ query
    groups), unstrided; latent paths and routers unpartitioned."""
    if not any(plain_shard(t) is not None for t in _sharded(spec)):
        return
    if not isinstance(spec, AttentionSpec):
        raise ValueError(f"{spec.name}: a partitioned router weight is not gathered")
    latents = [lat for lat in (spec.q_latent, spec.k_latent) if lat is not None]
    if any(plain_shard(t) is not None for lat in latents for t in _sharded(lat)):
        raise ValueError(f"{spec.name}: a partitioned latent path is not gathered")
    weights = [plain_shard(spec.q_weight), plain_shard(spec.k_weight)]
    biases = [plain_shard(b) for b in (spec.q_bias, spec.k_bias) if b is not None]
    group = weights[0].group if weights[0] is not None else None
    size = weights[0].size if weights[0] is not None else 0
    layouts = [(s.group, s.size, s.dim, s.stride) if s else None for s in weights + biases]
    expected = [(group, size, _out_dim(spec), 1)] * 2 + [(group, size, 0, 1)] * len(biases)
    if layouts != expected:
        raise ValueError(
            f"{spec.name}: W_q, W_k are not partitioned alike along their output features "
            "(unstrided, one group): not gathered"
        )


def _missing_bytes(tensor: DTensor) -> int:
    """Bytes of a DTensor this rank does not hold: what gathering it whole brings in."""
    whole = tensor.numel() * tensor.element_size()
    return whole - local_values(tensor).numel() * tensor.element_size()


def _replace_sharded(spec: Any, whole: Any) -> Any:
    """``spec`` with each sharded field (latent paths included) replaced by ``whole(field)``.
    Counts and rows are still those of the partition: ``_widen`` makes them whole."""
    changes: dict[str, Any] = {}
    for field in TENSOR_FIELDS[type(spec)]:
        value = getattr(spec, field)
        if _is_sharded(value):
            changes[field] = whole(value)
    if isinstance(spec, AttentionSpec):
        for field in ("q_latent", "k_latent"):
            latent = getattr(spec, field)
            if latent is not None and _sharded(latent):
                changes[field] = _replace_sharded(latent, whole)
    if not changes:
        return spec
    if any(v is None for v in changes.values()):  # a rank that is not the owner
        return None
    return _unchecked_replace(spec, changes)


def _unchecked_replace(spec: Any, changes: dict[str, Any]) -> Any:
    """``dataclasses.replace`` without ``__post_init__``'s checks: gathered partitions do
    not match the partition's head counts until ``_widen`` sets the whole ones."""
    copy = object.__new__(type(spec))
    copy.__dict__.update({**spec.__dict__, **changes})
    return copy


def _widen(local: Any, read: Any) -> Any:
    """The layer read whole from ``read`` (its partitions gathered), given the partition's
    own spec ``local``; ``read`` itself when nothing was a plain partition.

    Partition t of T (``_check_partitions``: colwise, whole heads, one layout) holds the
    global heads t·H_p … (t+1)·H_p − 1 and query groups t·G_p …: Megatron's ``linear_qkv``
    is group-major, [q_1 … q_r, k, v] per group, and splits into T contiguous blocks of
    R = G_p·(r + 2)·d_h rows. So the whole layer has T·H_p heads, T·G_p groups, and its rows
    are the partition's rows shifted by t·R for t = 0 … T − 1; head h still reads group
    h // r. The spec's checks run again on the whole."""
    if read is None or read is local:
        return read
    shard = plain_shard(local.q_weight) if isinstance(local, AttentionSpec) else None
    if shard is None:  # DTensors: their shapes were whole already
        return dataclasses.replace(read)
    dim = _out_dim(local)
    return dataclasses.replace(
        read,
        n_heads=local.n_heads * shard.size,
        n_kv_heads=local.n_kv_heads * shard.size,
        q_rows=_tiled(local.q_rows, local.q_weight.shape[dim], shard.size),
        k_rows=_tiled(local.k_rows, local.k_weight.shape[dim], shard.size),
    )


def _tiled(rows: slice | torch.Tensor, width: int, times: int) -> torch.Tensor:
    """A partition's rows (of ``width``) repeated for ``times`` partitions laid end to end:
    rows + t·width, t = 0 … times − 1, in that order.

    >>> _tiled(torch.tensor([0, 1, 6]), 8, 2).tolist()
    [0, 1, 6, 8, 9, 14]
    """
    index = torch.arange(width)[rows] if isinstance(rows, slice) else rows.to(torch.long)
    return (index.reshape(1, -1) + width * torch.arange(times).reshape(-1, 1)).flatten()


def _gathers_to_one(tensor: DTensor, world: int) -> bool:
    """Whether ``tensor`` can be gathered to one rank: one Shard placement on a 1-D mesh of
    every rank (the same answer on every rank: placements are global)."""
    mesh = tensor.device_mesh
    return mesh.ndim == 1 and tensor.placements[0].is_shard() and _spans_world(mesh, world)


@functools.lru_cache(maxsize=64)
def _spans_world(mesh: Any, world: int) -> bool:
    """Whether a 1-D mesh is ranks 0 … world − 1 in order (cached: reading ``mesh.mesh``
    builds a tensor, about 0.35 ms, and a mesh's ranks never change)."""
    return mesh.size() == world and mesh.mesh.tolist() == list(range(world))


def _gather_to(tensor: DTensor, owner: int, rank: int) -> torch.Tensor | None:
    """The whole of a 1-D-sharded DTensor on ``owner`` (None elsewhere), by one gather.

    Shards follow ``torch.chunk`` along the shard dimension, so the last ranks may hold fewer
    rows (or none): each is padded to the largest for the gather and trimmed after."""
    placement = cast("Shard", tensor.placements[0])  # a Shard: ``_gathers_to_one`` said so
    mesh = tensor.device_mesh
    dim, world, rows = placement.dim, mesh.size(), tensor.shape[placement.dim]
    sizes = [placement.local_shard_size_and_offset(rows, world, r)[0] for r in range(world)]
    local = local_values(tensor)
    pad = [0, 0] * (local.dim() - dim - 1) + [0, max(sizes) - local.shape[dim]]
    padded = (torch.nn.functional.pad(local, pad) if pad[-1] else local).contiguous()
    buffers = [torch.empty_like(padded) for _ in range(world)] if rank == owner else None
    torch.distributed.gather(padded, buffers, dst=owner, group=mesh.get_group())
    if buffers is None:
        return None
    return torch.cat([b.narrow(dim, 0, n) for b, n in zip(buffers, sizes, strict=True)], dim)
