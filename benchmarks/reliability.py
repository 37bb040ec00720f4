"""Faults survived: kill and restart each part of the pipeline under a live fleet; count losses.

For each fault (``--faults``; default ``none`` as the control, then ``worker``, ``sink``,
``broker`` and ``dashboard``) a fresh pipeline runs on 127.0.0.1: the embedded Tansu, one
``foreshock detect`` worker, one ``foreshock sink`` and ``foreshock dashboard``, each its own
process. A fleet of recorded lab runs (``--runs``) streams through it, each run from its own
producer (a :class:`~foreshock.producers.kafka_sink.KafkaSink`, as in a trainer) writing one
monitoring record every ``1 / --rate`` s. At ``--fault-at`` of the stream the part is killed
with SIGKILL (the broker loses every topic, message and offset it held) and restarted
``--down`` s later. Then, per run, after the producers closed and the pipeline drained:

* records: stored (run, step) rows against those the producer wrote — exactly equal;
* duplicates: stored rows minus distinct (run, seq), warning events minus distinct keys;
* warnings: stored warning events against an undisturbed offline replay of the same records
  through the same detector code and config — none missed, none extra;
* recovery time: from the restart until the restarted part's backlog (messages written and not
  yet consumed by the detectors, or not yet durably stored by the sink) is back under two
  seconds of the fleet's output (for the broker: both parts, and every producer's spool
  drained); for the dashboard, until it answers its health check again;
* lag: the services' own consumer-lag gauges at the end.

``tests/test_reliability.py`` runs the same function on a smaller fleet and asserts on it.
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from foreshock.services import ServiceGroup, foreshock_command
from foreshock.storage.store import store_exists
from foreshock.transport.broker import EmbeddedBroker, free_port
from foreshock.transport.settings import KafkaSettings

from ._table import emit_json, format_table
from .fleet import scrape

__all__ = ["FAULTS", "Plan", "run_fault"]

FAULTS = ("none", "worker", "sink", "broker", "dashboard")
DEFAULT_RUNS = (
    "fa-lowprec-s0",
    "fa-lowprec-s1",
    "lr-high-s0",
    "lr-high-s1",
    "healthy-s0",
    "healthy-s1",
)


@dataclass
class Plan:
    runs: tuple[str, ...] = DEFAULT_RUNS
    rate: float = 3.0  # monitoring records per second per run
    fault_at: float = 0.4  # fraction of the stream's duration
    down: float = 3.0  # seconds the part stays dead
    drain: float = 120.0  # seconds to wait for the tail after the producers closed


class Producer(threading.Thread):
    """One run of the fleet: its recorded messages through its own KafkaSink, paced."""

    def __init__(self, settings: KafkaSettings, name: str, rate: float) -> None:
        from foreshock.lab.recorded import load_run, shipped_runs

        super().__init__(name=f"producer-{name}", daemon=True)
        self.recorded = load_run(next(p for p in shipped_runs() if p.name.startswith(name + ".")))
        self.settings, self.run_id, self.rate = settings, name, rate
        self.written = 0
        self.pending = -1

    def run(self) -> None:
        from foreshock.producers.kafka_sink import KafkaSink

        sink = KafkaSink(self.settings, probe_interval=0.5, name=self.run_id, confirm_group="sink")
        messages = [self.recorded.start, *self.recorded.records, self.recorded.end]
        started = time.monotonic()
        for i, message in enumerate(messages):
            time.sleep(max(0.0, started + i / self.rate - time.monotonic()))
            sink.write({**message, "run_id": self.run_id})
            self.written += 1
        sink.close(timeout=60)
        self.pending = sink.pending()


@dataclass
class Pipeline:
    """Broker, worker, sink and dashboard on 127.0.0.1, each one killable and restartable."""

    root: Path
    broker: EmbeddedBroker = field(init=False)
    settings: KafkaSettings = field(init=False)
    group: ServiceGroup = field(init=False)
    ports: dict[str, int] = field(default_factory=dict)

    def start(self) -> Pipeline:
        from foreshock.transport.topics import ensure_topics

        self.broker = EmbeddedBroker(log_path=self.root / "tansu.log").start()
        self.settings = KafkaSettings(
            bootstrap_servers=self.broker.bootstrap,
            partitions=3,
            spool_dir=str(self.root / "spool"),
        )
        ensure_topics(self.settings)
        env = {
            "FORESHOCK_KAFKA_BOOTSTRAP_SERVERS": self.settings.bootstrap_servers,
            "FORESHOCK_KAFKA_PARTITIONS": "3",
            "FORESHOCK_KAFKA_SPOOL_DIR": str(self.root / "service-spool"),
        }
        self.group = ServiceGroup(env, self.root / "logs")
        self.ports = {"worker": free_port(), "sink": free_port(), "dashboard": free_port()}
        for part in ("worker", "sink", "dashboard"):
            self.start_part(part)
        return self

    @property
    def store(self) -> Path:
        return self.root / "history"

    def command(self, part: str) -> list[str]:
        port = str(self.ports[part])
        if part == "worker":
            return foreshock_command("detect", "--group", "detectors", "--metrics-port", port)
        if part == "sink":
            return foreshock_command(
                "sink", "--store", str(self.store), "--group", "sink", "--metrics-port", port
            )
        return foreshock_command("dashboard", "--store", str(self.store), "--port", port)

    def start_part(self, part: str) -> None:
        if part == "broker":
            self.broker.start()
        else:
            self.group.start(part, self.command(part))

    def kill(self, part: str) -> None:
        """SIGKILL: no clean shutdown, no last commit, nothing flushed."""
        if part == "broker":
            self.broker.kill()
            return
        process = self.group.processes[part]
        signal_group(process.pid, signal.SIGKILL)
        process.wait(10)

    def stop(self) -> None:
        self.group.stop()
        self.broker.stop()


def signal_group(pid: int, sig: int) -> None:
    import contextlib
    import os

    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, sig)


def _scrape(port: int) -> tuple[float, float]:
    """(messages consumed, consumer lag) from the service on ``port``; NaN while it is down."""
    return scrape(f"http://127.0.0.1:{port}/metrics")


def _healthy(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/health", timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


def stored_counts(store: Path) -> dict[str, Any]:
    """Per run: stored step rows and distinct seqs; warning event keys and their row count."""
    from foreshock.storage.reader import open_history

    if not store_exists(str(store)):
        return {"steps": {}, "distinct": {}, "events": [], "event_rows": 0, "messages": 0}
    with open_history(store) as history:
        steps = history.sql(
            "SELECT run_id, count(*) AS n, count(DISTINCT seq) AS d FROM steps GROUP BY run_id"
        ).to_pylist()
        events = history.sql("SELECT id, event, divergence_step, cleared_step FROM warnings")
        lifecycle = history.sql("SELECT count(*) AS n FROM run_events").to_pylist()[0]["n"]
    rows = [tuple(r.values()) for r in events.to_pylist()]
    return {
        "steps": {r["run_id"]: r["n"] for r in steps},
        "distinct": {r["run_id"]: r["d"] for r in steps},
        "events": rows,
        "event_rows": len(rows),
        "messages": sum(r["n"] for r in steps) + lifecycle,
    }


def expected_events(names: tuple[str, ...]) -> set[tuple]:
    """The warning events an undisturbed pipeline gives: the offline replay, same config."""
    from foreshock.detectors.commands import default_config
    from foreshock.detectors.replay import replay_run
    from foreshock.lab.recorded import load_run, shipped_runs

    config, out = default_config(), set()
    for name in names:
        run = load_run(next(p for p in shipped_runs() if p.name.startswith(name + ".")))
        run.start["run_id"] = name
        for e in replay_run(run, config).events:
            out.add((e.id, e.event, e.divergence_step, e.cleared_step))
    return out


class Watch(threading.Thread):
    """Every 0.5 s: each part's backlog against what the producers have written."""

    def __init__(self, pipeline: Pipeline, producers: list[Producer]) -> None:
        super().__init__(daemon=True)
        self.pipeline, self.producers = pipeline, producers
        self.samples: list[dict[str, float]] = []
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.wait(0.5):
            written = sum(p.written for p in self.producers)
            consumed, lag_w = _scrape(self.pipeline.ports["worker"])
            _, lag_s = _scrape(self.pipeline.ports["sink"])
            stored = stored_counts(self.pipeline.store)["messages"]
            self.samples.append(
                {
                    "t": time.monotonic(),
                    "worker": written - consumed,
                    "sink": written - stored,
                    "lag_worker": lag_w,
                    "lag_sink": lag_s,
                }
            )

    def recovered_at(self, since: float, parts: tuple[str, ...], within: float) -> float | None:
        """The first sample after ``since`` where every part's backlog is below ``within``."""
        for s in self.samples:
            if s["t"] > since and all(s[p] <= within for p in parts):
                return s["t"]
        return None


