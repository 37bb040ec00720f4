"""The recent acknowledged messages, and at close which of them the storage sink has stored.

Why: an acknowledgement is not storage (the embedded broker keeps messages in memory and
forgets them when it restarts), but the storage sink commits its group's offsets only past
what it stored durably. So a producer keeps a window of its recent acknowledged messages
(:class:`RecentWindow`: re-sent whole to a broker found restarted), and at close waits, up to
``timeout`` s, until that group has committed past every message of it, and spools the rest.
"""

from __future__ import annotations

import collections
import time
from typing import Any

from foreshock.transport.settings import KafkaSettings

from .spool import SpooledMessage

__all__ = ["RecentWindow", "unconfirmed"]

Sent = tuple[SpooledMessage, int, int]  # a message with its (partition, offset)


class RecentWindow:
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
    from foreshock.transport.clients import topic_consumer

    consumer = topic_consumer(settings, {"group.id": group, "enable.auto.commit": False})
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
