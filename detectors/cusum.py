"""One-sided CUSUM: an accumulating detector for shifts in one direction only.

Entropy *collapse* and ε *shrinking* are one-directional: a two-sided test spends half its
false-alarm budget on moves that mean nothing. On standardized input x (units of the run's own
warm-up σ) the statistic is

    S_t = max(0, S_{t−1} + s·x_t − k),   s = +1 (up) or −1 (down),

and the detector fires when S_t exceeds h (Page 1954). k (σ) is the allowance: shifts smaller
than k never accumulate; h (σ·records) trades delay for false alarms and is calibrated per
family on healthy runs (:mod:`foreshock.detectors.calibrate`).

With ``confirm`` = c > 1 it fires only when S has stayed above h for c updates in a row: the
sustained statistic min(S_{t−c+1}, …, S_t) crosses h. One noisy record then cannot open a
warning (nor name a wrong cause), and calibration on the sustained statistic's peak keeps
the false-alarm bound: its healthy maxima are lower, so thresholds come out lower too.
"""

from __future__ import annotations

import math
import sys
from collections import deque

from river import base

__all__ = ["OneSidedCUSUM"]


class OneSidedCUSUM(base.DriftDetector):
    """River-style: ``update(x)`` then read ``drift_detected`` (true on the crossing update).

    >>> cusum = OneSidedCUSUM(direction="down", k=0.5, h=4.0)
    >>> for x in [0.1, -0.3, 0.2, -2.0, -2.5, -3.0]:
    ...     cusum.update(x)
    ...     if cusum.drift_detected:
    ...         print(f"fired at x={x}, S={cusum.statistic:.1f}")
    fired at x=-3.0, S=6.0
    >>> cusum.in_alarm
    True

    Confirmed over two updates, a single spike no longer fires:

    >>> cusum = OneSidedCUSUM(direction="up", k=0.5, h=4.0, confirm=2)
    >>> fired = []
    >>> for x in [6.0, -6.0, 3.0, 3.0, 3.0]:
    ...     cusum.update(x)
    ...     fired.append(cusum.drift_detected)
    >>> fired
    [False, False, False, False, True]
    """

    def __init__(
        self, direction: str = "up", k: float = 0.5, h: float = 5.0, confirm: int = 1
    ) -> None:
        super().__init__()
        if direction not in ("up", "down"):
            raise ValueError(f"direction must be 'up' or 'down', got {direction!r}")
        if k < 0 or h <= 0 or confirm < 1:
            raise ValueError("k must be >= 0, h > 0 and confirm >= 1")
        # every constructor argument is an attribute of its name: river's repr() and clone()
        # rebuild the detector from them (tests/test_detector_contract.py)
        self.direction, self.k, self.h, self.confirm = direction, k, h, confirm
        self._reset()

    def _reset(self) -> None:
        """Back to a fresh detector's state (river's ``_reset``: its base clears only the flag,
        which would leave a reset detector in alarm on its old statistic)."""
        super()._reset()
        self.statistic = 0.0
        self.sustained = 0.0  # min of the last ``confirm`` statistics
        self.peak = 0.0  # the largest sustained statistic seen: what calibration records
        self._last: deque[float] = deque(maxlen=self.confirm)

    def update(self, x: float) -> None:
        self._drift_detected = False
        if not math.isfinite(x):
            return
        self.statistic = self._next_statistic(x)
        self._last.append(self.statistic)
        before = self.sustained
        self.sustained = min(self._last) if len(self._last) == self._last.maxlen else 0.0
        self.peak = max(self.peak, self.sustained)
        self._drift_detected = before <= self.h < self.sustained

    def _next_statistic(self, x: float) -> float:
        sign = 1.0 if self.direction == "up" else -1.0
        # capped at the largest float: a sum of huge inputs never becomes inf (then NaN)
        return min(max(0.0, self.statistic + sign * x - self.k), sys.float_info.max)

    @property
    def in_alarm(self) -> bool:
        return self.statistic > self.h