def run_fault(fault: str, plan: Plan, root: Path) -> dict[str, Any]:
    """One fault under a live fleet; see the module docstring for the figures."""
    if fault not in FAULTS:
        raise ValueError(f"unknown fault {fault!r}; choose from {FAULTS}")
    pipeline = Pipeline(root).start()
    try:
        time.sleep(6)  # group joins: Tansu holds a JoinGroup for half the session timeout
        producers = [Producer(pipeline.settings, name, plan.rate) for name in plan.runs]
        watch = Watch(pipeline, producers)
        watch.start()
        for producer in producers:
            producer.start()
        longest = max(len(p.recorded.records) + 2 for p in producers) / plan.rate
        time.sleep(plan.fault_at * longest)
        restarted = killed = None
        if fault != "none":
            killed = time.monotonic()
            pipeline.kill("broker" if fault == "broker" else fault)
            time.sleep(plan.down)
            restarted = time.monotonic()
            pipeline.start_part("broker" if fault == "broker" else fault)
        recovery = _recovery(fault, pipeline, watch, restarted, plan)
        for producer in producers:
            producer.join(plan.drain)
        closed = time.monotonic()
        drained = _drain(watch, plan.drain)
        lag_end = _lag_end(pipeline)
        watch.stop.set()
        watch.join(5)
        failed = pipeline.group.failed()
    finally:
        pipeline.stop()
    return _verdict(
        fault,
        plan,
        producers,
        pipeline,
        {
            "killed_s": None if killed is None else round(killed - watch.samples[0]["t"], 1),
            "recovery_s": recovery,
            "drain_s": None if drained is None else round(drained - closed, 1),
            "lag_end": lag_end,
            "services_failed": failed,
        },
    )


