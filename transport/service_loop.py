"""The one loop every consumer service runs: turn, until stopped or idle, then close.

Why one: the detector worker, the storage sink and the notifier each poll a batch, handle it,
flush what they made and commit; they differ only in that handling (their ``turn``). The
loop around it — trimming the heap of a process that runs for weeks, the assignment-aware
idle exit (:meth:`~foreshock.transport.consumer.MetricsConsumer.idle`), closing on the way out
whatever happened — was written three times and had already drifted (the worker's idle exit
lacked the guard the others documented as necessary). Now it is written here, once.

A turn that must end the service cleanly (the storage sink told to stop while its store
fails) raises :class:`StopServiceError`: the loop ends and ``close`` still runs.
"""

from __future__ import annotations

import threading
import time
from dataclasses import asdict, dataclass
from typing import Any, Protocol

from foreshock.memory import MemoryTrimmer

__all__ = ["ConsumerService", "ServiceStats", "StopServiceError", "run_service"]


@dataclass
class ServiceStats:
    """The base of a service's counts (a dataclass of ints: the sink's, the worker's, the
    notifier's): ``as_dict()`` is what its exit line and telemetry print."""

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


class StopServiceError(Exception):
    """Raised by a turn to end its service's loop (``close`` still runs)."""


class ConsumerService(Protocol):
    """A consumer service: its ``consumer`` (``MetricsConsumer``), one ``turn`` (poll, handle,
    flush then commit; True when a message came), and ``close`` (commit what is settled,
    release everything)."""

    consumer: Any

    def turn(self) -> bool: ...

    def close(self) -> None: ...


def run_service(
    service: ConsumerService, stop: threading.Event, idle_exit: float | None = None
) -> None:
    """Turn until ``stop`` is set, a turn raises :class:`StopServiceError`, or (``idle_exit``)
    that many seconds pass without a message since this member's assignment; then close."""
    idle_since, trimmer = time.monotonic(), MemoryTrimmer()
    try:
        while not stop.is_set():
            trimmer.maybe_trim()
            if service.turn():
                idle_since = time.monotonic()
            elif idle_exit is not None and service.consumer.idle(idle_exit, idle_since):
                break
    except StopServiceError:
        pass
    finally:
        service.close()
