"""Recorded lab runs: the runs shipped with foreshock (``lab/runs/``, see its README for how they
were made) and how they are split for calibration. ``shipped_runs()`` lists them; a run file is
read by :func:`foreshock.transport.run_files.load_run` (here as ``load_run`` too, for the lab).
"""

from __future__ import annotations

from pathlib import Path

from foreshock.transport.run_files import RecordedRun, load_run

__all__ = [
    "HELD_OUT_HEALTHY",
    "RECORDED_DIR",
    "RecordedRun",
    "calibration_healthy",
    "load_run",
    "seed_spans",
    "shipped_runs",
]

RECORDED_DIR = Path(__file__).parent / "runs"
# Per profile, the healthy seeds its shipped detector config never saw: benchmarks.detection_table
# judges on them (the other healthy seeds calibrate it). FIRST-LAST[,FIRST-LAST...].
HELD_OUT_HEALTHY = {
    "gpt-moe": "10-14,25-39,60-74",
    "mixtral": "15-24",
    "gpt-moe+capacity-1": "12-19",
    "llama": "5-9",
    "deepseek-v3": "5-9",
    "mixtral+h192": "5-9",
    "qwen3-moe": "100-109",  # trained after the zero-shot optimizer warning was set: all held out
}


def shipped_runs(directory: str | Path | None = None) -> list[Path]:
    """Paths of the finished, gzipped runs in ``directory`` (default: those shipped)."""
    root = Path(directory) if directory is not None else RECORDED_DIR
    return sorted(root.glob("*.jsonl.gz"))


def calibration_healthy(runs: list[RecordedRun], held_out: str) -> list[RecordedRun]:
    """The healthy runs that calibrate: every one whose seed ``held_out`` (``seed_spans``;
    empty: none) does not keep for judging."""
    held = seed_spans(held_out) if held_out else set()
    return [r for r in runs if r.scenario == "healthy" and r.seed not in held]


def seed_spans(spans: str) -> set[int]:
    """The seeds in ``FIRST-LAST[,FIRST-LAST...]`` (inclusive).

    >>> sorted(seed_spans("1-3,7-7"))
    [1, 2, 3, 7]
    """
    bounds = [tuple(int(x) for x in part.split("-")) for part in spans.split(",")]
    return {seed for first, last in bounds for seed in range(first, last + 1)}
