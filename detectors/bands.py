"""Healthy reference bands: where a series should be at this step, learned from healthy runs.

A run-relative detector (a CUSUM on the residual from the run's own trend, or a level against
its own warm-up) cannot tell a slow fault from healthy drift: healthy training moves every
series (logits grow, entropies settle) at rates that differ by step. Measured on the lab's runs
(``benchmarks.detection_table``, "envelope"), fa-lowprec's attention series leave the range of
the healthy runs ~510 steps before the loss diverges while the trend CUSUMs warned 181 steps
ahead: the information is there, but only *against what healthy runs do at the same step*.

So a ``band`` rule compares each value with the healthy runs of its profile (same
architecture and dispatch, same schedule) at the same step. For a series key and step s, with
lo_s, hi_s the min and max of the calibration runs at s and w_s = hi_s − lo_s,

    z_s = (x − hi_s) / w_s  above the band,   (x − lo_s) / w_s  below it,   0 inside,

in band widths (dimensionless); a ``SustainedLevel`` fires when z has stayed beyond h in the
rule's direction for ``confirm`` records. A step between calibrated steps uses the last
calibrated step before it; past the calibrated horizon, the last band.

h is calibrated leave-one-out: each calibration run is replayed against the band of the
others (its own values are inside its own band by construction), and

    h_m = max(1, (1 + margin) · max_i peak_m,i)   band widths,

the floor of one width being the lab's band rule (``lab.bands``: the healthy range widened by
its width on each side). Bands are stored per series key (module names included): they belong
to one profile's calibration and travel in its config. A run of the same model whose modules
are named otherwise (a wrapper's prefix: ``base_model.model.…``) finds its band by position
(``band_key``: the same metric, layer index and role), so a profile does not hang on how a
library or a wrapper names things; across sizes it is never used (a profile applies to its
own signature only, :mod:`foreshock.detectors.profiles`).

The weight norm's band raises no warning; it decides a cause (``attribution``: the weights left
what healthy runs do before any mechanism moved → ``optimizer``). Its threshold is the same
leave-one-out excursion with the same margin but *without* the floor,

    h_inflation = max(0.01, (1 + margin) · max_i peak_weight_norm,i)   band widths,

because the floor guards against false warnings, and this test makes none: between two real
warnings it asks whether the weights are already where no healthy calibration run went.
"""

from __future__ import annotations

import bisect
import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import replace
from functools import cache
from typing import Any, Protocol

from river import base

from foreshock.transport.records import SeriesKey, parse_series_key

from .config import DetectorConfig
from .level import SustainedLevel
from .schedule_clock import ScheduleClock

INFLATION_METRIC = "weight_norm"  # the optimizer's signature: every weight grows


__all__ = [
    "BAND_FLOOR",
    "INFLATION_FLOOR",
    "INFLATION_METRIC",
    "BandStandardizer",
    "band_key",
    "band_thresholds",
    "healthy_bands",
]

BAND_FLOOR = 1.0
INFLATION_FLOOR = 0.01  # band widths: a threshold must be > 0 (a healthy peak can be 0)
MIN_RUNS = 2  # a step needs values from this many healthy runs to have a band


Bands = dict[str, dict[str, list]]


class Recorded(Protocol):
    records: list[dict[str, Any]]


