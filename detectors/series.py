"""One ruled series of a run: its standardizer and its detectors, built from the profile.

Why apart from the engine: which series a profile reads, and why it leaves one unread, is a
question of the config (its rules, their kinds, its healthy bands), asked once per series key;
the engine's question is what a run's records do to what was built. A series key
``metric@module`` (``attn.d2.entropy_mean@h.0.attn``) is ruled when the profile has a rule for
its metric (:meth:`~foreshock.detectors.config.DetectorConfig.rule_for`) and, for a ``band``
rule, a healthy band for its module (:func:`~foreshock.detectors.bands.band_key`). Each
value x then becomes a residual z (warm-up σ, nats of ratio or band widths, by the rule's
kind: :mod:`~foreshock.detectors.kinds`) fed to one detector per direction, whose threshold
h is the metric's calibrated one (∞, never firing, when the profile has none).

Per-head series (``…@module#head``) are evidence only; so are the module-level metrics no rule
reads, and a catalogue metric the profile leaves unread is named in ``unruled``, with why.

>>> from foreshock.detectors.config import DetectorConfig
>>> unruled: dict[str, str] = {}
>>> series = build_series("router.epsilon@h.0.mlp.gate", DetectorConfig(), unruled)
>>> series.family, series.module, series.kind, sorted(series.cusums)
('router', 'h.0.mlp.gate', 'cusum', ['down', 'up'])
>>> build_series("not a key", DetectorConfig(), unruled) is None
True
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from foreshock.catalogue import SERIES
from foreshock.transport.records import parse_series_key

from .bands import BandStandardizer, band_key
from .config import DetectorConfig
from .kinds import BUILDERS, Detector
from .standardize import (
    LogTrendStandardizer,
    TrailingLogTrendStandardizer,
    TrendStandardizer,
    WarmupStandardizer,
)

__all__ = ["RULED_METRICS", "Fired", "Series", "Standardizer", "build_series"]

# The catalogue's series: the metrics a rule may read (the rest are evidence only).
RULED_METRICS = frozenset(s.metric for s in SERIES)

# LogRatioStandardizer is a Warmup one; LogTrend is the optimizer test's (inflation)
Standardizer = (
    WarmupStandardizer
    | TrendStandardizer
    | LogTrendStandardizer
    | TrailingLogTrendStandardizer
    | BandStandardizer
)


@dataclass
class Series:
    """A ruled series: ``cusums`` maps a direction to its detector (a ``SustainedLevel`` is a
    ``OneSidedCUSUM``); ``recent`` the last (step, value, z), a warning's evidence; ``kind``
    the kind of the rule that built it (also evidence)."""

    key: str
    metric: str
    family: str
    module: str | None
    kind: str
    standardizer: Standardizer
    cusums: dict[str, Detector]
    recent: deque[tuple[int, Any, float]] = field(default_factory=lambda: deque(maxlen=6))


# A detector that fired on a record: (its series, its direction, the detector).
Fired = tuple[Series, str, Detector]


def build_series(key: str, config: DetectorConfig, unruled: dict[str, str]) -> Series | None:
    """The series ``key`` as ``config`` rules it, or None when no rule reads it (a catalogue
    metric left unread is added to ``unruled``, metric → why, first reason kept)."""
    try:
        metric, module, head = parse_series_key(key)
    except ValueError:
        return None
    if head is not None:
        return None  # per-head series are evidence, not rules' input
    rule = config.rule_for(metric)
    if rule is None:
        if metric in RULED_METRICS:  # a catalogue series this profile leaves unread
            unruled.setdefault(metric, "no rule in this profile")
        return None
    kind = BUILDERS[rule.kind]
    band = band_key(key, config.bands) if kind.needs_band else None
    if kind.needs_band and band is None:
        unruled.setdefault(metric, "no healthy band for this module")
        return None  # no healthy reference for this series: nothing to compare with
    h = config.thresholds.get(rule.metric, math.inf)
    return Series(
        key,
        metric,
        rule.family,
        module,
        rule.kind,
        kind.standardizer(config, None if band is None else config.bands[band]),
        {d: kind.detector(config, rule, d, h) for d in rule.directions()},
    )
