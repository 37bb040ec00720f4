"""The runner of a remedy policy at a training loop's step boundaries, shared by the Hugging
Face and Lightning callbacks (``remedy=``) and a plain loop.

It takes the snapshots before a step when the policy rolls back, has the
:class:`~.remedy.Remediator` decide on the warnings that opened and on a person's approved
requests (a sink with a non-blocking ``poll_requests()``, e.g. ``KafkaSink``) at the boundary
after an update, applies the decisions, and writes each action to the run's sink as an
``action`` record (:func:`~.remedy.action_record`). The remedies themselves are
:class:`~.trainer_remedies.TrainerRemedies`. Why here and not in each callback: a framework
only says where the boundary is; what happens there is the same everywhere. It never raises
into the training loop: a failure is logged and counted (``errors``), and a remedy that fails
is an action with its error.

In a plain loop (the detectors run in the process on the Monitor's records)::

    remediation = Remediation.for_monitor(RemedyPolicy(), monitor, optimizer, scheduler)
    for step, batch in enumerate(loader):
        remediation.before_step(step)
        loss = train_step(batch)  # forward, backward, optimizer.step(), scheduler.step()
        if remediation.after_step(step, monitor.step(step, loss=loss)):
            break  # the policy stopped the run

Under torch.distributed with more than one rank, rank 0 decides and every rank applies the
same actions at the boundary after each monitoring step (:mod:`.remedy_ranks`): build the
runner on every rank. Only rank 0 writes the action records and polls the approved requests.

An applied action also resolves its warning in the detectors run in the process (``feed``,
:meth:`~.integrations.trackers.TrackerFeed.note`), as the service's detectors do on the action
record: the trackers' open count drops at once, and the cleared event is in ``updates`` for a
callback to report.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from foreshock.remediation.ranks import RemedyRanks
from foreshock.remediation.remedy import (
    CAUSES,
    Action,
    Decision,
    Remediator,
    RemedyPolicy,
    action_record,
    policy_summary,
)
from foreshock.remediation.snapshots import SnapshotRing
from foreshock.remediation.trainer import PRECISE, TrainerRemedies

if TYPE_CHECKING:
    from torch import nn

    from foreshock.detectors.trackers import TrackerFeed, TrackerUpdate
    from foreshock.producers.monitor import Monitor
    from foreshock.transport.warning import RunWarning

__all__ = ["Remediation", "as_policy", "check_remedy"]

log = logging.getLogger("foreshock.remedy")

Requests = Callable[[], Iterable[Mapping[str, Any]]]


def as_policy(remedy: RemedyPolicy | str | os.PathLike[str] | None) -> RemedyPolicy | None:
    """A callback's ``remedy=``: a policy, a policy file's path, or None (off)."""
    if remedy is None or isinstance(remedy, RemedyPolicy):
        return remedy
    if isinstance(remedy, str | os.PathLike):
        return RemedyPolicy.from_file(Path(remedy))
    raise TypeError(f"remedy must be a RemedyPolicy or a policy file's path, not {remedy!r}")


def check_remedy(remedy: Any, warnings: Any) -> RemedyPolicy | None:
    """The callbacks' check at construction: a policy acts on the in-process warnings."""
    policy = as_policy(remedy)
    if policy is not None and (warnings is False or warnings is None):
        raise ValueError("remedy= acts on the in-process warnings: leave warnings= on")
    return policy


