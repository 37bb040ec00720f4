"""The zero-shot profile: rules a model no one calibrated can be judged by.

A calibrated profile compares a run with healthy runs of the same model (bands at the same
step). A fleet trains many recipes and sizes and nobody trains seven healthy 70B runs to make
a band, so the zero-shot profile keeps only rules that compare a run with *itself*:

* every mechanism and symptom series against its own warm-up (``ZERO_SHOT_RULES``: a CUSUM on
  the residual from the run's own trend, in warm-up σ; the router entropies, the largest
  attention logit and the QK increment's entropy as a log ratio to their warm-up level, in
  nats) — scale-free, so one threshold serves any width or depth;
* the optimizer test (weights moved before any mechanism) as the total weight norm's log
  above its own recent trend (``inflation.weight_trend``), never another model's
  weight band.

Thresholds are pooled across architectures, and each metric's margin is chosen **leave one
architecture out**: the least margin in ``calibrate.MARGINS`` under which no healthy run of a
held-out architecture exceeds the threshold the *other* architectures set,

    h_m = max_i M_m,i · (1 + μ_m),
    μ_m = min{ μ : for every group A and run i in A, M_m,i ≤ max_{j ∉ A} M_m,j · (1 + μ) },

so the stated margin is what it took for an architecture never seen to stay quiet. The
optimizer test's statistic is a log (nats), so its margin is a *shift*, not a factor:

    h_opt = max(INFLATION_FLOOR, max_i M_i + δ),   δ = min{ δ ∈ SHIFTS : the same test },

because a factor on a peak near zero is no margin at all (healthy Llama runs stay within
0.001 nats of their trend, the lab's GPT-MoE reaches 0.1: any factor on the first fails the
second, and the largest factor on the second, ×6, arms the test at 0.6 nats — past where a
learning-rate ramp has already tipped the attention entropies, so it named them the cause).
``groups``
are the architectures (or architecture/size/dispatch combinations: any key); a single group
falls back to leaving one run out, which promises less.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any, NamedTuple

from .bands import sustained_peak
from .calibrate import MARGINS, calibrate, uncalibrated
from .config import DEFAULT_RULES, OPTIMIZER_TEST, DetectorConfig, SeriesRule
from .inflation import weight_trend

__all__ = [
    "INFLATION_FLOOR",
    "OPTIMIZER_TEST",
    "OPTIMIZER_WARNING_FLOOR",
    "RECIPE_FLOORED",
    "SHIFTS",
    "ZERO_SHOT_RULES",
    "calibrate_zero_shot",
    "inflation_peak",
    "recipe_floors",
    "zero_shot_base",
]

INFLATION_FLOOR = 0.05  # nats: the least optimizer threshold (a 5 % lead over the trend)
# nats: the least lead over the trend at which the optimizer test *warns* (a 28 % lead). Set
# after looking at every lab group: healthy runs reach 0.10 at most (the lab's GPT-MoE with
# expert capacity; 0.02 outside GPT-MoE), learning-rate ramps 0.9–2.0. The leave-one-out
# shift alone armed 0.05 when GPT-MoE was the architecture never seen: its healthy runs that
# warned went from 3 to 11 of 95. Judged on runs trained after it was set (docs/detectors.md).
OPTIMIZER_WARNING_FLOOR = 0.10
SHIFTS = (0.0, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5)  # nats: the optimizer test's margins

# Floors from healthy runs trained with recipes (warm-up, decay, 0.5-2x the lab's rate, up to
# 10,000 steps: ``lab/runs/recipes-calibration``). A threshold pooled from constant-rate
# 1,600-step runs is no bound there: past a warm-up the routers' load entropy keeps settling
# (8 % below its window on a Mixtral L3/d160 at 2x, 2.4x the pooled h) and at 2x a GPT-MoE's
# weights lead their trend by 0.375 nats (1.5x the optimizer warning's floor). So each metric
# here is never below the largest healthy recipe peak × (1 + RECIPE_MARGIN) (load entropy,
# nats) or + RECIPE_SHIFT (the optimizer warning: its statistic is a log). Chosen on those
# runs: every one quiet, every diverging fault among them still warned (docs/recipes.md).
RECIPE_FLOORED = ("router.load_entropy",)
RECIPE_MARGIN = 0.25
RECIPE_SHIFT = 0.025  # nats


# Levels, not CUSUMs, where a CUSUM's σ (a warm-up's noise) does not transfer across models.
# The largest logit and the QK increment's entropy of a healthy run drift by a factor of
# their warm-up that is alike across architectures, while their warm-up noise is not: as
# CUSUMs, leaving the lab's GPT-MoE out armed thresholds 42 of its 75 healthy runs crossed;
# as levels, 3 (``python -m benchmarks.zero_shot``). The ΔW entropies stay CUSUMs: as
# levels they tip under a learning-rate ramp before the weights do and name attention for it.
ZERO_SHOT_LEVELS = ("max_logit", "attn.d2.entropy_mean")
# Not read zero-shot: ε's run-relative CUSUM on healthy runs of one architecture reaches what
# faults of another reach (GPT-MoE healthy peaks up to 902, Mixtral learning-rate ramps' median
# 346): no threshold separates them without a model's own healthy runs (its band does).
ZERO_SHOT_UNREAD = ("router.epsilon",)
ZERO_SHOT_RULES = (
    *(
        replace(r, kind="level") if r.metric in ZERO_SHOT_LEVELS else r
        for r in DEFAULT_RULES
        if r.metric not in ZERO_SHOT_UNREAD
    ),
    # The optimizer test warns: a learning-rate ramp inflates every weight 400–600 steps
    # before it diverges, often before any mechanism crosses a threshold that must hold on
    # an architecture never seen (a name for a later cause alone left those runs unwarned).
    SeriesRule(OPTIMIZER_TEST, "optimizer", "up", "level"),
)


def zero_shot_base() -> DetectorConfig:
    """The rules, no thresholds: run-relative only, the optimizer test on the own trend."""
    return DetectorConfig(ZERO_SHOT_RULES)


def inflation_peak(run: Any, config: DetectorConfig) -> float:
    """A run's largest weight-norm lead over its own warm-up trend held for ``confirm``
    records (nats): what the optimizer test reads (:mod:`~foreshock.detectors.inflation`)."""
    return sustained_peak(run, weight_trend(config.warmup_start), config.confirm)


def recipe_floors(
    runs: Sequence[Any], replay: Callable[[Any, DetectorConfig], Any], base: DetectorConfig
) -> dict[str, float]:
    """The least thresholds healthy recipe runs allow (``RECIPE_FLOORED`` and the optimizer
    warning; see ``RECIPE_MARGIN``); none without runs."""
    if not runs:
        return {}
    bare = uncalibrated(base)
    peaks = [_peaks(run, base, replay(run, bare)).peaks for run in runs]
    floors = {m: max(p.get(m, 0.0) for p in peaks) * (1 + RECIPE_MARGIN) for m in RECIPE_FLOORED}
    floors[OPTIMIZER_TEST] = max(p[OPTIMIZER_TEST] for p in peaks) + RECIPE_SHIFT
    return {m: round(h, 4) for m, h in floors.items()}


def calibrate_zero_shot(
    groups: Mapping[str, Sequence[Any]],
    replay: Callable[[Any, DetectorConfig], Any],
    base: DetectorConfig | None = None,
    margin: float | None = None,
    floors: Mapping[str, float] | None = None,
) -> DetectorConfig:
    """The zero-shot config from healthy runs of several architectures (see above).
    ``replay(run, config)`` gives a report with ``peaks``; runs have ``records``.
    ``margin``: every metric's margin (and the optimizer test's shift) fixed instead of chosen
    leaving one architecture out — 0 gives the *tightest* thresholds the runs allow, the
    ceiling of what any threshold on these statistics could warn (``benchmarks.zero_shot``).
    ``floors``: thresholds never below these (``recipe_floors``)."""
    if not groups or not all(groups.values()):
        raise ValueError("a zero-shot profile needs healthy runs of each group given")
    base = base or zero_shot_base()
    bare = uncalibrated(base)
    reports = {
        name: [_peaks(run, base, replay(run, bare)) for run in runs]
        for name, runs in groups.items()
    }
    metrics = [r.metric for r in base.rules if r.metric != OPTIMIZER_TEST] + [OPTIMIZER_TEST]
    per_group = {
        m: {g: [r.peaks.get(m, 0.0) for r in rs] for g, rs in reports.items()} for m in metrics
    }
    if margin is None:
        margins = {m: _group_margin(per_group[m]) for m in metrics[:-1]}
        shift = _group_margin(per_group[OPTIMIZER_TEST], SHIFTS, additive=True)
    else:
        margins, shift = dict.fromkeys(metrics[:-1], margin), margin
    pooled = [r for rs in reports.values() for r in rs]
    config = calibrate(pooled, base, margin=margins)
    top = max(r.peaks[OPTIMIZER_TEST] for r in pooled)
    calibration = {
        **config.calibration,
        "method": "zero-shot: pooled max-statistic, margins leave one architecture out",
        "groups": {g: len(rs) for g, rs in sorted(reports.items())},
        "inflation": {
            "method": "weight-norm log above its recent trend",
            "peak": round(top, 4),
            "shift": shift,
        },
    }
    inflation_h = round(max(INFLATION_FLOOR, top + shift), 4)
    thresholds = dict(config.thresholds)
    if base.rule_for(OPTIMIZER_TEST) is not None:  # the warning: never below the naming test
        thresholds[OPTIMIZER_TEST] = max(inflation_h, OPTIMIZER_WARNING_FLOOR)
    floors = dict(floors or {})
    for metric, floor in floors.items():
        if metric in thresholds:
            thresholds[metric] = max(thresholds[metric], floor)
    if floors:
        calibration["recipe_floors"] = floors
    return replace(config, thresholds=thresholds, calibration=calibration, inflation_h=inflation_h)


class _Peaks(NamedTuple):
    run_id: str
    peaks: dict[str, float]


def _peaks(run: Any, base: DetectorConfig, report: Any) -> _Peaks:
    """A run's peaks as ``calibrate`` reads them, with the optimizer test's."""
    return _Peaks(report.run_id, {**report.peaks, OPTIMIZER_TEST: inflation_peak(run, base)})


def _group_margin(
    peaks: Mapping[str, Sequence[float]],
    margins: Sequence[float] = MARGINS,
    additive: bool = False,
) -> float:
    """The least margin in ``margins`` under which every group's peaks stay under the others'
    largest × (1 + margin) (``additive``: + margin); the largest margin if none does. One
    group alone: each run against the others (leave one run out), all a single group can
    tell."""
    if len(peaks) == 1:
        (only,) = peaks.values()
        peaks = {str(i): [p] for i, p in enumerate(only)}

    def others(g: str) -> float:
        return max((p for h, qs in peaks.items() if h != g for p in qs), default=0.0)

    for margin in margins:
        if all(
            max(ps, default=0.0) <= (others(g) + margin if additive else others(g) * (1 + margin))
            for g, ps in peaks.items()
        ):
            return margin
    return margins[-1]
