"""A Kafka sink that never blocks training and never loses a step.

``write(record)`` (the training thread) only numbers the record, encodes it and puts it on a
bounded in-memory queue — or, if that queue is full, appends it to the local spool. One
background thread owns the confluent-kafka producer: it sends, serves delivery callbacks,
and spools every message the broker did not acknowledge (unreachable, restarted, timed out).
While the broker is away it probes after ``probe_interval`` seconds, doubling the wait up to
``max_probe_interval`` (a long outage costs the training process nothing); when it is back the
thread re-creates the topics (a restarted Tansu forgot them) and re-sends the spool in order
before anything newer. Spools left by earlier runs in the same folder are re-sent too;
``foreshock spool flush`` does it by hand. Delivery is at least once: consumers drop
duplicates on (run_id, rank, seq).

An acknowledgement is not storage: the embedded broker keeps messages in memory, so one that
restarts forgets what it had acknowledged. While the producer lives it re-sends its recent
acknowledged messages (``replay_bytes``) when it finds the broker restarted. When it closes it
waits up to ``confirm_timeout`` s for the storage sink's consumer group (``confirm_group``,
``foreshock sink``'s default) to commit past its messages — the sink commits only what it
stored durably — and keeps what is still unconfirmed in its spool, to be re-sent later.

Wire fields added here (see :mod:`foreshock.transport.wire`): ``kind``, a gap-free ``seq`` per
(run_id, rank); a ``start`` message (synthesised if the caller sent none) with the producer's
version; an ``end`` message with ``last_seq`` (synthesised by ``close`` if none was sent).
"""

from __future__ import annotations

import collections
import logging
import os
import queue
import socket
import threading
import time
import uuid
from typing import Any

from foreshock import __version__
from foreshock.transport.settings import RDKAFKA_LOG, KafkaSettings, load_settings
from foreshock.transport.topics import ensure_topics
from foreshock.transport.wire import WireError, encode

from .records import METRICS_SCHEMA, RUN_SCHEMA
from .spool import Spool, SpooledMessage, orphaned_spools

__all__ = ["PRODUCER_DEFAULTS", "KafkaSink"]

log = logging.getLogger(__name__)

PRODUCER_DEFAULTS: dict[str, Any] = {
    "acks": "all",
    "linger.ms": 20,
    "compression.type": "lz4",
    "message.timeout.ms": 15_000,  # an unacknowledged message is spooled after this
    "queue.buffering.max.messages": 100_000,
    "allow.auto.create.topics": False,  # Tansu would create it with one partition
    "reconnect.backoff.max.ms": 2_000,
    "socket.connection.setup.timeout.ms": 5_000,
}
_DOWN = {"_ALL_BROKERS_DOWN", "_TRANSPORT", "_UNKNOWN_TOPIC", "UNKNOWN_TOPIC_OR_PART"}


