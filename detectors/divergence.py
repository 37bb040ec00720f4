"""The operational definition of a diverged run: one rule for the lab and the detectors.

A run diverges at step t when the training loss is not finite at t, or when its exponential
moving average (weight ``ema`` per step) stays more than ``margin`` nats above the best EMA
seen so far for ``patience`` steps starting at t. The EMA and the sustained window keep single
noisy batches from counting; "above its own best" makes the rule scale-free across model sizes
and data. Steps before ``warmup`` never start a sustained divergence (the EMA's start-up); a
non-finite loss is a divergence at any step — nothing trains on from a NaN.

The lab applies it to every step's loss (:func:`divergence_step`); the detectors apply it
online to the sparse losses that monitoring records carry (:class:`LossDivergence`). Records
arrive every δ steps, so the EMA weight of a record after a gap of g steps is 1 − (1 − ema)^g
(the weight g identical steps would have), and "sustained" means records above the margin
spanning at least ``patience`` steps. With a record every step the two are the same function:
:func:`divergence_step` *is* the online rule fed one loss per step.

``LossDivergence`` is a river ``base.Base`` like the detectors: ``repr()`` names its
parameters, ``clone()`` gives a fresh one (``tests/test_detector_contract.py``). Torch-free.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import asdict, dataclass

from river import base

__all__ = ["DivergenceRule", "LossDivergence", "divergence_step"]


@dataclass(frozen=True)
class DivergenceRule:
    """The rule's parameters (recorded in every lab run's labels as ``divergence_rule``)."""

    margin: float = 0.5  # nats above the best smoothed loss
    patience: int = 50  # consecutive steps
    ema: float = 0.05  # EMA weight of the newest loss, per step
    warmup: int = 100  # steps before which no sustained divergence can start

    def __post_init__(self) -> None:
        if self.margin <= 0 or self.patience < 1 or not 0 < self.ema <= 1 or self.warmup < 0:
            raise ValueError(f"invalid divergence rule: {self}")


class LossDivergence(base.Base):
    """``update(step, loss)``; ``divergence_step`` is set once a divergence is confirmed.

    ``loss`` None is a non-finite loss (JSON has no NaN).

    >>> d = LossDivergence()
    >>> for step in range(0, 1000, 25):
    ...     d.update(step, 2.0 if step < 600 else 4.0)
    >>> d.divergence_step
    600
    >>> d = LossDivergence()
    >>> d.update(0, 2.0); d.update(50, None); d.divergence_step
    50
    """

    def __init__(
        self, margin: float = 0.5, patience: int = 50, ema: float = 0.05, warmup: int = 100
    ) -> None:
        DivergenceRule(margin, patience, ema, warmup)  # validates
        self.margin, self.patience, self.ema, self.warmup = margin, patience, ema, warmup
        self.smoothed: float | None = None
        self.best: float | None = None
        self.last_step: int | None = None
        self.above_since: int | None = None
        self.divergence_step: int | None = None

    @classmethod
    def of(cls, rule: DivergenceRule) -> LossDivergence:
        return cls(**asdict(rule))

    def update(self, step: int, loss: float | None) -> None:
        if self.divergence_step is not None:
            return
        if loss is None or not math.isfinite(loss):
            self.divergence_step = step
            return
        gap = 1 if self.last_step is None else max(1, step - self.last_step)
        self.last_step = step
        weight = self.ema if gap == 1 else 1 - (1 - self.ema) ** gap  # ema exactly, per step
        self.smoothed = (
            loss if self.smoothed is None else ((1 - weight) * self.smoothed + weight * loss)
        )
        self.best = self.smoothed if self.best is None else min(self.best, self.smoothed)
        if step >= self.warmup and self.smoothed - self.best > self.margin:
            self.above_since = step if self.above_since is None else self.above_since
            if step - self.above_since + gap >= self.patience:
                self.divergence_step = self.above_since
        else:
            self.above_since = None


def divergence_step(
    losses: Iterable[float], rule: DivergenceRule = DivergenceRule(), first_step: int = 0
) -> int | None:
    """First step of the divergence, or None. ``losses`` holds one loss per step from
    ``first_step`` on.

    >>> flat = [2.0] * 300
    >>> divergence_step(flat) is None
    True
    >>> rising = [2.0] * 200 + [4.0] * 100        # jumps by 2 nats at step 200
    >>> divergence_step(rising)                   # EMA crosses best + 0.5 a few steps later
    205
    >>> divergence_step([2.0] * 50 + [float("nan")])   # a NaN diverges, warm-up or not
    50
    """
    online = LossDivergence.of(rule)
    for offset, loss in enumerate(losses):
        online.update(first_step + offset, loss)
        if online.divergence_step is not None:
            return online.divergence_step
    return None
