"""The consumer services' shared replay cursor and flush-then-commit checkpoint: the replay
ends when the consumer reaches *or passes* the committed offset (retention may have removed
the message before it), nothing unflushed is committed, and a failed commit is a WARNING."""

from __future__ import annotations

import logging
import time

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition

from foreshock.notify import notifier as notifier_module
from foreshock.notify.delivery import Target
from foreshock.notify.notifier import Notifier, NotifyConfig
from foreshock.transport.checkpoint import Checkpoint, ReplayCursor
from foreshock.transport.consumer import MetricsConsumer
from foreshock.transport.envelope import Consumed
from foreshock.transport.settings import KafkaSettings
from foreshock.transport.warning import WarningEvent


class FakeKafka:
    """A confluent-kafka consumer that knows committed offsets and records commits."""

    def __init__(self, committed: dict[int, int], fail: Exception | None = None) -> None:
        self.offsets, self.fail = committed, fail
        self.assigned: list[TopicPartition] = []
        self.commits: list[object] = []

    def committed(self, partitions, timeout=None):
        return [
            TopicPartition(p.topic, p.partition, self.offsets.get(p.partition, -1001))
            for p in partitions
        ]

    def assign(self, partitions):
        self.assigned = list(partitions)

    def commit(self, offsets=None, asynchronous=True):
        if self.fail is not None:
            raise self.fail
        self.commits.append(offsets)


def test_the_replay_ends_when_the_committed_offset_is_passed() -> None:
    cursor = ReplayCursor()
    cursor.resume_at([(0, 10), (1, 3)])
    assert [cursor.history(0, o) for o in (0, 5, 8)] == [True, True, True]
    assert cursor.replaying
    assert cursor.history(0, 12) is False  # 9 was removed by retention: 12 passes 10
    assert cursor.history(1, 2) is True  # exactly committed - 1: history, and caught up
    assert not cursor.replaying
    assert cursor.history(1, 1) is False  # a later rewind is not history


def test_replay_from_start_reads_from_the_beginning_and_remembers_the_commit() -> None:
    kafka, cursor = FakeKafka({0: 7}), ReplayCursor()
    found = cursor.replay_from_start(kafka, [TopicPartition("t", 0), TopicPartition("t", 1)])
    assert [(tp.partition, tp.offset) for tp in found] == [(0, 7), (1, -1001)]
    assert all(tp.offset < 0 for tp in kafka.assigned)  # OFFSET_BEGINNING
    assert cursor.replaying and cursor.history(0, 0) and not cursor.history(1, 0)


def test_the_notifier_leaves_replay_when_retention_removed_committed_minus_one(
    monkeypatch,
) -> None:
    """The notifier's bug: committed 5, offsets 3 and 4 gone, the next message at 6 — it must
    leave replay (and re-post its open warnings to Alertmanager again)."""
    monkeypatch.setattr(notifier_module, "wait_for_topics", lambda settings, service: None)
    monkeypatch.setattr(notifier_module, "MetricsConsumer", lambda *a, **k: None)
    config = NotifyConfig([Target("alertmanager", "http://127.0.0.1:9/am")], retries=0)
    notify = Notifier(KafkaSettings(spool_dir="unused"), config)
    try:
        notify._on_assign(FakeKafka({0: 5}), [TopicPartition("foreshock.warnings", 0)])
        base = {"schema": "foreshock.warning/1", "run_id": "r", "family": "router", "step": 1}
        a = WarningEvent.from_message({**base, "id": "a", "event": "opened"})
        notify.handle(Consumed(a, "foreshock.warnings", 0, 2))
        assert notify.cursor.replaying and notify.refresh_open() == 0
        b = WarningEvent.from_message({**base, "id": "b", "event": "opened"})
        notify.handle(Consumed(b, "foreshock.warnings", 0, 6, time.time()))
        assert not notify.cursor.replaying
        assert notify.stats.replayed == 1
        assert notify.refresh_open() == 2  # both open warnings, re-posted
    finally:
        for courier in notify.couriers.values():
            courier.stop(0)


def test_nothing_unflushed_is_committed(caplog) -> None:
    kafka = FakeKafka({})
    consumer = MetricsConsumer.__new__(MetricsConsumer)
    consumer._consumer = kafka
    checkpoint = Checkpoint(consumer, "test", flush=lambda: False)
    with caplog.at_level(logging.WARNING, logger="foreshock"):
        assert checkpoint.commit(final=True) is False
    assert kafka.commits == [] and checkpoint.unflushed == 1
    assert "not flushed at shutdown" in caplog.text
    assert Checkpoint(consumer, "test").commit() is True and kafka.commits == [None]
    assert Checkpoint(consumer, "test").commit([]) is False  # nothing moved


def test_a_flush_that_raises_is_not_committed_past() -> None:
    kafka = FakeKafka({})
    consumer = MetricsConsumer.__new__(MetricsConsumer)
    consumer._consumer = kafka

    def broken() -> bool:
        raise OSError("store away")

    with pytest.raises(OSError):
        Checkpoint(consumer, "test", flush=broken).commit()
    assert kafka.commits == []


def test_a_failed_commit_is_a_warning_and_nothing_consumed_is_not(caplog) -> None:
    consumer = MetricsConsumer.__new__(MetricsConsumer)
    consumer._consumer = FakeKafka({}, fail=KafkaException(KafkaError(KafkaError._TRANSPORT)))
    checkpoint = Checkpoint(consumer, "test")
    with caplog.at_level(logging.DEBUG, logger="foreshock"):
        assert checkpoint.commit() is False
    assert checkpoint.failures == 1
    assert [r.levelno for r in caplog.records] == [logging.WARNING]
    caplog.clear()
    consumer._consumer.fail = KafkaException(KafkaError(KafkaError._NO_OFFSET))
    with caplog.at_level(logging.DEBUG, logger="foreshock"):
        assert consumer.commit() is False
    assert caplog.records == []
