"""Load test of the whole pipeline: N concurrent runs → Kafka → detectors → storage → query.

For each fleet size N (``--runs``, default 10, 100, 1000) and number of detector workers W
(``--workers``, default 1 and 2), on the embedded Tansu (or ``--bootstrap``):

* ``--processes`` producer processes replay N recorded lab runs (each its own run id), every
  run writing one monitoring record (~75 values) per ``1 / --rate`` seconds through a
  ``KafkaSink`` — a fleet of trainers monitoring every few seconds;
* W ``foreshock detect`` workers (one consumer group) and one ``foreshock sink`` run as the
  services do in production, as separate processes.

Figures per (N, W):

* offered and sustained metric values/s — sustained = values *stored* per second from the
  first write until the store has them all (end to end through the broker and the sink);
* produce → warning latency p50/p95/p99: a warning's arrival on the warnings topic minus the
  producer's time stamp of the record at which it fired (read from the store);
* backlog, sampled every 2 s: messages written by the producers and not yet consumed by the
  detector group (its count scraped from each worker's ``/metrics``), or not yet durably
  stored by the sink — its maximum, and its value when the producers stopped and at the
  end; and the services' own consumer-lag gauge beside it;
* the fleet query on the resulting store (the dashboard's first page).

The knee: the smallest N whose sustained rate falls below 90 % of the offered one, or whose
lag keeps growing; the part whose lag grows first is the one that saturates.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import shutil
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from foreshock.app.harness import (
    DETECT,
    SINK,
    Pipeline,
    finished,
    paced,
    recorded_run,
    renumbered,
    scoped,
    scrape,
    stored_totals,
)
from foreshock.transport.settings import KafkaSettings

from ._table import emit_json, format_table, quantile

_WRITTEN: Any = None  # a shared counter of messages written, set in each producer process


def _init_producer(counter: Any) -> None:
    global _WRITTEN
    _WRITTEN = counter


def _produce(args: tuple[list[int], dict, float, int]) -> dict[str, float]:
    """One producer process: its runs, one record each per 1/rate s, then their end."""
    from foreshock.delivery.kafka_sink import KafkaSink

    ids, settings_dict, rate, records = args
    settings = KafkaSettings(**settings_dict)
    runs = {i: recorded_run(i) for i in ids}
    sink = KafkaSink(settings, name=f"fleet-{uuid.uuid4().hex[:6]}")
    sink.wait_delivered(30)
    for i, run in runs.items():
        sink.write({**run.start, "run_id": f"fleet-{i}"})
    with _WRITTEN.get_lock():
        _WRITTEN.value += len(runs)
    values = 0
    for n in paced(records, rate):
        for i, run in runs.items():
            record = renumbered(run, n, f"fleet-{i}", step=n * 25)
            sink.write(record)
            values += len(record["values"])
        with _WRITTEN.get_lock():
            _WRITTEN.value += len(runs)
    for i in runs:
        sink.write(finished(f"fleet-{i}"))
    with _WRITTEN.get_lock():
        _WRITTEN.value += len(runs)
    sink.close(timeout=120)
    return {"values": values, "pending": sink.pending(), "spooled": sink.spooled}


def _sample(urls: dict[str, list[str]], written: int, store: Path) -> dict[str, dict]:
    """Per service: its consumers' lag and its backlog — messages written by the producers
    and not yet consumed by the detectors, or not yet durably stored by the sink (the sink
    also consumes the warnings topic, so its own consumed count would overstate it)."""
    out = {}
    for service, service_urls in urls.items():
        scraped = [scrape(u) for u in service_urls]
        done = sum(c for c, _ in scraped) if service == "detectors" else stored_totals(store)[0]
        out[service] = {"lag": sum(lag for _, lag in scraped), "backlog": written - done}
    return out


class WarningClock(threading.Thread):
    """Consume the warnings topic; remember when each opened warning arrived."""

    def __init__(self, settings: KafkaSettings) -> None:
        super().__init__(daemon=True)
        from confluent_kafka import Consumer, TopicPartition

        self.consumer = Consumer(
            {
                "bootstrap.servers": settings.bootstrap_servers,
                "group.id": f"clock-{uuid.uuid4().hex[:6]}",
            }
        )
        self.consumer.assign(
            [TopicPartition(settings.warnings_topic, p, 0) for p in range(settings.partitions)]
        )
        self.arrivals: dict[str, tuple[str, int, float]] = {}
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            message = self.consumer.poll(0.2)
            if message is None or message.error():
                continue
            event = json.loads(message.value())
            if event.get("event") == "opened":
                self.arrivals.setdefault(event["id"], (event["run_id"], event["step"], time.time()))
        self.consumer.close()


def _latencies(store: Path, arrivals: dict[str, tuple[str, int, float]]) -> list[float]:
    from foreshock.storage.reader import open_history

    with open_history(store) as history:
        stamps = {
            (r["run_id"], r["step"]): r["time"]
            for r in history.sql("SELECT run_id, step, time FROM steps").to_pylist()
        }
    return [
        arrived - stamps[(run, step)]
        for run, step, arrived in arrivals.values()
        if (run, step) in stamps
    ]


def _finite_max(values: list[float]) -> float | None:
    finite = [v for v in values if v == v]
    return max(finite) if finite else None


def run_case(base: KafkaSettings, n: int, workers: int, args: argparse.Namespace) -> dict:
    """One (N, W) point; see the module docstring."""
    from foreshock.storage import queries
    from foreshock.storage.reader import open_history

    name = f"fleet{n}w{workers}-{uuid.uuid4().hex[:4]}"
    root = Path(tempfile.mkdtemp(prefix="foreshock-fleet-"))
    store = root / "history"
    pipeline = Pipeline(
        scoped(base, name, spool_dir=str(root / "spool")),
        store=store,
        log_dir=root / "logs",
        parts={SINK: SINK} | {f"detect-{w}": DETECT for w in range(workers)},
        groups={SINK: f"{name}-sink", DETECT: f"{name}-det"},
    )
    samples: list[tuple[float, dict[str, dict[str, float]]]] = []
    with pipeline.start():
        settings = pipeline.settings
        clock = WarningClock(settings)
        clock.start()
        urls = {
            "sink": [pipeline.metrics_url(SINK)],
            "detectors": [pipeline.metrics_url(f"detect-{w}") for w in range(workers)],
        }
        time.sleep(8)  # group joins (Tansu holds a JoinGroup for half the session timeout)
        procs = min(args.processes, n)
        chunks = [list(range(k, n, procs)) for k in range(procs)]
        settings_dict = {**settings.__dict__}
        context = mp.get_context("spawn")
        written = context.Value("q", 0)
        t0 = time.monotonic()
        with context.Pool(procs, initializer=_init_producer, initargs=(written,)) as pool:
            pending = pool.map_async(
                _produce, [(c, settings_dict, args.rate, args.records) for c in chunks]
            )
            while not pending.ready():
                pending.wait(2)
                samples.append((time.monotonic() - t0, _sample(urls, written.value, store)))
            produced = pending.get()
        produce_s = time.monotonic() - t0
        offered = sum(p["values"] for p in produced)
        deadline = time.monotonic() + args.drain
        while time.monotonic() < deadline:  # until stored and every message seen by detectors
            samples.append((time.monotonic() - t0, _sample(urls, written.value, store)))
            last = samples[-1][1]
            if last["sink"]["backlog"] <= 0 and last["detectors"]["backlog"] <= 0:
                break
            time.sleep(1)
        total_s = time.monotonic() - t0
        time.sleep(3)  # the last warnings
        samples.append((time.monotonic() - t0, _sample(urls, written.value, store)))
        stored = stored_totals(store)[1]
        clock.stop.set()
        clock.join(5)
        query_t = time.perf_counter()
        with open_history(store) as history:
            queries.fleet(history)
        query_s = time.perf_counter() - query_t
        latencies = _latencies(store, clock.arrivals)
    shutil.rmtree(root, ignore_errors=True)
    lag = {k: [s[1][k]["lag"] for s in samples] for k in ("detectors", "sink")}
    backlog = {k: [s[1][k]["backlog"] for s in samples] for k in ("detectors", "sink")}
    at_stop = next((s[1] for s in samples if s[0] >= produce_s), samples[-1][1])
    return {
        "runs": n,
        "workers": workers,
        "offered_values": offered,
        "stored_values": stored,
        "produce_seconds": round(produce_s, 1),
        "total_seconds": round(total_s, 1),
        "offered_values_per_s": round(offered / produce_s),
        "sustained_values_per_s": round(stored / total_s),
        "warnings": len(clock.arrivals),
        "latency_s": {
            q: round(quantile(latencies, p), 2) if latencies else None
            for q, p in (("p50", 0.5), ("p95", 0.95), ("p99", 0.99))
        },
        "lag_max": {k: _finite_max(v) for k, v in lag.items()},
        "backlog_max": {k: _finite_max(v) for k, v in backlog.items()},
        "backlog_when_producers_stopped": {k: at_stop[k]["backlog"] for k in at_stop},
        "lag_end": {k: v[-1] for k, v in lag.items()},
        "backlog_end": {k: v[-1] for k, v in backlog.items()},
        "lag_series": [
            (round(t, 1), {k: (v["lag"], v["backlog"]) for k, v in x.items()}) for t, x in samples
        ],
        "fleet_query_s": round(query_s, 3),
        "lost_values": offered - stored,
        "producer_pending": sum(p["pending"] for p in produced),
    }


def figures(result: dict[str, Any]) -> list[tuple[str, str]]:
    """``benchmarks.readme``'s rows for this result: one per fleet size and worker count, the
    sustained against the offered values/s, values lost, warning latency p50 / p95 / p99 and
    the most backlog (detectors / sink); then the knee."""
    rows = []
    for c in result["cases"]:
        lat = c["latency_s"]
        backlog = c.get("backlog_max", c["lag_max"])
        rows.append(
            (
                f"end to end, {c['runs']} runs, {c['workers']} detector worker(s)",
                f"{c['sustained_values_per_s']:,} of {c['offered_values_per_s']:,} values/s "
                f"offered, {c['lost_values']} lost; warning latency p50 {lat['p50']} s, "
                f"p95 {lat['p95']} s, p99 {lat['p99']} s; max backlog "
                f"{backlog['detectors']:,.0f} / {backlog['sink']:,.0f} messages "
                f"(detectors / sink)",
            )
        )
    rows.append(
        (
            "knee (smallest fleet below 90 % of its offered rate)",
            str(result["knee_runs"] or "not reached"),
        )
    )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="N = 10, 100; 1 worker; 20 records")
    parser.add_argument("--runs", default="10,100,1000")
    parser.add_argument("--workers", default="1,2")
    parser.add_argument("--rate", type=float, default=1.0, help="records/s per run")
    parser.add_argument("--records", type=int, default=60, help="records per run")
    parser.add_argument("--processes", type=int, default=4, help="producer processes")
    parser.add_argument("--drain", type=float, default=120.0, help="s to wait for the tail")
    parser.add_argument("--bootstrap", help="an external Kafka instead of the embedded Tansu")
    args = parser.parse_args()
    if args.quick:
        args.runs, args.workers, args.records = "10,100", "1", 20
    from foreshock.transport.broker import EmbeddedBroker

    broker = None if args.bootstrap else EmbeddedBroker().start()
    base = KafkaSettings(bootstrap_servers=args.bootstrap or broker.bootstrap, partitions=6)
    results = []
    try:
        for n in (int(x) for x in args.runs.split(",")):
            for w in (int(x) for x in args.workers.split(",")):
                results.append(run_case(base, n, w, args))
                r = results[-1]
                print(
                    f"N={n} W={w}: offered {r['offered_values_per_s']:,} values/s, "
                    f"sustained {r['sustained_values_per_s']:,}, lag max {r['lag_max']}",
                    flush=True,
                )
    finally:
        if broker is not None:
            broker.stop()
    rows = [
        [
            r["runs"],
            r["workers"],
            r["offered_values_per_s"],
            r["sustained_values_per_s"],
            r["lost_values"],
            r["warnings"],
            r["latency_s"]["p50"],
            r["latency_s"]["p95"],
            r["latency_s"]["p99"],
            r["backlog_max"]["detectors"],
            r["backlog_max"]["sink"],
            r["backlog_end"]["detectors"],
            r["backlog_end"]["sink"],
            r["fleet_query_s"],
        ]
        for r in results
    ]
    print(
        format_table(
            [
                "runs",
                "workers",
                "offered values/s",
                "sustained values/s",
                "lost",
                "warnings",
                "latency p50 s",
                "p95",
                "p99",
                "max backlog: detectors",
                "max backlog: sink",
                "end backlog: detectors",
                "end backlog: sink",
                "fleet query s",
            ],
            rows,
        )
    )
    saturated = [
        r for r in results if r["sustained_values_per_s"] < 0.9 * r["offered_values_per_s"]
    ]
    knee = saturated[0]["runs"] if saturated else None
    emit_json(
        {
            "rate_per_run": args.rate,
            "records_per_run": args.records,
            "knee_runs": knee,
            "cases": [{k: v for k, v in r.items() if k != "lag_series"} for r in results],
            "lag_series": {f"N={r['runs']},W={r['workers']}": r["lag_series"] for r in results},
        }
    )


if __name__ == "__main__":
    main()
