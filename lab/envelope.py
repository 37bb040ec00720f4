"""The envelope lead: how early a run's series leaves every healthy run for good — a ceiling.

For a series key and a monitoring step s, the healthy envelope is [min, max] over all healthy
runs' values of that key at s (null values left out; a step with fewer than two healthy values
has no band and is skipped). A run's *envelope exit* for the key is the first monitoring step
s ≥ ``min_step`` (the fault's onset label, and at least 100) at which the run is outside the band
— below, above, or null — and from which it stays outside at every banded monitoring step up to,
not including, the divergence step (to the end of the run when it did not diverge). A step at
which the run holds no value for the key is not a monitoring step of that key. The *envelope
lead* is divergence step − exit, for diverged runs only. Per-head keys (``…#h3``) are left out.

Why a ceiling and not a detector: it peeks at the future twice. "Stays outside until the
divergence" can only be known once the run has diverged (a causal rule must also sit through
excursions that come back), and the envelope is the raw min/max of every healthy run, the ones
judged included, with no margin for healthy runs not yet seen. So it is the most warning a level
rule on a series could give with no false alarm on the runs at hand, and the detectors' lead is
read against it. It is a reference, not a strict bound: a detector that reads something else
(the attention CUSUMs read a change in rate) can warn on a run before its envelope exit.
Torch-free.

>>> from pathlib import Path
>>> from foreshock.lab.recorded import RecordedRun
>>> def run(values, divergence=None, onset=None):
...     records = [{"step": 100 * i, "values": {"x": v}} for i, v in enumerate(values)]
...     start = {"run_id": "r", "labels": {"onset": onset}}
...     return RecordedRun(Path("r"), start, records, {"divergence_step": divergence})
>>> envelope = healthy_envelope([run([1, 1, 1, 1, 1, 1]), run([2, 2, 2, 2, 2, 2])])
>>> envelope["x"][300]
(1, 2)
>>> faulty = run([1, 2, 5, 1, 5, 5], divergence=550, onset=100)  # out, back in, out for good
>>> envelope_exit(faulty, envelope, min_step=100)
{'x': 400}
>>> envelope_leads(faulty, envelope)
{'x': 150}
>>> summary = scenario_envelope([faulty], envelope, family_of=lambda key: "f")
>>> summary["f"]["best_series"], summary["f"]["family_best_median"], summary["f"]["runs"]
('x', 150, 1)
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable
from typing import Any

from foreshock.detectors.bands import healthy_bands
from foreshock.table import median

from .recorded import RecordedRun

__all__ = [
    "MIN_STEP",
    "Envelope",
    "envelope_exit",
    "envelope_leads",
    "exit_floor",
    "healthy_envelope",
    "scenario_envelope",
]

MIN_STEP = 100  # the detectors' warm-up starts here: no exit is counted before it

Envelope = dict[str, dict[int, tuple[float, float]]]


def healthy_envelope(healthy_runs: Iterable[RecordedRun]) -> Envelope:
    """Per series key and monitoring step, (min, max) over the healthy runs' non-null values
    (the detectors' healthy bands of every module-level key, read as a step → band map)."""
    bands = healthy_bands(list(healthy_runs))
    return {
        key: dict(zip(b["steps"], zip(b["lo"], b["hi"], strict=True), strict=True))
        for key, b in bands.items()
        if b["steps"]
    }


def _outside(value: float | None, band: tuple[float, float]) -> bool:
    lo, hi = band
    return value is None or not lo <= value <= hi  # NaN compares false: outside too


def _series_exit(
    steps: list[int],
    values: list[float | None],
    band: dict[int, tuple[float, float]],
    min_step: int,
    stop: int | None,
) -> int | None:
    """Start of the trailing stretch of banded steps in [min_step, stop) that are all outside."""
    exit_step = None
    for step, value in zip(steps, values, strict=True):
        if step < min_step or (stop is not None and step >= stop) or step not in band:
            continue
        if _outside(value, band[step]):
            exit_step = step if exit_step is None else exit_step
        else:
            exit_step = None
    return exit_step


def envelope_exit(run: RecordedRun, envelope: Envelope, min_step: int) -> dict[str, int]:
    """Per key of ``envelope``, the step from which ``run`` stays outside until it diverges."""
    exits = {}
    for key, band in envelope.items():
        steps, values = run.series(key)
        found = _series_exit(steps, values, band, min_step, run.divergence_step)
        if found is not None:
            exits[key] = found
    return exits


def exit_floor(run: RecordedRun) -> int:
    """The earliest step an exit may have: the fault's onset label, and at least ``MIN_STEP``."""
    onset = run.labels.get("onset")
    return max(MIN_STEP, onset or 0)


def envelope_leads(run: RecordedRun, envelope: Envelope) -> dict[str, int]:
    """Per key, divergence step − envelope exit; empty for a run that did not diverge."""
    divergence = run.divergence_step
    if divergence is None:
        return {}
    exits = envelope_exit(run, envelope, exit_floor(run))
    return {key: divergence - step for key, step in exits.items()}


def _family_summary(per_run: list[dict[str, int]], keys: list[str]) -> dict[str, Any]:
    per_series = {}
    for key in keys:
        leads = [leads[key] for leads in per_run if key in leads]
        if leads:
            per_series[key] = {"median": median(leads), "n": len(leads)}
    best = max(
        per_series, key=lambda k: (per_series[k]["median"], per_series[k]["n"]), default=None
    )
    family_best = [max(ls[k] for k in keys if k in ls) for ls in per_run if ls.keys() & set(keys)]
    return {
        "best_series": best,
        "best_series_median": best and per_series[best]["median"],
        "best_series_n": best and per_series[best]["n"],
        "family_best_median": median(family_best),
        "runs": len(family_best),
        "per_series": per_series,
    }


def scenario_envelope(
    runs: Iterable[RecordedRun], envelope: Envelope, family_of: Callable[[str], str | None]
) -> dict[str, dict[str, Any]]:
    """Per family: the best single series by median lead, and the median of each run's best.

    ``family_of`` maps a series key to its family, or None to leave the key out. A family's
    ``runs`` counts the runs with a lead on any of its series (the family-best median's n);
    ``diverged`` counts the runs that diverged at all.
    """
    runs = list(runs)
    per_run = [envelope_leads(run, envelope) for run in runs]
    by_family: dict[str, list[str]] = defaultdict(list)
    for key in sorted(envelope):
        if (family := family_of(key)) is not None:
            by_family[family].append(key)
    diverged = sum(run.divergence_step is not None for run in runs)
    return {
        family: {**_family_summary(per_run, keys), "diverged": diverged}
        for family, keys in sorted(by_family.items())
    }
