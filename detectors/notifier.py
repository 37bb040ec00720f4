"""``foreshock notify``: the warnings topic to webhooks, Slack and Alertmanager — each once.

A consumer-group member of the warnings topic (key: run id, so all of a warning's events are in
one partition, in order). Each loop polls a small batch, delivers every new event to every
target (:func:`~foreshock.detectors.delivery.send`: retried with backoff up to a bound, then
counted as failed and logged — a target that is down never stops the service), and only then
commits the offsets. A crash between delivery and commit sends that batch again: delivery is at
least once, and what follows keeps the repeats to that window.

**What is sent.** A warning's ``opened`` event and its ``cleared`` event, once each. ``updated``
events (the lead time, once the loss diverged) are *not* sent by default: the engine emits one
for every warning of the run at the divergence, and again if the producer's exact divergence
step differs — a burst, when the run has already failed and its dashboard says it all. With
``updates=True`` each (warning, divergence step) is sent once; Alertmanager gets it only while
the warning is open (as a re-post of the same alert with the lead time in its annotations).
Opened and cleared events carry the lead time themselves when it is already known.

**Deduplication** (:class:`Ledger`): an ``opened`` for a warning already opened or cleared, a
second ``cleared``, and a repeated update are dropped and counted as duplicates — redeliveries,
the replay from offset 0 after a Tansu restart, a detector worker re-emitting after its own
restart. The ledger is rebuilt on start the way the detector worker rebuilds its state: on
assignment each partition is read from the beginning, events before the committed offset only
update the ledger, delivery resumes at the committed offset. So a restarted notifier (or a
second one taking over a partition) neither repeats what was sent nor loses what was not; the
cost is re-reading the retained topic, which is small (events, not metrics). A new group has no
committed offsets and delivers every event the topic still retains.

**Alertmanager** resolves an alert that is not re-posted within its ``resolve_timeout`` (5 min
by default), as Prometheus re-posts firing alerts. So every ``refresh`` seconds the warnings
open in this member's partitions are re-posted, in one list per target; Alertmanager
deduplicates them (no new notification). Not while a partition's history is still being
replayed: a warning cleared later in that history would fire again.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable
from typing import Any

from foreshock.transport.consumer import MetricsConsumer
from foreshock.transport.settings import KafkaSettings
from foreshock.transport.topics import ensure_topics

from .delivery import (
    Target,
    alertmanager_alert,
    check_event,
    send,
    slack_payload,
    webhook_payload,
)

__all__ = ["DEFAULT_DASHBOARD", "Ledger", "Notifier", "decode_warning"]

log = logging.getLogger(__name__)

DEFAULT_DASHBOARD = "http://127.0.0.1:8501"


class Ledger:
    """Which events went out: open warnings (event and start time), cleared ids, updates.

    >>> ledger = Ledger()
    >>> a = {"id": "a", "event": "opened"}
    >>> [ledger.admit(e, at=1.0) for e in (a, a, {"id": "a", "event": "updated",
    ...     "divergence_step": 9}, {"id": "a", "event": "cleared"}, {"id": "a", "event": "cleared"},
    ...     a)]
    [True, False, True, True, False, False]
    >>> ledger.open, ledger.cleared
    ({}, {'a'})
    >>> ledger.admit({"id": "b", "event": "cleared"}, at=2.0)  # its opening predates retention
    True
    """

    def __init__(self) -> None:
        self.open: dict[str, tuple[dict[str, Any], float, int | None]] = {}  # event, at, partition
        self.cleared: set[str] = set()
        self.updated: dict[str, Any] = {}  # id -> divergence step last sent

    def admit(self, event: dict[str, Any], at: float, partition: int | None = None) -> bool:
        """True the first time ``event`` should go out (and remember it); False for a repeat."""
        wid, kind = event["id"], event["event"]
        if kind == "opened":
            if wid in self.open or wid in self.cleared:
                return False
            self.open[wid] = (event, at, partition)
            return True
        if kind == "cleared":
            if wid in self.cleared:
                return False
            self.open.pop(wid, None)
            self.cleared.add(wid)
            return True
        if kind == "updated":
            if wid in self.updated and self.updated[wid] == event.get("divergence_step"):
                return False
            self.updated[wid] = event.get("divergence_step")
            if wid in self.open:
                _, started, where = self.open[wid]
                self.open[wid] = (event, started, where)
            return True
        return False

    def started(self, wid: str) -> float | None:
        """When the open warning ``wid`` opened (epoch seconds), if it is open."""
        entry = self.open.get(wid)
        return None if entry is None else entry[1]


def decode_warning(raw: Any) -> dict[str, Any]:
    """A ``foreshock.warning/1`` event with ``_time`` (the Kafka timestamp, epoch s).

    Never raises: a bad message is returned as ``{"_invalid": reason}`` and skipped. The storage
    sink reads the same topic and keeps bad messages in the dead letters; a second copy from here
    would only be noise.
    """
    import json

    try:
        event = json.loads(raw.value())
    except RecursionError:
        return {"_invalid": "warning is not JSON: nested too deeply"}
    except (TypeError, ValueError) as exc:  # a UnicodeDecodeError is a ValueError
        return {"_invalid": f"warning is not JSON: {exc}"}
    problem = check_event(event)
    if problem is not None:
        return {"_invalid": problem}
    kind, ms = raw.timestamp()
    event["_time"] = ms / 1000 if kind and ms > 0 else time.time()
    return event


class Notifier:
    """The notify service: ``run(stop)`` delivers until ``stop`` is set (or ``idle_exit``).

    ``stats``: ``delivered`` and ``failed`` count (event, target) pairs, ``duplicates`` events
    dropped as repeats, ``skipped`` updates not sent (``updates=False``), ``replayed`` history
    events read to rebuild the ledger, ``invalid`` messages that are not warning events.
    ``retries``/``backoff``/``timeout`` bound each delivery (:func:`send`); ``refresh`` is the
    Alertmanager re-post interval in seconds (0: never); ``batch`` the most events per commit.
    """

    def __init__(self, settings: KafkaSettings, targets: Iterable[Target],
                 dashboard_url: str = DEFAULT_DASHBOARD, group_id: str = "foreshock-notify",
                 updates: bool = False, retries: int = 4, backoff: float = 0.5,
                 timeout: float = 5.0, refresh: float = 60.0, batch: int = 50) -> None:  # fmt: skip
        self.targets = list(targets)
        if not self.targets:
            raise ValueError("no delivery target")
        self.settings, self.dashboard_url = settings, dashboard_url
        self.updates, self.retries, self.backoff, self.timeout = updates, retries, backoff, timeout
        self.refresh, self.batch = refresh, batch
        self.ledger = Ledger()
        self.stats = {"delivered": 0, "failed": 0, "duplicates": 0, "skipped": 0,
                      "replayed": 0, "invalid": 0}  # fmt: skip
        self._resume_at: dict[int, int] = {}  # partition -> committed offset, while replaying
        self._assigned: set[int] = set()
        self._down: set[Target] = set()  # last delivery failed: one try each until one passes
        self._stop = threading.Event()
        self._refreshed = time.monotonic()
        ensure_topics(settings)
        self.consumer = MetricsConsumer(settings, group_id, topics=[settings.warnings_topic],
                                        decoders={settings.warnings_topic: decode_warning},
                                        on_assign=self._on_assign)  # fmt: skip

    def _on_assign(self, consumer: Any, partitions: list[Any]) -> None:
        """Remember where delivery resumes; read each partition from its beginning."""
        from confluent_kafka import OFFSET_BEGINNING

        committed = consumer.committed(partitions, timeout=10)
        self._assigned = {tp.partition for tp in committed}
        self._resume_at = {tp.partition: tp.offset for tp in committed if tp.offset > 0}
        for tp in committed:
            tp.offset = OFFSET_BEGINNING
        consumer.assign(committed)

    def handle(self, message: dict[str, Any]) -> None:
        """One polled message: rebuild the ledger from history, or deliver what is new."""
        partition, offset = message.get("_partition"), message.get("_offset", 0)
        resume = self._resume_at.get(partition, 0)
        history = offset < resume  # delivered before (or given up on) by this group
        if history and offset >= resume - 1:
            del self._resume_at[partition]  # caught up: a later rewind is not history
        if "_invalid" in message:
            self.stats["invalid"] += 1
            log.debug("foreshock notify: skipped: %s", message["_invalid"])
            return
        at = message.get("_time") or time.time()
        event = {k: v for k, v in message.items() if not k.startswith("_")}
        if history:
            self.ledger.admit(event, at, partition)
            self.stats["replayed"] += 1
            return
        if event["event"] == "updated" and not self.updates:
            self.stats["skipped"] += 1
            return
        started = self.ledger.started(event["id"])
        if not self.ledger.admit(event, at, partition):
            self.stats["duplicates"] += 1
            return
        if started is None:
            started = at  # opened now, or a clearing whose opening predates retention
        for target in self.targets:
            payload = self._payload(target, event, started, at)
            if payload is not None:
                self._send(target, payload)

    def _payload(self, target: Target, event: dict[str, Any], started: float,
                 at: float) -> Any:  # fmt: skip
        if target.kind == "webhook":
            return webhook_payload(event, self.dashboard_url)
        if target.kind == "slack":
            return slack_payload(event, self.dashboard_url)
        kind = event["event"]
        if kind == "updated" and event["id"] not in self.ledger.open:
            return None  # resolved in Alertmanager already; a re-post would fire it again
        ends = at if kind == "cleared" else None
        return [alertmanager_alert(event, self.dashboard_url, started, ends)]

    def _send(self, target: Target, payload: Any) -> bool:
        retries = 0 if target in self._down or self._stop.is_set() else self.retries
        ok = send(target.endpoint, payload, retries, self.backoff, self.timeout,
                  where=target.where, sleep=self._stop.wait)  # fmt: skip
        self.stats["delivered" if ok else "failed"] += 1
        if ok:
            self._down.discard(target)
        else:
            self._down.add(target)
        return ok

    def refresh_open(self) -> int:
        """Re-post this member's open warnings to each Alertmanager; returns how many alerts."""
        self._refreshed = time.monotonic()
        if self._resume_at:
            return 0  # still replaying: the ledger may hold warnings cleared since
        alerts = [alertmanager_alert(event, self.dashboard_url, started)
                  for event, started, partition in self.ledger.open.values()
                  if partition is None or partition in self._assigned]  # fmt: skip
        if not alerts:
            return 0
        for target in self.targets:
            if target.kind == "alertmanager":
                send(target.endpoint, alerts, 0, self.backoff, self.timeout, where=target.where)
        return len(alerts)

    def run(self, stop: threading.Event, idle_exit: float | None = None) -> None:
        """Poll, deliver, commit until ``stop`` is set (or ``idle_exit`` s pass with nothing).

        A stop during a batch finishes it with one try per delivery, so the commit covers it.
        """
        self._stop = stop
        idle_since = time.monotonic()
        try:
            while not stop.is_set():
                batch = self.consumer.poll_batch(self.batch, timeout=0.5)
                for message in batch:
                    self.handle(message)
                if batch:
                    self.consumer.commit()
                    idle_since = time.monotonic()
                elif idle_exit is not None and time.monotonic() - idle_since > idle_exit:
                    break
                if self.refresh and time.monotonic() - self._refreshed >= self.refresh:
                    self.refresh_open()
        finally:
            self.consumer.commit()
            self.consumer.close()
