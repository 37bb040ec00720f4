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
from collections.abc import Sequence

from .config import FAMILIES, DetectorConfig
from .replay import RunReport

__all__ = ["calibrate"]


def calibrate(healthy: Sequence[RunReport], config: DetectorConfig, k: int = 1,
              margin: float = 0.1) -> DetectorConfig:  # fmt: skip
    """A config whose thresholds put each family's healthy maxima under h (see above).

    ``healthy`` must be replayed with ``config`` *without* thresholds (peaks only).
    """
    n = len(healthy)
    if n < k:
        raise ValueError(f"need at least {k} healthy runs to calibrate, got {n}")
    thresholds, rates = {}, {}
    for rule in config.rules:
        maxima = sorted((r.peaks.get(rule.metric, 0.0) for r in healthy), reverse=True)
        thresholds[rule.metric] = round(max(maxima[k - 1] * (1 + margin), config.k), 4)
    for family in FAMILIES:
        size = sum(rule.family == family for rule in config.rules)
        rates[family] = round(min(1.0, size * k / (n + 1)), 4)
    calibration = {"method": "conformal max-statistic", "healthy_runs": n, "k": k,
                   "margin": margin, "runs": sorted(r.run_id for r in healthy)}  # fmt: skip
    return config.with_thresholds(thresholds, rates, calibration)


def uncalibrated(config: DetectorConfig) -> DetectorConfig:
    """The config with no thresholds: replays record peaks and never fire."""
    return config.with_thresholds({r.metric: math.inf for r in config.rules}, {}, {})
