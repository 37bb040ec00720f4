"""Faults survived: kill and restart each part of the pipeline under a live fleet; count losses.

For one fault (:data:`FAULTS`: ``none`` as the control, then ``worker``, ``sink``, ``broker``
and ``dashboard``) a fresh :class:`~foreshock.app.harness.Pipeline` runs on 127.0.0.1:
the embedded Tansu, one ``foreshock detect`` worker, one ``foreshock sink`` and ``foreshock
dashboard``, each its own process. A fleet of recorded lab runs (``Plan.runs``) streams
through it, each run from its own producer (a
:class:`~foreshock.delivery.kafka_sink.KafkaSink`, as in a trainer) writing one monitoring
record every ``1 / Plan.rate`` s. At ``Plan.fault_at`` of the stream the part is killed with
SIGKILL (the broker loses every topic, message and offset it held) and restarted
``Plan.down`` s later. Then, per run, after the producers closed and the pipeline drained:

* records: stored (run, step) rows against those the producer wrote — exactly equal;
* duplicates: stored rows minus distinct (run, seq), warning events minus distinct keys;
* warnings: stored warning events against an undisturbed offline replay of the same records
  through the same detector code and config — none missed, none extra;
* recovery time: from the restart until the restarted part's backlog (messages written and not
  yet consumed by the detectors, or not yet durably stored by the sink) is back under two
  seconds of the fleet's output (for the broker: both parts, and every producer's spool
  drained); for the dashboard, until it answers its health check again;
* lag: the services' own consumer-lag gauges at the end.

Here, beside the benchmarks, because two callers need the same experiment: ``python -m
benchmarks.reliability`` (every fault, the table for docs/reliability.md) and
``tests/test_reliability.py`` (a smaller fleet, asserted on).
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from foreshock.app.harness import (
    DASHBOARD,
    DETECT,
    SINK,
    Pipeline,
    Replay,
    Replayer,
    recorded_run,
    scrape,
    stored_totals,
    wait_healthy,
)
from foreshock.storage.store import store_exists
from foreshock.transport.broker import EmbeddedBroker
from foreshock.transport.settings import KafkaSettings

__all__ = ["DEFAULT_RUNS", "FAULTS", "Plan", "expected_events", "kept_unstored", "run_fault"]

FAULTS = ("none", "worker", "sink", "broker", "dashboard")
# two seeds of each scenario: fa-lowprec-s0, fa-lowprec-s1, lr-high-s0, … healthy-s1
DEFAULT_RUNS = tuple(
    f"{s}-s{seed}" for s in ("fa-lowprec", "lr-high", "healthy") for seed in (0, 1)
)


@dataclass
class Plan:
    runs: tuple[str, ...] = DEFAULT_RUNS
    rate: float = 3.0  # monitoring records per second per run
    fault_at: float = 0.4  # fraction of the stream's duration
    down: float = 3.0  # seconds the part stays dead
    drain: float = 120.0  # seconds to wait for the tail after the producers closed


def fault_pipeline(root: Path) -> Pipeline:
    """Broker, worker, sink and dashboard, each killable and restartable (by the fault's
    name: ``broker``, ``worker``, ``sink``, ``dashboard``). The producers spool to
    ``root/spool``, the services to ``root/service-spool``: what the producers kept is then
    theirs alone (see :func:`kept_unstored`)."""
    return Pipeline(
        KafkaSettings(partitions=3, spool_dir=str(root / "spool")),
        store=root / "history",
        log_dir=root / "logs",
        parts={"worker": DETECT, "sink": SINK, "dashboard": DASHBOARD},
        groups={SINK: "sink", DETECT: "detectors"},
        env={"FORESHOCK_KAFKA_SPOOL_DIR": str(root / "service-spool")},
        broker=EmbeddedBroker(log_path=root / "tansu.log"),
    ).start()


def _producer(settings: KafkaSettings, name: str, rate: float) -> Replayer:
    """One run of the fleet as one trainer: its recorded messages through its own KafkaSink,
    one every ``1 / rate`` s; the sink confirms against the pipeline's sink group."""
    from foreshock.delivery.kafka_sink import KafkaSink

    sink = KafkaSink(settings, probe_interval=0.5, name=name, confirm_group="sink")
    replay = Replay(recorded_run(name), name, interval=1 / rate)
    return Replayer(sink, [replay], close_timeout=60, name=f"producer-{name}")


