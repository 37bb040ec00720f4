"""How a storage sink runs: one frozen config (``foreshock sink`` builds it from its flags and
the settings file); the steps it names are :mod:`.sink`'s."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .location import RETAIN_HOURS, StoreLocation

__all__ = ["SinkConfig"]


@dataclass(frozen=True)
class SinkConfig:
    """How a sink runs (``foreshock sink`` builds it from its flags and the settings file).

    ``root``: the store (a folder, a URI, a :class:`StoreLocation`; None: the settings'
    ``[store]``). Steps 1 and 5 of :mod:`.sink`: ``batch_values``, ``max_wait``, ``compact_every``,
    ``retention_days``, ``retain_hours``. ``metrics_port``: serve the sink's health at
    ``http://metrics_host:PORT/metrics`` (:class:`~foreshock.telemetry.ServiceTelemetry`; 0
    picks a free port; None: off).
    """

    root: str | Path | StoreLocation | None
    group_id: str = "foreshock-sink"
    writer_window: float = 600.0  # s: another group's commit this recent refuses the start
    take_over: bool = False  # start although another group wrote within the window
    batch_values: int = 500_000
    hold_values: int = 5_000_000  # values held for a table that fails, before reading stops
    max_wait: float = 1.0
    compact_every: float = 30.0
    retention_days: float | None = None
    retain_hours: float = RETAIN_HOURS
    metrics_port: int | None = None
    metrics_host: str = "127.0.0.1"
