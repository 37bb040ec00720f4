"""The lab's divergence rule, online, on the sparse losses that monitoring records carry.

:mod:`foreshock.lab.divergence` defines divergence on every step's loss: the loss is not
finite, or its EMA (weight ``ema`` per step) stays ``margin`` nats above its best EMA for
``patience`` steps. Records arrive every δ steps, so the EMA weight of a record after a gap
of g steps is 1 − (1 − ema)^g (the weight g identical steps would have), and "sustained"
means records above the margin spanning at least ``patience`` steps.

A river ``base.Base`` like the detectors: ``repr()`` names its parameters, ``clone()`` gives a
fresh one (``tests/test_detector_contract.py``).
"""

from __future__ import annotations

import math

from river import base

__all__ = ["LossDivergence"]


class LossDivergence(base.Base):
    """``update(step, loss)``; ``divergence_step`` is set once a divergence is confirmed.

    >>> d = LossDivergence()
    >>> for step in range(0, 1000, 25):
    ...     d.update(step, 2.0 if step < 600 else 4.0)
    >>> d.divergence_step
    600
    """

    def __init__(
        self, margin: float = 0.5, patience: int = 50, ema: float = 0.05, warmup: int = 100
    ) -> None:
        self.margin, self.patience, self.ema, self.warmup = margin, patience, ema, warmup
        self.smoothed: float | None = None
        self.best: float | None = None
        self.last_step: int | None = None
        self.above_since: int | None = None
        self.divergence_step: int | None = None

    def update(self, step: int, loss: float | None) -> None:
        if self.divergence_step is not None:
            return
        if loss is None or not math.isfinite(loss):
            if step >= self.warmup:
                self.divergence_step = step
            return
        gap = 1 if self.last_step is None else max(1, step - self.last_step)
        self.last_step = step
        weight = 1 - (1 - self.ema) ** gap
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