def stored_counts(store: Path) -> dict[str, Any]:
    """Per run: stored step rows and distinct seqs; warning event keys and their row count."""
    from foreshock.storage.reader import open_history

    if not store_exists(str(store)):
        return {"steps": {}, "distinct": {}, "events": [], "event_rows": 0}
    with open_history(store) as history:
        steps = history.sql(
            "SELECT run_id, count(*) AS n, count(DISTINCT seq) AS d FROM steps GROUP BY run_id"
        ).to_pylist()
        events = history.sql("SELECT id, event, divergence_step, cleared_step FROM warnings")
    rows = [tuple(r.values()) for r in events.to_pylist()]
    return {
        "steps": {r["run_id"]: r["n"] for r in steps},
        "distinct": {r["run_id"]: r["d"] for r in steps},
        "events": rows,
        "event_rows": len(rows),
    }


def expected_events(names: tuple[str, ...]) -> set[tuple]:
    """The warning events an undisturbed pipeline gives: the offline replay, same config."""
    from foreshock.detectors.replay import replay_run
    from foreshock.operate.detect_commands import default_config

    config, out = default_config(), set()
    for name in names:
        run = recorded_run(name)
        run.start["run_id"] = name
        for e in replay_run(run, config).events:
            out.add((e.id, e.event, e.divergence_step, e.cleared_step))
    return out


class Watch(threading.Thread):
    """Every 0.5 s: each part's backlog against what the producers have written."""

    def __init__(self, pipeline: Pipeline, producers: list[Replayer]) -> None:
        super().__init__(daemon=True)
        self.pipeline, self.producers = pipeline, producers
        self.samples: list[dict[str, float]] = []
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.wait(0.5):
            written = sum(p.written for p in self.producers)
            consumed, lag_w = scrape(self.pipeline.metrics_url("worker"))
            _, lag_s = scrape(self.pipeline.metrics_url("sink"))
            stored = stored_totals(self.pipeline.store)[0]
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
    pipeline = fault_pipeline(root)
    try:
        time.sleep(6)  # group joins: Tansu holds a JoinGroup for half the session timeout
        producers = [_producer(pipeline.settings, name, plan.rate) for name in plan.runs]
        watch = Watch(pipeline, producers)
        watch.start()
        for producer in producers:
            producer.start()
        longest = max(len(p.replays[0]) for p in producers) / plan.rate
        time.sleep(plan.fault_at * longest)
        restarted = killed = None
        if fault != "none":
            killed = time.monotonic()
            pipeline.kill(fault)
            time.sleep(plan.down)
            restarted = time.monotonic()
            pipeline.start_part(fault)
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
        if wait_healthy(pipeline.url(), deadline - time.monotonic(), poll=0.1):
            return round(time.monotonic() - restarted, 2)
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
        lag = {p: scrape(pipeline.metrics_url(p))[1] for p in ("worker", "sink")}
        if all(v == 0 for v in lag.values()) or time.monotonic() > deadline:
            return lag
        time.sleep(1)


def kept_unstored(spool_dir: Path, store: Path) -> int:
    """Messages the producers kept in their spools (unconfirmed when they closed) that the
    store does not hold: what a later ``foreshock spool flush`` would still have to deliver."""
    from foreshock.delivery.spool import orphaned_spools
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
    fault: str, plan: Plan, producers: list[Replayer], pipeline: Pipeline, timing: dict[str, Any]
) -> dict[str, Any]:
    store = pipeline.store
    stored = stored_counts(store)
    produced = {p.replays[0].run_id: p.written - 2 for p in producers}  # minus start and end
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