class Remediation:
    """The runner at the step boundaries of one run (see the module docstring); never raises.

    write:    where an action's record goes (the run's sink; None: not written)
    requests: a person's approved requests (``sink.poll_requests``; None: none)
    feed:     the detectors run in the process: :meth:`after_step` feeds them the records (a
              plain loop; the callbacks feed theirs and call :meth:`at_boundary` with its
              events), and an applied action resolves its warning there
    ranks:    under torch.distributed, this rank's part in acting together (None: alone)
    """

    def __init__(
        self,
        policy: RemedyPolicy,
        remedies: TrainerRemedies,
        *,
        run_id: str | None = None,
        rank: int = 0,
        write: Callable[[dict[str, Any]], None] | None = None,
        requests: Requests | None = None,
        feed: TrackerFeed | None = None,
        ranks: RemedyRanks | None = None,
    ) -> None:
        self.policy, self.remedies = policy, remedies
        self.remediator = Remediator(policy, remedies)
        self.run_id, self.rank = run_id or "", rank
        self.write, self.requests, self.feed = write, requests, feed
        self.ranks = ranks
        self.off = False  # a failed collective: this rank no longer acts (see remedy_ranks)
        self.errors = 0
        self.updates: list[TrackerUpdate] = []  # resolved warnings, for the trackers

    @classmethod
    def for_monitor(
        cls,
        policy: RemedyPolicy,
        monitor: Monitor,
        optimizer: Any,
        lr_scheduler: Any = None,
        *,
        model: nn.Module | None = None,
        warnings: Any = True,
        labels: Mapping[str, Any] | None = None,
        precise: str = PRECISE,
        snapshot_every: int = 100,
        snapshots: int = 3,
        checkpoints: Any = None,
        feed: TrackerFeed | None = None,
    ) -> Remediation | None:
        """The runner for a monitored run: its actions written to the Monitor's sink,
        requests polled from it; ``warnings`` (True: the shipped profiles, or a detector
        config; None: the caller feeds the events) run the detectors for :meth:`after_step`,
        unless ``feed`` gives the caller's own (where applied actions resolve their warnings).
        Under torch.distributed with more than one rank, call it on every rank: the ranks
        join once (:meth:`~.remedy_ranks.RemedyRanks.join`). None (logged) where it cannot
        act: a failure to build, or ranks that cannot act together."""
        runner = None
        try:
            # records written by their own step: an action comes at the boundary right after
            # the record that warned, as every remediation table was measured (the spectra
            # worker would write it a step later: producers/spectra_worker.py)
            monitor.compute_in_step()
            feed = feed if feed is not None else _feed(warnings, monitor, labels)
            policy = _for_profile(policy, feed, monitor)
            keep = policy.keeps_snapshots(_causes(monitor)) and snapshots > 0  # 0: none
            ring = SnapshotRing(snapshots, snapshot_every) if keep else None
            if ring is not None and feed is not None:  # the detectors go back with the weights
                feed.keep_states(snapshots)
            remedies = TrainerRemedies(
                model if model is not None else monitor.model,
                optimizer,
                lr_scheduler,
                monitor=monitor,
                precise=precise,
                snapshots=ring,
                checkpoints=checkpoints if policy.snapshots else None,
            )
            sink = monitor.sink
            runner = cls(
                policy,
                remedies,
                run_id=monitor.run_id,
                rank=monitor.rank,
                write=sink.write if monitor.active else None,
                requests=getattr(sink, "poll_requests", None),
                feed=feed,
            )
        except Exception:
            log.warning("foreshock remedy: off, it could not be set up", exc_info=True)
        if monitor.world_size > 1:  # every rank joins, built or not: none waits in vain
            ranks = RemedyRanks.join(monitor, ready=runner is not None)
            if ranks is None or runner is None:
                return None
            runner.ranks = ranks
            if not ranks.decides:  # the decider writes the action records, polls requests
                runner.write, runner.requests = None, None
        return runner

    @property
    def stopped(self) -> bool:
        return self.remedies.stopped

    @property
    def actions(self) -> list[Action]:
        return self.remediator.actions

    def before_step(self, step: int) -> None:
        """Before training step ``step`` (the optimizer update's 0-based index)."""
        if self.off:
            return
        try:
            if self.remedies.before_step(step) and self.feed is not None:
                self.feed.mark(step)  # the detectors go back with the weights kept now
        except Exception:
            self._failed("the snapshot before step %d failed", step)

    def after_step(self, step: int, record: Mapping[str, Any] | None) -> bool:
        """A plain loop's call after step ``step`` with the Monitor's record (None off the
        monitoring steps): act at the boundary; True when the policy stopped the run."""
        events: list[RunWarning] = []
        if record is not None and self.feed is not None:
            update = self.feed.update(record)
            events = update.events if update is not None else []
        self.at_boundary(step + 1, events)
        return self.stopped

    def at_boundary(self, step: int, events: Iterable[RunWarning] = ()) -> list[Action]:
        """Before training step ``step``: act on the warnings that opened, then on the
        approved requests; each action written as an ``action`` record. Under
        torch.distributed: at the boundaries after monitoring steps only, on every rank,
        with rank 0's decisions (:mod:`.remedy_ranks`)."""
        ranks = self.ranks
        if self.off or (ranks is not None and not ranks.due(step)):
            return []
        decided: list[Decision] = []
        try:
            self.remedies.step = step
            if ranks is None or ranks.decides:
                decided = self._decide(step, events)
        except Exception:
            self._failed("acting at step %d failed", step)
            if ranks is None:
                return []
        if ranks is not None:
            try:
                decided = ranks.share(decided)
            except Exception:
                self.off = True
                self._failed("sharing the decisions at step %d failed: off on this rank", step)
                return []
        taken = []
        for decision in decided:
            try:
                taken.append(self.remediator.apply(decision))
            except Exception:
                self._failed("applying a decision at step %d failed", step)
        for action in taken:
            self._report(action)
        return taken

    def end_fields(self) -> dict[str, Any]:
        """What the run's ``end`` record says of the remediation."""
        ring = self.remedies.ring
        return {
            "remedy": {
                "policy": policy_summary(self.policy),
                "actions": [a.to_message() for a in self.actions],
                "steps_redone": self.remedies.redone,
                "snapshot_bytes": ring.nbytes if ring is not None else 0,
                "errors": self.errors,
            }
        }

    def status(self, default: str = "finished") -> str:
        return "stopped" if self.stopped else default

    def close(self) -> None:
        try:
            self.remedies.close()
        except Exception:
            self._failed("closing the remedies failed")

    # ---- internals ----------------------------------------------------------------------
    def _decide(self, step: int, events: Iterable[RunWarning]) -> list[Decision]:
        """The policy's decisions for the warnings that opened, then the approved requests'."""
        decided = self.remediator.decide(step, list(events))
        for request in self._requests():
            decision = self.remediator.decide_request(step, request, decided)
            if decision is not None:
                decided.append(decision)
        return decided

    def _requests(self) -> list[Mapping[str, Any]]:
        """The approved requests for this run the sink holds now (non-blocking)."""
        if self.requests is None:
            return []
        try:
            requests = list(self.requests() or [])
        except Exception:
            self._failed("polling the approved requests failed")
            return []
        return [
            r
            for r in requests
            if isinstance(r, Mapping) and r.get("run_id") in (None, "", self.run_id)
        ]  # not another run's

    def _report(self, action: Action) -> None:
        """The action record written (where this rank writes); an applied action resolves
        its warning in the in-process detectors too (``feed``)."""
        record = action_record(self.run_id, self.rank, action)
        if self.write is not None:
            try:
                self.write(record)
            except Exception:
                self._failed("writing the %s action record failed", action.kind)
        if self.feed is not None and action.applied and not action.dry_run:
            update = self.feed.note(record)
            if update is not None:
                self.updates.append(update)

    def _failed(self, what: str, *args: Any) -> None:
        self.errors += 1
        log.warning("foreshock remedy: " + what, *args, exc_info=True)


