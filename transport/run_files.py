"""A run file: the start, metric records, actions and end one run wrote (plain or gzipped JSON
Lines).

Torch-free, and below every room that reads runs: the detectors replay them, the store imports
them, the lab ships them (:mod:`foreshock.lab.recorded` lists the shipped ones). What
``foreshock lab run``, the trainer integrations' ``JsonlSink`` and ``foreshock store export``
write, this reads.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["RecordedRun", "load_run"]


@dataclass
class RecordedRun:
    """A run's start labels, its metric records in step order, its end record, and the
    actions its trainer took (``action`` records, in step order: kept apart from the metric
    records, which every reader takes for monitoring steps)."""

    path: Path
    start: dict[str, Any]
    records: list[dict[str, Any]] = field(default_factory=list)
    end: dict[str, Any] | None = None
    actions: list[dict[str, Any]] = field(default_factory=list)

    @property
    def run_id(self) -> str:
        return self.start["run_id"]

    @property
    def labels(self) -> dict[str, Any]:
        return self.start.get("labels", {})

    @property
    def scenario(self) -> str:
        """The ``scenario`` label, else the file name's stem before ``-s<seed>``."""
        return self.labels.get("scenario") or self.path.name.rsplit("-s", 1)[0]

    @property
    def seed(self) -> int:
        """The ``seed`` label, else the file name's ``-s<seed>``."""
        seed = self.labels.get("seed")
        return int(self.path.name.split("-s")[-1].split(".")[0]) if seed is None else int(seed)

    @property
    def divergence_step(self) -> int | None:
        return None if self.end is None else self.end.get("divergence_step")

    def series(self, key: str) -> tuple[list[int], list[float | None]]:
        """(steps, values) of one series key, over the records that hold it."""
        steps, values = [], []
        for record in self.records:
            if key in record.get("values", {}):
                steps.append(record["step"])
                values.append(record["values"][key])
        return steps, values

    def keys(self) -> list[str]:
        seen: dict[str, None] = {}
        for record in self.records:
            seen.update(dict.fromkeys(record.get("values", {})))
        return list(seen)


def _lines(path: Path) -> Iterator[str]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as file:
        yield from file


def load_run(path: str | Path) -> RecordedRun:
    """Parse a run file; ValueError if it has no start record or a record is malformed (a
    step or attempt that is not an int in 0..2**63-1, values that are not an object)."""
    path = Path(path)
    start, end, records, actions = None, None, [], []
    for number, line in enumerate(_lines(path), start=1):
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue  # a torn line (a run cut short while writing)
        if not isinstance(record, dict):
            raise ValueError(f"{path}:{number}: a record must be a JSON object")
        kind = record.get("kind")
        if kind not in ("start", "end"):
            _check_record(record, f"{path}:{number}")
        if kind == "start":
            start = record
        elif kind == "end":
            end = record
        elif kind == "action":
            actions.append(record)
        else:
            records.append(record)
    if start is None:
        raise ValueError(f"{path}: no start record; not a foreshock lab run")
    records.sort(key=lambda r: (r.get("attempt", 0), r["step"]))
    actions.sort(key=lambda r: (r.get("attempt", 0), r["step"]))
    return RecordedRun(path, start, records, end, actions)


def _check_record(record: dict, where: str) -> None:
    for name in ("step", "attempt"):
        value = record.get(name, 0)
        if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < 2**63:
            raise ValueError(f"{where}: {name} must be an integer in 0..2**63-1, got {value!r:.80}")
    if "step" not in record:
        raise ValueError(f"{where}: a monitoring record without a step")
    if not isinstance(record.get("values", {}), dict):
        raise ValueError(f"{where}: values must be an object")
