"""Tune the detectors on the runs a store already holds: grid, calibrate, judge, choose.

The runs are read once (:mod:`foreshock.storage.queries`) and labelled by their ``start``
labels (``scenario``, ``seed``). Healthy runs are split by seed: those whose seed is not
held out calibrate (by default seeds with seed % 3 == 0 are held out), so no healthy run
both sets a threshold and judges it. Every other run — held-out healthy and fa-noise runs,
every faulty run — judges: faulty runs never calibrate anything, so all of them are judged
(as in ``benchmarks.detection_table``).

For each point of a small grid of detector parameters (k, confirm, trend_beta by default),
thresholds are calibrated on the calibration runs with leave-one-out margins
(:mod:`foreshock.detectors.calibrate`) and every judged run is replayed once. Each point gets
per-family figures (detection, false warnings, lead, attribution) and the point the rule
ranks first is chosen (:mod:`foreshock.operate.tune_score`: the figures, the rule).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, NamedTuple

from foreshock.catalogue import SCENARIOS
from foreshock.detectors.calibrate import calibrate, leave_one_out_margin, uncalibrated
from foreshock.detectors.config import DetectorConfig
from foreshock.detectors.replay import RunReport
from foreshock.detectors.streams import RunStreams

from .tune_score import RULE, families, score, verdicts

__all__ = [
    "DEFAULT_GRID",
    "StoredRun",
    "TuneError",
    "TuneResult",
    "load_runs",
    "parse_seed_range",
    "replay_messages",
    "tune",
]

NOT_FAULTY = tuple(s.name for s in SCENARIOS if s.quiet)  # any mechanism warning is false
DEFAULT_GRID: dict[str, tuple[Any, ...]] = {
    "k": (0.25, 0.5, 1.0),
    "confirm": (1, 2, 3),
    "trend_beta": (0.1, 0.2, 0.4),
}
Progress = Callable[[int, int], None]


class TuneError(ValueError):
    """The store cannot support a tune (no healthy runs, no faulty runs, a bad grid...)."""


@dataclass(frozen=True)
class StoredRun:
    """A finished, labelled run from the store, as the wire messages the detectors read."""

    run_id: str
    scenario: str
    seed: int
    start: dict[str, Any]
    records: list[dict[str, Any]]
    end: dict[str, Any]
    actions: list[dict[str, Any]] = field(default_factory=list)  # its trainer's action records

    @property
    def faulty(self) -> bool:
        return self.scenario not in NOT_FAULTY


class TuneResult(NamedTuple):
    config: DetectorConfig  # the chosen point, calibrated on the calibration runs
    report: dict[str, Any]  # split, grid, rule, every point's per-family figures, chosen


def replay_messages(
    run_id: str,
    start: dict[str, Any] | None,
    records: Sequence[dict],
    end: dict[str, Any] | None,
    config: DetectorConfig,
) -> RunReport:
    """:func:`~foreshock.detectors.replay.replay_run` for a run read back from a store.

    The divergence step is the producer's when its ``end`` says (even "none"), else the
    detectors' own estimate — the rule the store's ``runs`` view applies.
    """
    detector = RunStreams(run_id, config)
    events = [] if start is None else detector.update({**start, "kind": "start"})
    for record in records:
        events += detector.update(record)
    if end is not None:
        events += detector.finish(end)
    if end is not None and "divergence_step" in end:  # the producer's, even "none"
        divergence = end["divergence_step"]
    else:
        divergence = detector.divergence_step
    labels = (start or {}).get("labels", {})
    return RunReport(run_id, labels, divergence, detector.alerts, detector.peaks, events)


def load_runs(
    root: str | Path,
    progress: Progress | None = None,
    versions: dict[str, int] | None = None,
) -> tuple[list[StoredRun], dict[str, list[str]], dict[str, int]]:
    """Every finished, labelled run in the store (at table ``versions``, default the newest);
    the ids left out, by reason; the table versions read (what reproduces this exactly).
    ``progress(loaded, runs)`` after each run read."""
    from foreshock.storage import queries
    from foreshock.storage.reader import open_history

    runs: list[StoredRun] = []
    skipped: dict[str, list[str]] = {"unfinished": [], "unlabelled": []}
    with open_history(root, versions) as snapshot:
        read = dict(snapshot.versions)
        rows = sorted(queries.fleet(snapshot), key=lambda r: r["run_id"])
        for done, row in enumerate(rows, start=1):
            start, records, end = queries.run_records(snapshot, row["run_id"])
            if progress is not None:
                progress(done, len(rows))
            labels = (start or {}).get("labels", {})
            scenario, seed = labels.get("scenario"), labels.get("seed")
            if end is None:
                skipped["unfinished"].append(row["run_id"])
            elif start is None or not isinstance(scenario, str) or not isinstance(seed, int):
                skipped["unlabelled"].append(row["run_id"])
            else:
                actions = queries.run_actions(snapshot, row["run_id"])
                runs.append(StoredRun(row["run_id"], scenario, seed, start, records, end, actions))
    return runs, skipped, read


def parse_seed_range(text: str) -> range:
    """``FIRST-LAST`` (inclusive) or one seed.

    >>> parse_seed_range("10-14"), parse_seed_range("7")
    (range(10, 15), range(7, 8))
    """
    first, _, last = text.partition("-")
    try:
        low, high = int(first), int(last or first)
    except ValueError:
        raise ValueError(f"seed range {text!r}: expected FIRST-LAST, e.g. 10-14") from None
    if high < low:
        raise ValueError(f"seed range {text!r}: LAST is below FIRST")
    return range(low, high + 1)


def _selected(run: StoredRun, select: Mapping[str, str]) -> bool:
    labels = run.start.get("labels") or {}
    return all(str(labels.get(k)) == v for k, v in select.items())


def _shared_signature(runs: Sequence[StoredRun]) -> dict[str, Any] | None:
    from foreshock.detectors.make_profile import ProfileError, one_model

    try:
        return one_model(runs)
    except ProfileError:
        return None


def _held(seed: int, held_out: range | None) -> bool:
    return seed % 3 == 0 if held_out is None else seed in held_out


def _describe(held_out: range | None) -> str:
    return "seed % 3 == 0" if held_out is None else f"{held_out.start}-{held_out[-1]}"


def _split(runs: list[StoredRun], held_out: range | None) -> tuple[list, list]:
    """(calibration, judged); TuneError when either side cannot do its job."""
    if not runs:
        raise TuneError("no finished, labelled runs in the store (start labels scenario, seed)")
    if not any(r.scenario == "healthy" for r in runs):
        raise TuneError("no healthy runs in the store: thresholds are calibrated on them")
    if not any(r.faulty for r in runs):
        raise TuneError(
            "no labelled faulty runs in the store (a scenario other than "
            f"{' or '.join(NOT_FAULTY)}): nothing to judge detection on"
        )
    calibration = [r for r in runs if r.scenario == "healthy" and not _held(r.seed, held_out)]
    judged = [r for r in runs if r not in calibration]
    where = f"seeds {_describe(held_out)}"
    if len(calibration) < 2:
        raise TuneError(
            f"{len(calibration)} healthy runs left to calibrate with {where} held "
            "out; leave-one-out needs at least 2"
        )
    if not any(not r.faulty for r in judged):
        raise TuneError(f"no held-out healthy runs ({where}): false warnings cannot be judged")
    return calibration, judged


def _points(grid: Mapping[str, Sequence[Any]]) -> list[dict[str, Any]]:
    """Every combination of the grid's values, in order.

    >>> _points({"k": (0.5, 1.0), "confirm": (2,)})
    [{'k': 0.5, 'confirm': 2}, {'k': 1.0, 'confirm': 2}]
    """
    known = {f.name for f in fields(DetectorConfig)} - {
        "rules",
        "thresholds",
        "false_alarm",
        "calibration",
    }
    unknown = sorted(set(grid) - known)
    if unknown or not grid or not all(grid.values()):
        raise TuneError(f"bad grid {dict(grid)}: give values for any of {sorted(known)}")
    names = list(grid)
    return [
        dict(zip(names, values, strict=True))
        for values in itertools.product(*(grid[n] for n in names))
    ]


def _judge_point(
    point: dict[str, Any],
    base: DetectorConfig,
    calibration: list[StoredRun],
    judged: list[StoredRun],
    tick: Callable[[], None],
) -> tuple:
    """Calibrate at ``point``, replay the judged runs: (config, margins, per-family rows)."""
    trial = replace(base, **point)
    bare, peaks = uncalibrated(trial), []
    for run in calibration:
        peaks.append(replay_messages(run.run_id, run.start, run.records, run.end, bare))
        tick()
    margin = leave_one_out_margin(peaks, trial)
    config = calibrate(peaks, trial, margin=margin)
    rows = []
    for run in judged:
        report = replay_messages(run.run_id, run.start, run.records, run.end, config)
        rows += verdicts(report, run.run_id, run.scenario)
        tick()
    return config, margin, families(rows)


class _Counter:
    """Progress in work units: loading a run is one, each replay of it one more per point.
    The total is known from the start; a run left out counts its replays as done."""

    def __init__(self, points: int, progress: Progress | None) -> None:
        self.points, self.progress, self.done, self.total = points, progress, 0, 0

    def loaded(self, _: int, runs: int) -> None:
        self.total = runs * (1 + self.points)
        self.tick()

    def skip(self, runs: int) -> None:
        if runs:
            self.tick(runs * self.points)

    def tick(self, units: int = 1) -> None:
        self.done += units
        if self.progress is not None:
            self.progress(self.done, self.total)


def tune(
    root: str | Path,
    grid: Mapping[str, Sequence[Any]] = DEFAULT_GRID,
    held_out: range | None = None,
    base: DetectorConfig | None = None,
    progress: Progress | None = None,
    versions: dict[str, int] | None = None,
    select: Mapping[str, str] | None = None,
) -> TuneResult:
    """Choose detector parameters on a store's runs (the rule:
    :data:`~foreshock.operate.tune_score.RULE`).

    ``held_out``: the healthy seeds kept out of calibration (default: seed % 3 == 0);
    ``base``: the rules and other parameters the grid varies (default: the built-in ones);
    ``progress(done, total)`` is called after each run loaded and each replay; ``versions``:
    the store's table versions to read (the report's ``store_versions`` of an earlier tune
    reproduces it exactly, while vacuum has kept them); ``select``: only the runs whose
    labels have these values (one model's runs, to publish a named profile). The report's
    ``signature`` is the model the calibration runs share (None: several, or none sent).
    TuneError when the store cannot support a tune.
    """
    from foreshock.storage.store import store_exists

    if not store_exists(str(root)):
        raise TuneError(f"no store at {root}")
    base = base or DetectorConfig()
    points = _points(grid)
    counter = _Counter(len(points), progress)
    runs, skipped, read = load_runs(root, counter.loaded, versions)
    runs = [r for r in runs if _selected(r, select or {})]
    calibration, judged = _split(runs, held_out)
    counter.skip(sum(map(len, skipped.values())))
    results = [_judge_point(p, base, calibration, judged, counter.tick) for p in points]
    scores = [score(figures) for _, _, figures in results]
    best = max(range(len(points)), key=lambda i: (scores[i], -i))
    report = {
        "rule": RULE,
        "grid": {k: list(v) for k, v in grid.items()},
        "store_versions": read,
        "split": {
            "held_out_seeds": _describe(held_out),
            "calibration": [r.run_id for r in calibration],
            "judged": [r.run_id for r in judged],
            **skipped,
        },
        "points": [
            {"params": p, "version": c.version, "margin": m, "families": f}
            for p, (c, m, f) in zip(points, results, strict=True)
        ],
        "chosen": {"index": best, "params": points[best], "version": results[best][0].version},
        "select": dict(select or {}),
        "signature": _shared_signature(calibration),
    }
    return TuneResult(results[best][0], report)
