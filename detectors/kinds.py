"""What each rule kind builds: the standardizer that turns a series into its residual, and the
detector that reads the residual against h.

Why one table: the engine used to branch on ``rule.kind`` in three places, so a new kind of
rule meant editing the engine. Now a kind is one :class:`Kind` here (and its name in
:data:`~foreshock.detectors.config.KINDS`, which rules are checked against):

- ``cusum`` — a change in rate: the residual from the run's own trend (or warm-up mean), in
  warm-up standard deviations, summed by a one-sided CUSUM (:mod:`.cusum`);
- ``level`` — a slide too far: the log ratio to the run's own warm-up level, held beyond h for
  ``confirm`` records (:mod:`.level`);
- ``band`` — leaving what healthy runs of the profile do at the same step, in band widths,
  held beyond h (:mod:`.bands`); it needs the series' healthy band.

>>> from foreshock.detectors.config import KINDS, DetectorConfig, SeriesRule
>>> sorted(BUILDERS) == sorted(KINDS)
True
>>> rule = SeriesRule("router.epsilon", "router", "down", kind="level")
>>> type(BUILDERS["level"].detector(DetectorConfig(), rule, "down", 1.0)).__name__
'SustainedLevel'
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from .bands import BandStandardizer
from .config import KINDS, DetectorConfig, SeriesRule
from .cusum import OneSidedCUSUM
from .level import SustainedLevel
from .standardize import LogRatioStandardizer, TrendStandardizer, WarmupStandardizer

__all__ = ["BUILDERS", "Detector", "Kind"]


@runtime_checkable
class Detector(Protocol):
    """What a kind's detector is to the engine — river's drift-detector contract
    (``tests/test_detector_contract.py``): ``update(x)`` with one residual, then
    ``drift_detected`` (it crossed h at this update) and ``in_alarm`` (above h now);
    ``statistic``, ``sustained`` (its least over the last ``confirm`` records) and ``peak`` (the
    largest sustained) in the residual's units, ``h`` the threshold."""

    statistic: float
    sustained: float
    peak: float
    h: float

    def update(self, x: float) -> Any: ...

    @property
    def drift_detected(self) -> bool: ...

    @property
    def in_alarm(self) -> bool: ...


@dataclass(frozen=True)
class Kind:
    """``standardizer(config, band)`` (``band``: the series' healthy band, None unless
    ``needs_band``) and ``detector(config, rule, direction, h)``."""

    standardizer: Callable[[DetectorConfig, Any], Any]
    detector: Callable[[DetectorConfig, SeriesRule, str, float], Detector]
    needs_band: bool = False


def _rate(c: DetectorConfig, band: Any) -> Any:
    if c.baseline == "trend":
        return TrendStandardizer(c.warmup_start, c.warmup_records, c.trend_beta)
    return WarmupStandardizer(c.warmup_start, c.warmup_records)


def _cusum(c: DetectorConfig, rule: SeriesRule, direction: str, h: float) -> Detector:
    return OneSidedCUSUM(direction, c.k, h, c.confirm_of(rule))


def _sustained(c: DetectorConfig, rule: SeriesRule, direction: str, h: float) -> Detector:
    return SustainedLevel(direction, h, c.confirm_of(rule))


BUILDERS: dict[str, Kind] = {
    "cusum": Kind(_rate, _cusum),
    "level": Kind(
        lambda c, band: LogRatioStandardizer(c.warmup_start, c.warmup_records), _sustained
    ),
    "band": Kind(lambda c, band: BandStandardizer(band, c.warmup_start), _sustained, True),
}
if set(BUILDERS) != set(KINDS):
    raise RuntimeError(f"rule kinds {KINDS} and their builders {sorted(BUILDERS)} differ")
