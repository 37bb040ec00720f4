"""Storage: ingest rate from Kafka into the store, and the dashboard's queries on a big history.

**Ingest.** ``--ingest-runs`` runs × ``--ingest-records`` monitoring records (the shipped lab
records, ~75 values each, run id and step renumbered) are produced to the metrics topic of the
embedded Tansu (or ``--bootstrap``) first; then one ``StorageSink`` consumes them, timed from
the first message it receives until every value is durably stored (manifest published).
Figure: metric values/s. (The consumer-group join before that — Tansu holds a JoinGroup for
half the session timeout, 3 s — is reported beside it, not in the rate.)

**Queries.** A history of ``--runs`` runs × ``--steps`` training steps, monitored every
``--every`` steps with the lab's value set (default 200 × 20,000 / 10: 400,000 records, ~30 M
metric values), written straight through the store's Arrow path (no broker) and compacted as
the sink would. Each query opens a fresh snapshot (as a page render does) and is repeated;
median wall time:

* fleet — every run's status, last step, active warnings, lead (the fleet page);
* run page — summary, loss, Δ2 and ΔW entropies per layer, router entropy and ε per router,
  warnings, all downsampled to ≤ 1,000 points per line;
* compare — one monitor across 5 runs; lead table — ``foreshock report``'s table.

Targets (issue 6): ingest ≥ 200,000 values/s; fleet query ≤ 1 s.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import threading
import time
import uuid
from pathlib import Path

import numpy as np
import pyarrow as pa

from foreshock.lab.recorded import load_run, shipped_runs
from foreshock.storage import queries
from foreshock.storage.reader import open_history
from foreshock.storage.rows import BatchBuilder, split_key
from foreshock.storage.segments import SegmentStore
from foreshock.transport.settings import KafkaSettings

from ._table import emit_json, format_table, median

TEMPLATE = "fa-lowprec-s1"


def _template() -> list[dict]:
    path = next(p for p in shipped_runs() if p.name.startswith(TEMPLATE + "."))
    return load_run(path).records


def ingest(runs: int, records: int, bootstrap: str | None) -> dict:
    """Produce first, then time the sink until everything is stored."""
    from confluent_kafka import Producer

    from foreshock.storage.sink import StorageSink
    from foreshock.transport.broker import EmbeddedBroker
    from foreshock.transport.topics import ensure_topics
    from foreshock.transport.wire import encode

    broker = None if bootstrap else EmbeddedBroker().start()
    name = f"bench.{uuid.uuid4().hex[:6]}"
    settings = KafkaSettings(bootstrap_servers=bootstrap or broker.bootstrap,
                             metrics_topic=f"{name}.metrics", warnings_topic=f"{name}.warnings",
                             deadletter_topic=f"{name}.dead", partitions=6)  # fmt: skip
    root = Path(tempfile.mkdtemp(prefix="foreshock-ingest-"))
    try:
        ensure_topics(settings)
        producer = Producer({"bootstrap.servers": settings.bootstrap_servers, "linger.ms": 50,
                             "compression.type": "lz4", "batch.size": 1_000_000})  # fmt: skip
        template, values = _template(), 0
        for r in range(runs):
            for n in range(records):
                record = template[n % len(template)]
                message = {**record, "kind": "metrics", "run_id": f"ingest-{r}", "seq": n,
                           "step": n * 25}  # fmt: skip
                producer.produce(settings.metrics_topic, key=message["run_id"].encode(),
                                 value=encode(message))  # fmt: skip
                values += len(record["values"])
                if n % 1000 == 0:
                    producer.poll(0)
        producer.flush(120)
        sink = StorageSink(settings, root, group_id=f"{name}-sink", compact_every=3600)
        start = time.perf_counter()
        stop = threading.Event()
        thread = threading.Thread(target=sink.run, args=(stop,), daemon=True)
        thread.start()
        while sink.stats["values"] < values and time.perf_counter() - start < 600:
            time.sleep(0.05)
        end = time.perf_counter()
        stop.set()
        thread.join(60)
        streaming = end - (sink.first_message_at or start)
        return {"values": values, "stored": sink.stats["values"], "seconds": end - start,
                "streaming_seconds": streaming, "values_per_s": sink.stats["values"] / streaming,
                "batches": sink.stats["batches"]}  # fmt: skip
    finally:
        shutil.rmtree(root, ignore_errors=True)
        if broker is not None:
            broker.stop()


def build_history(root: Path, runs: int, steps: int, every: int) -> int:
    """A synthetic fleet with the lab's series and real-looking values (random walks around
    the template's levels); a few warnings per run and a divergence in every 4th run."""
    template = _template()
    keys = list(template[-1]["values"])
    split = [split_key(k) for k in keys]
    base = np.array([template[-1]["values"][k] or 0.0 for k in keys])
    rng = np.random.default_rng(0)
    record_steps = np.arange(0, steps, every)
    n, k = len(record_steps), len(keys)
    with SegmentStore(root) as store:
        for r in range(runs):
            run_id = f"fleet-{r:04d}"
            walk = base + np.cumsum(rng.normal(0, 0.01, (n, k)), axis=0) * np.abs(base + 0.1)
            metric_values = pa.table({
                "run_id": pa.array([run_id] * (n * k)), "rank": np.zeros(n * k, np.int64),
                "step": np.repeat(record_steps, k),
                "metric": pa.array([s[0] for s in split] * n),
                "module": pa.array([s[1] for s in split] * n),
                "head": pa.array([s[2] for s in split] * n, pa.int64()),
                "value": walk.reshape(-1)})  # fmt: skip
            now = time.time() - (runs - r)
            steps_table = pa.table({
                "run_id": pa.array([run_id] * n), "rank": np.zeros(n, np.int64),
                "step": record_steps, "seq": np.arange(1, n + 1), "time": now - n + np.arange(n),
                "received_at": now - n + np.arange(n), "n_values": np.full(n, k),
                "flags": pa.nulls(n, pa.string())})  # fmt: skip
            b = BatchBuilder()
            diverges = r % 4 == 0
            b.add_lifecycle({"kind": "start", "run_id": run_id, "seq": 0, "time": now - n,
                             "labels": {"scenario": "fa-lowprec" if diverges else "healthy",
                                        "project": f"p{r % 3}"}}, now)  # fmt: skip
            if diverges:
                first = int(record_steps[n // 2])
                b.add_warning({"id": f"{run_id}-w", "event": "opened", "run_id": run_id,
                               "family": "attention-numerics", "module": "h.0.attn",
                               "step": first, "role": "cause"}, now)  # fmt: skip
                b.add_lifecycle({"kind": "end", "run_id": run_id, "seq": n + 1, "time": now,
                                 "status": "diverged", "divergence_step": first + 200,
                                 "last_seq": n + 1}, now)  # fmt: skip
            tables = b.take()
            tables["metric_values"], tables["steps"] = metric_values, steps_table
            store.write(tables)
            store.compact(["metric_values", "steps"])
        store.compact()
    return runs * n * k


def _run_page(root: Path, run_id: str) -> None:
    with open_history(root) as h:
        queries.summary(h, run_id)
        queries.series(h, run_id, "loss")
        for metric in ("attn.d2.entropy_mean", "attn.dwq.entropy", "router.token_entropy_norm",
                       "router.epsilon"):  # fmt: skip
            queries.series(h, run_id, metric)
        queries.run_warnings(h, run_id)


def time_queries(root: Path, runs: int, repeats: int) -> dict[str, float]:
    def fleet() -> None:
        with open_history(root) as h:
            queries.fleet(h)

    def compare() -> None:
        with open_history(root) as h:
            ids = [f"fleet-{i:04d}" for i in range(0, min(runs, 5))]
            queries.series_across_runs(h, ids, "attn.d2.entropy_mean")

    def leads() -> None:
        with open_history(root) as h:
            queries.lead_table(h)

    jobs = {"fleet": fleet, "run page": lambda: _run_page(root, f"fleet-{runs // 2:04d}"),
            "compare (5 runs)": compare, "lead table": leads}  # fmt: skip
    out = {}
    for name, job in jobs.items():
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            job()
            times.append(time.perf_counter() - t0)
        out[name] = median(times)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes (about a minute)")
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--steps", type=int, default=20_000)
    parser.add_argument("--every", type=int, default=10)
    parser.add_argument("--ingest-runs", type=int, default=50)
    parser.add_argument("--ingest-records", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--bootstrap", help="an external Kafka instead of the embedded Tansu")
    args = parser.parse_args()
    if args.quick:
        args.runs, args.steps, args.ingest_runs, args.ingest_records = 20, 5000, 10, 300
    figures = ingest(args.ingest_runs, args.ingest_records, args.bootstrap)
    root = Path(tempfile.mkdtemp(prefix="foreshock-history-"))
    try:
        t0 = time.perf_counter()
        values = build_history(root, args.runs, args.steps, args.every)
        build_s = time.perf_counter() - t0
        size = sum(p.stat().st_size for p in root.rglob("*.parquet"))
        timings = time_queries(root, args.runs, args.repeats)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(format_table(["ingest (Kafka → store)", "values", "s incl. group join",
                        "s from first message", "values/s", "batches"],
                       [["StorageSink, 1 process", figures["stored"], round(figures["seconds"], 2),
                         round(figures["streaming_seconds"], 2), round(figures["values_per_s"]),
                         figures["batches"]]]))  # fmt: skip
    print()
    print(f"history: {args.runs} runs × {args.steps} steps (every {args.every}): {values:,} "
          f"values, {size / 1e6:.0f} MB of Parquet, written in {build_s:.1f} s "
          f"({values / build_s:,.0f} values/s through the Arrow path)")  # fmt: skip
    print(format_table(["query (fresh snapshot each)", "median s"],
                       [[k, round(v, 4)] for k, v in timings.items()]))  # fmt: skip
    emit_json({"ingest_values_per_s": round(figures["values_per_s"]),
               "ingest_values": figures["stored"],
               "ingest_seconds": round(figures["streaming_seconds"], 3),
               "ingest_seconds_with_group_join": round(figures["seconds"], 3),
               "history_runs": args.runs, "history_steps": args.steps, "every": args.every,
               "history_values": values, "history_bytes": size,
               "arrow_write_values_per_s": round(values / build_s),
               "query_seconds": {k: round(v, 4) for k, v in timings.items()},
               "targets_met": {"ingest": figures["values_per_s"] >= 200_000,
                               "fleet": timings["fleet"] <= 1.0}})  # fmt: skip


if __name__ == "__main__":
    main()
