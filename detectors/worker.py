"""The live detector service: a Kafka consumer-group member from metrics to warnings.

Several workers share the metrics topic's partitions (a run's messages are keyed by run id, so
one worker sees all of a run). For each message the worker calls the same
:class:`~foreshock.detectors.streams.RunStreams` (one detector per rank of the run) as the
offline replay and produces the events to the warnings topic (key: run id), then commits its
offsets once they are acknowledged.

State after a restart is rebuilt by *replay*: on assignment the worker reads its partitions
from the beginning, feeding every message to the detectors but emitting warnings only for
messages at or after the committed offset. Detector state is a pure function of a run's
messages and warning ids are deterministic, so the warnings after a kill and restart are the
ones an uninterrupted worker emits. The cost is re-reading retained history (the topic's
retention bounds it); a checkpoint would trade that for state that can go stale.

A broker that restarts without its data (the embedded Tansu keeps everything in memory) has
forgotten the committed offsets and the warnings it held. The consumer rewinds; the worker then
stops treating anything as history (the new topic's offsets start again at 0, below the old
resume points) and re-sends its most recent ``resend_window`` warning events, since the sink
may not have stored them yet. Their ids are deterministic, so the sink and the notifier drop
the ones they already have.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from foreshock.transport.checkpoint import Checkpoint, ReplayCursor
from foreshock.transport.clients import topic_producer
from foreshock.transport.consumer import MetricsConsumer
from foreshock.transport.envelope import Consumed
from foreshock.transport.service import as_config
from foreshock.transport.service_loop import ServiceStats, run_service
from foreshock.transport.settings import KafkaSettings
from foreshock.transport.topics import ensure_topics, wait_for_topics

from .config import DetectorConfig
from .ordering import SeqOrderer
from .profile_switch import MAX_KEPT, switch
from .profiles import ProfileConfigs
from .streams import RunStreams

__all__ = ["DetectorWorker", "WorkerConfig", "WorkerStats"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class WorkerConfig:
    """How a detector worker runs (``foreshock detect`` builds it from its flags).

    ``detectors``: the detector config (one, or one per profile). ``metrics_port``: serve the
    worker's health at ``http://metrics_host:PORT/metrics``
    (:class:`~foreshock.telemetry.ServiceTelemetry`; 0 picks a free port; None: off).
    ``resend_window``: the warning events re-sent after a broker forgot its data.
    ``reload``: called every ``reload_every`` seconds for the detectors' config as it is now
    (``foreshock detect --store``: the store's live config and published profiles), so a
    profile published while the worker runs judges the runs that start after it, and the live
    runs judged by the fallback switch to it at a record boundary
    (:mod:`~foreshock.detectors.profile_switch`; each switch is handed to ``on_switch``, the
    store's profile lineage under ``--store``). ``keep_ended``: how many ended
    runs' detectors are kept (newest), so that a run preempted gracefully and resumed
    carries on warm instead of starting cold. ``build_profiles``: called in a thread of its
    own ``build_after`` seconds after runs ended (``foreshock detect --store``: the store's
    profile builder, :mod:`~foreshock.operate.profile_builder`); it returns the ids of the
    runs the store holds as ended, and a run it does not yet (the sink lags) is tried again
    ``build_after`` later. A profile it publishes is loaded at once, for the runs that start
    after it.
    """

    detectors: DetectorConfig | ProfileConfigs
    group_id: str = "foreshock-detectors"
    metrics_port: int | None = None
    metrics_host: str = "127.0.0.1"
    resend_window: int = 10_000
    reload: Callable[[], DetectorConfig | ProfileConfigs] | None = None
    reload_every: float = 30.0
    keep_ended: int = 64
    build_profiles: Callable[[], set[str]] | None = None
    build_after: float = 30.0
    on_switch: Callable[[dict[str, Any]], None] | None = None


@dataclass
class WorkerStats(ServiceStats):
    """Counts since the worker started, for its telemetry and its exit line. One dataclass, as
    the sink's (:class:`~foreshock.storage.sink_stats.SinkStats`), rather than loose
    attributes: a miscounted name is an AttributeError at once, not a new zero nobody reads.

    >>> stats = WorkerStats(messages=3, values=120)
    >>> stats.warnings += 2
    >>> stats.as_dict()
    {'messages': 3, 'values': 120, 'warnings': 2, 'resent': 0, 'switched': 0}
    """

    messages: int = 0  # messages fed to the detectors (history replayed on assignment too)
    values: int = 0  # metric values in them
    warnings: int = 0  # warning events produced
    resent: int = 0  # warning events re-sent after the broker forgot its data
    switched: int = 0  # live runs moved to a profile published while they trained


class DetectorWorker:
    """The detect service: ``run(stop)`` consumes metrics and produces warning events.

    ``DetectorWorker(settings, detectors, group_id=…)`` (the keywords of :class:`WorkerConfig`)
    is the same as ``DetectorWorker(settings, WorkerConfig(detectors, group_id=…))``.
    """

    def __init__(
        self,
        settings: KafkaSettings,
        config: WorkerConfig | DetectorConfig | ProfileConfigs,
        **options: Any,
    ) -> None:
        self.settings = settings
        self.config = config = as_config(WorkerConfig, config, options)
        self.telemetry = None  # first: a port in use fails before anything else is opened
        if config.metrics_port is not None:
            from foreshock.telemetry import ServiceTelemetry

            self.telemetry = ServiceTelemetry("detector", config.metrics_port, config.metrics_host)
        wait_for_topics(settings, "detect")  # the broker may start later
        self.cursor = ReplayCursor()
        self._recent: deque[tuple[bytes, bytes]] = deque(maxlen=config.resend_window)
        self.stats = WorkerStats()  # before the consumer: its rewind callback counts re-sends
        self.consumer = MetricsConsumer(
            settings, config.group_id, on_assign=self._on_assign, on_rewind=self._on_rewind
        )
        self.producer = topic_producer(
            settings, {"acks": "all", "linger.ms": 20, "allow.auto.create.topics": False}
        )
        self.runs: dict[str, RunStreams] = {}
        self._ended: OrderedDict[str, RunStreams] = OrderedDict()  # oldest first
        self.detectors = config.detectors
        self._reloaded = time.monotonic()
        self.checkpoint = Checkpoint(
            self.consumer, "detect", flush=lambda: self.producer.flush(30) == 0
        )
        self.orderer: SeqOrderer[Consumed] = SeqOrderer(message_of=lambda c: c.message)
        self.seconds = {"consume+decode": 0.0, "detect": 0.0, "produce+commit": 0.0}
        self._unbuilt: set[str] = set()  # ended runs the profile builder has not seen stored
        self._ended_at = 0.0  # monotonic time of the last run end (the builder waits after)
        self._builder: threading.Thread | None = None

    # The counts as they were read before ``stats`` held them (the benchmarks, the tests).
    @property
    def messages(self) -> int:
        return self.stats.messages

    @property
    def values(self) -> int:
        return self.stats.values

    @property
    def warnings(self) -> int:
        return self.stats.warnings

    def _on_assign(self, consumer: Any, partitions: list[Any]) -> None:
        """Remember where to resume emitting; read each partition from its beginning."""
        self.cursor.replay_from_start(consumer, partitions)

    def _on_rewind(self, found: list[tuple[int, int]]) -> None:
        """After the broker was away: resume emitting at the committed offsets it still knows
        (0 where it forgot them), and re-send the recent warnings if it forgot anything."""
        self.cursor.resume_at(found)
        if any(offset < 0 for _, offset in found):
            for key, value in self._recent:
                self._produce(key, value)
            self.stats.resent += len(self._recent)
            log.info(
                "foreshock detect: broker restarted; re-sent %d recent warning events",
                len(self._recent),
            )

    def process(self, consumed: Consumed) -> int:
        """Feed one message (and any it released) to its run; produce events. Returns count."""
        produced = 0
        for ready_at in self.orderer.push(consumed):
            ready = ready_at.message
            run_id = ready["run_id"]
            detectors = self.runs.get(run_id) or self.runs.setdefault(
                run_id, self._revived(run_id) or self._new_run(run_id)
            )
            events = detectors.update(ready)
            if detectors.ended:  # a fleet served for weeks must not keep every run it saw,
                self._ended[run_id] = self.runs.pop(run_id)  # but a resume needs the last few
                while len(self._ended) > self.config.keep_ended:
                    self._ended.popitem(last=False)
            self.stats.messages += 1
            self.stats.values += len(ready.get("values", ()))
            if self.cursor.history(ready_at.partition, ready_at.offset):
                continue  # replaying history: state only, these warnings were emitted before
            if detectors.ended and self.config.build_profiles is not None:
                self._unbuilt.add(run_id)
                self._ended_at = time.monotonic()
            for event in events:
                key, value = run_id.encode(), json.dumps(event.to_message()).encode()
                self._produce(key, value)
                self._recent.append((key, value))
                produced += 1
        self.producer.poll(0)
        return produced

    def _new_run(self, run_id: str) -> RunStreams:
        """A run's detectors; kept messages for a switch where a reload may publish a profile."""
        keep = MAX_KEPT if self.config.reload is not None else 0
        return RunStreams(run_id, self.detectors, keep=keep)

    def _revived(self, run_id: str) -> RunStreams | None:
        """An ended run's detectors, taken back when the run goes on (a resume), else None."""
        return self._ended.pop(run_id) if run_id in self._ended else None

    def _produce(self, key: bytes, value: bytes) -> None:
        """Queue one warning event; while the client refuses it (queue full, or the topic is
        gone with a restarted broker) serve callbacks, re-create the topics and try again."""
        from confluent_kafka import KafkaException

        for attempt in itertools.count():
            try:
                self.producer.produce(self.settings.warnings_topic, key=key, value=value)
                return
            except (BufferError, KafkaException) as exc:
                if attempt % 20 == 0:
                    log.warning("foreshock detect: cannot queue a warning yet (%s); retrying", exc)
                self.producer.poll(0.5)
                with contextlib.suppress(Exception):
                    ensure_topics(self.settings, timeout=2.0)

    def run(self, stop: threading.Event, idle_exit: float | None = None) -> None:
        """Consume until ``stop`` is set (or ``idle_exit`` seconds pass with nothing new)."""
        run_service(self, stop, idle_exit)

    def turn(self) -> bool:
        """One batch: detect, emit, commit (:func:`~foreshock.transport.service_loop.
        run_service` turns it); True when a message came."""
        self.refresh()
        t0 = time.perf_counter()
        batch = self.consumer.poll_batch(1000, timeout=0.5)
        t1 = time.perf_counter()
        for consumed in batch:
            self.stats.warnings += self.process(consumed)
        t2 = time.perf_counter()
        if batch:
            self.checkpoint.commit()
            self.seconds["consume+decode"] += t1 - t0
            self.seconds["detect"] += t2 - t1
            self.seconds["produce+commit"] += time.perf_counter() - t2
        self._report()
        return bool(batch)

    def close(self) -> None:
        """Commit what is emitted, report, release the consumer and the metrics server."""
        self.checkpoint.commit(final=True)
        self._report(final=True)
        self.consumer.close()
        if self.telemetry is not None:
            self.telemetry.close()

    def refresh(self) -> None:
        """Every ``reload_every`` seconds, the config ``reload`` gives now; a bad one is
        logged and the current one kept (detection never stops for a broken file)."""
        self._build_profiles()
        reload = self.config.reload
        if reload is None or time.monotonic() - self._reloaded < self.config.reload_every:
            return
        self._reloaded = time.monotonic()
        try:
            fresh = reload()
        except Exception as exc:  # a half-written or altered file: keep judging by the last
            log.warning("foreshock detect: detector config not reloaded (%s)", exc)
            return
        if fresh.version != self.detectors.version:
            log.info("foreshock detect: detector config %s (new runs)", fresh.version)
            self.detectors = fresh
        self._switch_live()

    def _switch_live(self) -> None:
        """Live runs judged by the fallback move to a profile the config now has for them
        (:mod:`~foreshock.detectors.profile_switch`); one with an open warning waits."""
        for run_id, run in list(self.runs.items()):
            moved = switch(run, self.detectors)
            if moved is None:
                continue
            self.runs[run_id], event = moved
            self.stats.switched += 1
            log.info(
                "foreshock detect: run %s now judged by profile %s (was %s) after step %s",
                run_id, event.to_profile, event.from_profile, event.step,
            )  # fmt: skip
            if self.config.on_switch is not None:
                try:
                    self.config.on_switch(event.to_dict())
                except Exception as exc:  # a store being repaired: detection goes on
                    log.warning("foreshock detect: switch of %s not recorded (%s)", run_id, exc)

    def _build_profiles(self) -> None:
        """Start the profile builder in a thread once runs ended ``build_after`` seconds ago
        (one at a time; detection goes on meanwhile)."""
        if (
            not self._unbuilt
            or (self._builder is not None and self._builder.is_alive())
            or time.monotonic() - self._ended_at < self.config.build_after
        ):
            return
        self._ended_at = time.monotonic()  # a run the store lacks yet: again build_after later
        self._builder = threading.Thread(target=self._build, name="profile-builder", daemon=True)
        self._builder.start()

    def _build(self) -> None:
        build = self.config.build_profiles
        assert build is not None
        try:
            stored = build()
        except Exception as exc:  # a store being repaired: detection goes on, try again later
            log.warning("foreshock detect: profiles not built (%s)", exc)
            return
        self._unbuilt -= stored
        self._reloaded = -float("inf")  # load what it published at the next turn

    def _report(self, final: bool = False) -> None:
        """Totals (and, every few seconds, the lag) to the telemetry, if served."""
        if self.telemetry is None:
            return
        if final:
            self.telemetry.refresh_lag(self.consumer, force=True)
        self.telemetry.update(
            self.consumer,
            messages=self.stats.messages,
            values=self.stats.values,
            warnings=self.stats.warnings,
            dead_letters=self.consumer.dead_letters,
            duplicates=self.consumer.dedup.duplicates,
        )
