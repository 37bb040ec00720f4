"""``foreshock sink``: the metrics, warnings and dead-letter topics into the store, in batches.

Any number of sinks run in one consumer group; each owns the partitions Kafka assigns it, and
all append to the same Delta tables (:mod:`foreshock.storage.store`). One consumer-group member
reads three topics: the metrics topic (monitoring records *and* the run-lifecycle
``start``/``end`` messages — they share the run's key and partition, so a run's start is stored
before its records and its end after them), the warnings topic and the dead-letter topic. Each
loop:

1. **Poll** up to ``batch_values`` metric values or ``max_wait`` seconds of messages.
2. **Convert** each message to Arrow columns (:class:`~foreshock.storage.rows.BatchBuilder`).
   Already-stored messages are dropped first: (run, rank, seq) for metrics — a producer's seq
   and step go together, so this is idempotence on (run, step) — and the event key for
   warnings and dead letters. A message that decodes but cannot be stored becomes a
   ``dead_letters`` row with the reason; the others of the batch are kept.
3. **Write** the batch (one Delta commit per table, :mod:`~foreshock.storage.held`). A table
   that fails keeps its rows held, under the same batch number (so a commit that landed is
   never repeated), and is retried at the next flush while the other tables are written; past
   ``hold_values`` held values the sink stops polling and retries with backoff.
4. **Commit** the consumed offsets — only once nothing is held, so a crash before this point
   means the batch is delivered again and step 2 drops what was already written.
5. Every ``compact_every`` seconds, in a background thread: compact, prune runs older than
   ``retention_days``, vacuum files older than ``retain_hours``.

**Exactly once across sinks and restarts.** A run's messages share one partition, and a
partition has one owner at a time, so the owner's dedup state is the only one that matters for
its streams. That state is *read back from the store on every assignment* (the streams' stored
seqs, the stored warning and dead-letter keys, values whose step row a crashed writer never
committed) — after the previous owner has written and committed what it held (on revoke it
flushes; a member that *lost* its partitions, having missed its session, drops what it holds
unwritten instead). So a restart, a rebalance, a SIGKILL between two tables' commits, or a
replay from offset 0 (a restarted Tansu forgets offsets) stores nothing twice.
"""

from __future__ import annotations

import contextlib
import logging
import math
import threading
import time
from pathlib import Path
from typing import Any

from foreshock.transport.checkpoint import Checkpoint
from foreshock.transport.consumer import MetricsConsumer
from foreshock.transport.envelope import Consumed
from foreshock.transport.service import ServiceUnavailableError, as_config
from foreshock.transport.service_loop import StopServiceError, run_service
from foreshock.transport.settings import KafkaSettings
from foreshock.transport.topics import wait_for_topics

from .acks import event_key
from .attempts import AttemptTracker
from .held import HeldBatches
from .location import StoreLocation
from .periodic import periodically
from .retention import prune
from .rows import BatchBuilder, RecordError
from .second_writer import SecondWriterError, WriterLease, refuse_a_second_writer
from .sink_config import SinkConfig
from .sink_decoders import decode_dead_letter, decode_warning, header_int
from .sink_stats import SinkStats
from .store import DeltaStore, first_line
from .stored_state import StoredState

__all__ = ["MAX_HELD", "SecondWriterError", "SinkConfig", "StorageSink"]

MAX_HELD = 1_000  # batches held for a table that fails (warnings-only ones hold no values)

log = logging.getLogger(__name__)


