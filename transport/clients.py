"""The one place Kafka clients are built: a producer or a consumer for a room's topics.

Why one place: eight raw clients were built in three rooms, each passing the settings,
the TLS/SASL pass-through and the log routing its own way; a new option (a client id, a
statistics callback) had to be added eight times. Every room now asks here, with only what is
its own (acks, group, offsets), and gets the settings' bootstrap servers and pass-through
(``KafkaSettings.librdkafka``) and librdkafka's log routed to ``foreshock.rdkafka``. The
clients' own API (``produce``, ``poll``, ``assign``, ``TopicPartition``) is used as it is.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .settings import RDKAFKA_LOG, KafkaSettings

__all__ = ["topic_consumer", "topic_producer"]


def topic_producer(
    settings: KafkaSettings, config: Mapping[str, Any] | None = None, **callbacks: Any
) -> Any:
    """A ``confluent_kafka.Producer``: ``config`` < the settings < ``callbacks`` (error_cb, …)."""
    from confluent_kafka import Producer

    return Producer(settings.librdkafka(dict(config or {}), logger=RDKAFKA_LOG, **callbacks))


def topic_consumer(
    settings: KafkaSettings, config: Mapping[str, Any] | None = None, **callbacks: Any
) -> Any:
    """A ``confluent_kafka.Consumer``: ``config`` (its ``group.id`` at least) < the settings <
    ``callbacks``."""
    from confluent_kafka import Consumer

    return Consumer(settings.librdkafka(dict(config or {}), logger=RDKAFKA_LOG, **callbacks))
