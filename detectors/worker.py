"""The live detector service: a Kafka consumer-group member from metrics to warnings.

Several workers share the metrics topic's partitions (a run's messages are keyed by run id, so
one worker sees all of a run). For each message the worker calls the same
:class:`~foreshock.detectors.engine.RunDetector` as the offline replay and produces the events
to the warnings topic (key: run id), then commits its offsets once they are acknowledged.

State after a restart is rebuilt by *replay*: on assignment the worker reads its partitions
from the beginning, feeding every message to the detectors but emitting warnings only for
messages at or after the committed offset. Detector state is a pure function of a run's
messages and warning ids are deterministic, so the warnings after a kill and restart are the
ones an uninterrupted worker emits. The cost is re-reading retained history (the topic's
retention bounds it); a checkpoint would trade that for state that can go stale.
"""

from __future__ import annotations

import json
import logging
import threading
from typing import Any

from foreshock.transport.consumer import MetricsConsumer
from foreshock.transport.settings import RDKAFKA_LOG, KafkaSettings
from foreshock.transport.topics import ensure_topics

from .config import DetectorConfig
from .engine import RunDetector
from .ordering import SeqOrderer

__all__ = ["DetectorWorker"]

log = logging.getLogger(__name__)


class DetectorWorker:
    """``metrics_port``: serve this worker's health at ``http://metrics_host:PORT/metrics``
    (:class:`~foreshock.telemetry.ServiceTelemetry`; 0 picks a free port; None: off)."""

    def __init__(self, settings: KafkaSettings, config: DetectorConfig,
                 group_id: str = "foreshock-detectors", metrics_port: int | None = None,
                 metrics_host: str = "127.0.0.1") -> None:  # fmt: skip
        from confluent_kafka import Producer

        self.settings, self.config = settings, config
        self.telemetry = None  # first: a port in use fails before anything else is opened
        if metrics_port is not None:
            from foreshock.telemetry import ServiceTelemetry

            self.telemetry = ServiceTelemetry("detector", metrics_port, metrics_host)
        ensure_topics(settings)
        self._resume_at: dict[int, int] = {}
        self.consumer = MetricsConsumer(settings, group_id, on_assign=self._on_assign)
        self.producer = Producer(settings.librdkafka(
            {"acks": "all", "linger.ms": 20, "allow.auto.create.topics": False},
            logger=RDKAFKA_LOG))  # fmt: skip
        self.runs: dict[str, RunDetector] = {}
        self.orderer = SeqOrderer()
        self.messages = self.values = self.warnings = 0
        self.seconds = {"consume+decode": 0.0, "detect": 0.0, "produce+commit": 0.0}

    def _on_assign(self, consumer: Any, partitions: list[Any]) -> None:
        """Remember where to resume emitting; read each partition from its beginning."""
        from confluent_kafka import OFFSET_BEGINNING

        committed = consumer.committed(partitions, timeout=10)
        for tp in committed:
            self._resume_at[tp.partition] = max(tp.offset, 0)
            tp.offset = OFFSET_BEGINNING
        consumer.assign(committed)

    def process(self, message: dict[str, Any]) -> int:
        """Feed one message (and any it released) to its run; produce events. Returns count."""
        produced = 0
        for ready in self.orderer.push(message):
            run_id = ready["run_id"]
            detector = self.runs.get(run_id) or self.runs.setdefault(
                run_id, RunDetector(run_id, self.config))  # fmt: skip
            events = detector.update(ready)
            self.messages += 1
            self.values += len(ready.get("values", ()))
            if ready["_offset"] < self._resume_at.get(ready["_partition"], 0):
                continue  # replaying history: state only, these warnings were emitted before
            for event in events:
                self.producer.produce(self.settings.warnings_topic, key=run_id.encode(),
                                      value=json.dumps(event.to_message()).encode())  # fmt: skip
                produced += 1
        self.producer.poll(0)
        return produced

    def run(self, stop: threading.Event, idle_exit: float | None = None) -> None:
        """Consume until ``stop`` is set (or ``idle_exit`` seconds pass with nothing new)."""
        import time

        idle_since = time.monotonic()
        while not stop.is_set():
            t0 = time.perf_counter()
            batch = self.consumer.poll_batch(1000, timeout=0.5)
            t1 = time.perf_counter()
            for message in batch:
                self.warnings += self.process(message)
            t2 = time.perf_counter()
            if batch:
                if self.producer.flush(30) == 0:
                    self.consumer.commit()
                idle_since = time.monotonic()
                self.seconds["consume+decode"] += t1 - t0
                self.seconds["detect"] += t2 - t1
                self.seconds["produce+commit"] += time.perf_counter() - t2
            elif idle_exit is not None and time.monotonic() - idle_since > idle_exit:
                break
            self._report()
        self.producer.flush(30)
        self.consumer.commit()
        self._report(final=True)
        self.consumer.close()
        if self.telemetry is not None:
            self.telemetry.close()

    def _report(self, final: bool = False) -> None:
        """Totals (and, every few seconds, the lag) to the telemetry, if served."""
        if self.telemetry is None:
            return
        if final:
            self.telemetry.refresh_lag(self.consumer, force=True)
        self.telemetry.update(self.consumer, messages=self.messages, values=self.values,
                              warnings=self.warnings, dead_letters=self.consumer.dead_letters,
                              duplicates=self.consumer.dedup.duplicates)  # fmt: skip
