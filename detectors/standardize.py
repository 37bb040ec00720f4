"""Standardize a series against its own run's healthy warm-up window.

Runs differ in scale (model width, data, optimizer): an entropy of 0.6 is normal in one run
and a collapse in another. Each series is therefore measured in units of its own warm-up:
the first ``records`` values at steps ≥ ``start`` give a mean μ and a scale σ, and afterwards

    z = (x − μ) / σ,   σ = max(std, rel_floor·|μ|, abs_floor),

so a series that is flat during the warm-up does not turn every later wobble into a huge z.

Any finite input gives a finite z, μ and σ, however large (a value of 1e300 is possible on the
wire): sums that would overflow are rescaled, and |z| is capped at :data:`Z_LIMIT` — far above
any threshold, so a CUSUM still fires, and its sums stay finite.

Each standardizer is a river ``base.Base``, like the detectors it feeds: its constructor
arguments are attributes of the same name, so ``repr()`` names them and ``clone()`` builds a
fresh one with the same parameters and none of the state (``tests/test_detector_contract.py``).
"""

from __future__ import annotations

import math
import statistics
import sys
from collections import deque

from river import base

__all__ = [
    "Z_LIMIT",
    "LogRatioStandardizer",
    "LogTrendStandardizer",
    "TrailingLogTrendStandardizer",
    "TrendStandardizer",
    "WarmupStandardizer",
]

Z_LIMIT = 1e100
_MAX = sys.float_info.max


def _finite(x: float | None) -> float | None:
    """``x`` as a float, None when it is missing or not finite (an int beyond float too)."""
    if x is None:
        return None
    try:
        x = float(x)
    except OverflowError:
        return None
    return x if math.isfinite(x) else None


def _clamp(value: float, limit: float) -> float:
    """``value`` within ±``limit`` (±inf included)."""
    return max(-limit, min(limit, value))


def _mean(xs: list[float]) -> float:
    try:
        return statistics.fmean(xs)
    except OverflowError:  # a sum beyond float: the mean of xs / max|x|, scaled back (≤ max|x|)
        top = max(abs(x) for x in xs)
        return math.fsum(x / top for x in xs) / len(xs) * top


def _spread(xs: list[float]) -> float:
    try:
        return statistics.stdev(xs)
    except OverflowError:  # beyond float: the spread of xs / max|x|, scaled back (capped)
        top = max(abs(x) for x in xs)
        return min(statistics.stdev([x / top for x in xs]) * top, _MAX)


class WarmupStandardizer(base.Base):
    """``update(step, x)`` returns z once the warm-up is complete, else None.

    >>> s = WarmupStandardizer(start=100, records=3)
    >>> [s.update(step, x) for step, x in [(50, 9.0), (100, 1.0), (125, 1.2), (150, 0.8)]]
    [None, None, None, None]
    >>> round(s.update(175, 0.6), 2)
    -2.0
    >>> s.ready, s.clone().ready
    (True, False)
    """

    def __init__(
        self, start: int, records: int, rel_floor: float = 0.01, abs_floor: float = 1e-6
    ) -> None:
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
        x = _finite(x)
        if x is None or step < self.start:
            return None
        if self.mean is None or self.scale is None:  # warming up (both are set at its end)
            self._warmup.append(x)
            if len(self._warmup) == self.records:
                self.mean = _mean(self._warmup)
                spread = _spread(self._warmup)
                self.scale = max(spread, self.rel_floor * abs(self.mean), self.abs_floor)
            return None
        return _clamp((x - self.mean) / self.scale, Z_LIMIT)  # x − μ may overflow to ±inf


class TrendStandardizer(base.Base):
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

    def __init__(
        self,
        start: int,
        records: int,
        beta: float = 0.2,
        rel_floor: float = 0.01,
        abs_floor: float = 1e-6,
    ) -> None:
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
        x = _finite(x)
        if x is None or step < self.start:
            return None
        if self.trend is None:
            self.trend, self.mean = x, x
            return None
        residual = x - self.trend
        if math.isfinite(residual):
            self.trend += self.beta * residual
        else:  # x − m overflowed: the same EMA step, in a form that cannot
            self.trend = (1 - self.beta) * self.trend + self.beta * x
        if self.scale is None:
            self._residuals.append(_clamp(residual, _MAX))
            if len(self._residuals) == self.records - 1:
                spread = _spread(self._residuals)
                self.scale = max(spread, self.rel_floor * abs(self.trend), self.abs_floor)
            return None
        return _clamp(residual / self.scale, Z_LIMIT)


class LogRatioStandardizer(WarmupStandardizer):
    """The series as a log ratio to its own warm-up level: x = ln(value / μ) (nats).

    For a positive series whose *level* is what fails (a router's entropy sliding to a fraction
    of where it started), the ratio to the run's own warm-up mean μ is scale-free: runs of any
    width or vocabulary compare on one threshold. Values ≤ 0 count as the smallest positive
    one, ``abs_floor`` (a total collapse, not a missing value); a warm-up mean ≤ 0 has no ratio
    and the series stays silent. The warm-up is :class:`WarmupStandardizer`'s.

    >>> s = LogRatioStandardizer(start=100, records=2)
    >>> [s.update(step, x) for step, x in [(50, 9.0), (100, 0.9), (125, 1.1)]]
    [None, None, None]
    >>> round(s.update(150, 0.5), 3), round(s.update(175, 2.0), 3)
    (-0.693, 0.693)
    """

    def __init__(self, start: int, records: int, abs_floor: float = 1e-12) -> None:
        super().__init__(start, records, abs_floor=abs_floor)

    def update(self, step: int, x: float | None) -> float | None:
        if super().update(step, x) is None or self.mean is None or self.mean <= 0:
            return None
        return math.log(max(float(x), self.abs_floor)) - math.log(self.mean)  # type: ignore[arg-type]