def _recovery(
    fault: str, pipeline: Pipeline, watch: Watch, restarted: float | None, plan: Plan
) -> float | None:
    """Seconds from the restart until the part caught up (see the module docstring)."""
    if restarted is None:
        return None
    deadline = restarted + 120
    if fault == "dashboard":
        while time.monotonic() < deadline:
            if _healthy(pipeline.ports["dashboard"]):
                return round(time.monotonic() - restarted, 2)
            time.sleep(0.1)
        return None
    parts = {"worker": ("worker",), "sink": ("sink",), "broker": ("worker", "sink")}[fault]
    within = max(3.0, 2 * plan.rate * len(plan.runs))
    while time.monotonic() < deadline:
        at = watch.recovered_at(restarted, parts, within)
        if at is not None:
            return round(at - restarted, 1)
        time.sleep(0.5)
    return None


def _drain(watch: Watch, timeout: float) -> float | None:
    """When the store and the detectors had every message the producers wrote."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        last = watch.samples[-1] if watch.samples else None
        if last and last["worker"] <= 0 and last["sink"] <= 0:
            time.sleep(3)  # the warnings of the last records
            return last["t"]
        time.sleep(0.5)
    return None


def _lag_end(pipeline: Pipeline, timeout: float = 15.0) -> dict[str, float]:
    """The services' own lag gauges (refreshed every 5 s) once they read 0, or at timeout."""
    deadline = time.monotonic() + timeout
    while True:
        lag = {p: _scrape(pipeline.ports[p])[1] for p in ("worker", "sink")}
        if all(v == 0 for v in lag.values()) or time.monotonic() > deadline:
            return lag
        time.sleep(1)


