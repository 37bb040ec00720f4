"""Which series feed which family, in which direction, and the calibrated thresholds.

The attention-numerics family reads the ΔW and Δ2 spectral entropies (down) and the largest
attention logit max(αQKᵀ) per layer (up): the FA fault's feedback loop is a coherent low-rank
bias in the query/key gradients → growing logits → more repeated row maxima → more bias
(SCIENCE.md), so the logits are the loop's own state, not a symptom of the loss. Their
failure is a change in rate: a CUSUM on the residual from each series' own trend.

The router family judges its entropies as *levels* against the run's own warm-up: the
stable-winner loop slides them to a fraction of where they started, over hundreds of steps and
no faster per record than healthy early drift, which a trend-relative CUSUM cannot see. ε stays
a CUSUM (both directions; in the lab it rises under a learning-rate ramp).

A detector config is versioned by the hash of its content: every warning carries the version
that produced it, so a warning can always be traced to its thresholds and rules.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import Any

from foreshock.catalogue import FAMILIES, MECHANISMS, SERIES

__all__ = [
    "BAND_RULES",
    "DEFAULT_RULES",
    "FAMILIES",
    "KINDS",
    "MECHANISMS",
    "OPTIMIZER_TEST",
    "DetectorConfig",
    "SeriesRule",
]

KINDS = ("cusum", "level", "band")
# The optimizer test's rule: not a series of the records but the total weight norm's lead over
# its own trend (or band) that ``inflation_h`` arms. A profile whose rules hold it warns with
# family ``optimizer`` when the test fires; without it the test only names a later cause.
OPTIMIZER_TEST = "optimizer-test"


@dataclass(frozen=True)
class SeriesRule:
    """A metric (all its modules) feeding a family; direction ``up``, ``down`` or ``both``.

    ``kind`` says what fails: ``cusum``, a change in rate (a one-sided CUSUM on the residual
    from the run's own trend); ``level``, a slide too far (the log ratio to the run's own
    warm-up level, held beyond h for ``confirm`` records); ``band``, leaving what healthy runs
    of the same profile do at the same step (:mod:`foreshock.detectors.bands`), held beyond h
    band widths for ``confirm`` records. ``confirm`` None: the config's.
    """

    metric: str
    family: str
    direction: str
    kind: str = "cusum"
    confirm: int | None = None

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {self.kind!r}")
        if self.confirm is not None and self.confirm < 1:
            raise ValueError(f"confirm must be at least 1, got {self.confirm}")

    def directions(self) -> tuple[str, ...]:
        return ("up", "down") if self.direction == "both" else (self.direction,)


# How each catalogue series fails when not by a change in rate (``cusum``, the default). The
# router's entropies slide to a fraction of their warm-up level (see the module docstring).
LEVEL_METRICS = ("router.token_entropy_norm", "router.load_entropy")
# Only with expert capacity, and only judged against healthy runs (below).
BAND_ONLY_METRICS = ("router.dropped_fraction",)

DEFAULT_RULES: tuple[SeriesRule, ...] = tuple(
    SeriesRule(s.metric, s.family, s.direction, "level" if s.metric in LEVEL_METRICS else "cusum")
    for s in SERIES
    if s.metric not in BAND_ONLY_METRICS
)


# Compared with the healthy runs of the run's profile at the same step where a profile's
# calibration has them (``foreshock.detectors.bands``): the mechanism series whose slow faults a
# run-relative rule sees late — all but ε, which stays a CUSUM in both directions (see the
# module docstring). Capacity-limited routers add their dropped fraction.
RUN_RELATIVE_ONLY = ("router.epsilon",)
BAND_METRICS = tuple(
    r.metric for r in DEFAULT_RULES if r.family in MECHANISMS and r.metric not in RUN_RELATIVE_ONLY
)
# Confirmed on one record, not ``DetectorConfig.confirm``: the largest attention logit is a state
# of the weights (it moves smoothly, record to record), where the spectral entropies of one
# step's increment spike with a single batch. Confirmation filters spikes, so a state pays a
# record of delay for little: on healthy calibration runs the largest leave-one-out excursion
# held for 2 records stays a large share of the one held for 1 record for ``max_logit``, a
# small one for most entropies (``python -m benchmarks.band_frontier``, "persistence").
SINGLE_RECORD_METRICS = ("max_logit",)
BAND_RULES: tuple[SeriesRule, ...] = (
    *(
        replace(r, kind="band", confirm=1 if r.metric in SINGLE_RECORD_METRICS else None)
        if r.metric in BAND_METRICS
        else r
        for r in DEFAULT_RULES
    ),
    *(
        SeriesRule(s.metric, s.family, s.direction, "band")
        for s in SERIES
        if s.metric in BAND_ONLY_METRICS
    ),
)


@dataclass(frozen=True)
class DetectorConfig:
    rules: tuple[SeriesRule, ...] = DEFAULT_RULES
    warmup_start: int = 100  # first step of each run's warm-up window
    warmup_records: int = 6  # monitoring records in it
    k: float = 0.5  # CUSUM allowance (warm-up σ)
    baseline: str = "trend"  # "trend": residual from the run's own EMA; "level": vs warm-up
    trend_beta: float = 0.2  # EMA weight per record of the trend baseline
    confirm: int = 2  # consecutive records in alarm before a warning opens
    # consecutive records with every statistic below h before a warning resolves: hysteresis,
    # so a warning does not flap (chosen on calibration runs: python -m benchmarks.flapping)
    release: int = 8
    calm_ratio: float = 1.0  # the other mechanism family counts as calm below this × h
    inflation_h: float | None = None  # weights above their healthy band by this: optimizer
    thresholds: dict[str, float] = field(default_factory=dict)  # metric -> h; none = never fire
    false_alarm: dict[str, float] = field(default_factory=dict)  # family -> calibrated rate
    calibration: dict[str, Any] = field(default_factory=dict)  # how the thresholds were set
    bands: dict[str, dict[str, list]] = field(default_factory=dict)  # key -> healthy band

    @cached_property
    def version(self) -> str:
        """sha1 of the content (12 hex digits). Computed once per config: hashing the healthy
        bands took 80 % of the detectors' time when every warning asked for it (the config is
        frozen; its bands are never changed in place)."""
        text = json.dumps(self.to_dict(), sort_keys=True)
        return hashlib.sha1(text.encode()).hexdigest()[:12]

    def confirm_of(self, rule: SeriesRule) -> int:
        """Records in a row beyond h before ``rule`` warns: its own, else the config's."""
        return rule.confirm or self.confirm

    def rule_for(self, metric: str) -> SeriesRule | None:
        return next((r for r in self.rules if r.metric == metric), None)

    def with_thresholds(
        self,
        thresholds: dict[str, float],
        false_alarm: dict[str, float],
        calibration: dict[str, Any],
    ) -> DetectorConfig:
        return replace(
            self, thresholds=thresholds, false_alarm=false_alarm, calibration=calibration
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> DetectorConfig:
        rules = tuple(SeriesRule(**r) for r in data.get("rules", []) or []) or DEFAULT_RULES
        return cls(**{**data, "rules": rules})

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps({**self.to_dict(), "version": self.version}, indent=1))

    @classmethod
    def load(cls, path: str | Path) -> DetectorConfig:
        data = json.loads(Path(path).read_text())
        data.pop("version", None)
        return cls.from_dict(data)
