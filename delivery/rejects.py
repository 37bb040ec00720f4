"""What the Kafka sink could not send: refused records, dropped messages, unexpected errors.

Why a room of its own: a producer that nothing kills must still say what it lost. A record
that can't be sent is *refused*: kept whole in a local rejects file (``<spool_dir>/<name>
.rejects``, JSON Lines with the reason, fsynced; past ``REJECTS_MAX_BYTES`` a line keeps the
reason, not the record), counted by reason, logged (the first ten of a kind, then every
hundredth), and summed per stream for the run's ``end`` (``summary``). A valid message no
spool can hold is *dropped* and counted. An exception the sink caught is an *error*, counted
and logged. Counters are read by any thread; one lock guards them.
"""

from __future__ import annotations

import collections
import contextlib
import json
import logging
import os
import threading
import time
from pathlib import Path
from typing import Any

from .spool import SpooledMessage, write_all

__all__ = ["REJECTS_MAX_BYTES", "Rejects", "dumps", "loads", "often", "size_text"]

log = logging.getLogger("foreshock.delivery.kafka_sink")

REJECTS_MAX_BYTES = 256 << 20  # past this a rejects file keeps the reason, not the record


class Rejects:
    """The rejects file and the sink's loss counters: ``rejected``, ``dropped``, ``errors``,
    ``reasons`` (refusals and drops by reason)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.rejected = self.dropped = self.errors = 0
        self.reasons: collections.Counter[str] = collections.Counter()
        self.failed = False  # the rejects file could not be written: records only counted
        self._per_stream: dict[tuple[Any, Any], collections.Counter[str]] = {}
        self._lock = threading.Lock()

    @property
    def kept_where(self) -> str:
        return "not kept" if self.failed else f"kept in {self.path}"

    def refuse(
        self,
        kind: str,
        detail: str,
        *,
        message: Any = None,
        item: SpooledMessage | None = None,
        text: str | None = None,
    ) -> None:
        """Count, log and keep one refused record (whole, while the rejects file is small)."""
        info = _identify(message, item)
        with self._lock:
            self.rejected += 1
            self.reasons[kind] += 1
            stream = (info.get("run_id"), info.get("rank", 0))
            if isinstance(message, dict) and "seq" in message:
                self._per_stream.setdefault(stream, collections.Counter())[kind] += 1
            count = self.reasons[kind]
            if text is None:
                text = item.value.decode("utf-8", "replace") if item else dumps(message)
            line = {"time": time.time(), "reason": kind, "detail": detail, **info}
            self._keep({**line, "bytes": len(text)}, text)
        if often(count):
            log.warning(
                "foreshock: record refused (%s, %d so far): %s %s; %s; %s",
                kind,
                count,
                info.get("run_id"),
                {k: info[k] for k in ("kind", "seq", "step") if k in info},
                detail,
                self.kept_where,
            )

    def summary(self, stream: tuple[Any, Any]) -> dict[str, Any] | None:
        """What was refused of one stream (its ``end`` carries it), or None."""
        refused = self._per_stream.get(stream)
        if not refused:
            return None
        return {"count": sum(refused.values()), "reasons": dict(refused), "file": str(self.path)}

    def drop(self, item: SpooledMessage, reason: str, memory_bytes: int) -> None:
        """A valid message no spool can hold: counted, logged."""
        with self._lock:
            self.dropped += 1
            self.reasons[reason] += 1
            count = self.reasons[reason]
        if often(count):
            log.error(
                "foreshock: message of run %s dropped (%s; %d so far): the spool can't be "
                "written and the memory buffer (%s) is full",
                item.key[:200].decode("utf-8", "replace"),
                reason,
                count,
                size_text(memory_bytes),
            )

    def error(self, where: str, exc: BaseException) -> None:
        """An exception the sink caught and carried on after."""
        with self._lock:
            self.errors += 1
            count = self.errors
        if often(count):
            log.error(
                "foreshock: unexpected error in the Kafka sink's %s (%d so far); it carries on",
                where,
                count,
                exc_info=exc,
            )

    def _keep(self, line: dict[str, Any], text: str) -> None:
        """Append one JSON line to the rejects file, fsynced; a failure is logged once."""
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        except OSError as exc:
            return self._unwritable(exc)
        try:
            size = os.fstat(fd).st_size
            if size + len(text) < REJECTS_MAX_BYTES:
                line["value"] = text
            else:
                line["value_dropped"] = f"the rejects file is over {REJECTS_MAX_BYTES >> 20} MB"
            try:
                write_all(fd, json.dumps(line, default=repr).encode() + b"\n")
                os.fsync(fd)
            except OSError as exc:
                with contextlib.suppress(OSError):
                    os.ftruncate(fd, size)  # no torn line for the next one to glue onto
                self._unwritable(exc)
        finally:
            os.close(fd)

    def _unwritable(self, exc: OSError) -> None:
        if not self.failed:
            self.failed = True
            log.error(
                "foreshock: cannot write the rejects file %s (%s); refused records are "
                "only counted and logged",
                self.path,
                exc,
            )


def dumps(value: Any) -> str:
    """JSON text of anything, for the rejects file (what JSON can't hold is ``repr``'d)."""
    try:
        return json.dumps(value, default=repr, separators=(",", ":"))
    except (ValueError, TypeError, RecursionError):
        return repr(value)


def loads(value: bytes) -> dict[str, Any] | None:
    """A spooled message's value as a wire message, or None if it is not one."""
    try:
        message = json.loads(value)
    except (ValueError, RecursionError):
        return None
    return message if isinstance(message, dict) and "run_id" in message else None


def _identify(message: Any, item: SpooledMessage | None) -> dict[str, Any]:
    """The fields that say which record it was, for the rejects file and the log."""
    info: dict[str, Any] = {}
    if isinstance(message, dict):
        info = {k: message[k] for k in ("run_id", "rank", "kind", "seq", "step") if k in message}
    if "run_id" not in info and item is not None:
        info["run_id"] = item.key.decode("utf-8", "replace")
    return {
        k: v if isinstance(v, int | float | str | None) else repr(v)[:200] for k, v in info.items()
    }


def size_text(n: int) -> str:
    """Bytes for a log line.

    >>> size_text(64 << 20), size_text(200_000)
    ('64 MiB', '195 KiB')
    """
    return f"{n / (1 << 20):.0f} MiB" if n >= 1 << 20 else f"{n / 1024:.0f} KiB"


def often(count: int) -> bool:
    """Log the first ten of a kind, then every hundredth: a failure on every step of a long run
    must not flood the training log."""
    return count <= 10 or count % 100 == 0