def healthy_bands(runs: Sequence[Recorded], metrics: set[str] | None = None) -> Bands:
    """{series key: {"steps", "lo", "hi"}}: per step, the min and max of the runs' non-null
    values, over the module-level keys of ``metrics`` (None: every module-level key)."""
    values: dict[str, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    for run in runs:
        for record in run.records:
            for key, x in record.get("values", {}).items():
                if x is not None and _module_level(key, metrics):
                    values[key][int(record["step"])].append(x)
    bands: Bands = {}
    for key, by_step in sorted(values.items()):
        steps = sorted(s for s, xs in by_step.items() if len(xs) >= MIN_RUNS)
        bands[key] = {
            "steps": steps,
            "lo": [min(by_step[s]) for s in steps],
            "hi": [max(by_step[s]) for s in steps],
        }
    return bands


@cache
def _parsed(key: str) -> SeriesKey | None:
    try:
        return parse_series_key(key)
    except ValueError:
        return None


def _module_level(key: str, metrics: set[str] | None) -> bool:
    """A whole-module or global series (not per-head, not malformed) of ``metrics``."""
    parsed = _parsed(key)
    if parsed is None or parsed.head is not None:
        return False
    return metrics is None or parsed.metric in metrics


class BandStandardizer(base.Base):
    """``update(step, x)`` → z in band widths beyond the healthy band (0 inside), else None.

    >>> s = BandStandardizer({"steps": [100, 200], "lo": [1.0, 2.0], "hi": [2.0, 4.0]}, 100)
    >>> s.update(50, 9.0), s.update(100, 1.5), s.update(100, 3.0), s.update(250, 1.0)
    (None, 0.0, 1.0, -0.5)
    """

    def __init__(self, band: dict[str, list], start: int) -> None:
        self.band, self.start = band, start
        self.mean: float | None = None  # the band centre at the last step, for the evidence
        self.scale: float | None = None  # its width

    def update(self, step: int, x: float | None) -> float | None:
        steps = self.band["steps"]
        i = bisect.bisect_right(steps, step) - 1
        if x is None or step < self.start or i < 0 or not math.isfinite(float(x)):
            return None
        lo, hi = self.band["lo"][i], self.band["hi"][i]
        width = max(hi - lo, 1e-12 * max(abs(hi), 1.0))
        self.mean, self.scale = (lo + hi) / 2, width
        x = float(x)
        if x > hi:
            return (x - hi) / width
        return (x - lo) / width if x < lo else 0.0


def band_thresholds(
    runs: Sequence[Recorded],
    config: DetectorConfig,
    margin: float,
    replay: Any,
    floor: float = BAND_FLOOR,
) -> DetectorConfig:
    """``config`` with the bands of all ``runs`` and leave-one-out thresholds for its band
    rules (see the module docstring); ``replay(run, config) -> report with .peaks``.
    ``floor`` is the least threshold in band widths (``benchmarks.band_frontier`` measures
    what lowering it costs)."""
    metrics = {r.metric for r in config.rules if r.kind == "band"} | {INFLATION_METRIC}
    thresholds = dict(config.thresholds)
    peaks: dict[str, list[float]] = {m: [] for m in metrics}
    for i, run in enumerate(runs):
        others = [r for j, r in enumerate(runs) if j != i]
        bands = healthy_bands(others, metrics)
        bare = replace(
            config, bands=bands, thresholds={**thresholds, **{m: math.inf for m in metrics}}
        )
        report = replay(run, bare)
        for m in metrics - {INFLATION_METRIC}:
            peaks[m].append(report.peaks.get(m, 0.0))
        peaks[INFLATION_METRIC].append(_sustained_peak(run, bands, config))
    thresholds |= {
        m: round(max(floor, (1 + margin) * max(peaks[m], default=0.0)), 4)
        for m in metrics - {INFLATION_METRIC}
    }
    inflation_h = round(max(INFLATION_FLOOR, (1 + margin) * max(peaks[INFLATION_METRIC])), 4)
    calibration = {
        **config.calibration,
        "bands": {
            "method": "leave-one-out max excursion",
            "margin": margin,
            "floor": floor,
            "runs": len(runs),
            "peaks": {m: round(max(p, default=0.0), 4) for m, p in peaks.items()},
        },
    }
    return replace(
        config,
        bands=healthy_bands(runs, metrics),
        thresholds=thresholds,
        calibration=calibration,
        inflation_h=inflation_h,
    )


def _sustained_peak(
    run: Recorded, bands: dict[str, dict[str, list]], config: DetectorConfig
) -> float:
    """The largest excursion of the weight norm above its band held for ``confirm`` records."""
    if INFLATION_METRIC not in bands:
        return 0.0
    band = BandStandardizer(bands[INFLATION_METRIC], config.warmup_start)
    return sustained_peak(run, band, config.confirm)


def sustained_peak(run: Recorded, reference: Any, confirm: int) -> float:
    """The largest excursion of the total weight norm above ``reference`` (a standardizer:
    ``update(step, value)`` → x or None) held for ``confirm`` records: what the optimizer
    test reads (:mod:`~foreshock.detectors.inflation`), against a healthy band or the run's
    own trend — on the engine's clock: steps since the schedule's peak, nothing before it
    (:mod:`~foreshock.detectors.schedule_clock`)."""
    level, clock = SustainedLevel("up", math.inf, confirm), ScheduleClock()
    for record in run.records:
        values = record.get("values", {})
        since_peak = clock.update(int(record["step"]), values.get("lr"))
        if since_peak is None:
            continue
        x = reference.update(since_peak, values.get(INFLATION_METRIC))
        if x is not None:
            level.update(x)
    return level.peak


def band_key(key: str, bands: dict[str, Any]) -> str | None:
    """The band a series key reads: its own, else the one band of the same metric at the same
    position (layer index and role, ``position``); None when there is none or it is ambiguous.

    >>> bands = {"max_logit@h.0.attn": {}, "max_logit@h.1.attn": {}}
    >>> band_key("max_logit@base_model.model.h.1.attn", bands)
    'max_logit@h.1.attn'
    >>> band_key("max_logit@h.2.attn", bands) is None
    True
    """
    if key in bands:
        return key
    where = position(key)
    if where is None:
        return None
    matches = [k for k in bands if position(k) == where]
    return matches[0] if len(matches) == 1 else None


@cache
def position(key: str) -> tuple[str, int, str] | None:
    """(metric, layer index, role) of a module-level series key: the module path's first
    integer is its layer; the role is the family its metric reads (attention or router).

    >>> position("router.load_entropy@model.layers.3.mlp.gate")
    ('router.load_entropy', 3, 'router')
    """
    parsed = _parsed(key)
    if parsed is None or parsed.module is None or parsed.head is not None:
        return None
    layer = next((int(p) for p in parsed.module.split(".") if p.isdigit()), None)
    if layer is None:
        return None
    role = "router" if parsed.metric.startswith("router.") else "attention"
    return parsed.metric, layer, role
