"""Thresholds from healthy runs, to a stated false-alarm budget (conformal style).

For each configured metric m, replay n healthy runs with no threshold and record each run's
largest CUSUM statistic M_m,i over all modules and its whole horizon. If a new healthy run is
exchangeable with them, the probability that its maximum exceeds the k-th largest of the n is
at most k/(n+1) (the split-conformal bound). So

    h_m = M_m,(k) · (1 + margin),   P(false warning of metric m in a healthy run) ≤ k/(n+1),

and a family of |F| metrics warns falsely with probability ≤ |F|·k/(n+1) (union bound) — the
rate every warning carries. k = 1 (the largest healthy maximum) by default. The bound needs
n ≥ 100·|F| − 1 healthy runs to promise 1 false warning per 100 runs; with fewer it is what it
is and is reported as such.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from .config import FAMILIES, OPTIMIZER_TEST, DetectorConfig, SeriesRule

__all__ = ["MARGINS", "calibrate", "calibrate_profile", "leave_one_out_margin"]

MARGINS = (0.5, 1.0, 1.5, 2.0, 3.0, 5.0)
LEVEL_FLOOR = 0.01


class Replayed(Protocol):
    """What calibration reads of a healthy run replayed without thresholds: its id and its
    peaks (a :class:`~foreshock.detectors.replay.RunReport` is one; so is any pair of them)."""

    @property
    def run_id(self) -> str: ...

    @property
    def peaks(self) -> Mapping[str, float]: ...


def calibrate(
    healthy: Sequence[Replayed],
    config: DetectorConfig,
    k: int = 1,
    margin: float | dict[str, float] = 0.1,
) -> DetectorConfig:
    """A config whose thresholds put each family's healthy maxima under h (see above).

    ``healthy`` must be replayed with ``config`` *without* thresholds (peaks only).
    """
    n = len(healthy)
    if n < k:
        raise ValueError(f"need at least {k} healthy runs to calibrate, got {n}")
    thresholds, rates = {}, {}
    margins = margin if isinstance(margin, dict) else {r.metric: margin for r in config.rules}
    for rule in config.rules:
        if rule.metric == OPTIMIZER_TEST:
            continue  # armed by inflation_h, which the optimizer test's own calibration sets
        peaks = [r.peaks.get(rule.metric, 0.0) for r in healthy]
        thresholds[rule.metric] = _threshold(peaks, k, margins[rule.metric], _floor(rule, config))
    for family in FAMILIES:
        size = sum(rule.family == family for rule in config.rules)
        if size:  # a family with no rule never warns: it states no rate
            rates[family] = round(min(1.0, size * k / (n + 1)), 4)
    calibration = {
        "method": "conformal max-statistic",
        "healthy_runs": n,
        "k": k,
        "margin": margin,
        "runs": sorted(r.run_id for r in healthy),
    }
    return config.with_thresholds(thresholds, rates, calibration)


def leave_one_out_margin(
    healthy: Sequence[Replayed],
    config: DetectorConfig,
    k: int = 1,
    margins: Sequence[float] = MARGINS,
) -> dict[str, float]:
    """Per metric, the smallest margin under which no calibration run, left out in turn,
    exceeds the threshold set by the others.

    Healthy maxima are heavy-tailed here, and more so for some metrics than others: the
    largest of n runs is a poor guard for run n+1. Leave-one-out measures that on the
    calibration runs alone — no faulty or held-out run is looked at — and gives each metric the
    margin its own tail asks for. The least margin is 50 %, chosen by cross-validation on
    healthy runs alone (``python -m benchmarks.false_alarms``, figures in
    benchmarks/README.md): on the 55 healthy runs of that day a least margin of 10 % let 2.3 %
    of unseen healthy runs raise a false router warning, 50 % at most 0.9 % per family.
    """
    chosen = {}
    for rule in config.rules:
        peaks = [r.peaks.get(rule.metric, 0.0) for r in healthy]
        for margin in margins:
            exceed = sum(
                peak > _threshold([*peaks[:i], *peaks[i + 1 :]], k, margin, _floor(rule, config))
                for i, peak in enumerate(peaks)
            )
            if exceed == 0:
                break
        chosen[rule.metric] = margin
    return chosen


def calibrate_profile(
    healthy: Sequence[Any],
    base: DetectorConfig,
    replay: Any,
    band_margin: float = 0.5,
    band_floor: float | None = None,
) -> DetectorConfig:
    """Thresholds for one profile from its healthy runs (objects with ``records``): the
    conformal max-statistic with leave-one-out margins for run-relative rules, healthy bands
    with leave-one-out thresholds for band rules (:mod:`foreshock.detectors.bands`).
    ``replay(run, config)`` gives a report with ``peaks``; ``band_floor`` None: the shipped
    ``bands.BAND_FLOOR``."""
    from .bands import BAND_FLOOR, band_thresholds

    reports = [replay(run, uncalibrated(base)) for run in healthy]
    config = calibrate(reports, base, margin=leave_one_out_margin(reports, base))
    if any(rule.kind == "band" for rule in base.rules):
        floor = BAND_FLOOR if band_floor is None else band_floor
        config = band_thresholds(healthy, config, band_margin, replay, floor)
    return config


def _floor(rule: SeriesRule, config: DetectorConfig) -> float:
    """The least threshold: a CUSUM's allowance k (σ); for a level, 1 % (0.01 nats of ratio)."""
    return config.k if rule.kind == "cusum" else LEVEL_FLOOR


def _threshold(peaks: Sequence[float], k: int, margin: float, floor: float) -> float:
    return round(max(sorted(peaks, reverse=True)[k - 1] * (1 + margin), floor), 4)


def uncalibrated(config: DetectorConfig) -> DetectorConfig:
    """The config with no thresholds: replays record peaks and never fire."""
    return config.with_thresholds({r.metric: math.inf for r in config.rules}, {}, {})