class LogTrendStandardizer(base.Base):
    """The series' log above its own warm-up trend: x = ln(value) − (a + b·step) (nats).

    a and b are the least-squares line through (step, ln value) over the warm-up's
    ``records`` values at steps ≥ ``start``. Why: the weight norm of a healthy run grows, fast
    early and slower later (AdamW with weight decay), so its warm-up slope extrapolated
    overestimates what follows and x stays ≤ ~0.1; a learning-rate ramp accelerates the growth
    and x climbs (lab: past 0.05 some 500–800 steps before the loss diverges). Scale-free:
    a model of any width, depth or initialisation compares on one threshold, so the optimizer
    test needs no healthy runs of the user's model. Values ≤ 0 have no log and are skipped.

    >>> s = LogTrendStandardizer(start=0, records=3)
    >>> [s.update(t, math.exp(0.01 * t)) for t in (0, 10, 20)]
    [None, None, None]
    >>> round(s.update(30, math.exp(0.3)), 6), round(s.update(40, math.exp(0.9)), 6)
    (0.0, 0.5)
    """

    def __init__(self, start: int, records: int) -> None:
        if records < 2:
            raise ValueError("the warm-up needs at least 2 records")
        self.start, self.records = start, records
        self._warmup: list[tuple[float, float]] = []
        self.mean: float | None = None  # the line's value at the warm-up's last step (nats)
        self.scale: float | None = None  # its slope (nats per step)
        self._intercept = 0.0

    @property
    def ready(self) -> bool:
        return self.mean is not None

    def update(self, step: int, x: float | None) -> float | None:
        y = _log_at(step, x, self.start)
        if y is None:
            return None
        if self.mean is None:
            self._warmup.append((float(step), y))
            if len(self._warmup) == self.records:
                self._fit()
            return None
        return y - (self._intercept + self.scale * step)  # type: ignore[operator]

    def _fit(self) -> None:
        self._intercept, self.scale = _line(self._warmup)
        self.mean = self._intercept + self.scale * self._warmup[-1][0]


class TrailingLogTrendStandardizer(base.Base):
    """The series' log above its *recent* trend: x = ln(value) − (a + b·step) (nats), a and b
    the least-squares line through ``records`` values that end ``gap`` values before this
    one — or, while there are fewer than ``records + gap`` before it, the first ``records``
    (the warm-up's line, as :class:`LogTrendStandardizer`).

    Why not the warm-up's line for good: a weight norm's growth slows as the run goes on, and
    faster under a decaying learning rate, so the warm-up's slope extrapolated to step 1,000
    lies far above the healthy norm — a learning-rate ramp that starts there must first climb
    out of that deficit, and one in the lab's recipe runs (a Mixtral under WSD, ramp from
    step 1,000) diverged before it had. The recent line follows the slowing growth, so a
    ramp's acceleration shows wherever it starts; the ``gap`` keeps the ramp's own first
    records out of the line it is compared with (a window that ends at the present swallows a
    slow ramp's start). No value before ``records`` values at steps ≥ ``start``; values ≤ 0
    have no log and are skipped.

    >>> s = TrailingLogTrendStandardizer(start=0, records=3, gap=1)
    >>> [s.update(t, math.exp(0.01 * t)) for t in (0, 10, 20)]
    [None, None, None]
    >>> round(s.update(30, math.exp(0.3)), 6), round(s.update(40, math.exp(0.6)), 6)
    (0.0, 0.2)
    >>> round(s.update(50, math.exp(0.7)), 6)  # the line through steps 10-30 now
    0.2
    """

    def __init__(self, start: int, records: int, gap: int) -> None:
        if records < 2 or gap < 0:
            raise ValueError("the trend needs at least 2 records and a gap of 0 or more")
        self.start, self.records, self.gap = start, records, gap
        self._recent: deque[tuple[float, float]] = deque(maxlen=records + gap)
        self.mean: float | None = None  # the line's value at its window's last step (nats)
        self.scale: float | None = None  # its slope (nats per step)

    @property
    def ready(self) -> bool:
        return self.mean is not None

    def update(self, step: int, x: float | None) -> float | None:
        y, z = _log_at(step, x, self.start), None
        if y is None:
            return None
        if len(self._recent) >= self.records:
            window = list(self._recent)[: self.records]
            intercept, self.scale = _line(window)
            self.mean = intercept + self.scale * window[-1][0]
            z = y - (intercept + self.scale * step)
        self._recent.append((float(step), y))
        return z


def _log_at(step: int, x: float | None, start: int) -> float | None:
    """ln x for a finite x > 0 at a step ≥ ``start``, else None (no news)."""
    x = _finite(x)
    return None if x is None or x <= 0 or step < start else math.log(x)


def _line(points: list[tuple[float, float]]) -> tuple[float, float]:
    """The least-squares line through ``points`` (step, y): (intercept, slope)."""
    steps = [s for s, _ in points]
    s_mean, y_mean = _mean(steps), _mean([y for _, y in points])
    spread = sum((s - s_mean) ** 2 for s in steps)
    slope = 0.0 if spread == 0 else sum((s - s_mean) * (y - y_mean) for s, y in points) / spread
    return y_mean - slope * s_mean, slope
