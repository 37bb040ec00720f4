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

Nothing it is given, and no disk, can kill it: ``write`` and ``close`` never raise, and the
sending thread catches every failure of ``produce()``, the spool and the broker. A record that
can't be sent is *refused*: kept whole in a local rejects file (``<spool_dir>/<name>.rejects``,
JSON Lines, with the reason), counted in ``rejected`` and ``reasons``, logged, and flagged on the
run. A record the wire format refuses gives its seq back (the stream stays gap-free); a valid
record too large to carry (over the client's real limit: ``message.max.bytes`` less the key and
the record framing, or the wire's :data:`MAX_MESSAGE_BYTES`) is replaced by a *stand-in* with
its seq: ``values`` empty, flag ``producer_rejected``, ``error`` saying why — the same shape as
the monitor's own error records, so the store shows the step and why its values are missing.
Splitting such a record by series was not done: one step would become several messages with
one seq each, and every consumer (storage's one row per step, the detectors' step order) would
have to learn to merge them. A stand-in is also what a spooled message the broker refuses
becomes, so that it can't block the spool behind it. The ``end`` of a stream with refused
records carries ``rejected`` (count, reasons, the rejects file).

A spool that can't be written (an unwritable folder, a full disk) falls back to a bounded
in-memory buffer (``memory_bytes``), loudly; beyond it messages are *dropped* and counted
(``dropped``, ``reasons``), except a run's ``start`` and ``end``. What is still in memory at
``close`` goes to the spool if it can be written again, and is otherwise counted as dropped.

Wire fields added here (see :mod:`foreshock.transport.wire`): ``kind``; ``attempt``, this
producer's incarnation (its restart count and start time, :mod:`foreshock.transport.attempts`,
unless given: a job restarted from a checkpoint under the same run id is a new attempt, and
its seqs start again at 0 without colliding); a
gap-free ``seq`` per (run_id, rank, attempt); a ``start`` message (synthesised if the caller
sent none) with the producer's version; an ``end`` message with ``last_seq`` (synthesised by
``close`` if none was sent).
"""

from __future__ import annotations

import collections
import contextlib
import json
import logging
import os
import queue
import socket
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from foreshock import __version__
from foreshock.transport.attempts import attempt_number, scheduler_restart
from foreshock.transport.records import METRICS_SCHEMA, RUN_SCHEMA
from foreshock.transport.settings import RDKAFKA_LOG, KafkaSettings, load_settings
from foreshock.transport.topics import ensure_topics
from foreshock.transport.wire import MAX_MESSAGE_BYTES, WireError, encode, validate

from .spool import MemorySpool, Spool, SpooledMessage, is_lifecycle, orphaned_spools, write_all
from .stranded import expire_kept, strand

__all__ = ["PRODUCER_DEFAULTS", "RECORD_OVERHEAD", "KafkaSink"]

log = logging.getLogger(__name__)

# librdkafka refuses a message when key + value + headers + this exceed ``message.max.bytes``
# (RD_KAFKAP_MESSAGE_V2_MAX_OVERHEAD: a record's length, attributes, timestamp and offset
# deltas, key and value lengths and header count, each varint at its widest). Measured: with
# the default 1,000,000 it takes a value of at most 999,959 bytes under the 5-byte key "run-x".
RECORD_OVERHEAD = 36
_MAX_KEY_BYTES = 200  # the key is the run id: at most 200 ASCII characters

PRODUCER_DEFAULTS: dict[str, Any] = {
    "acks": "all",
    "linger.ms": 20,
    "compression.type": "lz4",
    "message.timeout.ms": 15_000,  # an unacknowledged message is spooled after this
    "queue.buffering.max.messages": 100_000,
    "allow.auto.create.topics": False,  # Tansu would create it with one partition
    "reconnect.backoff.max.ms": 2_000,
    "socket.connection.setup.timeout.ms": 5_000,
    # every message the wire format allows fits (librdkafka's default refused the last 41+
    # bytes below the wire's 1,000,000); brokers take record batches of up to 1 MiB by default
    "message.max.bytes": MAX_MESSAGE_BYTES + RECORD_OVERHEAD + _MAX_KEY_BYTES,
}
_DOWN = {"_ALL_BROKERS_DOWN", "_TRANSPORT", "_UNKNOWN_TOPIC", "UNKNOWN_TOPIC_OR_PART"}
# delivery errors about the message itself: sending it again fails again
_REFUSED = {"MSG_SIZE_TOO_LARGE", "INVALID_MSG_SIZE", "RECORD_LIST_TOO_LARGE", "INVALID_RECORD"}
_REJECTS_MAX_BYTES = 256 << 20  # past this a rejects file keeps the reason, not the record
_STAND_IN_FLAG = "producer_rejected"
_STAND_IN_FIELD_BYTES = 4096  # a stand-in keeps every field of the refused message up to this


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
    """Send monitoring records to Kafka; see the module docstring for the guarantees.

    Counters: ``delivered``, ``spooled``, ``replayed``, ``stranded`` (spooled messages for a
    topic the broker does not have, set aside: :mod:`~foreshock.producers.stranded`);
    ``rejected`` (records refused, see
    ``rejects_path``), ``dropped`` (valid messages no spool could hold), ``reasons`` (both, by
    reason), ``errors`` (unexpected exceptions caught); ``spool_error`` (why the spool file is
    not being written, or None).
    """

    def __init__(
        self,
        settings: KafkaSettings | None = None,
        *,
        queue_size: int = 10_000,
        probe_interval: float = 2.0,
        max_probe_interval: float = 30.0,
        close_timeout: float = 10.0,
        replay_bytes: int = 64 << 20,
        name: str | None = None,
        confirm_group: str | None = "foreshock-sink",
        confirm_timeout: float = 5.0,
        memory_bytes: int = 64 << 20,
        attempt: int | None = None,
        restart: int | None = None,
    ) -> None:
        self.settings = settings or load_settings()
        # which incarnation of its runs this producer is (foreshock.transport.attempts): a run
        # resumed under the same run id by a new process gets a new, higher one
        self._started_us = time.time_ns() // 1000
        restart = scheduler_restart() if restart is None else restart
        self.attempt = attempt_number(restart, self._started_us) if attempt is None else attempt
        self.confirm_group, self.confirm_timeout = confirm_group, confirm_timeout
        self.unconfirmed = 0  # messages spooled at close: not confirmed stored
        self._broker_restarted = False
        self.probe_interval, self.close_timeout = probe_interval, close_timeout
        self.max_probe_interval = max_probe_interval
        self.delivered = self.spooled = self.rejected = self.dropped = self.errors = 0
        self.reasons: collections.Counter[str] = collections.Counter()
        self._refused_in: dict[tuple[Any, Any], collections.Counter[str]] = {}
        self._quarantined: set[int] = set()
        self._max_message_bytes = _client_max_bytes(self.settings)
        self._queue: queue.Queue[SpooledMessage] = queue.Queue(maxsize=queue_size)
        self._seq: dict[tuple[str, int], int] = {}
        self._ended: set[tuple[str, int]] = set()
        self._spool_lock = threading.Lock()
        self._rejects_lock = threading.Lock()
        name = name or f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.rejects_path = Path(self.settings.spool_dir) / f"{name}.rejects"
        self._rejects_failed = False
        self.spool_error: str | None = None
        self._memory = MemorySpool(memory_bytes)
        self._spool = self._open_spool(name)
        self._others = self._adopt_orphans()  # earlier runs' leftovers
        self.expired_rejects = expire_kept(self.settings.spool_dir)
        self.stranded = 0  # spooled messages for a topic the broker does not have
        self._topics: set[str] = set()  # topics the broker was seen to have
        self._online = self._lost_brokers = False
        self._recent = _RecentWindow(replay_bytes)
        self._replay: list[SpooledMessage] = []
        self.replayed = 0
        self._producer: Any = None
        self._closing = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="foreshock-kafka", daemon=True)
        self._thread.start()

    def _open_spool(self, name: str) -> Spool | None:
        """This producer's spool file, or None (and memory instead) if it can't be written."""
        try:
            return Spool(self.settings.spool_dir, name)
        except OSError as exc:
            self.spool_error = str(exc)
            log.error(
                "foreshock: cannot write the spool folder %s (%s): messages the broker "
                "has not taken are kept in memory (up to %s) and lost if this process "
                "ends before the broker takes them; set FORESHOCK_KAFKA_SPOOL_DIR to a "
                "writable folder",
                self.settings.spool_dir,
                exc,
                _size(self._memory.max_bytes),
            )
            return None

    def _adopt_orphans(self) -> list[Spool]:
        try:
            return list(orphaned_spools(self.settings.spool_dir))
        except OSError as exc:
            log.warning(
                "foreshock: cannot read the spool folder %s (%s); earlier runs' spools "
                "there are not re-sent",
                self.settings.spool_dir,
                exc,
            )
            return []

    # ---- the training thread ------------------------------------------------------------
    def resume(self, restart: int) -> None:
        """This producer's runs resumed from a checkpoint written after ``restart - 1``
        restarts (``Monitor.load_state_dict`` calls it): its attempt number takes that
        restart count, so it orders after every attempt before the checkpoint whatever the
        clocks say (:mod:`foreshock.transport.attempts`). Only before the first message: a
        stream keeps its attempt (logged and ignored after)."""
        if self._seq:
            log.warning("foreshock: resume(%s) after messages were sent: attempt kept", restart)
            return
        self.attempt = attempt_number(restart, self._started_us)

    def write(self, record: dict[str, Any]) -> None:
        """Number, encode and enqueue one record. Never blocks, never raises: a record that
        can't be sent is refused (counted, logged, kept in the rejects file)."""
        try:
            if self._closing.is_set():
                self._reject("closed", "written after close()", message=record)
                return
            try:
                messages = self._to_wire(record)
            except Exception as exc:  # not a dict, a rank that is no int, ...
                self._reject("invalid", f"{type(exc).__name__}: {exc}", message=record)
                return
            for message in messages:
                item = self._encode(message)
                if item is None:
                    continue
                try:
                    self._queue.put_nowait(item)
                except queue.Full:
                    self._to_spool([item])
        except Exception as exc:
            self._count_error("write()", exc)

    def _encode(self, message: dict[str, Any]) -> SpooledMessage | None:
        """The message as it goes on the wire; a stand-in if it is valid but too large to
        carry; None (its seq given back) if the wire format refuses it."""
        try:
            value = encode(message)  # first: it checks the run id the key is made of
        except WireError as exc:
            try:
                validate(message)
            except WireError:
                self._unnumber(message)
                self._reject("invalid", str(exc), message=message)
                return None
            text = _dumps(message)
            kind = "too large" if len(text.encode()) > MAX_MESSAGE_BYTES else "not serialisable"
            return self._stand_in(message, kind, str(exc), text)
        item = SpooledMessage(self.settings.metrics_topic, message["run_id"].encode(), value)
        if not self.fits(item):
            return self._stand_in(
                message, "too large", self._size_detail(item), item.value.decode()
            )
        return item

    def _stand_in(
        self, message: dict[str, Any], kind: str, detail: str, text: str
    ) -> SpooledMessage | None:
        self._reject(kind, detail, message=message, text=text)
        item = self._stand_in_item(message, kind, self.settings.metrics_topic)
        if item is None:
            self._unnumber(message)
        return item

    def _stand_in_item(
        self, message: dict[str, Any], kind: str, topic: str
    ) -> SpooledMessage | None:
        """A valid message with the refused one's seq: values emptied, flagged, the reason.
        Its other small fields stay (run, rank, step, time, labels, any the wire adds later)."""
        stand_in = {
            k: v
            for k, v in message.items()
            if k not in ("values", "flags", "error") and len(_dumps(v)) <= _STAND_IN_FIELD_BYTES
        }
        if message.get("kind") == "metrics":
            stand_in["values"] = {}
        stand_in["flags"] = [_STAND_IN_FLAG]
        kept = "not kept" if self._rejects_failed else f"kept in {self.rejects_path}"
        stand_in["error"] = f"refused by the producer ({kind}); the record is {kept}"
        try:
            item = SpooledMessage(topic, str(message["run_id"]).encode(), encode(stand_in))
        except (WireError, KeyError, UnicodeError):
            return None
        return item if self.fits(item) else None

    def fits(self, item: SpooledMessage) -> bool:
        """Whether the client and the wire format both take ``item``."""
        return len(item.value) <= self.max_value_bytes(item.key)

    def max_value_bytes(self, key: bytes = b"") -> int:
        """The largest value this producer can send under ``key``: the wire's limit, or the
        client's real one (``message.max.bytes`` less the key and the record framing)."""
        return min(MAX_MESSAGE_BYTES, self._max_message_bytes - RECORD_OVERHEAD - len(key))

    def _size_detail(self, item: SpooledMessage) -> str:
        return (
            f"message of {len(item.value):,} bytes; at most {self.max_value_bytes(item.key):,}"
            f" fit under key {item.key[:40]!r} (message.max.bytes "
            f"{self._max_message_bytes:,} less {RECORD_OVERHEAD} bytes of framing and the "
            f"key; the wire format's limit is {MAX_MESSAGE_BYTES:,})"
        )

    def _to_wire(self, record: dict[str, Any]) -> list[dict[str, Any]]:
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
            refused = self._refused_in.get(stream)
            if refused:  # the run's flag: this producer refused some of its records
                message["rejected"] = {
                    "count": sum(refused.values()),
                    "reasons": dict(refused),
                    "file": str(self.rejects_path),
                }
        return message

    def _unnumber(self, message: dict[str, Any]) -> None:
        """Give a rejected message's seq back, so that the stream keeps no gap."""
        stream = (message.get("run_id"), message.get("rank"))
        if self._seq.get(stream) == message.get("seq"):
            self._seq[stream] -= 1
            self._ended.discard(stream)

    def close(self, timeout: float | None = None) -> None:
        """End open streams, deliver what the broker takes within ``timeout``, spool the rest.
        Never raises."""
        if self._closing.is_set():
            return
        for run_id, rank in [s for s in self._seq if s not in self._ended]:
            self.write(
                {
                    "schema": RUN_SCHEMA,
                    "kind": "end",
                    "run_id": run_id,
                    "rank": rank,
                    "time": time.time(),
                    "status": "closed",
                }
            )
        self.close_timeout = self.close_timeout if timeout is None else timeout
        self._closing.set()
        limit = self.close_timeout + self.confirm_timeout + 60.0
        self._thread.join(limit)
        if self._thread.is_alive():
            log.error(
                "foreshock: the Kafka sink's sending thread did not stop within %.0f s; "
                "what it still holds may be lost",
                limit,
            )
            return
        try:
            self._close_spools()
        except Exception as exc:
            self._count_error("close()", exc)

    def _close_spools(self) -> None:
        """Move what only memory holds to the spool file if it can be written now (else it is
        dropped, and counted); fsync and release the spool."""
        with self._spool_lock:
            left = self._memory.take()
            if left and not (self._spool is not None and self._spool_append(left)):
                for item in left:
                    self._drop(item, "unsent at close, spool unwritable")
            left_bytes = 0
            if self._spool is not None:
                left_bytes = self._spool.pending_bytes()
                self._spool.close()
        if left_bytes:
            log.warning(
                "foreshock: %d bytes of undelivered messages are kept in %s; they are "
                "re-sent by the next run or `foreshock spool flush`",
                left_bytes,
                self.spool_path,
            )
        if self.rejected or self.dropped:
            log.warning(
                "foreshock: Kafka sink closed with %d records refused and %d messages "
                "dropped (%s); rejects file: %s",
                self.rejected,
                self.dropped,
                dict(self.reasons),
                self.rejects_path,
            )

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
        """Bytes waiting in this sink's spool (and memory) and the orphaned ones it re-sends."""
        with self._spool_lock:
            return sum(s.pending_bytes() for s in [*self._others, *self._own_spools()])

    @property
    def spool_path(self) -> str:
        return str(self._spool.path) if self._spool is not None else "memory (no spool file)"

    # ---- failures: refused, dropped, unexpected ------------------------------------------
    def _reject(
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
        with self._rejects_lock:
            self.rejected += 1
            self.reasons[kind] += 1
            stream = (info.get("run_id"), info.get("rank", 0))
            if isinstance(message, dict) and "seq" in message:
                self._refused_in.setdefault(stream, collections.Counter())[kind] += 1
            count = self.reasons[kind]
            if text is None:
                text = item.value.decode("utf-8", "replace") if item else _dumps(message)
            self._keep_rejected(
                {"time": time.time(), "reason": kind, "detail": detail, **info, "bytes": len(text)},
                text,
            )
        if _often(count):
            kept = "not kept" if self._rejects_failed else f"kept in {self.rejects_path}"
            log.warning(
                "foreshock: record refused (%s, %d so far): %s %s; %s; %s",
                kind,
                count,
                info.get("run_id"),
                {k: info[k] for k in ("kind", "seq", "step") if k in info},
                detail,
                kept,
            )

    def _keep_rejected(self, line: dict[str, Any], text: str) -> None:
        """Append one JSON line to the rejects file, fsynced; a failure is logged once."""
        try:
            fd = os.open(self.rejects_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        except OSError as exc:
            return self._rejects_unwritable(exc)
        try:
            size = os.fstat(fd).st_size
            if size + len(text) < _REJECTS_MAX_BYTES:
                line["value"] = text
            else:
                line["value_dropped"] = f"the rejects file is over {_REJECTS_MAX_BYTES >> 20} MB"
            try:
                write_all(fd, json.dumps(line, default=repr).encode() + b"\n")
                os.fsync(fd)
            except OSError as exc:
                with contextlib.suppress(OSError):
                    os.ftruncate(fd, size)  # no torn line for the next one to glue onto
                self._rejects_unwritable(exc)
        finally:
            os.close(fd)

    def _rejects_unwritable(self, exc: OSError) -> None:
        if not self._rejects_failed:
            self._rejects_failed = True
            log.error(
                "foreshock: cannot write the rejects file %s (%s); refused records are "
                "only counted and logged",
                self.rejects_path,
                exc,
            )

    def _drop(self, item: SpooledMessage, reason: str) -> None:
        """A valid message no spool can hold: counted, logged (the caller holds the spool lock)."""
        with self._rejects_lock:  # the counters' lock
            self.dropped += 1
            self.reasons[reason] += 1
            count = self.reasons[reason]
        if _often(count):
            log.error(
                "foreshock: message of run %s dropped (%s; %d so far): the spool can't be "
                "written and the memory buffer (%s) is full",
                item.key[:200].decode("utf-8", "replace"),
                reason,
                count,
                _size(self._memory.max_bytes),
            )

    def _count_error(self, where: str, exc: BaseException) -> None:
        self.errors += 1
        if _often(self.errors):
            log.error(
                "foreshock: unexpected error in the Kafka sink's %s (%d so far); it carries on",
                where,
                self.errors,
                exc_info=exc,
            )

    def _quarantine(self, item: SpooledMessage, kind: str, detail: str) -> SpooledMessage | None:
        """The sending thread's refusal of an already numbered message: keep it in the rejects
        file (once, however often it is retried) and return its stand-in, if it can have one."""
        message = _loads(item.value)
        digest = hash(item)
        if digest not in self._quarantined:
            if len(self._quarantined) > 10_000:
                self._quarantined.clear()
            self._quarantined.add(digest)
            self._reject(kind, detail, message=message, item=item)
        return None if message is None else self._stand_in_item(message, kind, item.topic)

    # ---- the spool: a file, or memory when the file can't be written --------------------
    def _own_spools(self) -> list[Spool | MemorySpool]:
        """This sink's spools in the order they are drained: the file holds older messages."""
        return [self._spool, self._memory] if self._spool is not None else [self._memory]

    def _to_spool(self, items: list[SpooledMessage]) -> None:
        """Spool ``items`` in order: to the file while it takes them and memory is empty, else to
        memory; a message neither can hold is dropped. Never raises."""
        with self._spool_lock:
            if not self._memory.items and self._spool is not None and self._spool_append(items):
                return
            for item in items:
                if self._memory.append(item, force=is_lifecycle(item)):
                    self.spooled += 1
                else:
                    self._drop(item, "spool unwritable, memory buffer full")

    def _spool_append(self, items: list[SpooledMessage]) -> bool:
        assert self._spool is not None
        try:
            self._spool.append_many(items)
        except Exception as exc:  # ENOSPC, EIO, EACCES; a value that is no UTF-8
            if self.spool_error is None:
                log.error(
                    "foreshock: cannot write the spool %s (%s): messages the broker has "
                    "not taken are kept in memory (up to %s) and lost if this process "
                    "ends before the broker takes them; free space there or set "
                    "FORESHOCK_KAFKA_SPOOL_DIR",
                    self._spool.path,
                    exc,
                    _size(self._memory.max_bytes),
                )
            self.spool_error = str(exc)
            return False
        if self.spool_error is not None:
            log.warning("foreshock: the spool %s is written again", self._spool.path)
            self.spool_error = None
        self.spooled += len(items)
        return True

    def _sync_spool(self) -> None:
        with self._spool_lock:
            if self._spool is not None:
                try:
                    self._spool.sync()
                except OSError as exc:
                    self._count_error(f"spool fsync ({exc})", exc)

    # ---- the background thread ----------------------------------------------------------
    def _loop(self) -> None:
        """Send, spool, probe — until closing and the queue is empty. An exception in one turn
        is counted and logged, and the next turn goes on: nothing the thread meets kills it."""
        state = {"next_probe": 0.0, "delay": self.probe_interval}
        failures = 0
        while True:
            closing = self._closing.is_set()
            try:
                self._turn(state, closing)
                failures = 0
            except Exception as exc:
                failures += 1
                self._count_error("sending thread", exc)
                time.sleep(min(0.05 * failures, 1.0))
                if closing and failures >= 20:
                    break  # _finish spools what is left in the queue
            if closing and self._queue.empty():
                break
        self._finish()

    def _turn(self, state: dict[str, float], closing: bool) -> None:
        if not self._online and time.monotonic() >= state["next_probe"]:
            self._online = self._connect()
            state["delay"] = (
                self.probe_interval
                if self._online
                else min(2 * state["delay"], max(self.probe_interval, self.max_probe_interval))
            )
            state["next_probe"] = time.monotonic() + state["delay"]
        if self._online:
            self._drain_spools(time_budget=0.5)
        self._move_queue(block=not closing)
        if self._producer is not None:
            self._producer.poll(0)
        self._sync_spool()

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
        direct = self._online and self._producer is not None and self._own_pending() == 0
        spill = []
        for item in items:
            direct = direct and self._send(item, self._on_delivery, wait=False)
            if not direct:
                spill.append(item)
        if spill:
            self._to_spool(spill)

    def _own_pending(self) -> int:
        with self._spool_lock:
            return sum(s.pending_bytes() for s in self._own_spools())

    def _send(self, item: SpooledMessage, callback: Any, wait: bool) -> bool:
        """Produce ``item``; False only on a full client queue with ``wait`` False (the caller
        spools it). Anything else ``produce()`` raises refuses the message (the rejects file)
        and sends its stand-in instead: one message never stops the ones behind it."""
        stand_in = False
        if not self.fits(item):
            item, stand_in = self._quarantine(item, "too large", self._size_detail(item)), True
        while item is not None:
            try:
                self._producer.produce(
                    item.topic, key=item.key, value=item.value, on_delivery=callback
                )
                return True
            except BufferError:
                if not wait:
                    return False
                self._producer.poll(0.1)
            except Exception as exc:  # KafkaException (MSG_SIZE_TOO_LARGE, ...), TypeError
                if stand_in:
                    self._count_error("produce() of a stand-in", exc)
                    return True
                detail = f"produce() raised {exc}"
                item, stand_in = self._quarantine(item, "refused by the client", detail), True
        return True

    def _on_delivery(self, err: Any, msg: Any) -> None:
        try:
            item = SpooledMessage(msg.topic(), msg.key(), msg.value())
            if err is None:
                self.delivered += 1
                self._recent.add(item, msg.partition(), msg.offset())
            elif err.name() in _REFUSED:
                self._refused_by_broker(item, err)
            else:
                self._online = False
                self._to_spool([item])
        except Exception as exc:  # an exception here would come out of poll() and flush()
            self._count_error("delivery report", exc)

    def _refused_by_broker(self, item: SpooledMessage, err: Any) -> None:
        stand_in = self._quarantine(item, "refused by the broker", f"{err.name()}: {err.str()}")
        if stand_in is not None:
            self._to_spool([stand_in])

    def _on_error(self, err: Any) -> None:
        if err.name() in _DOWN:
            self._online = False
            self._lost_brokers = True

    def _connect(self, timeout: float = float("inf")) -> bool:
        """Reach the broker and (re-)create the topics, within ``timeout`` and one probe's time."""
        try:
            topics = ensure_topics(
                self.settings,
                timeout=min(timeout, 5.0, self.probe_interval + 1.0),
                quiet=True,
                names=[self.settings.metrics_topic, self.settings.deadletter_topic],
            )
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

            self._producer = Producer(
                self.settings.librdkafka(
                    PRODUCER_DEFAULTS, error_cb=self._on_error, logger=RDKAFKA_LOG
                )
            )
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
        for spool in [*self._others, *self._own_spools()]:
            while self._online and time.monotonic() < deadline:
                with self._spool_lock:
                    batch, end = spool.read_batch(500)
                if not batch:
                    break
                batch = self._set_aside_stranded(spool, batch)
                if batch and not self._send_batch(batch):
                    self._online = False
                    return
                with self._spool_lock:
                    spool.commit(end)
                self.delivered += len(batch)
        for spool in [s for s in self._others if s.pending_bytes() == 0]:
            spool.close()
            self._others.remove(spool)

    def _set_aside_stranded(
        self, spool: Spool | MemorySpool, batch: list[SpooledMessage]
    ) -> list[SpooledMessage]:
        """``batch`` less the messages for topics the broker does not have, which go to the
        stranded file (:mod:`~foreshock.producers.stranded`): sent, they would time out as if
        the broker were down, and hold up every spool behind them for good."""
        unknown = {m.topic for m in batch} - self._topics
        if not unknown:
            return batch
        try:
            self._topics |= set(self._producer.list_topics(timeout=5.0).topics)
        except Exception:  # the broker is away: nothing is stranded by a failed lookup
            return batch
        missing = unknown - self._topics
        if not missing:
            return batch
        where = getattr(spool, "path", None) or Path(self.settings.spool_dir) / "memory.spool"
        stranded = [m for m in batch if m.topic in missing]
        try:
            strand(where, stranded, missing)
        except OSError as exc:
            self._count_error(f"stranded file ({exc})", exc)
            return batch
        self.stranded += len(stranded)
        return [m for m in batch if m.topic not in missing]

    def _send_batch(self, batch: list[SpooledMessage]) -> bool:
        """Send and wait for the broker to acknowledge all of ``batch``. A message the client
        or the broker refuses for what it is (too large, invalid) is quarantined, not retried:
        it would block the spool behind it for good."""
        failed: list[tuple[Any, SpooledMessage]] = []

        def acked(err: Any, msg: Any) -> None:
            item = SpooledMessage(msg.topic(), msg.key(), msg.value())
            if err is not None:
                failed.append((err, item))
            else:
                self._recent.add(item, msg.partition(), msg.offset())

        for item in batch:
            self._send(item, acked, wait=True)
        left = self._producer.flush(PRODUCER_DEFAULTS["message.timeout.ms"] / 1000 + 1)
        if left or any(err.name() not in _REFUSED for err, _ in failed):
            return False
        for err, item in failed:
            self._refused_by_broker(item, err)
        return True

    def _finish(self) -> None:
        """Closing: deliver within ``close_timeout``; spool whatever is still unacknowledged.
        Adopted spools are released either way: a later flush, or another sink in this same
        process, must be able to take them. A sink still waiting out its probe back-off tries
        the broker once more first: a run that ends seconds after the broker came back must not
        leave its records in the spool."""
        try:
            self._deliver_at_close()
        except Exception as exc:
            self._count_error("closing", exc)
        finally:
            left = []
            with contextlib.suppress(queue.Empty):
                while True:
                    left.append(self._queue.get_nowait())
            if left:
                self._to_spool(left)
            for spool in self._others:
                with contextlib.suppress(Exception):
                    spool.close()
            self._others = []
            self._producer = None  # its threads and sockets go now, not at interpreter exit

    def _deliver_at_close(self) -> None:
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

    def _keep_unconfirmed(self) -> None:
        """Closing: wait (``confirm_timeout``) until the storage sink's consumer group has
        committed past every message in the window — it commits only what it stored durably —
        and spool whatever it has not: a broker that restarts without its data after this
        producer is gone must not take those messages with it."""
        if not self.confirm_group or not self._recent.items:
            return
        from confluent_kafka import Consumer

        consumer = Consumer(
            self.settings.librdkafka(
                {"group.id": self.confirm_group, "enable.auto.commit": False}, logger=RDKAFKA_LOG
            )
        )
        deadline = time.monotonic() + self.confirm_timeout
        try:
            while (left := self._unconfirmed(consumer)) and time.monotonic() < deadline:
                time.sleep(0.25)
        finally:
            consumer.close()
        if left:
            self._to_spool(left)
        self.unconfirmed = len(left or [])
        if left:
            log.warning(
                "foreshock: %d messages not yet confirmed stored by consumer group %r; kept in %s",
                len(left),
                self.confirm_group,
                self._spool.path,
            )

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


def _client_max_bytes(settings: KafkaSettings) -> int:
    """The producer's ``message.max.bytes``, pass-through settings included."""
    value = settings.librdkafka(PRODUCER_DEFAULTS).get("message.max.bytes")
    try:
        return int(value)
    except (TypeError, ValueError):
        return 1_000_000  # librdkafka's default


def _dumps(value: Any) -> str:
    """JSON text of anything, for the rejects file (what JSON can't hold is ``repr``'d)."""
    try:
        return json.dumps(value, default=repr, separators=(",", ":"))
    except (ValueError, TypeError, RecursionError):
        return repr(value)


def _loads(value: bytes) -> dict[str, Any] | None:
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


def _size(n: int) -> str:
    """Bytes for a log line.

    >>> _size(64 << 20), _size(200_000)
    ('64 MiB', '195 KiB')
    """
    return f"{n / (1 << 20):.0f} MiB" if n >= 1 << 20 else f"{n / 1024:.0f} KiB"


def _often(count: int) -> bool:
    """Log the first ten of a kind, then every hundredth: a failure on every step of a long run
    must not flood the training log."""
    return count <= 10 or count % 100 == 0
