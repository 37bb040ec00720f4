"""Remediation under torch.distributed: one rank decides, every rank applies the same actions
at the same step boundary.

Why: the warnings are decided where the records are read — the writing rank (rank 0 by
default), whose detectors see the job's combined records — and a person's approved requests
arrive at that rank's sink. An action applied there alone would make the ranks' models part
(a learning rate held on one rank, a layer switched on one, one rank rolled back). So, at the
boundary after each monitoring step:

1. rank 0 decides (``Remediator.decide`` / ``decide_request``: nothing applied yet);
2. it broadcasts the decisions, a few dicts of plain values (:meth:`RemedyRanks.share`);
3. every rank applies them to its own model and optimizer (``Remediator.apply`` through its
   ``TrainerRemedies``): ``hold-lr`` and ``stop`` are rank-local and the same everywhere;
   ``precise-attention`` switches the same layers on every rank; ``scale-router-lr`` scales
   each rank's local shards; a rollback restores each rank's own snapshot, taken at the same
   steps on every rank (``before_step`` runs on every rank).

Only at those boundaries: every rank knows which steps monitor (``step % every``), so every
rank reaches the collective with no other exchange, and the other steps pay for none. An
approved request polled in between waits for the next one (at most ``every`` steps).

Which ranks act together is settled once, through the process group's store, as the
Monitor's own join (:func:`~.collective._settle`): a rank with no runner — its Monitor failed
to build, its optimizer was not found — must not leave its peers alone in a broadcast. A rank
whose runner could not be built says so at once (the decision ``apart``), and a rank that
never arrives is waited for ``join_timeout_s`` (the Monitor's); either way remediation is off
on every rank, logged. When the Monitors themselves did not join (a rank without one: each
measures alone), remediation is off without waiting. After the join, a broadcast that raises
(a broken group, a timeout) turns remediation off on the rank that saw it (counted, logged;
never raised into training): such a failure is the group's, and its peers see it too.
"""

from __future__ import annotations

import logging
import pickle
from itertools import count
from typing import TYPE_CHECKING, Any

import torch

from foreshock.producers.collective import _settle

if TYPE_CHECKING:
    from foreshock.producers.monitor import Monitor
    from foreshock.remediation.remedy import Decision

__all__ = ["DECIDER", "RemedyRanks"]

log = logging.getLogger("foreshock.remedy")

DECIDER = 0  # the rank that decides: the writing rank under the default emit_ranks="zero"
_RUNNERS = count()  # the n-th runner built in this process joins the n-th key (as Monitors)


class RemedyRanks:
    """This rank's part in acting together (see the module docstring)."""

    def __init__(self, rank: int, world: int, every: int) -> None:
        self.rank, self.world, self.every = rank, world, every
        self.shared = 0  # boundaries whose decisions travelled

    @property
    def decides(self) -> bool:
        return self.rank == DECIDER

    def due(self, step: int) -> bool:
        """Whether the boundary before training step ``step`` follows a monitoring step
        (``step - 1``): the same answer on every rank."""
        return step >= 1 and (step - 1) % self.every == 0

    def share(self, decided: list[Decision]) -> list[Decision]:
        """The decider's ``decided``, on every rank: one ``broadcast_object_list``. Every
        rank calls it at every due boundary; the others' ``decided`` is ignored. Raises
        where the collective fails (the caller turns remediation off)."""
        payload: list[Any] = [None]
        if self.decides:
            try:
                pickle.dumps(decided)  # never fail before the peers' receive: send nothing
                payload[0] = decided
            except Exception:
                log.warning("foreshock remedy: decisions that do not travel", exc_info=True)
                payload[0] = []
        torch.distributed.broadcast_object_list(payload, src=DECIDER)
        received = payload[0]
        if not isinstance(received, list):
            raise TypeError(f"the decider sent {type(received).__name__}, not a list")
        self.shared += 1
        return received

    @classmethod
    def join(cls, monitor: Monitor, ready: bool, store: Any = None) -> RemedyRanks | None:
        """This rank's part once every rank has its runner (``ready``: this one was built);
        None where remediation is off (logged): the Monitors measure apart, a rank was not
        ready, or none arrived within the Monitor's ``join_timeout_s``. ``store``: the
        process group's by default."""
        peers = monitor.peers
        if peers is None:
            log.warning(
                "foreshock remedy: off, the ranks' Monitors did not join (a rank without "
                "one?): an action on some ranks alone would make their models part"
            )
            return None
        key = f"foreshock/remedy/{next(_RUNNERS)}"
        try:
            if store is None:
                store = torch.distributed.distributed_c10d._get_default_store()
            if not ready:
                store.compare_set(f"{key}/decision", "", "apart")
                return None
            together = _settle(store, key, peers.world, monitor.config.join_timeout_s)
        except Exception:
            log.warning("foreshock remedy: off, the ranks could not join", exc_info=True)
            return None
        if not together:
            log.warning(
                "foreshock remedy: off, not every rank built its remediation within %.0f s",
                monitor.config.join_timeout_s,
            )
            return None
        return cls(peers.rank, peers.world, monitor.config.every)
