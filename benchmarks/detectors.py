"""Detector worker throughput: metric values per second, Kafka in → warnings out.

The shipped lab runs are published ``--copies`` times under distinct run ids (pre-encoded,
before the clock starts); then one worker, and afterwards two workers in one consumer group,
each in its own process, consume the whole topic, run the detectors and produce warnings.
Rate = values consumed / (last message processed − first message consumed), summed over
workers. Where the time goes is measured inside the worker: consuming + JSON decoding +
validation + dedup, the detectors themselves, and producing + committing.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import time
import uuid
from typing import Any

from foreshock.app.harness import Replay, recorded_runs
from foreshock.transport.settings import KafkaSettings
from foreshock.transport.wire import encode

from ._table import emit_json, format_table


def _messages(copies: int) -> list[tuple[bytes, bytes]]:
    """Every shipped run ``copies`` times (run ids ``b<copy>-<name>``), numbered and encoded;
    every run ends ``finished`` so that no copy is told apart by its status."""
    out = []
    runs = recorded_runs()
    for copy in range(copies):
        for run in runs:
            replay = Replay(run, f"b{copy}-{run.path.name.split('.')[0]}", interval=0)
            last = len(replay) - 1
            for seq in range(len(replay)):
                kind = "start" if seq == 0 else "end" if seq == last else "metrics"
                message = {**replay.message(seq), "kind": kind, "rank": 0, "seq": seq}
                if kind == "end":
                    message.update(status="finished", last_seq=seq)
                out.append((replay.run_id.encode(), encode(message)))
    return out


def _publish(settings: KafkaSettings, messages: list[tuple[bytes, bytes]]) -> None:
    from confluent_kafka import Producer

    producer = Producer(settings.librdkafka({"linger.ms": 50, "compression.type": "lz4"}))
    for key, value in messages:
        while True:
            try:
                producer.produce(settings.metrics_topic, key=key, value=value)
                break
            except BufferError:
                producer.poll(0.1)
    producer.flush(120)


def _work(args: tuple[KafkaSettings, str, float]) -> dict[str, Any]:
    import threading

    from foreshock.detectors.worker import DetectorWorker
    from foreshock.operate.detect_commands import default_config

    settings, group, idle = args
    worker = DetectorWorker(settings, default_config(), group_id=group)
    stop, first, last = threading.Event(), [None], [None]
    original = worker.process

    def timed(message: dict[str, Any]) -> int:
        first[0] = first[0] or time.perf_counter()
        produced = original(message)
        last[0] = time.perf_counter()
        return produced

    worker.process = timed  # type: ignore[method-assign]
    worker.run(stop, idle_exit=idle)
    return {
        "messages": worker.messages,
        "values": worker.values,
        "warnings": worker.warnings,
        "first": first[0],
        "last": last[0],
        "seconds": worker.seconds,
    }


def _round(settings: KafkaSettings, workers: int, idle: float) -> dict[str, Any]:
    group = f"bench-{uuid.uuid4().hex[:6]}"
    with mp.get_context("spawn").Pool(workers) as pool:
        results = pool.map(_work, [(settings, group, idle)] * workers)
    busy = [r for r in results if r["first"] is not None]
    span = max(r["last"] for r in busy) - min(r["first"] for r in busy)
    values = sum(r["values"] for r in results)
    seconds = {k: round(sum(r["seconds"][k] for r in results), 2) for k in results[0]["seconds"]}
    return {
        "workers": workers,
        "messages": sum(r["messages"] for r in results),
        "values": values,
        "warnings_events": sum(r["warnings"] for r in results),
        "seconds": round(span, 2),
        "values_per_s": round(values / span),
        "time_split_s": seconds,
    }


def figures(result: dict[str, Any]) -> list[tuple[str, str]]:
    """``benchmarks.readme``'s rows for this result, one per round: the workers and values, the
    values per second and where the time went."""
    rows = []
    for x in result["rounds"]:
        split = ", ".join(f"{k} {v} s" for k, v in x["time_split_s"].items())
        rows.append(
            (
                f"{x['workers']} worker(s), {x['values']:,} values",
                f"{x['values_per_s']:,} values/s ({split})",
            )
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="4 copies, one worker")
    parser.add_argument("--copies", type=int, default=20, help="copies of the shipped runs")
    parser.add_argument("--bootstrap", help="an existing Kafka instead of the embedded Tansu")
    args = parser.parse_args()
    copies = 4 if args.quick else args.copies
    from foreshock.transport.broker import EmbeddedBroker
    from foreshock.transport.topics import ensure_topics

    broker = None if args.bootstrap else EmbeddedBroker().start()
    name = f"bench.{uuid.uuid4().hex[:6]}"
    settings = KafkaSettings(
        bootstrap_servers=args.bootstrap or broker.bootstrap,
        metrics_topic=f"{name}.metrics",
        warnings_topic=f"{name}.warnings",
        deadletter_topic=f"{name}.dead",
        partitions=6,
    )
    try:
        ensure_topics(settings)
        messages = _messages(copies)
        _publish(settings, messages)
        rounds = [_round(settings, 1, idle=8.0)]
        if not args.quick:
            rounds.append(_round(settings, 2, idle=15.0))
    finally:
        if broker is not None:
            broker.stop()
    rows = [
        [
            r["workers"],
            r["messages"],
            r["values"],
            r["seconds"],
            r["values_per_s"],
            r["time_split_s"]["consume+decode"],
            r["time_split_s"]["detect"],
            r["time_split_s"]["produce+commit"],
        ]
        for r in rounds
    ]
    print(
        format_table(
            [
                "workers",
                "messages",
                "values",
                "s",
                "values/s",
                "consume+decode s",
                "detect s",
                "produce+commit s",
            ],
            rows,
        )
    )
    emit_json({"published_messages": len(messages), "rounds": rounds})


if __name__ == "__main__":
    main()
