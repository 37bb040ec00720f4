"""Stream numbering: a gap-free ``seq`` per (run_id, rank) for one attempt of its runs.

Why: consumers drop duplicates on (run_id, rank, attempt, seq) and see a gap as a lost
message, so each message the sink sends is numbered once, in order, and a message the wire
format refuses gives its number back. A stream's first message is a ``start`` (synthesised,
labels empty, if the caller sent none) carrying the producer's version, host and pid; its
``end`` carries ``last_seq`` and what this producer refused of it
(:meth:`~foreshock.delivery.rejects.Rejects.summary`). ``attempt`` is the producer's
incarnation (:mod:`foreshock.transport.attempts`), stamped on every message.
"""

from __future__ import annotations

import os
import socket
import time
from typing import Any

from foreshock import __version__
from foreshock.transport.records import METRICS_SCHEMA, RUN_SCHEMA

from .rejects import Rejects

__all__ = ["StreamNumbers"]

Stream = tuple[str, int]  # (run_id, rank)


class StreamNumbers:
    """Numbers the messages of every stream a producer writes (see the module docstring).

    >>> numbers = StreamNumbers(attempt=7, rejects=None)
    >>> [(m["kind"], m["seq"]) for m in numbers.to_wire({"run_id": "r", "kind": "metrics"})]
    [('start', 0), ('metrics', 1)]
    >>> numbers.open_streams()
    [('r', 0)]
    """

    def __init__(self, attempt: int, rejects: Rejects | None) -> None:
        self.attempt = attempt
        self._rejects = rejects
        self._seq: dict[Stream, int] = {}
        self._ended: set[Stream] = set()

    @property
    def started(self) -> bool:
        """Whether any message was numbered (an attempt is kept from then on)."""
        return bool(self._seq)

    def run_ids(self) -> set[str]:
        """The runs this producer has written to (any rank, ended or not)."""
        return {run_id for run_id, _ in self._seq}

    def open_streams(self) -> list[Stream]:
        """Streams with no ``end`` yet, in the order they started."""
        return [s for s in self._seq if s not in self._ended]

    def to_wire(self, record: dict[str, Any]) -> list[dict[str, Any]]:
        """``record`` as numbered wire messages: preceded by a ``start`` for a new stream."""
        kind = record.get("kind") or ("metrics" if record.get("schema") == METRICS_SCHEMA else "")
        stream = (str(record.get("run_id", "")), int(record.get("rank", 0)))
        out = []
        if stream not in self._seq and kind != "start":
            start = {
                "schema": RUN_SCHEMA,
                "kind": "start",
                "run_id": stream[0],
                "rank": stream[1],
                "time": time.time(),
                "labels": {},
            }
            out.append(self._number(start))
        out.append(self._number({**record, "kind": kind, "rank": stream[1]}))
        return out

    def _number(self, message: dict[str, Any]) -> dict[str, Any]:
        stream = (message["run_id"], message["rank"])
        seq = self._seq.get(stream, -1) + 1
        self._seq[stream] = seq
        message["seq"] = seq
        message["attempt"] = self.attempt  # one producer is one incarnation of its runs
        if message["kind"] == "start":
            message["producer"] = {
                "foreshock": __version__,
                "host": socket.gethostname(),
                "pid": os.getpid(),
            }
        elif message["kind"] == "end":
            message["last_seq"] = seq
            message.setdefault("status", "closed")
            self._ended.add(stream)
            refused = self._rejects.summary(stream) if self._rejects is not None else None
            if refused:  # the run's flag: this producer refused some of its records
                message["rejected"] = refused
        return message

    def give_back(self, message: dict[str, Any]) -> None:
        """Give a refused message's seq back, so that the stream keeps no gap."""
        stream = (message.get("run_id"), message.get("rank"))
        if stream in self._seq and self._seq[stream] == message.get("seq"):
            self._seq[stream] -= 1
            self._ended.discard(stream)
