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
runs' largest sustained excursion. It is a ``OneSidedCUSUM`` whose statistic forgets its past, so
the engine treats both alike.
"""

from __future__ import annotations

from .cusum import OneSidedCUSUM

__all__ = ["SustainedLevel"]


class SustainedLevel(OneSidedCUSUM):
    """River-style: ``update(x)`` then read ``drift_detected`` (true on the crossing update).

    A CUSUM without memory: the same confirmation, peak and alarm, on S_t = max(0, s·x_t).

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
        super().__init__(direction, k=0.0, h=h, confirm=confirm)

    def _next_statistic(self, x: float) -> float:
        return max(0.0, x if self.direction == "up" else -x)
