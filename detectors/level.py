"""Sustained level: fires when a series has stayed beyond a level for ``confirm`` records.

A CUSUM accumulates evidence of a *change in rate*; it cannot see a series that falls steadily
but too far. A router's token entropy under a high learning rate does exactly that: it slides
from its warm-up level to a third of it over hundreds of steps, no faster per record than a
healthy router's early drift, so a trend-relative CUSUM sees little until the end. Measured as
a level against the run's own warm-up (``LogRatioStandardizer``: x = ln(value / warm-up mean),
in nats of ratio), the collapse is plain: healthy routers stay above ~0.58 of their warm-up
entropy over a whole lab run, collapsing ones fall below it.

On that input the statistic is the one-sided excursion

    S_t = max(0, s·x_t),   s = +1 (up) or −1 (down),

and the detector fires when min(S_{t−c+1}, …, S_t) — the *sustained* statistic — crosses h.
h is calibrated like every threshold (:mod:`foreshock.detectors.calibrate`): on the healthy
runs' largest sustained excursion. The attributes match ``OneSidedCUSUM``'s (``statistic``,
``sustained``, ``peak``, ``in_alarm``), so the engine treats both alike.
"""

from __future__ import annotations

import math
from collections import deque

from river import base

__all__ = ["SustainedLevel"]


class SustainedLevel(base.DriftDetector):
    """River-style: ``update(x)`` then read ``drift_detected`` (true on the crossing update).

    >>> level = SustainedLevel(direction="down", h=0.5, confirm=2)
    >>> for x in [-0.1, -0.7, -0.2, -0.6, -0.8]:
    ...     level.update(x)
    ...     if level.drift_detected:
    ...         print(f"fired at x={x}, sustained={level.sustained:.1f}")
    fired at x=-0.8, sustained=0.6
    >>> level.in_alarm
    True
    """

    def __init__(self, direction: str = "down", h: float = 1.0, confirm: int = 1) -> None:
        super().__init__()
        if direction not in ("up", "down"):
            raise ValueError(f"direction must be 'up' or 'down', got {direction!r}")
        if h <= 0 or confirm < 1:
            raise ValueError("h must be > 0 and confirm >= 1")
        self.direction, self.h = direction, h
        self.statistic = 0.0
        self.sustained = 0.0
        self.peak = 0.0
        self._last: deque[float] = deque(maxlen=confirm)

    def update(self, x: float) -> None:
        self._drift_detected = False
        if not math.isfinite(x):
            return
        sign = 1.0 if self.direction == "up" else -1.0
        self.statistic = max(0.0, sign * x)
        self._last.append(self.statistic)
        before = self.sustained
        self.sustained = min(self._last) if len(self._last) == self._last.maxlen else 0.0
        self.peak = max(self.peak, self.sustained)
        self._drift_detected = before <= self.h < self.sustained

    @property
    def in_alarm(self) -> bool:
        return self.statistic > self.h
