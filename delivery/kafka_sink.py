"""A Kafka sink that never blocks training and never loses a step.

``write(record)`` (the training thread) only numbers the record, encodes it and puts it on a
bounded in-memory queue — or, if that queue is full, appends it to the local spool. The rest
happens in small pieces, one idea each:

* :mod:`~foreshock.delivery.stream_numbers` — a gap-free ``seq`` per (run_id, rank) of this
  producer's ``attempt``, a synthesised ``start`` and ``end`` (``last_seq``);
* :mod:`~foreshock.delivery.sink_encoding` — the wire bytes, or a *stand-in* with the seq of a
  valid record too large to carry;
* :mod:`~foreshock.delivery.rejects` — what could not be sent: the rejects file and counters;
* :mod:`~foreshock.delivery.sink_spool` — the spool file, memory when it can't be written,
  and earlier producers' orphaned spools;
* :mod:`~foreshock.delivery.sender` — the one thread that owns the confluent-kafka producer:
  sends, spools what the broker did not acknowledge, probes with back-off, re-sends the
  spools in order, replays what a restarted broker forgot, and at close waits for the storage
  sink's group to confirm (``foreshock spool flush`` re-sends by hand).
* :mod:`~foreshock.delivery.control_requests` — the other way: a person's requests for this
  sink's runs from the control topic (``foreshock warnings act``), read by a thread of its
  own and handed to the trainer by ``poll_requests()`` at a step boundary.

Delivery is at least once: consumers drop duplicates on (run_id, rank, attempt, seq).

Nothing it is given, and no disk, can kill it: ``write`` and ``close`` never raise, and the
sending thread catches every failure of ``produce()``, the spool and the broker. A record that
can't be sent is *refused*: kept whole in a local rejects file (``<spool_dir>/<name>.rejects``,
JSON Lines, with the reason), counted in ``rejected`` and ``reasons``, logged, and flagged on the
run; the ``end`` of a stream with refused records carries ``rejected`` (count, reasons, the
rejects file). A spool that can't be written falls back to a bounded in-memory buffer
(``memory_bytes``), loudly; beyond it messages are *dropped* and counted (``dropped``,
``reasons``), except a run's ``start`` and ``end``.

Wire fields added here (see :mod:`foreshock.transport.wire`): ``kind``; ``attempt``, this
producer's incarnation (its restart count and start time, :mod:`foreshock.transport.attempts`,
unless given: a job restarted from a checkpoint under the same run id is a new attempt, and
its seqs start again at 0 without colliding); a gap-free ``seq`` per (run_id, rank, attempt);
a ``start`` message (synthesised if the caller sent none) with the producer's version; an
``end`` message with ``last_seq`` (synthesised by ``close`` if none was sent).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import queue
import socket
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from foreshock.transport.attempts import attempt_number, scheduler_restart
from foreshock.transport.records import RUN_SCHEMA
from foreshock.transport.settings import KafkaSettings, load_settings

from .control_requests import ControlRequests
from .rejects import Rejects
from .sender import PRODUCER_DEFAULTS, Sender, client_max_bytes
from .sink_encoding import RECORD_OVERHEAD, Encoder
from .sink_spool import SinkSpool
from .spool import SpooledMessage
from .stranded import expire_kept
from .stream_numbers import StreamNumbers

__all__ = ["PRODUCER_DEFAULTS", "RECORD_OVERHEAD", "KafkaSink", "KafkaSinkConfig"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class KafkaSinkConfig:
    """The Kafka sink's knobs (the broker's address and topics are ``KafkaSettings``)."""

    queue_size: int = 10_000  # messages between the training thread and the sending thread
    probe_interval: float = 2.0  # s before the first probe of an absent broker, then doubled
    max_probe_interval: float = 30.0  # s: the longest wait between probes
    close_timeout: float = 10.0  # s ``close`` waits for the broker before spooling the rest
    replay_bytes: int = 64 << 20  # recent acknowledged messages re-sent to a restarted broker
    name: str | None = None  # spool and rejects file name (default host-pid-random)
    confirm_group: str | None = "foreshock-sink"  # the storage sink's group, waited for at close
    confirm_timeout: float = 5.0  # s ``close`` waits for that group to commit past its messages
    memory_bytes: int = 64 << 20  # the in-memory spool when the spool file can't be written
    attempt: int | None = None  # this producer's attempt number (default: restart, start time)
    restart: int | None = None  # the restart count (default: the scheduler's)


class _Read:
    """A read-only attribute of the sink that one of its pieces keeps (``part.name``)."""

    def __init__(self, part: str, name: str) -> None:
        self.part, self.name = part, name

    def __get__(self, sink: Any, owner: type | None = None) -> Any:
        return self if sink is None else getattr(getattr(sink, self.part), self.name)


class KafkaSink:
    """Send monitoring records to Kafka; see the module docstring for the guarantees.

    ``KafkaSink(settings, config)`` or ``KafkaSink(settings, probe_interval=0.5, …)``: any
    field of :class:`KafkaSinkConfig` as a keyword.

    Counters: ``delivered``, ``spooled``, ``replayed``, ``stranded`` (spooled messages for a
    topic the broker does not have, set aside: :mod:`~foreshock.delivery.stranded`);
    ``rejected`` (records refused, see ``rejects_path``), ``dropped`` (valid messages no spool
    could hold), ``reasons`` (both, by reason), ``errors`` (unexpected exceptions caught);
    ``spool_error`` (why the spool file is not being written, or None); ``unconfirmed``
    (messages spooled at close: not confirmed stored).
    """

    def __init__(
        self,
        settings: KafkaSettings | None = None,
        config: KafkaSinkConfig | None = None,
        **knobs: Any,
    ) -> None:
        self.settings = settings or load_settings()
        self.config = dataclasses.replace(config or KafkaSinkConfig(), **knobs)
        c = self.config
        # which incarnation of its runs this producer is (foreshock.transport.attempts): a run
        # resumed under the same run id by a new process gets a new, higher one
        self._started_us = time.time_ns() // 1000
        restart = scheduler_restart() if c.restart is None else c.restart
        attempt = attempt_number(restart, self._started_us) if c.attempt is None else c.attempt
        name = c.name or f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self._rejects = Rejects(Path(self.settings.spool_dir) / f"{name}.rejects")
        self._numbers = StreamNumbers(attempt, self._rejects)
        self._encoder = Encoder(
            self.settings.metrics_topic,
            client_max_bytes(self.settings),
            self._rejects,
            self._numbers,
        )
        self._spool = SinkSpool(self.settings.spool_dir, name, c.memory_bytes, self._rejects)
        self.expired_rejects = expire_kept(self.settings.spool_dir)
        self._queue: queue.Queue[SpooledMessage] = queue.Queue(maxsize=c.queue_size)
        self._sender = Sender(
            self.settings, c, self._queue, self._spool, self._rejects, self._encoder
        )
        self._control = ControlRequests(
            self.settings, self._started_us / 1e6, self._numbers.run_ids
        )

    # ---- the training thread ------------------------------------------------------------
    @property
    def attempt(self) -> int:
        return self._numbers.attempt

    def resume(self, restart: int) -> None:
        """This producer's runs resumed from a checkpoint written after ``restart - 1``
        restarts (``Monitor.load_state_dict`` calls it): its attempt number takes that
        restart count, so it orders after every attempt before the checkpoint whatever the
        clocks say (:mod:`foreshock.transport.attempts`). Only before the first message: a
        stream keeps its attempt (logged and ignored after)."""
        if self._numbers.started:
            log.warning("foreshock: resume(%s) after messages were sent: attempt kept", restart)
            return
        self._numbers.attempt = attempt_number(restart, self._started_us)

    def write(self, record: dict[str, Any]) -> None:
        """Number, encode and enqueue one record. Never blocks, never raises: a record that
        can't be sent is refused (counted, logged, kept in the rejects file)."""
        try:
            if self._sender.closing.is_set():
                self._rejects.refuse("closed", "written after close()", message=record)
                return
            try:
                messages = self._numbers.to_wire(record)
            except Exception as exc:  # not a dict, a rank that is no int, ...
                detail = f"{type(exc).__name__}: {exc}"
                self._rejects.refuse("invalid", detail, message=record)
                return
            for message in messages:
                item = self._encoder.encode(message)
                if item is None:
                    continue
                try:
                    self._queue.put_nowait(item)
                except queue.Full:
                    self._spool.put([item])
        except Exception as exc:
            self._rejects.error("write()", exc)

    def poll_requests(self) -> list[dict[str, Any]]:
        """A person's requests for this sink's runs (``foreshock warnings act``: checked
        ``foreshock.control/1`` remedy requests), each once, made since this sink started; []
        when none came. For a trainer's step boundary: it only drains what a background
        thread read (started on the first call), never blocks, never raises. The trainer
        answers each with an ``action`` record carrying its ``request_id``, through ``write``.
        """
        if self._sender.closing.is_set():
            return []
        return self._control.poll()

    def requests_seen(self) -> list[str]:
        """The ids of the requests this sink handed over or refused (for the checkpoint)."""
        return self._control.seen()

    def remember_requests(self, request_ids: list[str]) -> None:
        """Request ids an earlier attempt took (from its checkpoint): refused if they come
        again."""
        self._control.remember(request_ids)

    def fits(self, item: SpooledMessage) -> bool:
        """Whether the client and the wire format both take ``item``."""
        return self._encoder.fits(item)

    def max_value_bytes(self, key: bytes = b"") -> int:
        """The largest value this producer can send under ``key``."""
        return self._encoder.max_value_bytes(key)

    def close(self, timeout: float | None = None) -> None:
        """End open streams, deliver what the broker takes within ``timeout``, spool the rest.
        Never raises."""
        sender = self._sender
        if sender.closing.is_set():
            return
        self._control.close()
        for run_id, rank in self._numbers.open_streams():
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
        if timeout is not None:
            sender.close_timeout = timeout
        sender.closing.set()
        limit = sender.close_timeout + sender.confirm_timeout + 60.0
        sender.thread.join(limit)
        if sender.thread.is_alive():
            log.error(
                "foreshock: the Kafka sink's sending thread did not stop within %.0f s; "
                "what it still holds may be lost",
                limit,
            )
            return
        try:
            self._spool.close()
        except Exception as exc:
            self._rejects.error("close()", exc)
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
        return self._sender.wait_delivered(timeout)

    def pending(self) -> int:
        """Bytes waiting in this sink's spool (and memory) and the orphaned ones it re-sends."""
        return self._spool.pending()

    @property
    def spool_path(self) -> str:
        return self._spool.path

    # ---- counters, each kept by the piece that counts it --------------------------------
    rejects_path = _Read("_rejects", "path")
    rejected = _Read("_rejects", "rejected")
    dropped = _Read("_rejects", "dropped")
    errors = _Read("_rejects", "errors")
    reasons = _Read("_rejects", "reasons")
    spooled = _Read("_spool", "spooled")
    spool_error = _Read("_spool", "spool_error")
    delivered = _Read("_sender", "delivered")
    replayed = _Read("_sender", "replayed")
    stranded = _Read("_sender", "stranded")
    unconfirmed = _Read("_sender", "unconfirmed")
