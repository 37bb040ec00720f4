"""Storage: ingest into the Delta store (1 and 2 sinks), queries on a big history, its size.

Ingest from Kafka with one and two sink processes; the dashboard's queries on a big history
through both read paths, after compaction and after z-order; the store's size on disk.

**Ingest.** ``--ingest-runs`` runs × ``--ingest-records`` monitoring records (the shipped lab
records, ~75 values each, run id and step renumbered; default 100 × 1,500: 11.1 M values, so
that each sink's start and last flush — fixed costs of about half a second — do not decide the
two-sink ratio: at 100 × 500 (3.7 M, the segment store's size) it measured 1.45–1.63×, at
100 × 1,500 1.78×) are produced once to a metrics topic of ``--partitions``
partitions (default 12) on the embedded Tansu (or ``--bootstrap``). Runs are keyed to
partitions by hash, so few runs on few partitions split unevenly between two sinks (50 runs on
6 partitions: 35 / 15, at most 1.43× for two sinks); 100 runs on 12 split 49 / 51. Then, for
each count in ``--sinks`` (default 1 and 2), that many ``StorageSink`` processes (``spawn``:
deltalake is not fork-safe) in one fresh consumer group read the whole topic into a fresh
store, each as ``foreshock sink`` does: batches of 500,000 values, one Delta commit per table
per batch, the consumed offsets committed after each batch (no compaction while timed). All
sinks are built first and start polling together, so they join the group in one generation.
Timed from the first message any sink receives until every value is stored (each sink's clock
is ``perf_counter``, CLOCK_MONOTONIC, one clock for every process of the machine). Figures:
metric values/s, 2 sinks over 1; beside them the group join (Tansu holds a JoinGroup for half
the session timeout, 3 s; not in the rate), each sink's share, its CPU seconds (all its
threads), its seconds waiting for the broker inside ``poll_batch`` (wall minus the polling
thread's CPU) and inside ``DeltaStore.write`` — all from its first message on — the broker's
CPU, the machine's busy cores, and what the store holds afterwards (values, records, records
stored twice). Each count runs ``--ingest-repeats`` times (default 3, counts alternating; the
machine is small and shared): the trial with the median rate is reported, with all rates.

**Queries.** A history of ``--runs`` runs × ``--steps`` training steps, monitored every
``--every`` steps with the lab's value set (default 200 × 20,000 / 10: 400,000 records, 30 M
metric values), written straight through ``DeltaStore.write`` as a sink fed by a fleet of
concurrent runs would write it: batches of ~``--batch-values`` values, each holding every run's
records over a range of steps (in arrival order: step, then run; ``--order run``: whole runs
per batch, as the segment store's benchmark wrote them). Then a copy of the store in each of
``--layouts``:

* ``uncompacted`` — as written, one file per batch (what a reader sees between compactions);
* ``compact`` — ``DeltaStore.maintain()``, as the sink runs it: bin-packing, then vacuum;
* ``z-order`` — ``metric_values`` z-ordered on (run_id, metric) instead of compacted, the other
  tables compacted, then vacuum.

Each query opens a fresh snapshot (as a page render does) and is repeated; median wall time,
through each read path: DuckDB ``read_parquet`` over the version's ``file_uris()`` (what
``open_history`` does for a local store), DuckDB over ``DeltaTable.to_pyarrow_dataset()`` (a
remote store with the read cache off or too small) and ``read_parquet`` over the read cache's
local copies (a remote store: ``remote_cached``; its first page, with every file still to
copy down, is ``run page, cold cache``):

* fleet — every run's status, last step, active warnings, lead (the fleet page);
* run page — summary, loss, Δ2 and ΔW entropies per layer, router entropy and ε per router,
  warnings, all downsampled to ≤ 1,000 points per line;
* compare — one monitor across 5 runs; lead table — ``foreshock report``'s table;
* sink read-back — the queries a sink makes on start and on every rebalance (stored streams,
  event keys, orphan values), read_parquet path only.

Size on disk: every file under the store (Parquet and Delta log) after vacuum with no retention;
the sink's default vacuum keeps replaced files for a week (``--retain-hours``), so a live store
also holds the pre-compaction files of its last week.

Targets (issue 18): one sink ≥ 313,000 values/s (the segment store's figure), 2 sinks ≥ 1.6×
one; fleet query ≤ 1 s; run page queries ≤ 1 s.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import shutil
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
from deltalake import WriterProperties

from foreshock.lab.recorded import load_run, shipped_runs
from foreshock.storage import queries, stream_queries
from foreshock.storage.file_cache import FileCache
from foreshock.storage.reader import History, open_history
from foreshock.storage.rows import BatchBuilder, split_key
from foreshock.storage.schema import TABLES
from foreshock.storage.store import DeltaStore
from foreshock.transport.settings import KafkaSettings

from ._table import emit_json, format_table, median

TEMPLATE = "fa-lowprec-s1"
LAYOUTS = ("uncompacted", "compact", "z-order")
READ_PATHS = ("read_parquet", "pyarrow_dataset", "remote_cached")
ZORDER_COLUMNS = ["run_id", "metric"]

# benchmarks/results/storage.json before the switch to Delta Lake: the hand-made segment store
# (storage/segments.py), measured 2026-11-30 20:09 UTC, x86_64, 2 cores, Python 3.11.7, by
# `python -m benchmarks.storage` at the same sizes (its history written one run per batch, its
# compacted segments sorted by run, metric, step).
SEGMENT_STORE_BEFORE = {
    "note": "segment store (storage/segments.py, removed), same benchmark and sizes; history "
    "written one run per batch and compacted into segments sorted by (run, metric, step); "
    "history_bytes counts its *.parquet files, which may include merged-away segments still in "
    "their 60 s grace (the same data sorted, zstd, 128k-row groups is ~295 MB)",
    "measured_at": "2026-11-30 20:09 UTC",
    "ingest_values_per_s": 313425,
    "ingest_values": 3703200,
    "ingest_seconds": 11.815,
    "ingest_seconds_with_group_join": 15.517,
    "history_values": 30000000,
    "history_bytes": 619980056,
    "arrow_write_values_per_s": 243725,
    "query_seconds": {
        "fleet": 0.1962,
        "run page": 0.4274,
        "compare (5 runs)": 0.1792,
        "lead table": 0.1425,
    },
}


def _template() -> list[dict]:
    path = next(p for p in shipped_runs() if p.name.startswith(TEMPLATE + "."))
    return load_run(path).records


# ---------------------------------------------------------------------------------- ingest


def produce(settings: KafkaSettings, runs: int, records: int) -> int:
    """Every record onto the metrics topic (keyed by run); returns the number of values."""
    from confluent_kafka import Producer

    from foreshock.transport.wire import encode

    producer = Producer(
        {
            "bootstrap.servers": settings.bootstrap_servers,
            "linger.ms": 50,
            "compression.type": "lz4",
            "batch.size": 1_000_000,
        }
    )
    template, values = _template(), 0
    for r in range(runs):
        for n in range(records):
            record = template[n % len(template)]
            message = {
                **record,
                "kind": "metrics",
                "run_id": f"ingest-{r}",
                "seq": n,
                "step": n * 25,
            }
            producer.produce(
                settings.metrics_topic, key=message["run_id"].encode(), value=encode(message)
            )
            values += len(record["values"])
            if (r * records + n) % 1000 == 0:
                producer.poll(0)
    if producer.flush(120):
        raise RuntimeError("the broker did not take every message in 120 s")
    return values


def _sink_process(
    settings: KafkaSettings,
    root: str,
    group: str,
    index: int,
    shared: Any,
    ready: Any,
    stop: Any,
    results: Any,
) -> None:
    """One sink (a spawned process): built, then all start polling together at ``ready``;
    ``shared[4 * index:]`` = first message, values stored, when last stored, batches. Reports
    its CPU seconds (all its threads) and the seconds spent in ``DeltaStore.write_table`` and in the
    offset commit, up to its last stored batch."""
    from foreshock.storage.sink import StorageSink

    sink = StorageSink(settings, root, group_id=group, compact_every=3600)
    spent = dict.fromkeys(
        ("write_seconds", "commit_seconds", "poll_seconds", "poll_idle_seconds"), 0.0
    )

    def timed(fn: Callable, key: str) -> Callable:
        def call(*args: Any, **kwargs: Any) -> Any:
            t0, cpu0 = time.perf_counter(), time.thread_time()
            try:
                return fn(*args, **kwargs)
            finally:
                spent[key] += time.perf_counter() - t0
                if key == "poll_seconds":  # waiting for the broker, not decoding
                    spent["poll_idle_seconds"] += time.perf_counter() - t0
                    spent["poll_idle_seconds"] -= time.thread_time() - cpu0

        return call

    sink.store.write_table = timed(sink.store.write_table, "write_seconds")
    sink.consumer.commit = timed(sink.consumer.commit, "commit_seconds")
    sink.consumer.poll_batch = timed(sink.consumer.poll_batch, "poll_seconds")
    ready.wait()
    cpu0 = time.process_time()
    halt = threading.Event()
    thread = threading.Thread(target=sink.run, args=(halt,), daemon=True)
    thread.start()
    base, stored, at_last, at_first = 4 * index, 0, {}, {}
    while not stop.wait(0.01):
        if sink.first_message_at is not None and not shared[base]:
            shared[base] = sink.first_message_at
            at_first = {**spent, "cpu_seconds": time.process_time() - cpu0}
        if sink.stats.values != stored:
            stored = sink.stats.values
            at_last = {**spent, "cpu_seconds": time.process_time() - cpu0}
            shared[base + 2] = time.perf_counter()  # before the count: the parent reads it
            shared[base + 3] = sink.stats.batches
            shared[base + 1] = stored
    halt.set()
    thread.join(120)
    since_first = {k: v - at_first.get(k, 0.0) for k, v in at_last.items()}  # the join left out
    results.put({"index": index, **sink.stats.as_dict(), **since_first})


def _cpu_ticks(pid: int | None = None) -> tuple[int, int]:
    """(busy, total) clock ticks of the machine, or (busy, 0) of process ``pid``."""
    if pid is not None:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return int(fields[11]) + int(fields[12]), 0
    ticks = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return sum(ticks) - ticks[3] - ticks[4], sum(ticks)  # all but idle and iowait


def _stored_counts(root: Path) -> dict[str, int]:
    """What the store holds: metric values, step rows, and records stored more than once
    (``stream_queries.duplicate_records``, what ``foreshock store check`` fails on)."""
    with open_history(root) as h:
        row = h.sql(
            "SELECT (SELECT count(*) FROM metric_values) AS values_in_store, "
            "(SELECT count(*) FROM steps) AS records_in_store"
        ).to_pylist()[0]
        twice = sum(r["extra"] for r in stream_queries.duplicate_records(h))
    return {**{k: int(v) for k, v in row.items()}, "records_stored_twice": int(twice)}


def ingest_case(
    settings: KafkaSettings,
    sinks: int,
    values: int,
    broker_pid: int | None = None,
    timeout: float = 600,
) -> dict:
    """``sinks`` sink processes in a fresh group and store read the topic; see the docstring."""
    root = Path(tempfile.mkdtemp(prefix="foreshock-ingest-"))
    group = f"{settings.metrics_topic}-sinks{sinks}-{uuid.uuid4().hex[:4]}"
    context = mp.get_context("spawn")
    shared = context.Array("d", 4 * sinks)
    ready, stop, results = context.Barrier(sinks + 1), context.Event(), context.Queue()
    procs = [
        context.Process(
            target=_sink_process,
            args=(settings, str(root / "history"), group, i, shared, ready, stop, results),
        )
        for i in range(sinks)
    ]
    try:
        DeltaStore(str(root / "history"))  # the tables exist before the sinks start
        for p in procs:
            p.start()
        ready.wait(180)  # every sink built (imports, consumer, read-back of the empty store)
        go = time.perf_counter()
        machine0, broker0 = _cpu_ticks(), _cpu_ticks(broker_pid)[0] if broker_pid else 0
        while time.perf_counter() - go < timeout and all(p.is_alive() for p in procs):
            if sum(shared[4 * i + 1] for i in range(sinks)) >= values:
                break
            time.sleep(0.02)
        machine1, broker1 = _cpu_ticks(), _cpu_ticks(broker_pid)[0] if broker_pid else 0
        snapshot = list(shared)
        stop.set()
        stats = sorted((results.get(timeout=180) for _ in procs), key=lambda s: s["index"])
        for p in procs:
            p.join(60)
    finally:
        stop.set()
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join(10)
        size = _disk_bytes(root)
        check = _stored_counts(root / "history")
        shutil.rmtree(root, ignore_errors=True)
    firsts = [snapshot[4 * i] for i in range(sinks) if snapshot[4 * i]]
    stored = [int(snapshot[4 * i + 1]) for i in range(sinks)]
    end = max(snapshot[4 * i + 2] for i in range(sinks))
    streaming = end - min(firsts)
    hz, window = os.sysconf("SC_CLK_TCK"), time.perf_counter() - go
    busy = (machine1[0] - machine0[0]) / max(1, machine1[1] - machine0[1])
    return {
        "sinks": sinks,
        "values": values,
        "stored": sum(stored),
        "stored_per_sink": stored,
        "batches": sum(s["batches"] for s in stats),
        "seconds_from_first_message": round(streaming, 3),
        "seconds_with_group_join": round(end - go, 3),
        "values_per_s": round(sum(stored) / streaming),
        "read_backs_per_sink": [s["read_backs"] for s in stats],
        "first_message_s_per_sink": [round(snapshot[4 * i] - min(firsts), 3) for i in range(sinks)],
        "last_stored_s_per_sink": [
            round(snapshot[4 * i + 2] - min(firsts), 3) for i in range(sinks)
        ],
        "duplicates": sum(s["duplicates"] for s in stats),
        "write_retries": sum(s["write_retries"] for s in stats),
        "cpu_seconds_per_sink": [round(s.get("cpu_seconds", 0), 2) for s in stats],
        "write_seconds_per_sink": [round(s.get("write_seconds", 0), 2) for s in stats],
        "commit_seconds_per_sink": [round(s.get("commit_seconds", 0), 3) for s in stats],
        "poll_seconds_per_sink": [round(s.get("poll_seconds", 0), 2) for s in stats],
        "poll_idle_seconds_per_sink": [round(s.get("poll_idle_seconds", 0), 2) for s in stats],
        "broker_cpu_seconds": round((broker1 - broker0) / hz, 2) if broker_pid else None,
        "machine_cores_busy": round(busy * (os.cpu_count() or 1), 2),
        "window_seconds": round(window, 2),
        "store_bytes": size,
        **check,
    }


def ingest(
    runs: int,
    records: int,
    bootstrap: str | None,
    partitions: int,
    sink_counts: list[int],
    repeats: int = 1,
) -> dict[int, dict]:
    """Produce once, then ``repeats`` rounds of one timed case per sink count (each its own
    group and store, the counts alternating); per count, the trial with the median rate."""
    from foreshock.transport.broker import EmbeddedBroker
    from foreshock.transport.topics import ensure_topics

    broker = None if bootstrap else EmbeddedBroker().start()
    name = f"bench.{uuid.uuid4().hex[:6]}"
    settings = KafkaSettings(
        bootstrap_servers=bootstrap or broker.bootstrap,
        metrics_topic=f"{name}.metrics",
        warnings_topic=f"{name}.warnings",
        deadletter_topic=f"{name}.dead",
        partitions=partitions,
    )
    try:
        ensure_topics(settings)
        values = produce(settings, runs, records)
        pid = broker.process.pid if broker is not None and broker.process else None
        trials: dict[int, list[dict]] = {n: [] for n in sink_counts}
        for _ in range(repeats):
            for n in sink_counts:
                trials[n].append(ingest_case(replace(settings), n, values, pid))
        out = {}
        for n, cases in trials.items():
            ranked = sorted(cases, key=lambda c: c["values_per_s"])
            out[n] = {
                **ranked[(len(ranked) - 1) // 2],
                "trials_values_per_s": [c["values_per_s"] for c in cases],
            }
        return out
    finally:
        if broker is not None:
            broker.stop()


# ---------------------------------------------------------------------------------- history


def _conform(name: str, columns: dict[str, Any]) -> pa.Table:
    """``columns`` as table ``name``; a column of the schema not given is 0 if an integer
    (``rank``, ``attempt``: one stream per run), else null."""
    rows = len(next(iter(columns.values())))
    return pa.table(
        {
            f.name: columns[f.name]
            if f.name in columns
            else np.zeros(rows, np.int64)
            if pa.types.is_integer(f.type)
            else pa.nulls(rows, f.type)
            for f in TABLES[name]
        },
        schema=TABLES[name],
    )


def _batches(runs: int, n: int, k: int, batch_values: int, order: str):
    """(run indices, first record, end record) of each batch of ~``batch_values`` values."""
    if order == "step":  # every run's records over a range of steps: a concurrent fleet
        per_batch = max(1, batch_values // (runs * k))
        for a in range(0, n, per_batch):
            yield np.arange(runs), a, min(n, a + per_batch)
    elif order == "run":  # whole runs, one after another: runs that ran one at a time
        per_batch = max(1, batch_values // (n * k))
        for r in range(0, runs, per_batch):
            yield np.arange(r, min(runs, r + per_batch)), 0, n
    else:
        raise ValueError(f"unknown order {order!r}")


def build_history(
    root: Path,
    runs: int,
    steps: int,
    every: int,
    batch_values: int = 500_000,
    layout: str = "compact",
    order: str = "step",
) -> int:
    """A synthetic fleet with the lab's series and real-looking values (random walks around
    the template's levels); a few warnings per run and a divergence in every 4th run. Written
    through ``DeltaStore.write`` in sink-sized batches — ``order`` ``step``: each holding every
    run's records over a range of steps, in arrival order (step, run); ``run``: whole runs —
    then ``layout`` (:func:`lay_out`). Returns the number of metric values."""
    template = _template()
    keys = list(template[-1]["values"])
    split = [split_key(k) for k in keys]
    base = np.array([template[-1]["values"][k] or 0.0 for k in keys])
    rng = np.random.default_rng(0)
    record_steps = np.arange(0, steps, every)
    n, k = len(record_steps), len(keys)
    walks = np.stack(
        [
            base + np.cumsum(rng.normal(0, 0.01, (n, k)), axis=0) * np.abs(base + 0.1)
            for _ in range(runs)
        ]
    )  # (run, record, key)
    run_ids = pa.array([f"fleet-{r:04d}" for r in range(runs)])
    metric, module = pa.array([s[0] for s in split]), pa.array([s[1] for s in split])
    head = pa.array([s[2] for s in split], pa.int64())
    now = time.time() - runs + np.arange(runs)  # run r's last record: now - (runs - r)
    times = now[:, None] - n + np.arange(n)[None, :]  # (run, record)
    middle = n // 2
    first = int(record_steps[middle])
    with DeltaStore(str(root)) as store:
        for rs, a, b in _batches(runs, n, k, batch_values, order):
            m, u = b - a, len(rs)
            records = np.arange(a, b)
            if order == "step":  # rows: record, run, key
                run_of_step, record_of_step = np.tile(rs, m), np.repeat(records, u)
                values = walks[rs, a:b, :].transpose(1, 0, 2).reshape(-1)
            else:  # rows: run, record, key
                run_of_step, record_of_step = np.repeat(rs, m), np.tile(records, u)
                values = walks[rs, a:b, :].reshape(-1)
            tables = BatchBuilder()
            for r in rs:
                run_id, diverges = f"fleet-{r:04d}", r % 4 == 0
                if a == 0:
                    tables.add_lifecycle(
                        {
                            "kind": "start",
                            "run_id": run_id,
                            "seq": 0,
                            "time": times[r, 0] - 1,
                            "labels": {
                                "scenario": "fa-lowprec" if diverges else "healthy",
                                "project": f"p{r % 3}",
                            },
                        },
                        times[r, 0] - 1,
                    )
                if diverges and a <= middle < b:
                    tables.add_warning(
                        {
                            "id": f"{run_id}-w",
                            "event": "opened",
                            "run_id": run_id,
                            "family": "attention-numerics",
                            "module": "h.0.attn",
                            "step": first,
                            "role": "cause",
                        },
                        times[r, middle],
                    )
                if diverges and b == n:
                    tables.add_lifecycle(
                        {
                            "kind": "end",
                            "run_id": run_id,
                            "seq": n + 1,
                            "time": now[r],
                            "status": "diverged",
                            "divergence_step": first + 200,
                            "last_seq": n + 1,
                        },
                        now[r],
                    )
            batch = tables.take()
            key_of_row = pa.array(np.tile(np.arange(k), m * u))
            t = times[run_of_step, record_of_step]
            batch["metric_values"] = _conform(
                "metric_values",
                {
                    "run_id": run_ids.take(pa.array(np.repeat(run_of_step, k))),
                    "rank": np.zeros(m * u * k, np.int64),
                    "step": np.repeat(record_steps[record_of_step], k),
                    "metric": metric.take(key_of_row),
                    "module": module.take(key_of_row),
                    "head": head.take(key_of_row),
                    "value": values,
                },
            )
            batch["steps"] = _conform(
                "steps",
                {
                    "run_id": run_ids.take(pa.array(run_of_step)),
                    "rank": np.zeros(m * u, np.int64),
                    "step": record_steps[record_of_step],
                    "seq": record_of_step + 1,
                    "time": t,
                    "received_at": t,
                    "n_values": np.full(m * u, k),
                    "flags": pa.nulls(m * u, pa.string()),
                },
            )
            store.write(batch)
    lay_out(root, layout)
    return runs * n * k


def lay_out(root: Path, layout: str, retain_hours: float = 0.0) -> dict[str, Any]:
    """``compact``: the sink's maintenance; ``z-order``: metric_values z-ordered on
    :data:`ZORDER_COLUMNS` first; ``uncompacted``: nothing. Vacuum keeps ``retain_hours``."""
    if layout == "uncompacted":
        return {}
    store = DeltaStore(str(root))
    report: dict[str, Any] = {}
    if layout == "z-order":
        table = store.tables["metric_values"]
        table.update_incremental()
        report["z_order"] = table.optimize.z_order(
            ZORDER_COLUMNS, writer_properties=WriterProperties(compression="ZSTD")
        )
    elif layout != "compact":
        raise ValueError(f"unknown layout {layout!r}")
    report.update(store.maintain(retain_hours))
    return report


# ---------------------------------------------------------------------------------- queries


class RemoteHistory(History):
    """A local store read the way :class:`History` reads a remote one (:mod:`..file_cache`):
    with ``cache=None``, through ``DeltaTable.to_pyarrow_dataset()``; with a cache, DuckDB's
    ``read_parquet`` over local copies of the files."""

    @property
    def remote(self) -> bool:
        return True


_CACHE = Path(tempfile.gettempdir()) / f"foreshock-read-cache-{os.getpid()}"  # (removed at end)
OPENERS: dict[str, Callable[[Path], History]] = {
    "read_parquet": open_history,
    "pyarrow_dataset": lambda root: RemoteHistory(root, cache=None),
    "remote_cached": lambda root: RemoteHistory(root, cache=FileCache(_CACHE, 2**40)),
}


def _run_page(h: History, run_id: str) -> None:
    queries.summary(h, run_id)
    queries.series(h, run_id, "loss")
    for metric in (
        "attn.d2.entropy_mean",
        "attn.dwq.entropy",
        "router.token_entropy_norm",
        "router.epsilon",
    ):
        queries.series(h, run_id, metric)
    queries.run_warnings(h, run_id)


def _read_back(h: History) -> None:
    """What ``StorageSink._read_back`` asks on start and on every partition assignment."""
    stream_queries.stored_streams(h)
    stream_queries.stored_event_keys(h)
    stream_queries.orphan_values(h)


def time_queries(
    root: Path, runs: int, repeats: int, path: str = "read_parquet", read_back: bool = False
) -> dict[str, float]:
    """Median seconds of each page's queries, a fresh snapshot (``path``) per repetition."""
    opener = OPENERS[path]
    ids = [f"fleet-{i:04d}" for i in range(0, min(runs, 5))]
    jobs: dict[str, Callable[[History], Any]] = {
        "fleet": queries.fleet,
        "run page": lambda h: _run_page(h, f"fleet-{runs // 2:04d}"),
        "compare (5 runs)": lambda h: queries.series_across_runs(h, ids, "attn.d2.entropy_mean"),
        "lead table": queries.lead_table,
    }
    if read_back:
        jobs["sink read-back"] = _read_back
    out = {}
    if path == "remote_cached":  # the first page after a start: every file copied down
        shutil.rmtree(_CACHE, ignore_errors=True)
        t0 = time.perf_counter()
        with opener(root) as h:
            jobs["run page"](h)
        out["run page, cold cache"] = time.perf_counter() - t0
    for name, job in jobs.items():
        times = []
        for _ in range(repeats if name != "sink read-back" else max(1, min(repeats, 3))):
            t0 = time.perf_counter()
            with opener(root) as h:
                job(h)
            times.append(time.perf_counter() - t0)
        out[name] = median(times)
    return out