class _RecentWindow:
    """The last acknowledged messages with their (partition, offset), up to ``max_bytes``."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes, self.size = max_bytes, 0
        self.items: collections.deque[tuple[SpooledMessage, int, int]] = collections.deque()

    def add(self, item: SpooledMessage, partition: int, offset: int) -> None:
        self.items.append((item, partition, offset))
        self.size += len(item.value)
        while self.size > self.max_bytes and self.items:
            self.size -= len(self.items.popleft()[0].value)

    def take(self) -> list[SpooledMessage]:
        items, self.items, self.size = [i for i, _, _ in self.items], collections.deque(), 0
        return items


class KafkaSink:
    """Send monitoring records to Kafka; see the module docstring for the guarantees."""

    def __init__(self, settings: KafkaSettings | None = None, *, queue_size: int = 10_000,
                 probe_interval: float = 2.0, max_probe_interval: float = 30.0,
                 close_timeout: float = 10.0,
                 replay_bytes: int = 64 << 20, name: str | None = None,
                 confirm_group: str | None = "foreshock-sink",
                 confirm_timeout: float = 5.0) -> None:  # fmt: skip
        self.settings = settings or load_settings()
        self.confirm_group, self.confirm_timeout = confirm_group, confirm_timeout
        self.unconfirmed = 0  # messages spooled at close: not confirmed stored
        self._broker_restarted = False
        self.probe_interval, self.close_timeout = probe_interval, close_timeout
        self.max_probe_interval = max_probe_interval
        self.delivered = self.spooled = self.rejected = 0
        self._queue: queue.Queue[SpooledMessage] = queue.Queue(maxsize=queue_size)
        self._seq: dict[tuple[str, int], int] = {}
        self._ended: set[tuple[str, int]] = set()
        self._spool_lock = threading.Lock()
        name = name or f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self._spool = Spool(self.settings.spool_dir, name)
        self._others = list(orphaned_spools(self.settings.spool_dir))  # earlier runs' leftovers
        self._online = self._lost_brokers = False
        self._recent = _RecentWindow(replay_bytes)
        self._replay: list[SpooledMessage] = []
        self.replayed = 0
        self._producer: Any = None
        self._closing = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="foreshock-kafka", daemon=True)
        self._thread.start()

    # ---- the training thread ------------------------------------------------------------
    def write(self, record: dict[str, Any]) -> None:
        """Number, encode and enqueue one record. Never blocks, never raises on transport."""
        if self._closing.is_set():
            raise RuntimeError("KafkaSink is closed")
        for message in self._to_wire(record):
            try:
                item = SpooledMessage(self.settings.metrics_topic, message["run_id"].encode(),
                                      encode(message))  # fmt: skip
            except WireError as exc:
                self.rejected += 1
                self._unnumber(message)
                log.warning("foreshock: record rejected by the wire format: %s", exc)
                continue
            try:
                self._queue.put_nowait(item)
            except queue.Full:
                self._to_spool(item)

    def _to_wire(self, record: dict[str, Any]) -> list[dict[str, Any]]:
        kind = record.get("kind") or ("metrics" if record.get("schema") == METRICS_SCHEMA else "")
        stream = (str(record.get("run_id", "")), int(record.get("rank", 0)))
        out = []
        if stream not in self._seq and kind != "start":
            start = {"schema": RUN_SCHEMA, "kind": "start", "run_id": stream[0],
                     "rank": stream[1], "time": time.time(), "labels": {}}  # fmt: skip
            out.append(self._number(start))
        out.append(self._number({**record, "kind": kind, "rank": stream[1]}))
        return out

    def _number(self, message: dict[str, Any]) -> dict[str, Any]:
        stream = (message["run_id"], message["rank"])
        seq = self._seq.get(stream, -1) + 1
        self._seq[stream] = seq
        message["seq"] = seq
        if message["kind"] == "start":
            message["producer"] = {"foreshock": __version__, "host": socket.gethostname(),
                                   "pid": os.getpid()}  # fmt: skip
        elif message["kind"] == "end":
            message["last_seq"] = seq
            message.setdefault("status", "closed")
            self._ended.add(stream)
        return message

    def _unnumber(self, message: dict[str, Any]) -> None:
        """Give a rejected message's seq back, so that the stream keeps no gap."""
        stream = (message.get("run_id"), message.get("rank"))
        if self._seq.get(stream) == message.get("seq"):
            self._seq[stream] -= 1
            self._ended.discard(stream)

    def close(self, timeout: float | None = None) -> None:
        """End open streams, deliver what the broker takes within ``timeout``, spool the rest."""
        if self._closing.is_set():
            return
        for run_id, rank in [s for s in self._seq if s not in self._ended]:
            self.write({"schema": RUN_SCHEMA, "kind": "end", "run_id": run_id, "rank": rank,
                        "time": time.time(), "status": "closed"})  # fmt: skip
        self.close_timeout = self.close_timeout if timeout is None else timeout
        self._closing.set()
        self._thread.join()
        with self._spool_lock:
            left = self._spool.pending_bytes()
            self._spool.close()
        if left:
            log.warning("foreshock: %d bytes of undelivered messages are kept in %s; they are "
                        "re-sent by the next run or `foreshock spool flush`", left,
                        self._spool.path)  # fmt: skip

    def wait_delivered(self, timeout: float) -> bool:
        """Block until the queue, the producer and every spool are empty, or ``timeout``."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            producer_empty = self._producer is not None and len(self._producer) == 0
            if self._online and producer_empty and self._queue.empty() and not self.pending():
                return True
            time.sleep(0.05)
        return False

    def pending(self) -> int:
        """Bytes waiting in this sink's spool and the orphaned ones it is re-sending."""
        with self._spool_lock:
            return sum(s.pending_bytes() for s in [*self._others, self._spool])

    @property
    def spool_path(self) -> str:
        return str(self._spool.path)

    # ---- the background thread ----------------------------------------------------------
    def _to_spool(self, item: SpooledMessage) -> None:
        with self._spool_lock:
            self._spool.append(item)
            self.spooled += 1

    def _loop(self) -> None:
        next_probe, delay = 0.0, self.probe_interval
        while True:
            closing = self._closing.is_set()
            if not self._online and time.monotonic() >= next_probe:
                self._online = self._connect()
                delay = (
                    self.probe_interval
                    if self._online
                    else min(2 * delay, max(self.probe_interval, self.max_probe_interval))
                )
                next_probe = time.monotonic() + delay
            if self._online:
                self._drain_spools(time_budget=0.5)
            self._move_queue(block=not closing)
            if self._producer is not None:
                self._producer.poll(0)
            if closing and self._queue.empty():
                break
        self._finish()

    def _move_queue(self, block: bool) -> None:
        try:
            items = [self._queue.get(timeout=0.05 if block else 0)]
        except queue.Empty:
            return
        while len(items) < 1000:
            try:
                items.append(self._queue.get_nowait())
            except queue.Empty:
                break
        direct = self._online and self._spool.pending_bytes() == 0
        for item in items:
            if not (direct and self._produce(item)):
                self._to_spool(item)

    def _produce(self, item: SpooledMessage) -> bool:
        try:
            self._producer.produce(item.topic, key=item.key, value=item.value,
                                   on_delivery=self._on_delivery)  # fmt: skip
            return True
        except BufferError:
            return False

    def _on_delivery(self, err: Any, msg: Any) -> None:
        item = SpooledMessage(msg.topic(), msg.key(), msg.value())
        if err is None:
            self.delivered += 1
            self._recent.add(item, msg.partition(), msg.offset())
            return
        self._online = False
        self._to_spool(item)

    def _on_error(self, err: Any) -> None:
        if err.name() in _DOWN:
            self._online = False
            self._lost_brokers = True

    def _connect(self, timeout: float = float("inf")) -> bool:
        """Reach the broker and (re-)create the topics, within ``timeout`` and one probe's time."""
        try:
            topics = ensure_topics(self.settings,
                                   timeout=min(timeout, 5.0, self.probe_interval + 1.0),
                                   quiet=True,
                                   names=[self.settings.metrics_topic,
                                          self.settings.deadletter_topic])  # fmt: skip
        except Exception:
            self._lost_brokers = self._lost_brokers or self._producer is not None
            return False
        if self._lost_brokers or self.settings.metrics_topic in topics.created:
            self._replay = self._recent.take()  # the broker may have lost what it acknowledged
            self.replayed += len(self._replay)
            self._broker_restarted = self._broker_restarted or bool(self._replay)
        self._lost_brokers = False
        if self._producer is None:
            from confluent_kafka import Producer

            self._producer = Producer(self.settings.librdkafka(
                PRODUCER_DEFAULTS, error_cb=self._on_error, logger=RDKAFKA_LOG))  # fmt: skip
        return True

    def _drain_spools(self, time_budget: float) -> None:
        """Re-send spooled messages, oldest spool first, in order, batch by batch."""
        deadline = time.monotonic() + time_budget
        while self._replay and self._online and time.monotonic() < deadline:
            batch, self._replay = self._replay[:500], self._replay[500:]
            if not self._send_batch(batch):
                self._replay = batch + self._replay
                self._online = False
                return
        for spool in [*self._others, self._spool]:
            while self._online and time.monotonic() < deadline:
                with self._spool_lock:
                    batch, end = spool.read_batch(500)
                if not batch:
                    break
                if not self._send_batch(batch):
                    self._online = False
                    return
                with self._spool_lock:
                    spool.commit(end)
                self.delivered += len(batch)
        for spool in [s for s in self._others if s.pending_bytes() == 0]:
            spool.close()
            self._others.remove(spool)

    def _send_batch(self, batch: list[SpooledMessage]) -> bool:
        """Send and wait for the broker to acknowledge all of ``batch``."""
        failed: list[Any] = []

        def acked(err: Any, msg: Any) -> None:
            if err is not None:
                failed.append(err)
            else:
                item = SpooledMessage(msg.topic(), msg.key(), msg.value())
                self._recent.add(item, msg.partition(), msg.offset())

        for item in batch:
            while True:
                try:
                    self._producer.produce(item.topic, key=item.key, value=item.value,
                                           on_delivery=acked)  # fmt: skip
                    break
                except BufferError:
                    self._producer.poll(0.1)
        left = self._producer.flush(PRODUCER_DEFAULTS["message.timeout.ms"] / 1000 + 1)
        return left == 0 and not failed

    def _finish(self) -> None:
        """Closing: deliver within ``close_timeout``; spool whatever is still unacknowledged.
        Adopted spools are released either way: a later flush, or another sink in this same
        process, must be able to take them. A sink still waiting out its probe back-off tries
        the broker once more first: a run that ends seconds after the broker came back must not
        leave its records in the spool."""
        if not self._online and self.close_timeout > 0:
            self._online = self._connect(self.close_timeout)
        if self._producer is not None:
            if self._online:
                self._drain_spools(time_budget=self.close_timeout)
            left = self._producer.flush(self.close_timeout if self._online else 0)
            if left:
                self._producer.purge(in_queue=True, in_flight=True)
                self._producer.flush(1.0)  # purged messages come back through _on_delivery
            elif self._online:
                self._keep_unconfirmed()
        for spool in self._others:
            spool.close()
        self._others = []
        self._producer = None  # its threads and sockets go now, not at interpreter exit

    def _keep_unconfirmed(self) -> None:
        """Closing: wait (``confirm_timeout``) until the storage sink's consumer group has
        committed past every message in the window — it commits only what it stored durably —
        and spool whatever it has not: a broker that restarts without its data after this
        producer is gone must not take those messages with it."""
        if not self.confirm_group or not self._recent.items:
            return
        from confluent_kafka import Consumer

        consumer = Consumer(self.settings.librdkafka(
            {"group.id": self.confirm_group, "enable.auto.commit": False},
            logger=RDKAFKA_LOG))  # fmt: skip
        deadline = time.monotonic() + self.confirm_timeout
        try:
            while (left := self._unconfirmed(consumer)) and time.monotonic() < deadline:
                time.sleep(0.25)
        finally:
            consumer.close()
        for item in left or []:
            self._to_spool(item)
        self.unconfirmed = len(left or [])
        if left:
            log.warning("foreshock: %d messages not yet confirmed stored by consumer group %r; "
                        "kept in %s", len(left), self.confirm_group, self._spool.path)  # fmt: skip

    def _unconfirmed(self, consumer: Any) -> list[SpooledMessage] | None:
        """Window messages at or past the group's committed offsets; None when the group has
        committed nothing here and no broker restart was seen (no sink to wait for)."""
        from confluent_kafka import TopicPartition

        parts = sorted({(i.topic, p) for i, p, _ in self._recent.items})
        try:
            found = consumer.committed([TopicPartition(t, p) for t, p in parts], timeout=2.0)
        except Exception:
            return [i for i, _, _ in self._recent.items]
        committed = {(tp.topic, tp.partition): tp.offset for tp in found}
        if all(o < 0 for o in committed.values()) and not self._broker_restarted:
            return None
        return [i for i, p, o in self._recent.items if o >= committed.get((i.topic, p), -1)]
