"""What the spectra worker computes for a record measured alone: from copies, on any thread.

The training thread reads a monitoring step's inputs (its part: the hooks' routing states as
plain numbers, the norms, the loss; the router rows and the attention heads copied) and hands
the rest here (:mod:`.spectra_worker`): the routing summaries (:func:`~.partials.combine`, on
fresh accumulators shaped as the live ones), the router geometry and the attention spectra.
The values are those the step would have computed itself: the same operations on the same
numbers.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any

import torch

from .layouts import AttentionSpec, RouterSpec
from .measure import attention_inputs, router_geometry_of, solve_attention
from .partials import RankPart, combine
from .reading import to_host
from .spectra_worker import SpectraWorker, Work

__all__ = ["deferred_work", "measured_alone", "worker_copies"]

log = logging.getLogger("foreshock.monitor")


Copies = tuple[list[Any], list[tuple[str, torch.Tensor]]]  # (attention jobs, router rows)


def worker_copies(
    attention: list[AttentionSpec],
    routers: list[RouterSpec],
    snapshots: dict[str, tuple[torch.Tensor, torch.Tensor]],
    config: Any,
    gather: Callable[[str, Callable[[], Any]], Any],
) -> Copies:
    """What the worker reads, copied at the step: the attention jobs (the snapshots move on
    to now) and each router's rows. ``gather(name, make)`` runs ``make``, a failure flagged
    against ``name`` (None)."""
    jobs = gather("attention", lambda: attention_inputs(attention, snapshots, config)) or []
    copies = [gather(r.name, functools.partial(_rows_copy, r)) for r in routers]
    return jobs, [c for c in copies if c is not None]


def _rows_copy(router: RouterSpec) -> tuple[str, torch.Tensor]:
    return router.name, router.rows().clone()


def deferred_work(
    part: RankPart, routers: list[tuple[str, torch.Tensor]], jobs: list[Any], config: Any
) -> Work:
    """The rest of a record measured alone: ``part`` (this rank's, the only one), router rows
    ``routers`` (name, copy) and attention ``jobs`` (``attention_inputs``)."""

    def work(spectra: bool) -> tuple[dict[str, float], set[str]]:
        values, found = combine([part], [part], {})  # accumulators rebuilt from the shapes
        flags, chunks = set(found), []
        for name, weight in routers:
            try:
                chunks.append(router_geometry_of(name, weight))
            except Exception:
                log.warning("foreshock: router geometry of %s failed", name, exc_info=True)
                flags.add(f"monitor_error@{name}")
        if spectra and jobs:
            try:
                chunks += solve_attention(jobs, config)
            except Exception:  # an eigen-solver failed: the record keeps the rest
                log.warning("foreshock: the attention spectra failed", exc_info=True)
                flags.add("monitor_error@attention")
        keys = [key for chunk_keys, _ in chunks for key in chunk_keys]
        values.update(zip(keys, to_host([v for _, v in chunks]), strict=True))
        return values, flags

    return work


def measured_alone(
    worker: SpectraWorker,
    step: int,
    part: RankPart,
    jobs: Copies,
    rates: dict[str, float],
    config: Any,
) -> tuple[dict[str, float], set[str]] | None:
    """The record of a Monitor measuring alone: queued on ``worker`` (None), or, with no
    spectra to solve and no record waiting before it, (values, flags) done now.
    ``jobs``: (attention jobs, router rows); ``rates``: the step's learning rates."""
    attention, routers = jobs
    work = deferred_work(part, routers, attention, config)
    if attention or worker.waiting:
        worker.submit(step, rates, set(), work, bool(attention))
        return None
    values, flags = work(False)
    return {**values, **rates}, flags
