"""``foreshock notify``: the warnings topic to webhooks, Slack and Alertmanager — each transition
once, each receiver on its own.

A consumer-group member of the warnings topic (key: run id, so all of a warning's events are in
one partition, in order). Each loop polls a small batch and queues every new event for every
receiver; each receiver has a courier (:mod:`foreshock.notify.courier`: a thread, a bounded
queue, retries with backoff and jitter), so a receiver that is down or hangs delays no other
one. A message's offset is committed once every courier has settled it (delivered, refused,
given up on): a crash, or a receiver still retrying at a restart, sends that window again —
delivery is at least once, and what follows keeps the repeats to that window.

**What is sent** (states: :mod:`foreshock.detectors.alerts`). A warning's ``opened`` event and
its ``cleared`` event (resolved: its statistic back under the threshold, or its run ended), once
each; a person's ``acknowledged`` and ``silenced``, once each, while the warning is not resolved.
``updated`` events (the lead time, once the loss diverged) are *not* sent by default: the engine
emits one for every warning of the run at the divergence, and again if the producer's exact
divergence step differs — a burst, when the run has already failed and its dashboard says it
all. With ``updates=True`` each (warning, divergence step) is sent once, except to Slack and
webhooks while the warning is silenced; Alertmanager gets it only while the warning is open
(as a re-post of the same alert with the lead time in its annotations).

How each receiver sees a warning:

====================  =====================  ======================  =========================
state                 webhook                Slack                   Alertmanager
====================  =====================  ======================  =========================
open                  the event,             ":rotating_light: …     an alert (labels: family,
                      ``state: open``        opened"                 module, run), re-posted
                                                                     every ``refresh`` s
acknowledged          the event,             ":eyes: … acknowledged  a silence of that alert
                      ``state:               by NAME"                by NAME, renewed while the
                      acknowledged``                                 warning is open
silenced until T      the event,             ":mute: … silenced by   a silence of that alert
                      ``state: silenced``    NAME until T"           by NAME until T
resolved              the event,             ":white_check_mark: …   the alert with ``endsAt``;
                      ``state: resolved``,   resolved …: the run     re-posting stops, its
                      ``resolved_by``        ended"                  silences are expired
====================  =====================  ======================  =========================

**Deduplication** (:class:`Ledger`): an ``opened`` for a warning already opened or resolved, a
second ``cleared``, a repeated update and a person's event already seen (its ``action_id``) are
dropped and counted as duplicates — redeliveries, the replay from offset 0 after a Tansu
restart, a detector worker re-emitting after its own restart. The ledger is rebuilt on start
the way the detector worker rebuilds its state: on assignment each partition is read from the
beginning, events before the committed offset only update the ledger, delivery resumes at the
committed offset. So a restarted notifier (or a second one taking over a partition) neither
repeats what was sent nor loses what was not; the cost is re-reading the retained topic, which
is small (events, not metrics). A new group has no committed offsets and delivers every event
the topic still retains.

**Alertmanager** resolves an alert that is not re-posted within its ``resolve_timeout`` (5 min
by default), as Prometheus re-posts firing alerts. So every ``refresh`` seconds the warnings
open in this member's partitions are re-posted, in one list per target (at most one such list
queued per target); Alertmanager deduplicates them (no new notification). Not while a
partition's history is still being replayed: a warning resolved later in that history would
fire again. An acknowledgement's silence lasts ``ack_horizon`` seconds and is renewed by the
re-posts while the warning stays open, so it lapses by itself if nobody renews it; a resolved
warning's silences are expired at once. A restarted notifier reads the ids of the silences it
made back from Alertmanager (:mod:`~foreshock.notify.known_silences`), so it extends and
expires them as if it had never stopped.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any

from foreshock.transport.checkpoint import Checkpoint, ReplayCursor
from foreshock.transport.consumer import MetricsConsumer
from foreshock.transport.envelope import Consumed, SkippedMessageError
from foreshock.transport.service_loop import run_service
from foreshock.transport.settings import KafkaSettings
from foreshock.transport.topics import wait_for_topics
from foreshock.transport.warning import PERSON_EVENTS, WarningEvent, decode_event
from foreshock.transport.wire import WireError

from .courier import Courier, Job
from .delivery import Target
from .ledger import Ledger
from .receivers import Receiver, receiver_for
from .stats import NotifierStats

__all__ = ["DEFAULT_DASHBOARD", "Notifier", "NotifyConfig", "decode_warning"]

log = logging.getLogger(__name__)

DEFAULT_DASHBOARD = "http://127.0.0.1:8501"


def decode_warning(raw: Any) -> WarningEvent:
    """A ``foreshock.warning/1`` event, typed; a bad message is skipped (counted as ``invalid``:
    :class:`~foreshock.transport.envelope.SkippedMessageError`), not dead-lettered: the storage
    sink reads the same topic and keeps bad messages in the dead letters, and a second copy
    from here would only be noise."""
    try:
        return decode_event(raw.value())
    except WireError as exc:
        raise SkippedMessageError(str(exc)) from None


@dataclass(frozen=True)
class NotifyConfig:
    """How a notifier runs (``foreshock notify`` builds it from its flags and the settings
    file's ``[[notify.receivers]]``).

    Each delivery is tried within ``timeout`` s, retried with backoff from ``backoff`` s (at
    most ``max_delay`` apart) for up to ``patience`` s — and at most ``retries`` times, if set;
    ``capacity`` bounds each receiver's queue; ``refresh`` is the Alertmanager re-post interval
    in seconds (0: never); ``batch`` the most events per poll; ``drain`` how long a stop gives
    the queues (one try each); ``updates``: also send ``updated`` events.

    >>> NotifyConfig([]).targets
    Traceback (most recent call last):
    ...
    ValueError: no delivery target
    """

    targets: Iterable[Target]
    dashboard_url: str = DEFAULT_DASHBOARD
    group_id: str = "foreshock-notify"
    updates: bool = False
    retries: int | None = None
    backoff: float = 0.5
    timeout: float = 5.0
    refresh: float = 60.0
    batch: int = 50
    patience: float = 900.0
    max_delay: float = 60.0
    capacity: int = 1000
    drain: float = 10.0

    def __post_init__(self) -> None:
        targets = tuple(dict.fromkeys(self.targets))  # each receiver once
        if not targets:
            raise ValueError("no delivery target")
        object.__setattr__(self, "targets", targets)


class Notifier:
    """The notify service: ``run(stop)`` delivers until ``stop`` is set (or ``idle_exit``).

    ``stats``: a snapshot of its counts (``stats.NotifierStats``). Per receiver:
    ``couriers[target].stats``.
    """

    def __init__(self, settings: KafkaSettings, config: NotifyConfig) -> None:
        self.settings, self.config, self.targets = settings, config, list(config.targets)
        self.dashboard_url, self.updates = config.dashboard_url, config.updates
        refresh = self.refresh = config.refresh
        self.ack_horizon = max(3 * refresh, 600.0) if refresh else 86_400.0
        self.ledger = Ledger()
        self._stats = NotifierStats()
        self._lock = threading.Lock()  # couriers settle jobs from their own threads
        self.cursor = ReplayCursor()
        self._assigned: set[int] = set()
        self._committed: dict[int, int] = {}  # partition -> offset committed (or found)
        self._handled: dict[int, int] = {}  # partition -> 1 + the last offset handled
        self._pending: dict[int, dict[int, int]] = {}  # partition -> offset -> jobs unsettled
        self._refreshed = time.monotonic()
        wait_for_topics(settings, "notify")  # the broker may start later
        self.consumer = MetricsConsumer(
            settings,
            config.group_id,
            topics=[settings.warnings_topic],
            decoders={settings.warnings_topic: decode_warning},
            on_assign=self._on_assign,
        )
        c = config
        self.couriers = {
            t: Courier(t, c.timeout, c.backoff, c.max_delay, c.patience, c.retries, c.capacity)
            for t in self.targets
        }
        self.receivers: dict[Target, Receiver] = {
            t: receiver_for(t, self.dashboard_url, self.ack_horizon, self.couriers[t].submit)
            for t in self.targets
        }
        # step 1 is the couriers': an offset is committed once they settled its message
        self.checkpoint = Checkpoint(self.consumer, "notify")
        for receiver in self.receivers.values():  # silences an earlier notifier made
            recover = getattr(receiver, "recover", None)
            if recover is not None:
                recover(self.config.timeout)

    @property
    def stats(self) -> NotifierStats:
        reposts = sum(getattr(r, "reposts", 0) for r in self.receivers.values())
        with self._lock:
            return replace(self._stats, refreshed=reposts)

    def _on_assign(self, consumer: Any, partitions: list[Any]) -> None:
        """Remember where delivery resumes; read each partition from its beginning."""
        committed = self.cursor.replay_from_start(consumer, partitions)
        with self._lock:
            self._assigned = {tp.partition for tp in committed}
            for tp in committed:
                self._committed[tp.partition] = max(tp.offset, 0)
                self._handled.pop(tp.partition, None)

    def handle(self, consumed: Consumed) -> None:
        """One polled message: rebuild the ledger from history, or queue what is new."""
        partition, offset = consumed.partition, consumed.offset
        try:
            self._handle(consumed, partition, offset)
        finally:
            if partition is not None:
                with self._lock:
                    self._handled[partition] = max(self._handled.get(partition, 0), offset + 1)

    def _handle(self, consumed: Consumed, partition: int, offset: int) -> None:
        history = self.cursor.history(partition, offset)  # sent (or given up on) before
        if consumed.invalid is not None:
            self._count("invalid")
            log.debug("foreshock notify: skipped: %s", consumed.invalid)
            return
        at = consumed.time or time.time()
        event: WarningEvent = consumed.message  # decode_warning's
        if history:
            self.ledger.admit(event, at, partition)
            self._count("replayed")
            return
        wid, kind = event.id, event.event
        if kind == "updated" and not self.updates:
            self._count("skipped")
            return
        if kind in PERSON_EVENTS and wid in self.ledger.cleared:
            self._count("skipped")  # stored by the sink; nothing to tell a receiver
            return
        started, muted = self.ledger.started(wid), self.ledger.muted(wid, time.time())
        if not self.ledger.admit(event, at, partition):
            self._count("duplicates")
            return
        if started is None:
            started = at  # opened now, or a resolve whose opening predates retention
        jobs = []
        for target, receiver in self.receivers.items():
            try:
                open_ = wid in self.ledger.open
                jobs += [(target, j) for j in receiver.jobs(event, started, at, muted, open_)]
            except Exception:  # a payload we cannot build is our bug: log it, never stop
                log.exception(
                    "foreshock notify: %s: cannot build the %s event of warning %s",
                    target.where,
                    event.event,
                    event.id,
                )
                self._count("failed")
        self._dispatch(jobs, partition, offset)

    def _dispatch(self, jobs: list[tuple[Target, Job]], partition: int, offset: int) -> None:
        """Queue ``jobs``; the message's offset stays uncommitted until all are settled."""
        if partition is not None and jobs:
            with self._lock:
                self._pending.setdefault(partition, {})[offset] = len(jobs)
        for target, job in jobs:
            job.done = self._settler(job.done, partition, offset)
            self.couriers[target].submit(job)

    def _settler(self, inner: Any, partition: int, offset: int) -> Any:
        def settle(delivered: bool, answer: Any) -> None:
            if inner is not None:
                inner(delivered, answer)
            with self._lock:
                if delivered:
                    self._stats.delivered += 1
                else:
                    self._stats.failed += 1
                waiting = self._pending.get(partition, {})
                if offset in waiting:
                    waiting[offset] -= 1
                    if waiting[offset] <= 0:
                        del waiting[offset]

        return settle

    def _count(self, name: str) -> None:
        """One more of ``name`` (a ``NotifierStats`` field), under the couriers' lock."""
        with self._lock:
            setattr(self._stats, name, getattr(self._stats, name) + 1)

    def commit(self) -> None:
        """Commit, per partition, up to the first message some courier has not settled."""
        offsets = self._settled()
        if self.checkpoint.commit(offsets):
            with self._lock:
                for tp in offsets:
                    self._committed[tp.partition] = max(
                        self._committed.get(tp.partition, 0), tp.offset
                    )

    def _settled(self) -> list[Any]:
        """Per assigned partition whose position moved, the first offset not yet settled."""
        from confluent_kafka import TopicPartition

        offsets = []
        with self._lock:
            for partition, handled in self._handled.items():
                if partition not in self._assigned:
                    continue
                waiting = self._pending.get(partition)
                position = min(waiting) if waiting else handled
                if position > self._committed.get(partition, 0):
                    offsets.append(
                        TopicPartition(self.settings.warnings_topic, partition, position)
                    )
        return offsets

    def refresh_open(self) -> int:
        """Queue what each receiver re-sends for this member's open warnings (Alertmanager:
        a re-post of the alerts, renewed acknowledgement silences); returns how many open."""
        self._refreshed = time.monotonic()
        if self.cursor.replaying:
            return 0  # still replaying: the ledger may hold warnings resolved since
        mine = {
            wid: (event, started)
            for wid, (event, started, partition) in self.ledger.open.items()
            if partition is None or partition in self._assigned
        }
        for target, receiver in self.receivers.items():
            for job in receiver.refresh(mine, dict(self.ledger.acked)):
                self.couriers[target].submit(job)
        return len(mine)

    def wait_idle(self, timeout: float) -> bool:
        """Wait until every courier has settled what it was given (tests, a graceful stop)."""
        deadline = time.monotonic() + timeout
        return all(
            c.wait_idle(max(deadline - time.monotonic(), 0.0)) for c in self.couriers.values()
        )

    def run(self, stop: threading.Event, idle_exit: float | None = None) -> None:
        """Poll, queue, commit until ``stop`` is set (or ``idle_exit`` s pass with nothing).

        On the way out each courier gets ``drain`` s to try what it holds once; what is left
        stays uncommitted, for the next notifier.
        """
        run_service(self, stop, idle_exit)

    def turn(self) -> bool:
        """One batch: queue it for the couriers, commit what they settled, re-post the open
        warnings when due; True when a message came."""
        batch = self.consumer.poll_batch(self.config.batch, timeout=0.5)
        for consumed in batch:
            self.handle(consumed)
        self.commit()
        if self.refresh and time.monotonic() - self._refreshed >= self.refresh:
            self.refresh_open()
        return bool(batch)

    def close(self) -> None:
        """Stop the couriers (``drain`` s, one try each), commit what they settled, leave."""
        for courier in self.couriers.values():
            courier.stop(self.config.drain)
        for courier in self.couriers.values():
            courier.join(self.config.drain + courier.timeout + 1.0)
        self.commit()
        self.consumer.close()
