"""Create foreshock's topics on first use, idempotently.

Called by producers when they start and whenever they reconnect (a restarted Tansu has
forgotten every topic), and by the services. "Already exists" is success; a topic that exists
with fewer partitions than configured is reported, not silently used (keys would map to other
partitions than the operator planned).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from .settings import RDKAFKA_LOG, KafkaSettings

__all__ = ["Topics", "ensure_topics", "topic_names", "wait_for_topics"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Topics:
    partitions: dict[str, int]  # topic -> partition count, as the cluster reports it
    created: list[str]  # topics this call created (a restarted Tansu: all of them)


def topic_names(settings: KafkaSettings) -> list[str]:
    return [
        settings.metrics_topic,
        settings.warnings_topic,
        settings.deadletter_topic,
        settings.control_topic,
    ]


def ensure_topics(
    settings: KafkaSettings,
    timeout: float = 10.0,
    names: list[str] | None = None,
    quiet: bool = False,
) -> Topics:
    """Create missing topics; report partition counts and which topics were created.

    Raises ``KafkaException`` when the cluster cannot be reached within ``timeout`` seconds.
    ``quiet``: the client logs nothing, not even through Python's logging — for a probe that
    repeats while the broker is away, inside a training process whose Python thread must not
    wait on librdkafka's log callbacks.
    """
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import AdminClient, NewTopic

    names = names or topic_names(settings)
    logging = {"log_level": 0} if quiet else {"logger": RDKAFKA_LOG}
    admin = AdminClient(settings.librdkafka({"socket.timeout.ms": int(timeout * 1000)}, **logging))
    existing = admin.list_topics(timeout=timeout).topics
    missing = [name for name in names if name not in existing]
    created = []
    if missing:
        config = {"retention.ms": str(settings.retention_ms)}
        new = [
            NewTopic(
                name,
                num_partitions=settings.partitions,
                replication_factor=settings.replication_factor,
                config=config,
            )
            for name in missing
        ]
        for name, future in admin.create_topics(new, request_timeout=timeout).items():
            try:
                future.result(timeout)
                created.append(name)
            except KafkaException as exc:
                if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                    raise
                continue
            log.info("foreshock: created topic %s (%d partitions)", name, settings.partitions)
    topics = admin.list_topics(timeout=timeout).topics
    counts = {name: len(topics[name].partitions) for name in names if name in topics}
    for name, count in counts.items():
        if count < settings.partitions:
            log.warning(
                "foreshock: topic %s has %d partitions, configured %d",
                name,
                count,
                settings.partitions,
            )
    return Topics(counts, created)


def wait_for_topics(
    settings: KafkaSettings,
    service: str,
    probe: float = 5.0,
    max_wait: float = 30.0,
    stop: Any = None,
) -> Topics:
    """``ensure_topics`` once the broker answers: a service started before its broker waits
    for it — a log line per try, the wait doubling from 1 s to ``max_wait`` s — instead of
    exiting with a traceback (``detect``, ``sink`` and ``notify`` once died 10 s after a start
    the broker had not finished). ``stop`` (an Event): give up when set (KafkaException).
    """
    import time

    from confluent_kafka import KafkaException

    wait = 1.0
    while True:
        try:
            return ensure_topics(settings, timeout=probe)
        except KafkaException as exc:
            if stop is not None and stop.is_set():
                raise
            log.warning(
                "foreshock %s: the broker at %s is not up yet (%s); trying again in %.0f s",
                service,
                settings.bootstrap_servers,
                str(exc)[:200],
                wait,
            )
            if stop is not None:
                stop.wait(wait)
            else:
                time.sleep(wait)
            wait = min(wait * 2, max_wait)
