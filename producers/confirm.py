"""Closing: which recent messages the storage sink's consumer group has not yet stored.

Why: an acknowledgement is not storage (the embedded broker keeps messages in memory and
forgets them when it restarts), but the storage sink commits its group's offsets only past
what it stored durably. So a closing producer waits, up to ``timeout`` s, until that group has
committed past every message of its recent window, and spools the rest.
"""

from __future__ import annotations

import time
from typing import Any

from foreshock.transport.settings import RDKAFKA_LOG, KafkaSettings

from .spool import SpooledMessage

__all__ = ["unconfirmed"]

Sent = tuple[SpooledMessage, int, int]  # a message with its (partition, offset)


def unconfirmed(
    settings: KafkaSettings,
    group: str,
    sent: list[Sent],
    broker_restarted: bool,
    timeout: float,
) -> list[SpooledMessage]:
    """The messages of ``sent`` that ``group`` has not committed past within ``timeout`` s;
    none when the group has committed nothing here and no broker restart was seen (there is no
    sink to wait for)."""
    from confluent_kafka import Consumer

    consumer = Consumer(
        settings.librdkafka({"group.id": group, "enable.auto.commit": False}, logger=RDKAFKA_LOG)
    )
    deadline = time.monotonic() + timeout
    try:
        while (left := _past_committed(consumer, sent, broker_restarted)) and (
            time.monotonic() < deadline
        ):
            time.sleep(0.25)
    finally:
        consumer.close()
    return left or []


def _past_committed(
    consumer: Any, sent: list[Sent], broker_restarted: bool
) -> list[SpooledMessage] | None:
    """``sent`` messages at or past the group's committed offsets (all of them if the offsets
    can't be read); None when the group has committed nothing and no restart was seen."""
    from confluent_kafka import TopicPartition

    parts = sorted({(i.topic, p) for i, p, _ in sent})
    try:
        found = consumer.committed([TopicPartition(t, p) for t, p in parts], timeout=2.0)
    except Exception:
        return [i for i, _, _ in sent]
    committed = {(tp.topic, tp.partition): tp.offset for tp in found}
    if all(o < 0 for o in committed.values()) and not broker_restarted:
        return None
    return [i for i, p, o in sent if o >= committed.get((i.topic, p), -1)]
