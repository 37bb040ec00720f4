"""A person's requests for a running trainer, from the control topic, without ever blocking it.

``foreshock warnings act`` publishes a remedy request on the control topic
(:mod:`foreshock.transport.control`); the trainer's :class:`~foreshock.producers.kafka_sink.
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
* **Only its own runs.** ``poll()`` returns the requests whose ``run_id`` this sink writes;
  those for a run it has not written yet wait (a bounded few), those of other runs too.

Every request the trainer is handed has passed :func:`~foreshock.transport.control.
check_request`; a malformed one is counted (``invalid``) and skipped.
"""

from __future__ import annotations

import logging
import queue
import threading
import uuid
from collections.abc import Callable, Collection
from typing import Any

from foreshock.transport.control import ControlError, decode_request
from foreshock.transport.settings import RDKAFKA_LOG, KafkaSettings

__all__ = ["ControlRequests"]

log = logging.getLogger("foreshock.producers.control")

MAX_HELD = 1000  # requests held for runs this sink does not (yet) write; queued ones
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
    ) -> None:
        self.settings, self.started, self._run_ids = settings, started, run_ids
        self.max_wait = max_wait
        self._queue: queue.Queue[dict[str, Any]] = queue.Queue(maxsize=MAX_HELD)
        self._held: list[dict[str, Any]] = []  # for runs not (yet) this sink's
        self._known = -1  # how many run ids the held requests were last checked against
        self._seen: dict[str, None] = {}  # request ids taken, oldest first
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.taken = self.invalid = self.dropped = self.errors = 0

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
                break
        if not fresh and not self._held:
            return []
        runs = self._run_ids()
        if not fresh and len(runs) == self._known:
            return []  # nothing new, and no new run for the requests held
        self._known = len(runs)
        out: list[dict[str, Any]] = []
        held: list[dict[str, Any]] = []
        for request in self._held + fresh:
            (out if request["run_id"] in runs else held).append(request)
        self._held = held[-MAX_HELD:]
        return out

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
        from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

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
        consumer = Consumer(self.settings.librdkafka(config, logger=RDKAFKA_LOG))
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
            log.warning("foreshock: a control message skipped: %s", exc)
            return
        request_id = request["request_id"]
        if request["time"] < self.started or request_id in self._seen:
            return  # for an earlier producer of the run, or taken already
        self._seen[request_id] = None
        if len(self._seen) > 10 * MAX_HELD:
            del self._seen[next(iter(self._seen))]
        try:
            self._queue.put_nowait(request)
            self.taken += 1
        except queue.Full:
            self.dropped += 1
            log.warning("foreshock: control request %s dropped: none polled", request_id)


def _close(consumer: Any) -> None:
    """Close ``consumer`` (None too), whatever state it is in."""
    if consumer is not None:
        try:
            consumer.close()
        except Exception as exc:
            log.debug("foreshock: control consumer close: %r", exc)