def _disk_bytes(root: Path, suffix: str = "") -> int:
    return sum(p.stat().st_size for p in root.rglob(f"*{suffix}") if p.is_file())


def _store_figures(root: Path) -> dict[str, Any]:
    with open_history(root) as h:
        files = dict(h.files)
    return {
        "bytes_on_disk": _disk_bytes(root),
        "parquet_bytes": _disk_bytes(root, ".parquet"),
        "metric_values_files": files["metric_values"],
        "files": sum(files.values()),
    }


def history_figures(args: argparse.Namespace) -> dict[str, Any]:
    """Build once, then per layout (a copy of the store each): its size and query timings."""
    work = Path(tempfile.mkdtemp(prefix="foreshock-history-"))
    try:
        written = work / "written"
        t0 = time.perf_counter()
        values = build_history(
            written,
            args.runs,
            args.steps,
            args.every,
            args.batch_values,
            layout="uncompacted",
            order=args.order,
        )
        build_s = time.perf_counter() - t0
        layouts: dict[str, Any] = {}
        for layout in args.layouts:
            root = work / layout
            shutil.copytree(written, root)
            t0 = time.perf_counter()
            report = lay_out(root, layout)
            layouts[layout] = {
                "optimize_seconds": round(time.perf_counter() - t0, 2),
                **_store_figures(root),
                "query_seconds": {},
            }
            if "z_order" in report:
                layouts[layout]["z_order_report"] = {
                    k: v for k, v in report["z_order"].items() if isinstance(v, int | float)
                }
            for path in READ_PATHS:
                timings = time_queries(
                    root, args.runs, args.repeats, path, read_back=path == "read_parquet"
                )
                layouts[layout]["query_seconds"][path] = {
                    k: round(v, 4) for k, v in timings.items()
                }
            shutil.rmtree(root, ignore_errors=True)
        return {"values": values, "build_seconds": build_s, "layouts": layouts}
    finally:
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(_CACHE, ignore_errors=True)