class StorageSink:
    """The sink service; ``run(stop)`` loops steps 1–5 until ``stop`` is set.

    ``StorageSink(settings, root, group_id=…)`` (the keywords of :class:`SinkConfig`) is the
    same as ``StorageSink(settings, SinkConfig(root, group_id=…))``.
    """

    def __init__(
        self,
        settings: KafkaSettings,
        config: SinkConfig | str | Path | StoreLocation | None,
        **options: Any,
    ) -> None:
        self.settings = settings
        self.config = config = as_config(SinkConfig, config, options)
        self._stop = threading.Event()  # run()'s: a SIGTERM ends every wait for the store
        root = config.root
        try:
            self.store = DeltaStore(
                str(root) if isinstance(root, Path) else root, writer=config.group_id
            )
        except Exception as exc:  # away at start: ``serve`` waits for it, as we do mid-run
            raise ServiceUnavailableError(f"the store {root} cannot be opened ({exc})") from exc
        if self.store.damaged:  # the read-back needs every table (`foreshock store check`)
            name, error = next(iter(self.store.damaged.items()))
            raise ServiceUnavailableError(
                f"the store {root} cannot be opened: table {name} does not open "
                f"({first_line(error)}; `foreshock store check` names a damaged commit)"
            )
        self.location = self.store.location
        try:
            c = config
            refuse_a_second_writer(
                self.store, self.location.uri, c.group_id, c.writer_window, c.take_over
            )
            self.lease = WriterLease(self.location, c.group_id)
            self.lease.acquire(c.take_over)  # held while this sink runs: checked every commit
        except SecondWriterError:
            self.store.close()
            raise
        self.telemetry = None
        if config.metrics_port is not None:
            from foreshock.telemetry import ServiceTelemetry

            try:
                self.telemetry = ServiceTelemetry("sink", config.metrics_port, config.metrics_host)
            except BaseException:  # the port is in use
                self.store.close()
                raise
        wait_for_topics(settings, "sink")  # the broker may start later
        self.consumer = MetricsConsumer(
            settings,
            config.group_id,
            decoders={
                settings.warnings_topic: decode_warning,
                settings.deadletter_topic: decode_dead_letter,
            },
            on_assign=self._assigned,
            on_revoke=self._revoked,
        )
        self.checkpoint = Checkpoint(self.consumer, "sink", flush=self._write_batch)
        self.stored = StoredState()  # what the store holds already (read back)
        self.attempts = AttemptTracker()
        self.builder = BatchBuilder()
        self.held = HeldBatches()  # batches some table of the store has not taken yet
        self._held_since: float | None = None
        self._held_said = -math.inf
        self.first_message_at: float | None = None  # perf_counter of the first message polled
        self.stats = SinkStats()
        try:
            self._read_back()
        except Exception as exc:
            self.consumer.close()
            self.store.close()
            raise ServiceUnavailableError(f"the store {root} cannot be read ({exc})") from exc

    def _read_back(self) -> None:
        """Rebuild the dedup state from the store (``stored_state``; "Exactly once" above)."""
        duplicates = self.consumer.dedup.duplicates
        self.consumer.dedup = self.stored.read_back(self.location, duplicates)
        self.stats.read_backs += 1

    def _assigned(self, consumer: Any, partitions: list[Any]) -> None:
        """Read the store back before anything of the new partitions is polled; while the
        store cannot be read, wait (with backoff) rather than admit with a stale state."""
        delay = 0.5
        while True:
            try:
                self._read_back()
                return
            except Exception as exc:  # the store is away or unreadable
                self.stats.read_back_retries += 1
                log.error(
                    "foreshock sink: reading the store back failed (%s); retrying in %.1f s",
                    exc,
                    delay,
                )
                self._backoff(delay)
                delay = min(delay * 2, 30.0)

    def _backoff(self, delay: float) -> None:
        """Wait ``delay`` s before retrying the store, unless the sink is told to stop: then
        give up (``_StoppedError``) — what is not written is not committed, and the broker keeps
        it for the next sink. A SIGTERM used to wait for a store that might never come back."""
        if self._stop.wait(delay):
            raise _StoppedError

    def _revoked(self, consumer: Any, partitions: list[Any], lost: bool) -> None:
        """Hand over: write and commit what this member holds, unless it already lost it.
        What the store would not take stays uncommitted: the next owner reads it again."""
        if not lost:
            self._flush()
        self.builder.take()
        if self.held.drop():
            log.warning("foreshock sink: partitions handed over with tables held; uncommitted")

    def add(self, consumed: Consumed, now: float) -> None:
        """Step 2 for one message."""
        message, topic = consumed.message, consumed.topic
        partition, offset = consumed.partition, consumed.offset
        if topic == self.settings.deadletter_topic:
            key = (
                "d",
                message["source"],
                header_int(message["origin_partition"]),
                header_int(message["origin_offset"]),
            )
            if key[2] is None or key not in self.stored.seen:
                self.stored.seen.add(key)
                self.builder.add_dead_letter(
                    message["raw"], message["reason"], key[1], key[2], key[3], now
                )
                self.stats.dead_letters += 1
            return
        try:
            if topic == self.settings.warnings_topic:
                key = ("w", *event_key(message))
                if key in self.stored.seen:
                    self.stats.duplicates += 1
                    return
                self.builder.add_warning(message, now)
                self.stored.seen.add(key)
            elif self._stray(message, partition, offset, now):
                return
            elif message["kind"] == "metrics":
                self.builder.add_metrics(message, now, self.stored.has_values(message))
            else:
                self.builder.add_lifecycle(message, now)
        except RecordError as exc:
            where = "metrics" if topic == self.settings.metrics_topic else topic
            self._reject(message, str(exc), f"sink:{where}", partition, offset, now)
            return
        self.stats.messages += 1

    def _stray(
        self, message: dict[str, Any], partition: int | None, offset: int | None, now: float
    ) -> bool:
        """A message of a stray attempt (another job under a live run id): stored apart, as a
        dead letter with the reason, never in the run's tables (:mod:`.attempts`)."""
        reason = self.attempts.observe(message)
        if reason is not None:
            self.stats.collisions += 1
            self._reject(message, reason, "sink:identity", partition, offset, now)
        return reason is not None

    def _reject(
        self,
        message: dict[str, Any],
        reason: str,
        source: str,
        partition: int | None,
        offset: int | None,
        now: float,
    ) -> None:
        """A message that decoded but cannot be stored: a dead-letter row, once per origin."""
        import json

        key = ("d", source, partition, offset)
        if key in self.stored.seen:
            self.stats.duplicates += 1
            return
        self.stored.seen.add(key)
        try:
            raw = json.dumps(message, default=str).encode()
        except (TypeError, ValueError, RecursionError):
            raw = repr(message)[:100_000].encode("utf-8", "replace")
        self.builder.add_dead_letter(raw, reason, source, partition, offset, now)
        self.stats.dead_letters += 1
        log.warning("foreshock sink: stored as dead letter: %s", reason)

    def step(self) -> int:
        """One loop (steps 1–4); returns the number of messages stored."""
        start, count = time.monotonic(), 0
        limit, wait = self.config.batch_values, self.config.max_wait
        while self.builder.values < limit and time.monotonic() - start < wait:
            batch = self.consumer.poll_batch(2000, timeout=0.2)
            now = time.time()
            if batch and self.first_message_at is None:
                self.first_message_at = time.perf_counter()
            for consumed in batch:
                self.add(consumed, now)
            count += len(batch)
            if not batch and count:
                break
        self._flush()
        self._report()
        return count

    def _flush(self) -> None:
        """Steps 3–4 for what the builder holds (:class:`Checkpoint`: write, then commit)."""
        if len(self.builder) or len(self.held):
            self.checkpoint.commit()

    def _write_batch(self) -> bool:
        """Step 3: the builder's batch into the store; True once nothing is held (step 4 then
        commits). A table that fails is held (:mod:`~foreshock.storage.held`) while the others
        are written; past ``hold_values`` (or :data:`MAX_HELD` batches) held, the sink stops
        reading and waits for the store, with backoff."""
        if len(self.builder):
            values = self.builder.values
            self.held.add(self.store.next_batch(), self.builder.take(), values)
            self.stats.values += values
            self.stats.batches += 1
        delay = 0.5
        while True:
            self.lease.renew()  # before every commit: another group's lease stops this sink
            failed = self.held.write(self.store)
            if not failed:
                break
            self._say_held(failed)
            if self.held.values <= self.config.hold_values and len(self.held) <= MAX_HELD:
                return False
            self._backoff(delay)
            delay = min(delay * 2, 30.0)
        if self._held_since is not None:
            log.warning("foreshock sink: every held table is written again")
            self._held_since = None
        return True

    def _say_held(self, failed: dict[str, BaseException]) -> None:
        """Count a failed write; say which tables wait and why (at most every 30 s)."""
        self.stats.write_retries += 1
        now = time.monotonic()
        if self._held_since is None:
            self._held_since = now
        if now - self._held_said < 30.0:
            return
        self._held_said = now
        for name, exc in failed.items():
            log.error(
                "foreshock sink: table %s not written (%s); %d batches held, the other tables "
                "written meanwhile (`foreshock store check` names a damaged commit)",
                name,
                first_line(exc),
                len(self.held),
            )

    def _report(self, final: bool = False) -> None:
        """The stats (and, every few seconds, the lag) to the telemetry, if served."""
        if self.telemetry is None:
            return
        if final:
            self.telemetry.refresh_lag(self.consumer, force=True)
        s = self.stats
        self.telemetry.update(
            self.consumer,
            messages=s.messages,
            values=s.values,
            batches=s.batches,
            dead_letters=self.consumer.dead_letters,
            dead_letters_stored=s.dead_letters,
            duplicates=self.consumer.dedup.duplicates + s.duplicates,
            write_retries=s.write_retries,
        )

    def maintain(self) -> None:
        """Step 5: retention, compaction, vacuum."""
        if self.config.retention_days is not None:
            prune(self.store, self.config.retention_days)
        self.store.maintain(self.config.retain_hours)

    def run(self, stop: threading.Event, idle_exit: float | None = None) -> None:
        self._stop = stop
        with periodically(self.config.compact_every, self.maintain, "maintenance"):
            run_service(self, stop, idle_exit)

    def turn(self) -> bool:
        """One loop (:meth:`step`) for :func:`~foreshock.transport.service_loop.run_service`;
        told to stop while the store fails, it leaves what is uncommitted to the broker."""
        try:
            self.lease.renew(force=False)  # idle too: the lease is held while the sink runs
            return self.step() > 0
        except SecondWriterError as exc:  # another group took the store over: stop, say so
            log.error("foreshock sink: %s", exc)
            self.builder.take()
            self.held.drop()
            raise StopServiceError from None
        except _StoppedError:
            log.warning("foreshock sink: stopped while the store failed; nothing uncommitted lost")
            self.builder.take()
            self.held.drop()
            raise StopServiceError from None

    def close(self) -> None:
        try:
            self._flush()
        except (_StoppedError, SecondWriterError):  # the broker keeps what was not written
            self.builder.take()
        self._report(final=True)
        self.consumer.close()
        with contextlib.suppress(Exception):  # a lease left behind expires by itself
            self.lease.release()
        self.store.close()
        if self.telemetry is not None:
            self.telemetry.close()


class _StoppedError(Exception):
    """The sink was told to stop while waiting for its store."""
