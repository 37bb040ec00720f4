"""How ``foreshock tune`` scores one grid point, and the rule that chooses among the points.

Why apart from the search (:mod:`foreshock.operate.tune`): the search calibrates and replays;
what it then measures is a contract with whoever reads a tune report — the per-family figures
are the report's ``points[].families`` (the dashboard's Tuning page plots them) and
:data:`RULE` is the sentence the report quotes — so both live here, with the sort key that
applies the rule. Every judged run is judged by :mod:`foreshock.detectors.judge`, as the
detection benchmark judges it. Per family:

* detection: the family's faulty runs (fa-lowprec → attention-numerics, lr-high and
  gbs-small → router, combined → both) with a warning of that family before divergence;
* false warnings: mechanism warnings of the family per held-out healthy (and fa-noise) run;
* lead: divergence step − the first warning of the family before it, in steps (median, p10,
  p90, linear interpolation);
* attribution: of the runs warned before divergence, those whose first mechanism warning
  names one of the scenario's right causes (the catalogue's: lr-high → optimizer or router).

A faulty scenario with no known family counts under ``unknown``: any mechanism warning
before divergence detects it, attribution is not judged.

>>> families = [{"false_warnings": 0, "detection_rate": 1.0, "lead_median": 300.0},
...             {"false_warnings": 1, "detection_rate": None, "lead_median": None}]
>>> score(families)
(-1, [1.0], [300.0])
"""

from __future__ import annotations

import math
from typing import Any

import polars as pl

from foreshock.detectors.judge import judge
from foreshock.detectors.replay import RunReport

__all__ = ["RULE", "families", "family_table", "score", "verdicts"]

RULE = (
    "fewest held-out false warnings (zero when any point has none); then the highest "
    "detection rate of the worst-detected family (ties: the next worst, and so on); then "
    "the longest median lead of the family with the shortest (ties: the next); then "
    "grid order"
)

_VERDICT = {
    "run": pl.String,
    "scenario": pl.String,
    "family": pl.String,
    "faulty": pl.Boolean,
    "detected": pl.Boolean,
    "lead": pl.Int64,
    "attribution_ok": pl.Boolean,
    "false_warnings": pl.Int64,
}


def verdicts(report: RunReport, run_id: str, scenario: str) -> list[dict[str, Any]]:
    """One row per family the run is judged on (:func:`~foreshock.detectors.judge.judge`): a
    fault's families, or every mechanism family (false warnings) for a quiet run (healthy
    or a control)."""
    verdict = judge(scenario, report.divergence_step, report.alerts)
    if not verdict.faulty:
        return [
            {
                "run": run_id,
                "scenario": scenario,
                "family": family,
                "faulty": False,
                "false_warnings": count,
            }
            for family, count in verdict.false_warnings.items()
        ]
    return [
        {
            "run": run_id,
            "scenario": scenario,
            "family": family,
            "faulty": True,
            "detected": verdict.detected_by(family),
            "lead": verdict.lead(family),
            "attribution_ok": verdict.attribution_ok,
        }
        for family in verdict.families
    ]


def family_table(verdicts: pl.DataFrame) -> pl.DataFrame:
    """Per family: detection rate, leads (median, p10, p90), attribution, false warnings."""
    faults = (
        verdicts.filter(pl.col("faulty"))
        .group_by("family")
        .agg(
            runs=pl.len(),
            detected=pl.col("detected").sum(),
            detection_rate=pl.col("detected").mean(),
            lead_median=pl.col("lead").median(),
            lead_p10=pl.col("lead").quantile(0.1, "linear"),
            lead_p90=pl.col("lead").quantile(0.9, "linear"),
            attribution_ok=pl.col("attribution_ok").mean(),
        )
    )
    healthy = (
        verdicts.filter(~pl.col("faulty"))
        .group_by("family")
        .agg(
            healthy_runs=pl.len(),
            false_warnings=pl.col("false_warnings").sum(),
            false_warnings_per_run=pl.col("false_warnings").mean(),
        )
    )
    return faults.join(healthy, on="family", how="full", coalesce=True).sort("family")


def families(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A point's per-family figures (:func:`family_table`) from its judged runs' ``verdicts``
    rows, as the report holds them (floats to 4 decimals)."""
    table = family_table(pl.DataFrame(rows, schema=_VERDICT))
    return [_rounded(row) for row in table.to_dicts()]


def score(families: list[dict[str, Any]]) -> tuple[Any, ...]:
    """Larger is better; the selection rule (:data:`RULE`) as a sort key."""
    false = sum(f["false_warnings"] or 0 for f in families)
    rates = sorted(f["detection_rate"] for f in families if f["detection_rate"] is not None)
    leads = sorted(
        -math.inf if f["lead_median"] is None else f["lead_median"]
        for f in families
        if f["detection_rate"] is not None
    )
    return (-false, rates, leads)


def _rounded(row: dict[str, Any]) -> dict[str, Any]:
    return {k: round(v, 4) if isinstance(v, float) else v for k, v in row.items()}
