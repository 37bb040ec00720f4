"""The lab's trainer side of a remedy policy (:mod:`foreshock.remediation.remedy`).

The lab trains with its faults switched on in the training computation; a remedy acts on that
same computation, as a trainer would on its own:

* ``precise_attention(module)``: that attention layer's backward goes back to full precision
  (its ``lowp`` switch off from the next step on) — what switching a layer to a
  higher-precision attention implementation does on a real model;
* ``hold_lr(scale, since)``: the faulted parameter groups' learning rate is held at ``scale``
  × its value at step ``since`` (when the warning's evidence began; None: at the warning; a
  held one: × ``scale`` again), whatever the schedule does next;
* ``scale_router_lr(scale)``: the routers' learning rate held at ``scale`` × its value at the
  warning (a router-only fault keeps the routers in their own group, the faulted one, so this
  is ``hold_lr`` on it; with one group for the whole model it is refused);
* ``stop()``: training stops at the next step boundary (the run ends ``stopped``);
* ``rollback(step)``: the newest snapshot (:class:`~foreshock.remediation.snapshots.
  SnapshotRing`) before ``step`` is restored and the run goes on from that step (the loop
  truncates its loss history and rewinds the schedule, as a checkpoint restore does); the data
  go on from where they were (the batches since the snapshot are not replayed).

The same hooks carry the baseline a remedy is judged against: loss-triggered rollback
(:mod:`.loss_trigger`), which restores a snapshot once the loss diverged, with or without the
right fix.

The policy's decisions come from the detectors run in the training process, on the records the
Monitor writes (:class:`~foreshock.detectors.trackers.InProcessDetector`, the
service's code), with the shipped profiles — so a lab run warns as ``foreshock detect
--replay`` of it would, up to the first action.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from foreshock.detectors.profiles import shipped_profiles
from foreshock.detectors.trackers import InProcessDetector
from foreshock.remediation.remedy import Action, Remediator, RemedyPolicy
from foreshock.remediation.snapshots import SnapshotRing

from .lab_model import LabModel, set_switch
from .loss_trigger import LossTrigger, LossTriggerPolicy

__all__ = ["LabRemedies"]

log = logging.getLogger("foreshock.lab")


class LabRemedies:
    """The remedies a lab run offers, and the loop's hooks that apply them."""

    def __init__(
        self,
        policy: RemedyPolicy | None,
        lab: LabModel,
        optimizer: torch.optim.Optimizer,
        start: dict[str, Any],
        snapshot_every: int = 100,
        trigger: LossTriggerPolicy | None = None,
    ) -> None:
        self.lab, self.optimizer = lab, optimizer
        self.detector = (
            None if policy is None else InProcessDetector(str(start["run_id"]), shipped_profiles())
        )
        if self.detector is not None:
            self.detector.update(start)
        self.remediator = Remediator(policy or RemedyPolicy(), self)
        self.trigger = None if trigger is None else LossTrigger(trigger)
        rolls = trigger is not None or (policy is not None and policy.snapshots)
        self.ring = SnapshotRing(4, snapshot_every) if rolls else None
        self.cured: set[str] = set()  # attention layers back to full precision
        self.lr_hold: float | None = None  # the held factor on the faulted groups
        self._hold_scale: float | None = None  # a hold asked, fixed at the next step's factor
        self._hold_since: int | None = None  # the step whose factor it scales (None: now)
        self._factors: dict[int, float] = {}  # the faulted groups' factor at each step
        self.stopped = False
        self.redone = 0  # steps whose training a rollback undid
        self.rewind: int | None = None  # the step a rollback restored, for the loop to resume at
        self._step = 0

    # ---- the loop's hooks ---------------------------------------------------------------
    def before_step(self, step: int) -> None:
        """Snapshot when due, then undo the fault where a remedy cured it."""
        self._step = step
        if self.ring is not None:
            self.ring.maybe_take(step, self.lab.model, self.optimizer)
        for name in self.cured:
            set_switch(self.lab.attention[name], "lowp", None)

    def lr_factor(self, scheduled: float, faulted: bool) -> float:
        """The factor on a group's base learning rate, the schedule's unless a remedy holds
        (a hold fixes ``scale`` × the schedule's factor at the first step after it)."""
        if not faulted:
            return scheduled
        if self._hold_scale is not None:
            now = scheduled if self.lr_hold is None else self.lr_hold
            base = self._factor_at(self._hold_since, now)
            self.lr_hold, self._hold_scale = base * self._hold_scale, None
        factor = scheduled if self.lr_hold is None else self.lr_hold
        self._factors[self._step] = factor
        return factor

    def _factor_at(self, step: int | None, now: float) -> float:
        """The faulted groups' factor at the newest step ≤ ``step`` trained (``now`` if None)."""
        seen = [s for s in self._factors if step is not None and s <= step]
        return self._factors[max(seen)] if seen else now

    def after_record(self, step: int, record: dict[str, Any] | None) -> list[Action]:
        """Feed the Monitor's record to the detectors; act on the warnings that opened."""
        if record is None or self.detector is None:
            return []
        warnings = self.detector.update({**record, "kind": "metrics"})
        return self.remediator.act(step + 1, warnings)  # applied before the next step

    def after_loss(self, losses: list[float]) -> None:
        """The loss trigger's turn (``losses``: the run's history, this step's last): on a
        confirmed divergence, restore a snapshot ``back`` steps before it and apply the fix."""
        trigger = self.trigger
        if trigger is None or trigger.spent:
            return
        diverged = trigger.observe(len(losses) - 1, losses[-1])
        if diverged is None:
            return
        restored = self.rollback(diverged - trigger.policy.back + 1)
        if restored is None:
            log.warning("loss trigger: no snapshot before step %d", diverged)
            return
        trigger.restart(losses[:restored])
        if trigger.policy.fix is not None:
            self.remediator._remedy(trigger.policy.fix, _fixed(self.lab))

    def take_rewind(self) -> int | None:
        """The step a rollback restored since the last call (the loop resumes there), once."""
        rewind, self.rewind = self.rewind, None
        return rewind

    @property
    def actions(self) -> list[Action]:
        return self.remediator.actions

    # ---- the remedies -------------------------------------------------------------------
    def precise_attention(self, module: str | None) -> None:
        names = list(self.lab.attention) if module is None else [module]
        unknown = [n for n in names if n not in self.lab.attention]
        if unknown:
            raise KeyError(f"no attention layer {unknown} in this model")
        self.cured.update(names)

    def hold_lr(self, scale: float, since: int | None = None) -> None:
        self._hold_scale, self._hold_since = scale, since

    def scale_router_lr(self, scale: float) -> None:
        if not any(g.get("faulted") is True for g in self.optimizer.param_groups):
            raise NotImplementedError("the routers share the model's parameter group")
        self.hold_lr(scale)

    def stop(self) -> None:
        self.stopped = True

    def rollback(self, before: int) -> int | None:
        if self.ring is None:
            raise RuntimeError("rollback needs the policy's snapshots (rollback = true)")
        restored = self.ring.restore_before(before, self.lab.model, self.optimizer)
        if restored is not None:
            self.redone += self._step + 1 - restored
            self.rewind = restored
        return restored


def _fixed(lab: LabModel) -> Any:
    """The warning a loss trigger's fix answers: the whole model (every attention layer)."""
    from foreshock.remediation.decision import opened

    return opened("loss", None)
