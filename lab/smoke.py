"""A short healthy training run with the monitors attached, summarised in a table.

Why: the quickest proof on a new machine that the monitors read a live model — discovery,
snapshots, spectra, router hooks and the sink all run end to end. It is a lab run of the
``healthy`` scenario (no fault), so it shares the lab's training loop and record format.
"""

from __future__ import annotations

from typing import Any

from foreshock.lab.faults import Fault
from foreshock.lab.recorded import RecordedRun, load_run
from foreshock.lab.run import LabResult, RunConfig, run_lab
from foreshock.table import format_table
from foreshock.transport.records import parse_series_key

__all__ = ["run_smoke", "summary_table"]


def run_smoke(
    steps: int = 200, every: int = 10, seed: int = 0, out: str = "runs/smoke.jsonl"
) -> tuple[LabResult, RecordedRun]:
    """Train the lab's GPT-MoE without a fault for ``steps`` steps, monitoring every ``every``."""
    config = RunConfig(fault=Fault("healthy"), seed=seed, steps=steps, every=every)
    result = run_lab(config, out, progress=False)
    return result, load_run(out)


def summary_table(records: list[dict[str, Any]]) -> str:
    """One row per layer-level series (per-head detail left to the file): first/last/min/max."""
    series: dict[str, list[float]] = {}
    for record in records:
        for key, value in record.get("values", {}).items():
            if value is not None and parse_series_key(key).head is None:
                series.setdefault(key, []).append(value)
    rows = [[key, v[0], v[-1], min(v), max(v), len(v)] for key, v in sorted(series.items())]
    return format_table(["series", "first", "last", "min", "max", "n"], rows)
