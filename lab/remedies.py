"""The lab's trainer side of a remedy policy (:mod:`foreshock.producers.remedy`).

The lab trains with its faults switched on in the training computation; a remedy acts on that
same computation, as a trainer would on its own:

* ``precise_attention(module)``: that attention layer's backward goes back to full precision
  (its ``lowp`` switch off from the next step on) — what switching a layer to a
  higher-precision attention implementation does on a real model;
* ``hold_lr(scale)``: the faulted parameter groups' learning rate is held at ``scale`` × its
  value at the warning, whatever the schedule does next;
* ``scale_router_lr(scale)``: the routers' learning rate × ``scale`` (a router-only fault keeps
  the routers in their own group; with one group for the whole model it is refused);
* ``stop()``: training stops at the next step boundary (the run ends ``stopped``);
* ``rollback(step)``: the newest snapshot (:class:`~foreshock.producers.snapshots.
  SnapshotRing`) before ``step`` is restored; the data go on from where they were (the
  batches since the snapshot are skipped, as PaLM's restarts did), the step count too.

The policy's decisions come from the detectors run in the training process, on the records the
Monitor writes (:class:`~foreshock.producers.integrations.trackers.InProcessDetector`, the
service's code), with the shipped profiles — so a lab run warns as ``foreshock detect
--replay`` of it would, up to the first action.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from foreshock.detectors.profiles import shipped_profiles
from foreshock.producers.integrations.trackers import InProcessDetector
from foreshock.producers.remedy import Action, Remediator, RemedyPolicy
from foreshock.producers.snapshots import SnapshotRing

from .lab_model import LabModel, set_switch

__all__ = ["LabRemedies"]

log = logging.getLogger("foreshock.lab")


class LabRemedies:
    """The remedies a lab run offers, and the loop's hooks that apply them."""

    def __init__(
        self,
        policy: RemedyPolicy,
        lab: LabModel,
        optimizer: torch.optim.Optimizer,
        start: dict[str, Any],
        snapshot_every: int = 100,
    ) -> None:
        self.lab, self.optimizer = lab, optimizer
        self.detector = InProcessDetector(str(start["run_id"]), shipped_profiles())
        self.detector.update(start)
        self.remediator = Remediator(policy, self)
        self.ring = SnapshotRing(3, snapshot_every) if policy.rollback else None
        self.cured: set[str] = set()  # attention layers back to full precision
        self.lr_hold: float | None = None  # the held factor on the faulted groups
        self.router_scale = 1.0
        self.stopped = False
        self.redone = 0  # steps whose training a rollback undid
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
        """The factor on a group's base learning rate, the schedule's unless a remedy holds."""
        if not faulted:
            return scheduled
        held = scheduled if self.lr_hold is None else self.lr_hold
        return held * self.router_scale

    def after_record(self, step: int, record: dict[str, Any] | None) -> list[Action]:
        """Feed the Monitor's record to the detectors; act on the warnings that opened."""
        if record is None:
            return []
        warnings = self.detector.update({**record, "kind": "metrics"})
        return self.remediator.act(step + 1, warnings)  # applied before the next step

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

    def hold_lr(self, scale: float) -> None:
        group = next(g for g in self.optimizer.param_groups if g.get("faulted", True))
        current = group["lr"] / group.get("base_lr", group["lr"])
        self.lr_hold = current * scale

    def scale_router_lr(self, scale: float) -> None:
        if not any(g.get("faulted") is True for g in self.optimizer.param_groups):
            raise NotImplementedError("the routers share the model's parameter group")
        self.router_scale *= scale

    def stop(self) -> None:
        self.stopped = True

    def rollback(self, before: int) -> int | None:
        if self.ring is None:
            raise RuntimeError("rollback needs the policy's snapshots (rollback = true)")
        restored = self.ring.restore_before(before, self.lab.model, self.optimizer)
        if restored is not None:
            self.redone += self._step - restored
        return restored
