"""Where monitoring records go. A sink has ``write(record)`` and ``close()``.

The local default is JSON Lines: one record per line, appended and flushed per record, so a
crash loses at most the line being written and ``tail -f`` / ``jq`` work on a live run.
The Kafka sink (:class:`~foreshock.delivery.kafka_sink.KafkaSink`) streams them to the broker.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Protocol

__all__ = ["JsonlSink", "ListSink", "Sink", "read_jsonl"]


class Sink(Protocol):
    def write(self, record: dict[str, Any]) -> None: ...

    def close(self) -> None: ...


class JsonlSink:
    """Append records to a JSON Lines file (created with its parent folders).

    >>> import tempfile, os
    >>> path = os.path.join(tempfile.mkdtemp(), "run.jsonl")
    >>> sink = JsonlSink(path)
    >>> sink.write({"step": 0, "values": {"loss": 2.5}})
    >>> sink.close()
    >>> read_jsonl(path)
    [{'step': 0, 'values': {'loss': 2.5}}]
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = self.path.open("a", encoding="utf-8")
        self._bounds = _Bounds()

    def write(self, record: dict[str, Any]) -> None:
        self._file.write(json.dumps(record, allow_nan=False, separators=(",", ":")) + "\n")
        self._file.flush()
        self._bounds.saw(record)

    def has_start(self, run_id: str) -> bool:
        """Whether a ``start`` record of ``run_id`` went through this sink (``run_bounds``)."""
        return run_id in self._bounds.started

    def has_end(self, run_id: str) -> bool:
        return run_id in self._bounds.ended

    def close(self) -> None:
        if not self._file.closed:
            self._file.close()


class ListSink:
    """Keep records in memory (notebooks, tests of the monitor itself): exactly what the
    Monitor measured, no ``start``/``end`` of its own (a file sink gets them: ``run_bounds``)."""

    def __init__(self) -> None:
        self.records: list[dict[str, Any]] = []

    def write(self, record: dict[str, Any]) -> None:
        self.records.append(record)

    def close(self) -> None:
        pass


class _Bounds:
    """The runs whose ``start`` and ``end`` records a sink wrote."""

    def __init__(self) -> None:
        self.started: set[str] = set()
        self.ended: set[str] = set()

    def saw(self, record: Any) -> None:
        kind = record.get("kind") if isinstance(record, dict) else None
        if kind in ("start", "end"):
            (self.started if kind == "start" else self.ended).add(str(record.get("run_id")))


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    """All records of a JSON Lines file (a torn last line from a crash is skipped)."""
    records = []
    with Path(path).open(encoding="utf-8") as file:
        for line in file:
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return records
