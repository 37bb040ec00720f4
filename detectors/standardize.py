"""Standardize a series against its own run's healthy warm-up window.

Runs differ in scale (model width, data, optimizer): an entropy of 0.6 is normal in one run
and a collapse in another. Each series is therefore measured in units of its own warm-up:
the first ``records`` values at steps ≥ ``start`` give a mean μ and a scale σ, and afterwards

    z = (x − μ) / σ,   σ = max(std, rel_floor·|μ|, abs_floor),

so a series that is flat during the warm-up does not turn every later wobble into a huge z.
"""

from __future__ import annotations

import math
import statistics

__all__ = ["TrendStandardizer", "WarmupStandardizer"]


class WarmupStandardizer:
    """``update(step, x)`` returns z once the warm-up is complete, else None.

    >>> s = WarmupStandardizer(start=100, records=3)
    >>> [s.update(step, x) for step, x in [(50, 9.0), (100, 1.0), (125, 1.2), (150, 0.8)]]
    [None, None, None, None]
    >>> round(s.update(175, 0.6), 2)
    -2.0
    """

    def __init__(self, start: int, records: int, rel_floor: float = 0.01,
                 abs_floor: float = 1e-6) -> None:  # fmt: skip
        if records < 2:
            raise ValueError("the warm-up needs at least 2 records")
        self.start, self.records = start, records
        self.rel_floor, self.abs_floor = rel_floor, abs_floor
        self._warmup: list[float] = []
        self.mean: float | None = None
        self.scale: float | None = None

    @property
    def ready(self) -> bool:
        return self.mean is not None

    def update(self, step: int, x: float | None) -> float | None:
        if x is None or not math.isfinite(x) or step < self.start:
            return None
        if self.mean is None:
            self._warmup.append(x)
            if len(self._warmup) == self.records:
                self.mean = statistics.fmean(self._warmup)
                spread = statistics.stdev(self._warmup)
                self.scale = max(spread, self.rel_floor * abs(self.mean), self.abs_floor)
            return None
        return (x - self.mean) / self.scale


class TrendStandardizer:
    """Residuals from the series' own slow trend, in units of their warm-up spread.

    Healthy training moves every series slowly (entropies settle, the loss falls); a fault
    moves its mechanism's series faster than that. The trend is an EMA m with weight β per
    record; the residual r_t = x_t − m_{t−1} is scaled by σ, the standard deviation of the
    residuals during the warm-up (floored like :class:`WarmupStandardizer`). A steady slope a
    per record leaves r ≈ −a(1 − β)/β: a collapse faster than the healthy drift accumulates in
    a CUSUM, a slow drift does not.

    >>> s = TrendStandardizer(start=0, records=4, beta=0.5)
    >>> [s.update(step, x) for step, x in enumerate([1.0, 1.1, 0.9, 1.0])]
    [None, None, None, None]
    >>> round(s.update(4, 1.1), 1), round(s.update(5, 0.2), 1)
    (0.9, -6.6)
    """

    def __init__(self, start: int, records: int, beta: float = 0.2, rel_floor: float = 0.01,
                 abs_floor: float = 1e-6) -> None:  # fmt: skip
        if records < 3:
            raise ValueError("the warm-up needs at least 3 records")
        self.start, self.records, self.beta = start, records, beta
        self.rel_floor, self.abs_floor = rel_floor, abs_floor
        self.trend: float | None = None
        self._residuals: list[float] = []
        self.mean: float | None = None  # warm-up level, for the evidence
        self.scale: float | None = None

    @property
    def ready(self) -> bool:
        return self.scale is not None

    def update(self, step: int, x: float | None) -> float | None:
        if x is None or not math.isfinite(x) or step < self.start:
            return None
        if self.trend is None:
            self.trend, self.mean = x, x
            return None
        residual = x - self.trend
        self.trend += self.beta * residual
        if self.scale is None:
            self._residuals.append(residual)
            if len(self._residuals) == self.records - 1:
                spread = statistics.stdev(self._residuals)
                self.scale = max(spread, self.rel_floor * abs(self.trend), self.abs_floor)
            return None
        return residual / self.scale
