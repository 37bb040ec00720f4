"""What each rule takes to fire on this run, in the run's own units.

Why: a zero-shot threshold is pooled across architectures and stated in nats or warm-up σ;
whether it can fire on *your* run depends on your run's warm-up. The largest attention logit's
level rule, for instance, fires at e^h ≈ 190× its warm-up level: a Qwen2-MoE whose logits
grew from 15 to 90 (6×) by step 400 was never warned, and nothing said the rule could not
have. So once a run's warm-up is measured, each rule's firing point is put in the series'
units, median over the modules that series is read on:

* a ``level`` rule (x = ln(value / μ), μ the warm-up level) fires when the value passes
  μ·e^{±h} — reported with its factor e^h;
* a ``cusum`` rule fires when the residuals from the series' trend, less k·σ each, add up to
  h·σ (σ the warm-up's residual spread) — reported as that total drift, h·σ, and h·σ/μ;
* a rule read against a calibrated profile's healthy band fires when its excursions outside
  that band add up to h band widths.

Whether a point that far is reached depends on the model, so it is shown, not judged: over
the 535 stored lab runs, the largest logit went up to ×457 its warm-up level before a
divergence (a GPT-MoE with learned positions under a low-precision attention fault), past
the zero-shot ×190, while on a Qwen2-MoE it grew ×6 — there the rule cannot help, and the
user now sees it.
"""

from __future__ import annotations

import math
import statistics
from typing import Any

from .config import OPTIMIZER_TEST

__all__ = ["rule_reach"]


def rule_reach(series: dict[str, Any], thresholds: dict[str, float], k: float) -> dict[str, str]:
    """Metric -> what its rule takes to fire on this run (series whose warm-up is measured;
    ``series``: the detector's, key -> :class:`~foreshock.detectors.series.Series`)."""
    by_metric: dict[str, list[Any]] = {}
    for s in series.values():
        mean = getattr(s.standardizer, "mean", None)
        if mean is not None and getattr(s.standardizer, "ready", True) and s.metric in thresholds:
            by_metric.setdefault(s.metric, []).append(s)
    out = {}
    for metric, found in sorted(by_metric.items()):
        h = thresholds[metric]
        if not math.isfinite(h):
            out[metric] = "no threshold (uncalibrated): cannot fire"
            continue
        level = statistics.median(float(s.standardizer.mean) for s in found)
        direction = next(iter(found[0].cusums))
        if type(found[0].standardizer).__name__ == "BandStandardizer":  # a calibrated band
            out[metric] = (
                f"fires when its excursions outside its healthy band at the same step add up to "
                f"{h:.3g} band widths"
            )
            continue
        if metric == OPTIMIZER_TEST:  # its standardizer's level is ln W on its trend
            lead = math.exp(h) - 1
            out[metric] = f"fires when the weight norm leads its warm-up trend by {lead:.0%}"
            continue
        out[metric] = (
            _level(level, h, direction, len(found))
            if found[0].kind == "level"
            else _cusum(found, level, h, k)
        )
    return out


def _level(level: float, h: float, direction: str, n: int) -> str:
    factor = math.exp(h)
    at = level * factor if direction == "up" else level / factor
    sign = "≥" if direction == "up" else "≤"
    text = f"fires at {sign} {at:.4g} (×{factor:.3g} {direction} from its warm-up {level:.4g}"
    text += f", median of {n})" if n > 1 else ")"
    return text


def _cusum(found: list[Any], level: float, h: float, k: float) -> str:
    sigma = statistics.median(float(s.standardizer.scale or 0.0) for s in found)
    drift = h * sigma
    share = f", {drift / abs(level):.2%} of its level" if level else ""
    return f"fires after a drift of {drift:.3g} beyond k·σ a record (σ {sigma:.3g}{share})"
