"""A service's own health as Prometheus metrics, served at ``http://HOST:PORT/metrics``.

:class:`ServiceTelemetry` is what the detector worker (``foreshock detect``) and the storage
sink (``foreshock sink``) expose with ``--metrics-port``. Each instance has a registry of its
own (not ``prometheus_client``'s global one), so several services can share one process — as
in the tests. Every sample carries the ``service`` label:

==========================================  =====================================================
``foreshock_messages_consumed_total``       messages handled (worker: fed to the detectors, a
                                            replay of history after a restart included; sink:
                                            stored — records, run start/end, warnings)
``foreshock_metric_values_total``           metric values in them
``foreshock_values_per_second``             the same over the last ``rate_window`` seconds
``foreshock_warnings_emitted_total``        warning events produced (worker)
``foreshock_batches_written_total``         batches written durably to the store (sink)
``foreshock_dead_letters_total``            messages this service sent to the dead-letter topic
                                            (not wire format v1)
``foreshock_dead_letters_stored_total``     dead-letter rows stored: the dead-letter topic's and
                                            messages the sink could decode but not store (sink)
``foreshock_duplicates_dropped_total``      messages dropped as already seen
``foreshock_write_retries_total``           failed store writes, retried (sink)
``foreshock_consumer_lag``                  per ``topic`` and ``partition`` assigned to this
                                            member: high watermark − position (or − committed
                                            offset before anything was consumed there)
==========================================  =====================================================

The services call :meth:`ServiceTelemetry.update` from their own loop with their running
totals (counters advance by the difference), once per batch and when idle: a few counter
increments, and every ``lag_interval`` seconds a lag refresh that reads the consumer's cached
high watermarks and positions (local, non-blocking); only a partition without a
position (nothing consumed there since the assignment) costs a broker round trip for its
committed offset, bounded by ``lag_timeout``.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import threading
import time
from collections import deque
from typing import Any

__all__ = ["MetricsPortError", "ServiceTelemetry", "add_metrics_options"]

log = logging.getLogger(__name__)


class MetricsPortError(OSError):
    """The metrics endpoint could not bind its address (e.g. the port is in use)."""


# update() keyword → (metric name without the _total suffix, help text)
_COUNTERS: dict[str, tuple[str, str]] = {
    "messages": ("foreshock_messages_consumed", "Messages consumed and handled"),
    "values": ("foreshock_metric_values", "Metric values in the messages handled"),
    "warnings": ("foreshock_warnings_emitted", "Warning events produced"),
    "batches": ("foreshock_batches_written", "Batches written durably to the store"),
    "dead_letters": ("foreshock_dead_letters", "Messages sent to the dead-letter topic"),
    "dead_letters_stored": ("foreshock_dead_letters_stored", "Dead-letter rows stored"),
    "duplicates": ("foreshock_duplicates_dropped", "Messages dropped as already seen"),
    "write_retries": ("foreshock_write_retries", "Failed store writes (retried)"),
}


class ServiceTelemetry:
    """The metrics of one service, in a registry of its own; served when ``port`` is given.

    ``port=0`` binds a free port (then see :attr:`port`). ``host`` defaults to the loopback
    interface: pass ``"0.0.0.0"`` (``--metrics-host``) for a Prometheus on another machine.

    >>> t = ServiceTelemetry("doc", port=None)
    >>> t.update(messages=3, values=120, duplicates=1)
    >>> t.update(messages=5, values=200, duplicates=1)
    >>> t.sample("foreshock_messages_consumed_total"), t.sample("foreshock_metric_values_total")
    (5.0, 200.0)
    >>> t.sample("foreshock_warnings_emitted_total") is None  # never reported: not exposed
    True
    """

    def __init__(
        self,
        service: str,
        port: int | None = None,
        host: str = "127.0.0.1",
        lag_interval: float = 5.0,
        lag_timeout: float = 0.5,
        rate_window: float = 10.0,
    ) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge

        self.service = service
        self.lag_interval, self.lag_timeout = lag_interval, lag_timeout
        self.rate_window = rate_window
        self.registry = CollectorRegistry()
        self._counters = {
            key: Counter(name, text, ["service"], registry=self.registry)
            for key, (name, text) in _COUNTERS.items()
        }
        self._children: dict[str, Any] = {}  # created on first report: absent metrics stay out
        self._totals: dict[str, float] = {}
        self._lock = threading.Lock()
        self._samples: deque[tuple[float, float]] = deque([(time.monotonic(), 0.0)])
        rate = Gauge(
            "foreshock_values_per_second",
            "Metric values handled per second over a sliding window",
            ["service"],
            registry=self.registry,
        )
        rate.labels(service).set_function(self._rate)
        self._lag = Gauge(
            "foreshock_consumer_lag",
            "Messages not yet consumed: high watermark "
            "minus position, per assigned topic-partition",
            ["service", "topic", "partition"],
            registry=self.registry,
        )
        self._lag_keys: set[tuple[str, int]] = set()
        self._lag_at = float("-inf")
        self.host, self.port = host, None
        self._server: Any = None
        self._thread: threading.Thread | None = None
        if port is not None:
            from prometheus_client import start_http_server

            try:
                self._server, self._thread = start_http_server(
                    port, addr=host, registry=self.registry
                )
            except OSError as exc:
                raise MetricsPortError(
                    exc.errno, f"cannot serve metrics at {host}:{port}: {exc.strerror or exc}"
                ) from exc
            self.port = self._server.server_port

    @property
    def url(self) -> str | None:
        """Where the metrics are served (None when not served)."""
        if self.port is None:
            return None
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/metrics"

    def update(self, consumer: Any = None, **totals: float) -> None:
        """Report running totals (keywords: ``messages``, ``values``, ``warnings``, ``batches``,
        ``dead_letters``, ``dead_letters_stored``, ``duplicates``, ``write_retries``); with a
        ``consumer`` (a :class:`~foreshock.transport.consumer.MetricsConsumer` or a
        confluent-kafka ``Consumer``), refresh the lag if ``lag_interval`` has passed.

        Call it from the thread that owns the consumer. A total that went down (a counter
        reset by the service) starts counting again from there.
        """
        for key, total in totals.items():
            if total is None:
                continue
            child = self._children.get(key)
            if child is None:
                child = self._children[key] = self._counters[key].labels(self.service)
            delta = total - self._totals.get(key, 0)
            if delta > 0:
                child.inc(delta)
            self._totals[key] = total
        values = totals.get("values")
        if values is not None:
            self._observe_values(values)
        if consumer is not None:
            self.refresh_lag(consumer)

    def _observe_values(self, total: float) -> None:
        now = time.monotonic()
        with self._lock:
            self._samples.append((now, total))
            self._prune(now)

    def _prune(self, now: float) -> None:
        """Keep the samples of the window plus the newest one before it (the baseline)."""
        samples = self._samples
        while len(samples) >= 2 and samples[1][0] <= now - self.rate_window:
            samples.popleft()

    def _rate(self) -> float:
        now = time.monotonic()
        with self._lock:
            self._prune(now)
            (t0, v0), (_, v1) = self._samples[0], self._samples[-1]
        return (v1 - v0) / max(now - t0, 1.0)

    def refresh_lag(self, consumer: Any, force: bool = False) -> None:
        """Set the lag gauges from ``consumer``'s assignment (at most every ``lag_interval``
        seconds unless ``force``); partitions no longer assigned are removed. Never raises."""
        now = time.monotonic()
        if not force and now - self._lag_at < self.lag_interval:
            return
        self._lag_at = now
        try:
            lags = self._read_lag(getattr(consumer, "_consumer", consumer))
        except Exception as exc:  # the broker away, a rebalance, a closed consumer
            log.debug("foreshock telemetry: lag not refreshed: %s", exc)
            return
        for (topic, partition), lag in lags.items():
            if lag is not None:
                self._lag.labels(self.service, topic, str(partition)).set(lag)
                self._lag_keys.add((topic, partition))
        for topic, partition in self._lag_keys - lags.keys():  # revoked: no longer ours
            with contextlib.suppress(KeyError):
                self._lag.remove(self.service, topic, str(partition))
            self._lag_keys.discard((topic, partition))

    def _read_lag(self, kc: Any) -> dict[tuple[str, int], int | None]:
        """(topic, partition) → lag, or None where it cannot be read yet.

        The high watermarks are the consumer's cached ones (from its last fetch response: no
        round trip). A partition not fetched since it was assigned has none yet and is left
        out until it has — a broker query (``cached=False``) is no substitute: the embedded
        broker (Tansu) answers it with the last record *batch*'s base offset + 1, not the end
        of the log.
        """
        assigned = kc.assignment()
        if not assigned:
            return {}
        out: dict[tuple[str, int], int | None] = {}
        marks, unread = {}, []
        for tp in kc.position(assigned):
            key = (tp.topic, tp.partition)
            out[key] = None
            low, high = kc.get_watermark_offsets(tp, cached=True) or (-1, -1)
            if high < 0:
                continue
            marks[key] = (low, high)
            if tp.offset >= 0:
                out[key] = max(high - tp.offset, 0)
            else:
                unread.append(tp)
        if unread:  # nothing consumed there since the assignment: count from the committed
            try:
                committed = kc.committed(unread, timeout=self.lag_timeout)
            except Exception as exc:  # e.g. the broker away: these stay as they were
                log.debug("foreshock telemetry: committed offsets: %s", exc)
                committed = []
            for tp in committed:
                key = (tp.topic, tp.partition)
                low, high = marks[key]
                start = tp.offset if tp.offset >= 0 else low  # none: from the beginning
                if start >= 0:
                    out[key] = max(high - start, 0)
        return out

    def sample(self, name: str, **labels: str) -> float | None:
        """The value of one sample of this service (for tests and the doctest)."""
        return self.registry.get_sample_value(name, {"service": self.service, **labels})

    def close(self) -> None:
        """Stop serving (the port is free again). The registry stays readable."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(5)
            self._thread = None


def add_metrics_options(parser: argparse.ArgumentParser) -> None:
    """``--metrics-port`` and ``--metrics-host`` of a service's command line."""
    parser.add_argument(
        "--metrics-port",
        type=int,
        metavar="PORT",
        help="serve Prometheus metrics at http://HOST:PORT/metrics "
        "(default: off; 0 picks a free port)",
    )
    parser.add_argument(
        "--metrics-host",
        default="127.0.0.1",
        metavar="HOST",
        help="address the metrics endpoint binds (default 127.0.0.1: this "
        "machine only; 0.0.0.0 for a Prometheus elsewhere)",
    )
