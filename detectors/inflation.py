"""The optimizer test: did every weight grow beyond what is healthy before a mechanism moved?

Why apart from the engine: it is one test with its own reference, read two ways, and the
engine only asks it two questions. An optimizer fault (a learning-rate ramp, a batch too
small) moves the router and the attention entropies too, hundreds of steps after it has grown
every weight; so a first mechanism warning whose run's weights are already inflated names the
``optimizer`` as its cause (:mod:`~foreshock.detectors.attribution`), and where the profile's
rules hold the test (``OPTIMIZER_TEST``) it also warns on its own, as family ``optimizer``.

The total weight norm W (``weight_norm``) is read against its healthy band where the profile
has one (z in band widths, :class:`~foreshock.detectors.bands.BandStandardizer`), else against
the run's own recent trend (a zero-shot profile reads no other model's weights:
:class:`~foreshock.detectors.standardize.TrailingLogTrendStandardizer`,

    z = ln W − (a + b·step)   nats,

a and b the least-squares line through (step, ln W) of ``TREND_RECORDS`` records that end
``TREND_GAP`` records before this one; the warm-up's first ``TREND_RECORDS`` until there
are that many). The weights are
*inflated* once z has stayed above ``inflation_h`` for ``confirm`` records (a
``SustainedLevel``: min of the last ``confirm`` z above h). The warning reads the same z
against a threshold of its own, ``thresholds[OPTIMIZER_TEST]`` (at least ``inflation_h``:
naming a cause may come early, paging needs more; ∞ when uncalibrated).

The first z comes once ``TREND_RECORDS`` records (12) at steps ≥ ``warmup_start`` are in:

>>> from foreshock.detectors.config import DetectorConfig
>>> test = WeightInflation(DetectorConfig(warmup_start=0, warmup_records=2), h=0.05)
>>> peaks: dict[str, float] = {}
>>> fits = [test.track(step, math.exp(0.001 * step), peaks) for step in range(0, 120, 10)]
>>> fits == [[]] * 12, test.inflated
(True, False)
>>> _ = [test.track(step, math.exp(0.1 * step), peaks) for step in (120, 130)]
>>> test.inflated, test.optimizer is None, peaks
(True, True, {})
"""

from __future__ import annotations

import math
from typing import Any

from .bands import INFLATION_METRIC, BandStandardizer
from .config import OPTIMIZER_TEST, DetectorConfig
from .level import SustainedLevel
from .series import Fired, Series
from .standardize import LogTrendStandardizer, TrailingLogTrendStandardizer

__all__ = ["TREND_GAP", "TREND_RECORDS", "WeightInflation", "weight_trend"]

# Records the weight-norm trend is fitted on (a run's own, zero-shot): 12, 300 steps of the
# lab's records. Over the 6 records of the other series' window the line caught the slow
# start of a run at twice the lab's rate, and its weights then led the line by 0.375 nats at
# step 1,500 though it never diverged (a 0.25-nat warning on a healthy run). Chosen on the
# recipe calibration runs and the lab's constant-rate runs (``benchmarks.zero_shot``): at 12
# every healthy recipe run stayed under 0.19 nats, and learning-rate ramps were warned as
# often as at 6 (Mixtral 17/17, GPT-MoE 40/40); at 20 the window swallowed a ramp's start and
# missed 4 of them.
TREND_RECORDS = 12
# Records between the trend's window and the record read against it: 8 (200 steps of the
# lab's records); None reads against the warm-up's line (before the third freeze). Chosen
# on the recipe calibration runs (``benchmarks.recipes``' table of what was tried): the
# warm-up's line missed a Mixtral's learning-rate ramp from step 1,000 under WSD (the line
# lay 0.3 nats above the norm by then); the recent line warned it with every healthy recipe
# run under 0.075 nats.
TREND_GAP: int | None = 8


def weight_trend(start: int) -> LogTrendStandardizer | TrailingLogTrendStandardizer:
    """The weight norm's own trend the zero-shot optimizer test reads against (above)."""
    if TREND_GAP is None:
        return LogTrendStandardizer(start, TREND_RECORDS)
    return TrailingLogTrendStandardizer(start, TREND_RECORDS, TREND_GAP)


class WeightInflation:
    """The test for one run under ``config``, armed at ``h`` (the config's ``inflation_h``).

    ``optimizer`` is the test's own warning series (family ``optimizer``, module None) when
    the profile's rules hold it, else None; it shares ``reference`` with the test, and the
    engine keeps it among the run's series (its statistics then count where every series'
    do: which warnings are open, how close its family is to firing)."""

    def __init__(self, config: DetectorConfig, h: float) -> None:
        c = config
        self.reference: BandStandardizer | LogTrendStandardizer | TrailingLogTrendStandardizer = (
            BandStandardizer(c.bands[INFLATION_METRIC], c.warmup_start)
            if INFLATION_METRIC in c.bands
            else weight_trend(c.warmup_start)
        )
        self.level = SustainedLevel("up", h, c.confirm)
        self.optimizer: Series | None = None
        rule = c.rule_for(OPTIMIZER_TEST)
        if rule is not None:  # its warning: h of its own
            warns = SustainedLevel("up", c.thresholds.get(OPTIMIZER_TEST, math.inf), c.confirm)
            self.optimizer = Series(
                OPTIMIZER_TEST,
                OPTIMIZER_TEST,
                "optimizer",
                None,
                rule.kind,
                self.reference,
                {"up": warns},
            )

    @property
    def inflated(self) -> bool:
        """Have the weights stayed above ``h`` for ``confirm`` records, as of now?"""
        return self.level.sustained > self.level.h

    def track(
        self, step: int, value: Any, peaks: dict[str, float], since_peak: int | None = None
    ) -> list[Fired]:
        """Read one record's weight norm (``value``; None or missing: no news). The optimizer
        series' peak goes into ``peaks`` (for calibration); it is returned when it fired.
        ``since_peak``: the steps since the schedule's peak, the warm-up's clock (default
        ``step``: :mod:`~foreshock.detectors.schedule_clock`)."""
        z = self.reference.update(step if since_peak is None else since_peak, value)
        if z is None:
            return []
        self.level.update(z)
        series = self.optimizer
        if series is None:
            return []
        warns = series.cusums["up"]
        warns.update(z)
        series.recent.append((step, value, round(z, 3)))
        peaks[OPTIMIZER_TEST] = max(peaks.get(OPTIMIZER_TEST, 0.0), warns.peak)
        return [(series, "up", warns)] if warns.drift_detected else []