def kept_unstored(spool_dir: Path, store: Path) -> int:
    """Messages the producers kept in their spools (unconfirmed when they closed) that the
    store does not hold: what a later ``foreshock spool flush`` would still have to deliver."""
    from foreshock.producers.spool import orphaned_spools
    from foreshock.storage.reader import open_history

    kept = set()
    for spool in orphaned_spools(spool_dir):
        batch, _ = spool.read_batch(10**9)
        spool.close(delete_if_empty=False)
        for item in batch:
            message = json.loads(item.value)
            kept.add((message["run_id"], message.get("rank", 0), message["seq"]))
    if not kept:
        return 0
    with open_history(store) as history:
        rows = history.sql(
            "SELECT run_id, rank, seq FROM steps UNION ALL SELECT run_id, rank, seq FROM run_events"
        ).to_pylist()
    return len(kept - {(r["run_id"], r["rank"], r["seq"]) for r in rows})


def _verdict(
    fault: str, plan: Plan, producers: list[Producer], pipeline: Pipeline, timing: dict[str, Any]
) -> dict[str, Any]:
    store = pipeline.store
    stored = stored_counts(store)
    produced = {p.run_id: p.written - 2 for p in producers}  # minus start and end
    expected = expected_events(plan.runs)
    got = set(stored["events"])
    return {
        "fault": fault,
        **timing,
        "records_produced": sum(produced.values()),
        "records_stored": sum(stored["steps"].values()),
        "runs_exact": sum(stored["steps"].get(r, 0) == n for r, n in produced.items()),
        "runs": len(produced),
        "record_mismatch": {
            r: [n, stored["steps"].get(r, 0)]
            for r, n in produced.items()
            if stored["steps"].get(r, 0) != n
        },
        "duplicate_records": sum(stored["steps"].values()) - sum(stored["distinct"].values()),
        "warning_events_expected": len(expected),
        "warning_events_stored": len(got),
        "duplicate_warning_events": stored["event_rows"] - len(got),
        "missed_warning_events": sorted(expected - got),
        "extra_warning_events": sorted(got - expected),
        "producer_pending_bytes": sum(max(p.pending, 0) for p in producers),
        "producer_kept_unstored": kept_unstored(Path(pipeline.settings.spool_dir), store),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="4 runs, faults worker and broker")
    parser.add_argument("--faults", default=",".join(FAULTS))
    parser.add_argument("--runs", default=",".join(DEFAULT_RUNS))
    parser.add_argument("--rate", type=float, default=3.0, help="records/s per run")
    parser.add_argument("--down", type=float, default=3.0, help="s a killed part stays down")
    args = parser.parse_args()
    logging.getLogger("foreshock.rdkafka").setLevel(logging.CRITICAL)  # refused reconnects
    if args.quick:
        args.faults, args.runs = "worker,broker", ",".join(DEFAULT_RUNS[::2][:3])
    plan = Plan(runs=tuple(args.runs.split(",")), rate=args.rate, down=args.down)
    results = []
    for fault in args.faults.split(","):
        with tempfile.TemporaryDirectory(prefix=f"foreshock-reliability-{fault}-") as tmp:
            results.append(run_fault(fault, plan, Path(tmp)))
        print(json.dumps(results[-1]), flush=True)
    rows = [
        [
            r["fault"],
            r["killed_s"],
            r["recovery_s"],
            r["drain_s"],
            f"{r['records_stored']}/{r['records_produced']}",
            f"{r['runs_exact']}/{r['runs']}",
            r["duplicate_records"],
            f"{r['warning_events_stored']}/{r['warning_events_expected']}",
            len(r["missed_warning_events"]),
            len(r["extra_warning_events"]),
            r["duplicate_warning_events"],
            r["lag_end"]["worker"],
            r["lag_end"]["sink"],
            f"{r['producer_pending_bytes']} B / {r['producer_kept_unstored']}",
        ]
        for r in results
    ]
    print(
        format_table(
            [
                "fault",
                "killed at s",
                "recovery s",
                "drain s",
                "records stored",
                "runs exact",
                "dup records",
                "warning events",
                "missed",
                "extra",
                "dup warnings",
                "end lag: worker",
                "end lag: sink",
                "kept by producers / of it unstored",
            ],
            rows,
        )
    )
    emit_json(
        {"runs": len(plan.runs), "rate_per_run": plan.rate, "down_s": plan.down, "faults": results}
    )


if __name__ == "__main__":
    main()
