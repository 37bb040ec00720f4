"""The Kafka sink's sending thread: send, spool, probe, re-send, and confirm at close.

Why a thread of its own: the training thread only enqueues. One background thread owns the
confluent-kafka producer: it sends, serves delivery callbacks, and spools every message the
broker did not acknowledge (unreachable, restarted, timed out). While the broker is away it
probes after ``probe_interval`` seconds, doubling the wait up to ``max_probe_interval`` (a long
outage costs the training process nothing); when it is back it re-creates the topics (a
restarted Tansu forgot them) and re-sends the spools in order before anything newer.

An acknowledgement is not storage: the embedded broker keeps messages in memory, so one that
restarts forgets what it had acknowledged. While the producer lives it re-sends its recent
acknowledged messages (``replay_bytes``) when it finds the broker restarted. When it closes it
waits up to ``confirm_timeout`` s for the storage sink's consumer group (``confirm_group``) to
commit past its messages — the sink commits only what it stored durably — and spools what is
still unconfirmed, to be re-sent later. Nothing it meets kills it: every turn's failure is
counted and the next turn goes on.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from pathlib import Path
from typing import Any

from foreshock.transport.settings import KafkaSettings
from foreshock.transport.topics import ensure_topics
from foreshock.transport.wire import MAX_MESSAGE_BYTES

from .confirm import RecentWindow, unconfirmed
from .rejects import Rejects
from .sink_encoding import RECORD_OVERHEAD, Encoder
from .sink_spool import SinkSpool
from .spool import MemorySpool, Spool, SpooledMessage
from .stranded import strand

__all__ = ["PRODUCER_DEFAULTS", "Sender", "client_max_bytes"]

log = logging.getLogger("foreshock.delivery.kafka_sink")

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
_BATCH = 500  # spooled messages re-sent, then committed, at a time


class Sender:
    """The thread that delivers a queue's messages (see the module docstring).

    Counters: ``delivered``, ``replayed`` (re-sent after a broker restart), ``stranded``
    (spooled messages for a topic the broker does not have, set aside), ``unconfirmed``
    (spooled at close: not confirmed stored)."""

    def __init__(
        self,
        settings: KafkaSettings,
        config: Any,  # KafkaSinkConfig: the knobs it reads are named below
        messages: queue.Queue[SpooledMessage],
        spool: SinkSpool,
        rejects: Rejects,
        encoder: Encoder,
    ) -> None:
        self.settings, self.messages = settings, messages
        self.probe_interval, self.max_probe_interval = (
            config.probe_interval,
            config.max_probe_interval,
        )
        self.close_timeout = config.close_timeout
        self.confirm_group, self.confirm_timeout = config.confirm_group, config.confirm_timeout
        self.spool, self.rejects, self.encoder = spool, rejects, encoder
        self.delivered = self.replayed = self.stranded = self.unconfirmed = 0
        self.online = self.lost_brokers = self.broker_restarted = False
        self.topics: set[str] = set()  # topics the broker was seen to have
        self.recent = RecentWindow(config.replay_bytes)
        self.replay: list[SpooledMessage] = []
        self.producer: Any = None
        self.closing = threading.Event()
        self.thread = threading.Thread(target=self._loop, name="foreshock-kafka", daemon=True)
        self.thread.start()

    def wait_delivered(self, timeout: float) -> bool:
        """Block until the queue, the producer and every spool are empty, or ``timeout``."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            producer_empty = self.producer is not None and len(self.producer) == 0
            # unfinished_tasks, not empty(): a message the thread has taken off the queue but
            # not yet handed to the producer or the spool is neither, and not delivered
            quiet = self.messages.unfinished_tasks == 0 and not self.spool.pending()
            if self.online and producer_empty and quiet:
                return True
            time.sleep(0.05)
        return False

    # ---- the loop -----------------------------------------------------------------------
    def _loop(self) -> None:
        """Send, spool, probe — until closing and the queue is empty. An exception in one turn
        is counted and logged, and the next turn goes on: nothing the thread meets kills it."""
        state = {"next_probe": 0.0, "delay": self.probe_interval}
        failures = 0
        while True:
            closing = self.closing.is_set()
            try:
                self._turn(state, closing)
                failures = 0
            except Exception as exc:
                failures += 1
                self.rejects.error("sending thread", exc)
                time.sleep(min(0.05 * failures, 1.0))
                if closing and failures >= 20:
                    break  # _finish spools what is left in the queue
            if closing and self.messages.empty():
                break
        self._finish()

    def _turn(self, state: dict[str, float], closing: bool) -> None:
        if not self.online and time.monotonic() >= state["next_probe"]:
            self.online = self._connect()
            state["delay"] = (
                self.probe_interval
                if self.online
                else min(2 * state["delay"], max(self.probe_interval, self.max_probe_interval))
            )
            state["next_probe"] = time.monotonic() + state["delay"]
        if self.online:
            self._drain_spools(time_budget=0.5)
        self._move_queue(block=not closing)
        if self.producer is not None:
            self.producer.poll(0)
        self.spool.sync()

    def _move_queue(self, block: bool) -> None:
        try:
            items = [self.messages.get(timeout=0.05 if block else 0)]
        except queue.Empty:
            return
        while len(items) < 1000:
            try:
                items.append(self.messages.get_nowait())
            except queue.Empty:
                break
        try:
            direct = self.online and self.producer is not None and self.spool.own_pending() == 0
            spill = []
            for item in items:
                direct = direct and self._send(item, self._on_delivery, wait=False)
                if not direct:
                    spill.append(item)
            if spill:
                self.spool.put(spill)
        finally:
            for _ in items:  # in the producer or the spool now: wait_delivered sees them there
                self.messages.task_done()

    # ---- one message --------------------------------------------------------------------
    def _send(self, item: SpooledMessage, callback: Any, wait: bool) -> bool:
        """Produce ``item``; False only on a full client queue with ``wait`` False (the caller
        spools it). Anything else ``produce()`` raises refuses the message (the rejects file)
        and sends its stand-in instead: one message never stops the ones behind it."""
        stand_in = False
        message: SpooledMessage | None = item
        if not self.encoder.fits(item):
            detail = self.encoder.size_detail(item)
            message, stand_in = self.encoder.quarantine(item, "too large", detail), True
        while message is not None:
            try:
                self.producer.produce(
                    message.topic, key=message.key, value=message.value, on_delivery=callback
                )
                return True
            except BufferError:
                if not wait:
                    return False
                self.producer.poll(0.1)
            except Exception as exc:  # KafkaException (MSG_SIZE_TOO_LARGE, ...), TypeError
                if stand_in:
                    self.rejects.error("produce() of a stand-in", exc)
                    return True
                why = f"produce() raised {exc}"
                message = self.encoder.quarantine(message, "refused by the client", why)
                stand_in = True
        return True

    def _on_delivery(self, err: Any, msg: Any) -> None:
        try:
            item = SpooledMessage(msg.topic(), msg.key(), msg.value())
            if err is None:
                self.delivered += 1
                self.recent.add(item, msg.partition(), msg.offset())
            elif err.name() in _REFUSED:
                self._refused_by_broker(item, err)
            else:
                self.online = False
                self.spool.put([item])
        except Exception as exc:  # an exception here would come out of poll() and flush()
            self.rejects.error("delivery report", exc)

    def _refused_by_broker(self, item: SpooledMessage, err: Any) -> None:
        detail = f"{err.name()}: {err.str()}"
        stand_in = self.encoder.quarantine(item, "refused by the broker", detail)
        if stand_in is not None:
            self.spool.put([stand_in])

    def _on_error(self, err: Any) -> None:
        if err.name() in _DOWN:
            self.online = False
            self.lost_brokers = True

    # ---- the broker, and what it must be sent again -------------------------------------
    def _connect(self, timeout: float = float("inf")) -> bool:
        """Reach the broker and (re-)create the topics, within ``timeout`` and one probe's time."""
        try:
            topics = ensure_topics(
                self.settings,
                timeout=min(timeout, 5.0, self.probe_interval + 1.0),
                quiet=True,
                names=[
                    self.settings.metrics_topic,
                    self.settings.deadletter_topic,
                    self.settings.control_topic,
                ],
            )
        except Exception:
            self.lost_brokers = self.lost_brokers or self.producer is not None
            return False
        if self.lost_brokers or self.settings.metrics_topic in topics.created:
            self.replay = self.recent.take()  # the broker may have lost what it acknowledged
            self.replayed += len(self.replay)
            self.broker_restarted = self.broker_restarted or bool(self.replay)
        self.lost_brokers = False
        if self.producer is None:
            from foreshock.transport.clients import topic_producer

            self.producer = topic_producer(
                self.settings, PRODUCER_DEFAULTS, error_cb=self._on_error
            )
        return True

    def _drain_spools(self, time_budget: float) -> None:
        """Re-send spooled messages, oldest spool first, in order, batch by batch."""
        deadline = time.monotonic() + time_budget
        while self.replay and self.online and time.monotonic() < deadline:
            batch, self.replay = self.replay[:_BATCH], self.replay[_BATCH:]
            if not self._send_batch(batch):
                self.replay = batch + self.replay
                self.online = False
                return
        for spool in self.spool.drain_order():
            while self.online and time.monotonic() < deadline:
                with self.spool.lock:
                    batch, end = spool.read_batch(_BATCH)
                if not batch:
                    break
                batch = self._set_aside_stranded(spool, batch)
                if batch and not self._send_batch(batch):
                    self.online = False
                    return
                with self.spool.lock:
                    spool.commit(end)
                self.delivered += len(batch)
        self.spool.release_others(only_empty=True)

    def _set_aside_stranded(
        self, spool: Spool | MemorySpool, batch: list[SpooledMessage]
    ) -> list[SpooledMessage]:
        """``batch`` less the messages for topics the broker does not have, which go to the
        stranded file (:mod:`~foreshock.delivery.stranded`): sent, they would time out as if
        the broker were down, and hold up every spool behind them for good."""
        unknown = {m.topic for m in batch} - self.topics
        if not unknown:
            return batch
        try:
            self.topics |= set(self.producer.list_topics(timeout=5.0).topics)
        except Exception:  # the broker is away: nothing is stranded by a failed lookup
            return batch
        missing = unknown - self.topics
        if not missing:
            return batch
        where = getattr(spool, "path", None) or Path(self.settings.spool_dir) / "memory.spool"
        stranded = [m for m in batch if m.topic in missing]
        try:
            strand(where, stranded, missing)
        except OSError as exc:
            self.rejects.error(f"stranded file ({exc})", exc)
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
                self.recent.add(item, msg.partition(), msg.offset())

        for item in batch:
            self._send(item, acked, wait=True)
        left = self.producer.flush(PRODUCER_DEFAULTS["message.timeout.ms"] / 1000 + 1)
        if left or any(err.name() not in _REFUSED for err, _ in failed):
            return False
        for err, item in failed:
            self._refused_by_broker(item, err)
        return True

    # ---- closing ------------------------------------------------------------------------
    def _finish(self) -> None:
        """Closing: deliver within ``close_timeout``; spool whatever is still unacknowledged.
        Adopted spools are released either way: a later flush, or another sink in this same
        process, must be able to take them. A sink still waiting out its probe back-off tries
        the broker once more first: a run that ends seconds after the broker came back must not
        leave its records in the spool."""
        try:
            self._deliver_at_close()
        except Exception as exc:
            self.rejects.error("closing", exc)
        finally:
            left = []
            with contextlib.suppress(queue.Empty):
                while True:
                    left.append(self.messages.get_nowait())
            if left:
                self.spool.put(left)
            for _ in left:
                self.messages.task_done()
            self.spool.release_others(only_empty=False)
            self.producer = None  # its threads and sockets go now, not at interpreter exit

    def _deliver_at_close(self) -> None:
        if not self.online and self.close_timeout > 0:
            self.online = self._connect(self.close_timeout)
        if self.producer is not None:
            if self.online:
                self._drain_spools(time_budget=self.close_timeout)
            left = self.producer.flush(self.close_timeout if self.online else 0)
            if left:
                self.producer.purge(in_queue=True, in_flight=True)
                self.producer.flush(1.0)  # purged messages come back through _on_delivery
            elif self.online:
                self._keep_unconfirmed()

    def _keep_unconfirmed(self) -> None:
        """Closing: spool what the storage sink's group has not confirmed stored
        (:func:`~foreshock.delivery.confirm.unconfirmed`): a broker that restarts without its
        data after this producer is gone must not take those messages with it."""
        if not self.confirm_group or not self.recent.items:
            return
        left = unconfirmed(
            self.settings,
            self.confirm_group,
            list(self.recent.items),
            self.broker_restarted,
            self.confirm_timeout,
        )
        if left:
            self.spool.put(left)
            log.warning(
                "foreshock: %d messages not yet confirmed stored by consumer group %r; kept in %s",
                len(left),
                self.confirm_group,
                self.spool.path,
            )
        self.unconfirmed = len(left)


def client_max_bytes(settings: KafkaSettings) -> int:
    """The producer's ``message.max.bytes``, pass-through settings included."""
    value = settings.librdkafka(PRODUCER_DEFAULTS).get("message.max.bytes", 1_000_000)
    try:
        return int(value)
    except (TypeError, ValueError):
        return 1_000_000  # librdkafka's default