def _feed(warnings: Any, monitor: Monitor, labels: Mapping[str, Any] | None) -> TrackerFeed | None:
    """The in-process detectors, their profile chosen by the model's signature (as the
    worker's is) and the run's labels."""
    if warnings is None or warnings is False:
        return None
    from foreshock.detectors.trackers import TrackerFeed

    feed = TrackerFeed(warnings)
    feed.start(monitor.run_id, dict(labels or {}), monitor.signature())
    return feed


def _for_profile(policy: RemedyPolicy, feed: TrackerFeed | None, monitor: Monitor) -> RemedyPolicy:
    """The policy for a run the fallback profile judges: every action rolls back first
    (``rollback_uncalibrated``). In one process only: ranks must keep the same snapshots."""
    if not policy.rollback_uncalibrated or policy.rollback is True or monitor.world_size > 1:
        return policy
    if feed is None or not feed.uncalibrated:
        return policy
    log.info("foreshock remedy: no profile was calibrated on this model: actions roll back")
    return replace(policy, rollback=True)


def _causes(monitor: Monitor) -> tuple[str, ...]:
    """The causes a warning can name on this monitored model: no router one where a single
    process found no router (a dense model keeps no snapshot for a router rollback). Under
    torch.distributed every cause: a rank may hold no router where a peer does, and the
    ranks must snapshot at the same steps."""
    if monitor.world_size > 1 or monitor.discovery.routers:
        return CAUSES
    return tuple(c for c in CAUSES if c != "router")