# ---------------------------------------------------------------------------------- main


def _faster(q: dict[str, dict[str, float]]) -> dict[str, str]:
    """Per query: which read path had the smaller median, and by how much."""
    out = {}
    for name, a in q["read_parquet"].items():
        b = q["pyarrow_dataset"].get(name)  # (a remote store without the read cache)
        if b is not None:
            fast, slow = ("read_parquet", b / a) if a <= b else ("pyarrow_dataset", a / b)
            out[name] = f"{fast} ({slow:.2f}×)"
    return out


def figures(result: dict[str, Any]) -> list[tuple[str, str]]:
    """``benchmarks.readme``'s rows for this result: the ingest rate with one sink (with two and
    the scaling, when measured), the fleet query and the run page queries on the history, the
    run page through a remote store's read path (when measured), and the history's size on
    disk against the segment store's."""
    q = result["query_seconds"]
    rows = [("ingest, Kafka → store (one sink)", f"{result['ingest_values_per_s']:,} values/s")]
    if "ingest_values_per_s_2_sinks" in result:
        scaling = result["ingest_scaling_2_over_1"]
        rows.append(
            (
                "ingest, two sink processes in one group",
                f"{result['ingest_values_per_s_2_sinks']:,} values/s "
                f"({scaling:.2f}× one sink; target ≥ 1.6×)",
            )
        )
    rows += [
        (
            f"fleet query, {result['history_runs']} runs × {result['history_steps']:,} steps",
            f"{q['fleet']:.2f} s",
        ),
        ("run page queries", f"{q['run page']:.2f} s"),
    ]
    layout = result.get("layouts", {}).get(result.get("history_layout"), {})
    remote = layout.get("query_seconds", {})
    if "remote_cached" in remote:
        cached, off = remote["remote_cached"], remote["pyarrow_dataset"]
        cold = cached["run page, cold cache"]
        rows.append(
            (
                "run page queries, a remote store's read path (local files read as remote)",
                f"{cached['run page']:.2f} s with the read cache ({cold:.2f} s cold); "
                f"{off['run page']:.2f} s with it off",
            )
        )
    before = result.get("segment_store_before")
    if before and "history_bytes" in result:
        rows.append(
            (
                "history on disk (compacted, vacuumed)",
                f"{result['history_bytes'] / 1e6:.0f} MB (segment store: "
                f"{before['history_bytes'] / 1e6:.0f} MB)",
            )
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes (about a minute)")
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--steps", type=int, default=20_000)
    parser.add_argument("--every", type=int, default=10)
    parser.add_argument(
        "--batch-values",
        type=int,
        default=500_000,
        help="values per history batch (the sink's default batch)",
    )
    parser.add_argument(
        "--order",
        choices=("step", "run"),
        default="step",
        help="history batches: every run over a range of steps (a concurrent "
        "fleet, default) or whole runs (as the segment store's benchmark "
        "wrote them)",
    )
    parser.add_argument(
        "--layouts", default=",".join(LAYOUTS), help=f"comma-separated, of {', '.join(LAYOUTS)}"
    )
    parser.add_argument("--ingest-runs", type=int, default=100)
    parser.add_argument("--ingest-records", type=int, default=1500)
    parser.add_argument(
        "--ingest-repeats",
        type=int,
        default=3,
        help="trials per sink count; the median is reported",
    )
    parser.add_argument("--sinks", default="1,2", help="sink counts to time, comma-separated")
    parser.add_argument("--partitions", type=int, default=12, help="of the metrics topic")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--bootstrap", help="an external Kafka instead of the embedded Tansu")
    parser.add_argument("--skip-ingest", action="store_true")
    parser.add_argument("--skip-queries", action="store_true")
    args = parser.parse_args()
    if args.quick:
        args.runs, args.steps, args.ingest_runs, args.ingest_records = 20, 5000, 10, 300
        args.repeats, args.ingest_repeats = min(args.repeats, 3), 1
    args.layouts = [x for x in args.layouts.split(",") if x]
    unknown = set(args.layouts) - set(LAYOUTS)
    if unknown:
        parser.error(f"unknown layouts: {sorted(unknown)}")
    sink_counts = [int(x) for x in args.sinks.split(",") if x]
    figures: dict[str, Any] = {}

    cases: dict[int, dict] = {}
    if not args.skip_ingest:
        cases = ingest(
            args.ingest_runs,
            args.ingest_records,
            args.bootstrap,
            args.partitions,
            sink_counts,
            args.ingest_repeats,
        )

        def per_sink(values: list, fmt: str = "{}") -> str:
            return " / ".join(fmt.format(v) for v in values)

        print(
            format_table(
                [
                    "ingest (Kafka → Delta store)",
                    "values",
                    "s incl. group join",
                    "s from first message",
                    "values/s (median)",
                    "trials",
                    "batches",
                    "values per sink",
                    "CPU s per sink",
                    "idle in poll s",
                    "in write s",
                    "read-backs",
                ],
                [
                    [
                        f"{c['sinks']} sink process{'es' if c['sinks'] > 1 else ''}",
                        c["stored"],
                        c["seconds_with_group_join"],
                        c["seconds_from_first_message"],
                        c["values_per_s"],
                        per_sink(c["trials_values_per_s"], "{:,}"),
                        c["batches"],
                        per_sink(c["stored_per_sink"], "{:,}"),
                        per_sink(c["cpu_seconds_per_sink"]),
                        per_sink(c["poll_idle_seconds_per_sink"]),
                        per_sink(c["write_seconds_per_sink"]),
                        per_sink(c["read_backs_per_sink"]),
                    ]
                    for c in cases.values()
                ],
            )
        )
        figures["ingest"] = {str(n): c for n, c in cases.items()}
        if 1 in cases:
            one = cases[1]
            figures.update(
                {
                    "ingest_values_per_s": one["values_per_s"],
                    "ingest_values": one["stored"],
                    "ingest_seconds": one["seconds_from_first_message"],
                    "ingest_seconds_with_group_join": one["seconds_with_group_join"],
                }
            )
        if 1 in cases and 2 in cases:
            figures["ingest_values_per_s_2_sinks"] = cases[2]["values_per_s"]
            figures["ingest_scaling_2_over_1"] = round(
                cases[2]["values_per_s"] / cases[1]["values_per_s"], 3
            )
            print(f"2 sinks / 1 sink: {figures['ingest_scaling_2_over_1']:.2f}×")
        print()

    if not args.skip_queries:
        h = history_figures(args)
        values, build_s = h["values"], h["build_seconds"]
        print(
            f"history: {args.runs} runs × {args.steps} steps (every {args.every}): "
            f"{values:,} values in batches of ~{args.batch_values:,}, written in "
            f"{build_s:.1f} s ({values / build_s:,.0f} values/s through "
            "DeltaStore.write)"
        )
        layouts = h["layouts"]
        print(
            format_table(
                ["layout", "optimize s", "MB on disk", "MB Parquet", "metric_values files"],
                [
                    [
                        name,
                        x["optimize_seconds"],
                        round(x["bytes_on_disk"] / 1e6, 1),
                        round(x["parquet_bytes"] / 1e6, 1),
                        x["metric_values_files"],
                    ]
                    for name, x in layouts.items()
                ],
            )
        )
        names = list(next(iter(layouts.values()))["query_seconds"]["read_parquet"])
        header = ["query: median s (fresh snapshot each)"] + [
            f"{layout}: {path}" for layout in layouts for path in READ_PATHS
        ]
        rows = [
            [name]
            + [
                layouts[layout]["query_seconds"][path].get(name, "–")
                for layout in layouts
                for path in READ_PATHS
            ]
            for name in names
        ]
        print(format_table(header, rows))
        faster = {layout: _faster(x["query_seconds"]) for layout, x in layouts.items()}
        for layout, which in faster.items():
            print(
                f"faster read path, {layout}: " + "; ".join(f"{q}: {w}" for q, w in which.items())
            )
        main_layout = "compact" if "compact" in layouts else next(iter(layouts))
        chosen = layouts[main_layout]
        figures.update(
            {
                "history_runs": args.runs,
                "history_steps": args.steps,
                "every": args.every,
                "history_values": values,
                "history_batch_values": args.batch_values,
                "history_order": args.order,
                "history_layout": main_layout,
                "history_bytes": chosen["bytes_on_disk"],
                "history_parquet_bytes": chosen["parquet_bytes"],
                "arrow_write_values_per_s": round(values / build_s),
                "query_seconds": {
                    k: v
                    for k, v in chosen["query_seconds"]["read_parquet"].items()
                    if k != "sink read-back"
                },
                "layouts": layouts,
                "faster_read_path": faster,
            }
        )
        if "z-order" in layouts and "compact" in layouts:
            z, c = layouts["z-order"]["query_seconds"], layouts["compact"]["query_seconds"]
            figures["run_page_z_order_over_compact"] = {
                path: round(z[path]["run page"] / c[path]["run page"], 3) for path in READ_PATHS
            }
        print()

    figures["segment_store_before"] = SEGMENT_STORE_BEFORE
    if "history_bytes" in figures:
        figures["history_bytes_over_segment_store"] = round(
            figures["history_bytes"] / SEGMENT_STORE_BEFORE["history_bytes"], 3
        )
    targets: dict[str, bool] = {}
    if 1 in cases:
        targets["ingest"] = cases[1]["values_per_s"] >= SEGMENT_STORE_BEFORE["ingest_values_per_s"]
    if "ingest_scaling_2_over_1" in figures:
        targets["ingest_2_sinks"] = figures["ingest_scaling_2_over_1"] >= 1.6
    if "query_seconds" in figures:
        targets["fleet"] = figures["query_seconds"]["fleet"] <= 1.0
        targets["run_page"] = figures["query_seconds"]["run page"] <= 1.0
    figures["targets_met"] = targets
    emit_json(figures)


if __name__ == "__main__":
    main()
