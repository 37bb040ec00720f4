"""Every training step's loss through the divergence rule: the run's exact divergence step.

The detectors see a run's loss only in its monitoring records, one batch every δ steps, so
their divergence step is an estimate — sparse one-batch losses once called a run diverged at
step 375 that the every-step rule never did. The producer sees every step. It applies the
project's rule (:mod:`foreshock.detectors.divergence`, the one the lab applies) to every
step's loss and writes the answer into the run's ``end`` record: ``divergence_step`` an int,
or null for "did not diverge", which the store and the detectors tell apart from an absent
one (not known: estimate it). The trainer callbacks do this for the user
(``integrations.MonitoredRun``); a plain loop calls :meth:`DivergenceWatch.observe` next to
``monitor.step`` and puts :meth:`DivergenceWatch.end_fields` into its own ``end`` record.

Cheap, and never in the training's way:

* a loss on the accelerator is kept as it is (detached, one scalar a step), not read: reading
  it would synchronise the device every step. :meth:`~DivergenceWatch.drain` reads the kept
  ones in one copy; the callbacks drain on monitoring steps, right after the Monitor's own
  synchronisation, when nothing queued is left for the copy to wait on (and at the end). At
  most ``max_pending`` are kept between drains;
* it never raises. NaN or ±Inf is a divergence (the rule's: nothing trains on from a NaN);
  anything else that is not one number (None, a tensor of many elements, a string) is a step
  without a loss;
* exact or absent: the rule cannot see across a step without a loss, so after one (before the
  rule fired) :meth:`~DivergenceWatch.end_fields` says nothing and the detectors estimate.
  The rule starts at the first step observed: a run resumed from a checkpoint is judged on
  the steps of this attempt (the losses before the checkpoint are not in it).

>>> watch = DivergenceWatch()
>>> for step in range(300):
...     watch.observe(step, 2.0 if step < 200 else 4.0)
>>> watch.end_fields()
{'divergence_step': 205}
>>> calm = DivergenceWatch()
>>> for step in range(300):
...     calm.observe(step, "no loss" if step == 7 else 2.0)
>>> calm.end_fields()   # a step without a loss: not known, the detectors estimate
{}
"""

from __future__ import annotations

import logging
import numbers
import sys
from typing import Any

from foreshock.detectors.divergence import DivergenceRule, LossDivergence

__all__ = ["DivergenceWatch"]

log = logging.getLogger("foreshock.divergence")


class DivergenceWatch:
    """``observe(step, loss)`` once per optimizer step; ``end_fields()`` for the end record.

    rule:        the divergence rule (default: the project's, as the lab applies it)
    max_pending: device losses kept unread at most; more are read at once
    """

    def __init__(self, rule: DivergenceRule | None = None, max_pending: int = 1024) -> None:
        self.rule = rule or DivergenceRule()
        self.max_pending = max(1, max_pending)
        self._online = LossDivergence.of(self.rule)
        self._pending: list[tuple[int, Any]] = []  # (step, float | None | 0-d tensor)
        self._last_step: int | None = None
        self.steps = 0  # steps whose loss the rule has read
        self.exact = True  # no step without a loss before the rule fired

    def observe(self, step: int, loss: Any) -> None:
        """One optimizer step's loss (a tensor, kept unread, or a number; see the module)."""
        if self._online.divergence_step is not None:
            return  # the rule has fired: nothing more to read
        try:
            self._pending.append((int(step), _kept(loss)))
        except Exception:  # never into the training loop: a step the rule cannot read
            self.exact = False
            log.debug("foreshock: no loss for the divergence rule at %r", step, exc_info=True)
        if len(self._pending) >= self.max_pending:
            self.drain()

    def drain(self) -> None:
        """Read the kept losses (one device copy) and apply the rule to them, in step order."""
        pending, self._pending = self._pending, []
        if not pending:
            return
        try:
            values = _to_host([value for _, value in pending])
        except Exception:
            log.warning("foreshock: could not read %d step losses", len(pending), exc_info=True)
            values = [None] * len(pending)
        for (step, _), value in zip(pending, values, strict=True):
            self._apply(step, value)

    @property
    def divergence_step(self) -> int | None:
        """The step the run diverged at by the rule so far (None: not, or not known)."""
        self.drain()
        return self._online.divergence_step

    def end_fields(self) -> dict[str, Any]:
        """``{"divergence_step": int | None}`` for the run's ``end`` record, or ``{}`` when the
        rule could not read every step (the detectors then estimate from the records)."""
        self.drain()
        if not (self.exact and self.steps):
            return {}
        return {"divergence_step": self._online.divergence_step}

    def _apply(self, step: int, loss: float | None) -> None:
        if self._online.divergence_step is not None:
            return
        skipped = self._last_step is not None and step != self._last_step + 1
        self._last_step = step
        if loss is None or skipped:
            self.exact = False
        if loss is None:
            return
        self.steps += 1
        self._online.update(step, loss)  # NaN or ±Inf: diverged at this step


def _kept(loss: Any) -> Any:
    """What to keep of a step's loss: a float, a detached 0-d tensor (unread), or None."""
    if isinstance(loss, bool) or loss is None:
        return None
    if isinstance(loss, numbers.Real):
        return float(loss)
    torch = sys.modules.get("torch")  # a tensor means torch is imported: no import here
    if torch is None or not isinstance(loss, torch.Tensor):
        return None
    if type(loss).__name__ == "DTensor":  # reading a sharded or partial one is a collective
        if not all(p.is_replicate() for p in loss.placements):
            return None
        loss = loss.to_local()
    if loss.numel() != 1 or loss.is_complex():
        return None
    return loss.detach().reshape(())


def _to_host(values: list[Any]) -> list[float | None]:
    """The kept values as floats: every tensor read in one ``stack(...).tolist()``."""
    tensors = [v for v in values if v is not None and not isinstance(v, float)]
    if not tensors:
        return values
    torch = sys.modules["torch"]
    try:
        read = iter(torch.stack(tensors).tolist())  # one device sync for all of them
    except Exception:  # mixed devices: one by one
        read = iter([_item(t) for t in tensors])
    return [v if v is None or isinstance(v, float) else next(read) for v in values]


def _item(tensor: Any) -> float | None:
    try:
        return float(tensor.item())
    except Exception:
        return None
