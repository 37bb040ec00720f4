"""Transport throughput and latency: many concurrent producers replaying recorded lab runs.

``--producers`` simulated trainers (default 100), each a :class:`KafkaSink` of its own, spread
over ``--processes`` OS processes, replay the metric records of the shipped lab runs (run id
and step renumbered, ``time`` stamped at ``write``) as fast as the sinks take them. One
consumer in this process reads the metrics topic and de-duplicates. Figures:

* delivered rate: messages (and metric values) per second from the first ``write`` to the
  last message consumed — end to end, not what ``write`` alone can absorb;
* latency: consumer receipt time − the message's ``time`` stamp (same host clock), p50/p95/p99;
* lost: messages written but not consumed within the timeout (must be 0).

Broker: the embedded Tansu (default) or ``--bootstrap HOST:PORT``.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import sys
import time
import uuid
from typing import Any

from foreshock.app.harness import paced, recorded_runs, renumbered
from foreshock.transport.settings import KafkaSettings

from ._table import emit_json, format_table, quantile


def _replay(args: tuple[list[int], str, str, int, str, float]) -> tuple[int, int, float, dict]:
    """One worker process: its producers write their messages round-robin (``rate`` messages
    per second each, 0 = as fast as possible), then close."""
    from foreshock.delivery.kafka_sink import KafkaSink

    ids, bootstrap, topic, per_producer, spool_dir, rate = args
    settings = KafkaSettings(
        bootstrap_servers=bootstrap,
        metrics_topic=topic,
        deadletter_topic=f"{topic}.dead",
        spool_dir=spool_dir,
    )
    runs = recorded_runs()
    sinks = {i: KafkaSink(settings, name=f"bench-{i}") for i in ids}
    for sink in sinks.values():  # connected, topics checked: measure the steady state
        sink.wait_delivered(30)
    written = values = 0
    first = time.time()
    for n in paced(per_producer, rate, start=first, clock=time.time):
        for i in ids:
            record = renumbered(runs[i % len(runs)], n, f"sim-{i}", step=n)
            sinks[i].write(record)
            written += 1
            values += len(record["values"])
    left = 0
    for sink in sinks.values():
        sink.close(timeout=60)
        left += sink.pending()
    stats = {
        "spooled": sum(s.spooled for s in sinks.values()),
        "rejected": sum(s.rejected for s in sinks.values()),
        "replayed": sum(s.replayed for s in sinks.values()),
        "left_in_spool_bytes": left,
    }
    return written + 2 * len(ids), values, first, stats  # + start and end per producer


def _joined_consumer(settings: KafkaSettings) -> Any:
    """A consumer that has joined its group and holds its partitions (Tansu takes seconds)."""
    from foreshock.transport.consumer import MetricsConsumer

    consumer = MetricsConsumer(settings, group_id=f"bench-{uuid.uuid4().hex[:6]}")
    deadline = time.monotonic() + 60
    while not consumer._consumer.assignment() and time.monotonic() < deadline:
        consumer.poll_batch(1, timeout=0.2)
    return consumer


def _consume(
    consumer: Any, expected: int, timeout: float, producers: int, finished: Any
) -> tuple[list[float], int, float, list[str]]:
    """Until every message arrived, or ``timeout``, or 30 s of silence after the producers
    finished (a message missing by then is counted lost)."""
    latencies: list[float] = []
    attempts: dict[str, int] = {}  # a KafkaSink numbers its attempt: the stream's third key
    seen, last = 0, time.time()
    deadline = time.monotonic() + timeout
    quiet_since = time.monotonic()
    while seen < expected and time.monotonic() < deadline:
        batch = consumer.poll_batch(1000, timeout=0.5)
        now = time.time()
        if batch or not finished():
            quiet_since = time.monotonic()
        elif time.monotonic() - quiet_since > 30:
            break
        for message in (c.message for c in batch):
            seen += 1
            attempts[message["run_id"]] = message.get("attempt", 0)
            if message["kind"] == "metrics":
                latencies.append(now - message["time"])
        if batch:
            last = now
    missing = [
        f"sim-{i}:{seq}"
        for i in range(producers)
        for seq in consumer.dedup.missing(
            f"sim-{i}", 0, expected // producers, attempts.get(f"sim-{i}", 0)
        )
    ]
    print(
        f"consumer: {consumer.rereads} gap re-reads, {consumer.dedup.duplicates} duplicates "
        f"dropped",
        file=sys.stderr,
    )
    consumer.close()
    return latencies, seen, last, missing[:20]


def run(
    producers: int, processes: int, per_producer: int, rate: float, bootstrap: str | None
) -> dict:
    from foreshock.transport.broker import EmbeddedBroker
    from foreshock.transport.topics import ensure_topics

    broker = None if bootstrap else EmbeddedBroker().start()
    bootstrap = bootstrap or broker.bootstrap
    topic = f"bench.{uuid.uuid4().hex[:8]}"
    spool_dir = f"/tmp/foreshock-bench-spool-{uuid.uuid4().hex[:6]}"
    settings = KafkaSettings(
        bootstrap_servers=bootstrap,
        metrics_topic=topic,
        deadletter_topic=f"{topic}.dead",
        spool_dir=spool_dir,
    )
    ensure_topics(settings, names=[topic, settings.deadletter_topic])
    groups = [list(range(producers))[k::processes] for k in range(processes)]
    expected = producers * (per_producer + 2)
    try:
        with mp.get_context("spawn").Pool(processes) as pool:
            consumer = _joined_consumer(settings)
            jobs = [(g, bootstrap, topic, per_producer, spool_dir, rate) for g in groups]
            pending = pool.map_async(_replay, jobs)
            latencies, consumed, last, missing = _consume(
                consumer, expected, 600, producers, pending.ready
            )
            results = pending.get(timeout=600)
    finally:
        if broker is not None:
            broker.stop()
    written = sum(r[0] for r in results)
    values = sum(r[1] for r in results)
    first = min(r[2] for r in results)
    seconds = max(last - first, 1e-9)
    return {
        "producers": producers,
        "processes": processes,
        "offered_per_producer_per_s": rate,
        "messages": written,
        "consumed": consumed,
        "lost": written - consumed,
        "missing": missing,
        "sink": {k: sum(r[3][k] for r in results) for k in results[0][3]},
        "seconds": round(seconds, 2),
        "messages_per_s": round(written / seconds, 1),
        "values_per_s": round(values / seconds, 1),
        "latency_p50_s": round(quantile(latencies, 0.50), 4),
        "latency_p95_s": round(quantile(latencies, 0.95), 4),
        "latency_p99_s": round(quantile(latencies, 0.99), 4),
        "broker": "external" if broker is None else "tansu (embedded, memory)",
    }


def figures(result: dict[str, Any]) -> list[tuple[str, str]]:
    """``benchmarks.readme``'s rows for this result: the producers (and their pace) with the
    messages delivered and lost, the delivered rate in messages and metric values per second,
    and the latency p50 / p95 / p99 from write to consumed."""
    offered = result["offered_per_producer_per_s"]
    pace = f"{offered:g} msg/s each" if offered else "as fast as the sinks take them"
    who = f"{result['producers']} producers in {result['processes']} processes, {pace}"
    return [
        (f"{who}: messages delivered / lost", f"{result['messages']:,} / {result['lost']}"),
        (
            "delivered rate",
            f"{result['messages_per_s']:,.0f} msg/s = {result['values_per_s']:,.0f} metric "
            "values/s",
        ),
        (
            "latency p50 / p95 / p99 (write → consumed)",
            f"{result['latency_p50_s']:.2f} / {result['latency_p95_s']:.2f} / "
            f"{result['latency_p99_s']:.2f} s",
        ),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="10 producers x 50 messages")
    parser.add_argument("--producers", type=int, default=100)
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument("--messages", type=int, default=200, help="per producer (default 200)")
    parser.add_argument(
        "--rate",
        type=float,
        default=5.0,
        help="messages/s per producer (default 5; 0 = as fast as possible)",
    )
    parser.add_argument("--bootstrap", help="an existing Kafka instead of the embedded Tansu")
    args = parser.parse_args()
    if args.quick:
        args.producers, args.processes, args.messages = 10, 2, 50
    figures = run(args.producers, args.processes, args.messages, args.rate, args.bootstrap)
    rows: list[list[Any]] = [[k, v] for k, v in figures.items()]
    print(format_table(["figure", "value"], rows))
    emit_json(figures)


if __name__ == "__main__":
    main()
