"""Offline: run the detectors over recorded runs — the same code path as the live worker
(one detector per rank, :mod:`foreshock.detectors.streams`: a file a per-rank run wrote holds
every rank's records, each its own stream)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from foreshock.transport.run_files import RecordedRun, load_run
from foreshock.transport.warning import RunWarning

from .config import DetectorConfig
from .profiles import ProfileConfigs
from .streams import RunStreams

__all__ = ["RunReport", "replay", "replay_run"]


@dataclass
class RunReport:
    run_id: str
    labels: dict[str, Any]
    divergence_step: int | None  # the producer's own (exact, every step) when it sent one
    alerts: list[RunWarning]
    peaks: dict[str, float]
    events: list[RunWarning] = field(default_factory=list)
    profile: str | None = None  # the profile the run was judged by
    profile_reason: str = ""  # why that one (``profiles.ProfileChoice.reason``)
    unruled: dict[str, str] = field(default_factory=dict)  # metric no rule read -> why
    reach: dict[str, str] = field(default_factory=dict)  # metric -> what its rule takes to fire

    def first(self, family: str, before: int | None = None) -> RunWarning | None:
        """The first warning of ``family`` (optionally only those before step ``before``)."""
        hits = [
            a for a in self.alerts if a.family == family and (before is None or a.step < before)
        ]
        return min(hits, key=lambda a: a.step, default=None)


def replay_run(run: RecordedRun, config: DetectorConfig | ProfileConfigs) -> RunReport:
    run_id = run.start.get("run_id") or run.path.name.split(".")[0]
    detector = RunStreams(run_id, config)
    events = detector.update({**run.start, "kind": "start"})
    actions = list(getattr(run, "actions", ()))  # a run read back from a store may have none
    for record in run.records:
        while actions and _order(actions[0]) < _order(record):
            events += detector.update({**actions.pop(0), "kind": "action"})
        events += detector.update({**record, "kind": "metrics"})
    for action in actions:
        events += detector.update({**action, "kind": "action"})
    if run.end is not None:
        events += detector.finish(run.end)
    exact = (run.end or {}).get("divergence_step")
    profile = detector.profile
    return RunReport(
        run_id,
        run.start.get("labels", {}),
        exact,
        detector.alerts,
        detector.peaks,
        events,
        profile.name,
        profile.reason,
        detector.unruled,
        detector.reach,
    )


def _order(record: dict[str, Any]) -> tuple[int, int]:
    """Where a record falls in its run: an action taken at step s follows the record of s
    (the trainer acts at the step boundary, after the step's monitoring)."""
    return int(record.get("attempt") or 0), int(record["step"])


def replay(paths: list[str | Path], config: DetectorConfig | ProfileConfigs) -> list[RunReport]:
    return [replay_run(load_run(p), config) for p in paths]
