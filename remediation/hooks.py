"""What a framework callback keeps of the remediation (``remedy=``): the runner, built once
the trainer's optimizer exists, and the horizon a rollback lengthens.

Why apart from :mod:`.remediation`: the runner is the same in every loop; only a callback
builds it late (the Trainer makes its optimizer after the callbacks exist), stops its trainer
through a flag and owns a horizon to extend — the Hugging Face and Lightning callbacks share
this, a plain loop needs none of it.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from foreshock.remediation.policy import RemedyPolicy
from foreshock.remediation.ranks import RemedyRanks
from foreshock.remediation.runner import Remediation, check_remedy
from foreshock.remediation.trainer import PRECISE

if TYPE_CHECKING:
    from foreshock.detectors.trackers import TrackerFeed, TrackerUpdate
    from foreshock.producers.monitor import Monitor

__all__ = ["RemedyHooks"]

log = logging.getLogger("foreshock.remedy")


class RemedyHooks:
    """What a framework callback keeps of the remediation (``remedy=``): the runner, built
    at the first step boundary (when the trainer's optimizer exists), once; never raises.
    Its settings (``precise``, ``snapshot_every``, ``snapshots``: 0 for none kept in memory;
    ``extend_horizon``: a rollback of r steps lengthens the run by r, so its schedule, rewound
    with the weights, still ends — else it stops r steps short, its decay unfinished) may be
    changed until then: ``callback.remedy.precise = "eager"``; ``checkpoints``: the
    trainer's own (:mod:`.trainer_checkpoints`), which the callback finds where it saves
    them. ``feed``: the callback's in-process detectors, where an applied action resolves its
    warning (:meth:`take_updates` for the trackers)."""

    def __init__(
        self,
        remedy: RemedyPolicy | str | os.PathLike[str] | None,
        warnings: Any,
        feed: TrackerFeed | None = None,
    ):
        self.policy = check_remedy(remedy, warnings)
        self.feed = feed
        self.runner: Remediation | None = None
        self.precise, self.snapshot_every, self.snapshots = PRECISE, 100, 3
        self.extend_horizon = True
        self.checkpoints: Any = None
        self._tried = False
        self._redone = 0  # the steps re-done that a callback has extended its horizon by

    def before_step(self, monitor: Monitor | None, step: int, setup: Callable[[], Any]) -> None:
        """Before training step ``step``; ``setup()`` gives (optimizer, lr_scheduler, model)."""
        if self.policy is None or monitor is None:
            return
        if not self._tried:
            self._tried = True
            try:
                optimizer, scheduler, model = setup()
            except Exception:
                log.warning("foreshock remedy: off, no optimizer found", exc_info=True)
                if monitor.world_size > 1:  # say so to the peers: none waits for this rank
                    RemedyRanks.join(monitor, ready=False)
                return
            self.runner = Remediation.for_monitor(
                self.policy,
                monitor,
                optimizer,
                scheduler,
                model=model,
                warnings=None,
                precise=self.precise,
                snapshot_every=self.snapshot_every,
                snapshots=self.snapshots,
                checkpoints=self.checkpoints,
                feed=self.feed,
            )
        if self.runner is not None:
            self.runner.before_step(step)

    def at_boundary(self, step: int, update: TrackerUpdate | None) -> bool:
        """After the update before step ``step``, with the monitoring step's warnings (None
        off the monitoring steps): act; True when the run is to stop."""
        if self.runner is None:
            return False
        self.runner.at_boundary(step, update.events if update is not None else ())
        return self.runner.stopped

    def take_extension(self) -> int:
        """The steps the rollbacks undid since the last call, by which the callback extends
        its trainer's horizon (0 with ``extend_horizon`` off)."""
        if self.runner is None:
            return 0
        redone = self.runner.remedies.redone
        more, self._redone = redone - self._redone, redone
        return more if self.extend_horizon else 0

    def take_updates(self) -> list[TrackerUpdate]:
        """What the trackers get of the warnings the actions resolved since the last call
        (the cleared events, the open counts): the callback reports them after
        :meth:`at_boundary`."""
        if self.runner is None:
            return []
        updates, self.runner.updates = self.runner.updates, []
        return updates

    def finish(self, status: str) -> tuple[str, dict[str, Any]]:
        """The end record's status (``stopped`` where the policy stopped it) and fields."""
        if self.runner is None:
            return status, {}
        self.runner.close()
        return self.runner.status(status), self.runner.end_fields()
