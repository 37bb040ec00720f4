"""A person's requests for a running trainer, from the control topic, without ever blocking it.

``foreshock warnings act`` publishes a remedy request on the control topic
(:mod:`foreshock.transport.control`); the trainer's :class:`~foreshock.delivery.kafka_sink.
KafkaSink` hands it over at a step boundary (``poll_requests()``). What decides the design is
the training loop: a step boundary must cost nothing and can never wait on a broker.

* **One thread of its own, started on the first poll.** It owns its consumer; ``poll()`` only
  drains a queue the thread fills. A broker that is down, a topic that does not exist yet, a
  restarted broker that forgot it: the thread waits (1 s, doubling to 30 s) and tries again;
  nothing reaches the training thread but an empty list.
* **No consumer group.** Every trainer reads every request and keeps its own: a group would
  share the partitions among trainers (one trainer would get another's run) and commit
  offsets a restarted attempt must not inherit. The thread assigns every partition from its
  beginning (the topic holds a few requests a day) and keeps a request only if it was made
  after this producer started — a request for an earlier attempt of the run is not this one's
  to follow — and only once per ``request_id`` (a replay after a broker restart, a re-read).
* **Only its own runs, filtered before any queue.** A request whose ``run_id`` this sink does
  not write is counted (``other_runs``) and dropped in the thread: a fleet's traffic on the
  topic can neither fill the trainer's queue nor evict its own requests. Malformed messages
  are counted (``invalid``), logged once and then every 1,000th.
* **Only approved hands** (:mod:`foreshock.transport.approvals`). Every request for its runs is
  verified against the allowlist of approvers' keys (``FORESHOCK_KAFKA_APPROVERS``; none: no
  request is followed): unsigned, unknown-key, badly signed, expired and future-dated
  requests, and a request id seen before (a replay), are handed over *refused* (``refused``:
  why), so that the trainer records the refusal; a verified one carries ``approver`` (the
  allowlist's key id and name; ``by`` is that name, never the sender's text).

Every request the trainer is handed has passed :func:`~foreshock.transport.control.
check_request`.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
import uuid
from collections.abc import Callable, Collection
from typing import Any

from foreshock.transport.approvals import Allowlist, ApprovalError
from foreshock.transport.control import ControlError, decode_request
from foreshock.transport.settings import KafkaSettings

__all__ = ["ControlRequests"]

log = logging.getLogger("foreshock.producers.control")

MAX_QUEUED = 1000  # this sink's runs' requests not yet polled (a trainer polls every step)
MAX_REMEMBERED = 10_000  # request ids seen, for refusing replays (the newest kept)
_PROBE = 2.0  # s: the longest a probe of the broker takes (``close`` waits for it to end)
_GONE = {"UNKNOWN_TOPIC_OR_PART", "_UNKNOWN_TOPIC", "_UNKNOWN_PARTITION"}


class _RebuildError(Exception):
    """The topic went away under the consumer (a restarted broker): start again."""


class ControlRequests:
    """The control topic's requests for ``run_ids()``, made after ``started`` (Unix seconds).

    ``poll()`` never blocks nor raises; ``close()`` stops the thread. Counters: ``taken``
    (requests queued), ``invalid``, ``dropped`` (the queue was full), ``errors`` (failures of
    the consumer, retried).
    """

    def __init__(
        self,
        settings: KafkaSettings,
        started: float,
        run_ids: Callable[[], Collection[str]],
        max_wait: float = 30.0,
        approvers: Allowlist | None = None,
    ) -> None:
        self.settings, self.started, self._run_ids = settings, started, run_ids
        self.max_wait = max_wait
        self.approvers = approvers if approvers is not None else _allowlist(settings)
        self._queue: queue.Queue[dict[str, Any]] = queue.Queue(maxsize=MAX_QUEUED)
        self._seen: dict[str, None] = {}  # request ids taken, oldest first
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.taken = self.invalid = self.dropped = self.errors = 0
        self.other_runs = self.refused = 0

    def remember(self, request_ids: Collection[str]) -> None:
        """Request ids an earlier attempt took (its checkpoint's): a replay of one is refused."""
        for request_id in request_ids:
            self._seen[str(request_id)] = None

    def seen(self) -> list[str]:
        """The request ids taken (the newest ``MAX_REMEMBERED``), for the checkpoint (read
        while the control thread may add one: asked again then)."""
        for _ in range(3):
            with contextlib.suppress(RuntimeError):
                return list(self._seen)
        return []

    # ---- the training thread ------------------------------------------------------------
    def poll(self) -> list[dict[str, Any]]:
        """The requests that came for this sink's runs since the last poll (in order)."""
        try:
            if self._thread is None and not self._stop.is_set():
                self._thread = threading.Thread(
                    target=self._run, name="foreshock-control", daemon=True
                )
                self._thread.start()
            return self._mine()
        except Exception as exc:  # never into the training loop
            self.errors += 1
            log.warning("foreshock: control requests: %r", exc)
            return []

    def _mine(self) -> list[dict[str, Any]]:
        fresh = []
        while True:
            try:
                fresh.append(self._queue.get_nowait())
            except queue.Empty:
                return fresh

    def close(self, timeout: float = _PROBE + 1.0) -> None:
        """Stop the thread (it closes its consumer; a probe under way ends first); never
        raises. The thread is a daemon: one that outlives ``timeout`` keeps no process up."""
        self._stop.set()
        thread = self._thread
        if thread is not None and thread.is_alive():
            thread.join(timeout)

    # ---- the control thread -------------------------------------------------------------
    def _run(self) -> None:
        consumer, wait = None, 1.0
        while not self._stop.is_set():
            try:
                if consumer is None:
                    consumer = self._consumer()
                    wait = 1.0
                for raw in consumer.consume(50, 0.5):
                    self._take(raw)
            except Exception as exc:  # the broker away, the topic gone: again, later
                self.errors += 1
                log.debug("foreshock: control topic: %r; retrying in %.0f s", exc, wait)
                _close(consumer)
                consumer = None
                self._stop.wait(wait)
                wait = min(wait * 2, self.max_wait)
        _close(consumer)

    def _consumer(self) -> Any:
        """A consumer of every partition of the control topic from its beginning (the topic
        made first if missing: the probe logs nothing while the broker is away)."""
        from confluent_kafka import OFFSET_BEGINNING, TopicPartition

        from foreshock.transport.clients import topic_consumer
        from foreshock.transport.topics import ensure_topics

        name = self.settings.control_topic
        topics = ensure_topics(self.settings, timeout=_PROBE, names=[name], quiet=True)
        if not topics.partitions.get(name):
            raise _RebuildError(f"no topic {name}")
        config = {
            "group.id": f"foreshock-control-{uuid.uuid4().hex[:12]}",
            "enable.auto.commit": False,
            "enable.partition.eof": False,
            "auto.offset.reset": "earliest",
        }
        consumer = topic_consumer(self.settings, config)
        partitions = range(topics.partitions[name])
        consumer.assign([TopicPartition(name, p, OFFSET_BEGINNING) for p in partitions])
        return consumer

    def _take(self, raw: Any) -> None:
        error = raw.error()
        if error is not None:
            if error.name() in _GONE:
                raise _RebuildError(error.name())
            return
        try:
            request = decode_request(raw.value())
        except ControlError as exc:
            self.invalid += 1
            if self.invalid % 1000 == 1:  # the first, then every 1,000th: never a flood
                log.warning("foreshock: %d control message(s) skipped; last: %s", self.invalid, exc)
            return
        if not self._ours(request["run_id"]):
            self.other_runs += 1  # another trainer's: counted, never queued
            return
        if request["time"] < self.started and request["request_id"] not in self._seen:
            return  # made for an earlier attempt of the run: not this one's to follow
        self._queue_request(self._verified(request))

    def _ours(self, run_id: str) -> bool:
        """Whether this sink writes ``run_id`` (asked from this thread while the training
        thread may add a stream: a set built mid-insert is asked again)."""
        for _ in range(3):
            with contextlib.suppress(RuntimeError):
                return run_id in self._run_ids()
        return False

    def _verified(self, request: dict[str, Any]) -> dict[str, Any]:
        """``request`` with its ``approver``, or with ``refused`` saying why not."""
        request_id = request["request_id"]
        if request_id in self._seen:
            return {**request, "refused": "already taken (a replay)"}
        self._seen[request_id] = None
        if len(self._seen) > MAX_REMEMBERED:
            del self._seen[next(iter(self._seen))]
        name, why = self.approvers.verify(request, time.time())
        if why is not None:
            return {**request, "refused": why}
        return {**request, "by": name, "approver": {"key_id": request["key_id"], "name": name}}

    def _queue_request(self, request: dict[str, Any]) -> None:
        self.refused += "refused" in request
        try:
            self._queue.put_nowait(request)
            self.taken += 1
        except queue.Full:
            self.dropped += 1
            if self.dropped % 1000 == 1:
                log.warning("foreshock: %d control request(s) dropped: none polled", self.dropped)


def _close(consumer: Any) -> None:
    """Close ``consumer`` (None too), whatever state it is in."""
    if consumer is not None:
        try:
            consumer.close()
        except Exception as exc:
            log.debug("foreshock: control consumer close: %r", exc)


def _allowlist(settings: KafkaSettings) -> Allowlist:
    """The trainer's approvers (``settings.approvers``, a file); one that cannot be read is
    logged and none are followed: a trainer never follows a request it cannot verify."""
    try:
        return Allowlist.load(getattr(settings, "approvers", ""))
    except ApprovalError as exc:
        log.warning("foreshock: no remote request will be followed: %s", exc)
        return Allowlist([])
