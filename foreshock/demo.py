"""``foreshock demo``: the whole system on one machine, watching a fleet fail.

1. Start the embedded broker (Tansu) on a free port, the storage sink, ``--workers`` detector
   workers and the dashboard (its URL is printed at once).
2. Start ``--live`` real lab runs (``foreshock lab run --kafka``: a fault injected into the
   training computation, the loss really diverging) and replay ``--replayed`` recorded lab
   runs through a Kafka sink at ``--speed`` × their recorded pace, starts spread over the
   first third of ``--duration``.
3. Every few seconds print progress: runs, records stored, warnings, divergences.
4. When every run has ended and is stored (or ``--duration`` is up), print the lead-time
   table — first mechanism warning vs loss divergence, per run and per scenario — and stop
   everything it started (also on Ctrl-C). The history stays in ``--store`` for
   ``foreshock dashboard --store``.
"""

from __future__ import annotations

import heapq
import random
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from foreshock.services import ServiceGroup, foreshock_command
from foreshock.table import format_table

__all__ = ["DemoConfig", "run_demo"]

LIVE = [("fa-lowprec", 0), ("lr-high", 9), ("healthy", 0), ("fa-lowprec", 13)]


@dataclass(frozen=True)
class DemoConfig:
    live: int = 2  # real lab runs trained now (torch; one CPU core each)
    replayed: int = 40  # recorded runs replayed through Kafka
    speed: float = 8.0  # replay pace × the recorded one
    duration: float = 480.0  # seconds before the demo stops regardless
    workers: int = 1
    port: int = 8501
    store: Path | None = None
    progress_every: float = 5.0


class Replayer(threading.Thread):
    """Writes recorded runs to one KafkaSink, each record at its (accelerated) time."""

    def __init__(self, sink: Any, runs: list[tuple[str, Any]], speed: float, spread: float):
        super().__init__(name="foreshock-demo-replay", daemon=True)
        self.sink, self.done, self.written = sink, threading.Event(), 0
        self.stop_event = threading.Event()
        rng, now = random.Random(0), time.monotonic()
        self._heap: list[tuple[float, int, int]] = []
        self._runs = runs
        for i in range(len(runs)):
            heapq.heappush(self._heap, (now + rng.uniform(0, spread), i, -1))
        self._interval = [_record_interval(run) / speed for _, run in runs]

    def run(self) -> None:
        while self._heap and not self.stop_event.is_set():
            due, i, j = heapq.heappop(self._heap)
            self.stop_event.wait(max(0.0, due - time.monotonic()))
            run_id, run = self._runs[i]
            if j == -1:
                self.sink.write(
                    {
                        **run.start,
                        "run_id": run_id,
                        "labels": {
                            **run.start.get("labels", {}),
                            "project": "demo",
                            "source": "replayed",
                        },
                    }
                )
            elif j < len(run.records):
                self.sink.write({**run.records[j], "run_id": run_id, "time": time.time()})
            else:
                self.sink.write(
                    {**(run.end or {"status": "finished"}), "kind": "end", "run_id": run_id}
                )
                continue
            self.written += 1
            heapq.heappush(self._heap, (due + self._interval[i], i, j + 1))
        self.done.set()


def _record_interval(run: Any) -> float:
    times = [r["time"] for r in run.records if "time" in r]
    return (times[-1] - times[0]) / max(1, len(times) - 1) if len(times) > 1 else 2.5


def _replay_plan(count: int, tag: str) -> list[tuple[str, Any]]:
    from foreshock.lab.recorded import load_run, shipped_runs

    paths = shipped_runs()
    order = random.Random(0).sample(paths, len(paths))  # a spread of scenarios and seeds
    plan = []
    for i in range(count):
        path, copy = order[i % len(order)], i // len(order)
        suffix = f"-c{copy}" if copy else ""  # every replayed run gets a run id of its own
        plan.append((f"replay-{path.name.split('.')[0]}-{tag}{suffix}", load_run(path)))
    return plan


def _progress(store: Path) -> dict[str, Any]:
    from foreshock.storage import queries
    from foreshock.storage.reader import open_history
    from foreshock.storage.store import store_exists

    if not store_exists(str(store)):
        return {"runs": 0, "ended": 0, "records": 0, "warned": 0, "diverged": 0}
    with open_history(store) as history:
        rows = queries.fleet(history)
    return {
        "runs": len(rows),
        "ended": sum(r["lifecycle"] != "running" for r in rows),
        "records": sum(r["records"] for r in rows),
        "warned": sum(r["first_warning_step"] is not None for r in rows),
        "diverged": sum(r["divergence_step"] is not None for r in rows),
    }


def _start_services(group: ServiceGroup, store: Path, config: DemoConfig) -> None:
    group.start("sink", foreshock_command("sink", "--store", str(store)))
    for i in range(config.workers):
        group.start(f"detect-{i}", foreshock_command("detect"))
    group.start(
        "dashboard",
        foreshock_command("dashboard", "--store", str(store), "--port", str(config.port)),
    )


def _start_live(group: ServiceGroup, config: DemoConfig, bootstrap: str, tag: str) -> None:
    for scenario, seed in LIVE[: config.live]:
        group.start(
            f"live-{scenario}-s{seed}",
            foreshock_command(
                "lab",
                "run",
                "--scenario",
                scenario,
                "--seed",
                str(seed),
                "--quiet",
                "--run-id",
                f"live-{scenario}-s{seed}-{tag}",
                "--project",
                "demo",
                "--kafka",
                bootstrap,
            ),
        )


def _interrupt(*_: object) -> None:
    raise KeyboardInterrupt


def run_demo(config: DemoConfig) -> int:
    """Steps 1–4 above. SIGINT (Ctrl-C) and SIGTERM both end it the same clean way, even
    where the caller started it with SIGINT ignored (a background job of a script)."""
    import signal

    from foreshock.producers.kafka_sink import KafkaSink
    from foreshock.transport.broker import EmbeddedBroker
    from foreshock.transport.settings import load_settings
    from foreshock.transport.topics import ensure_topics

    signal.signal(signal.SIGINT, _interrupt)
    signal.signal(signal.SIGTERM, _interrupt)
    tag = time.strftime("%H%M%S")
    store = config.store or Path("foreshock-demo") / time.strftime("%Y%m%d-%H%M%S")
    store = store.resolve()
    t0 = time.monotonic()
    with EmbeddedBroker() as broker:
        env = {
            "FORESHOCK_KAFKA_BOOTSTRAP_SERVERS": broker.bootstrap,
            "FORESHOCK_KAFKA_SPOOL_DIR": str(store.parent / f".spool-{store.name}"),
        }
        settings = load_settings(env=env)
        ensure_topics(settings)
        with ServiceGroup(env, store.parent / f"logs-{store.name}") as group:
            _start_services(group, store, config)
            print(
                f"foreshock demo: dashboard at http://127.0.0.1:{config.port}  "
                f"(history: {store}; logs: {group.log_dir})",
                flush=True,
            )
            _start_live(group, config, broker.bootstrap, tag)
            sink = KafkaSink(settings, name=f"demo-{tag}")
            replayer = Replayer(
                sink, _replay_plan(config.replayed, tag), config.speed, spread=config.duration / 3
            )
            replayer.start()
            try:
                _watch(group, replayer, store, config, t0)
            except KeyboardInterrupt:
                print("\nforeshock demo: interrupted; stopping everything", flush=True)
            finally:
                replayer.stop_event.set()
                sink.close(timeout=10)
            _print_leads(store)
            failed = group.failed()
    print(
        f"foreshock demo: stopped everything after {time.monotonic() - t0:.0f} s. "
        f"Browse the history again: foreshock dashboard --store {store}",
        flush=True,
    )
    if failed:
        print(f"foreshock demo: services that failed: {failed} (see the logs)", flush=True)
    return 1 if failed else 0


def _watch(
    group: ServiceGroup, replayer: Replayer, store: Path, config: DemoConfig, t0: float
) -> None:
    """Print progress until every run has ended and is stored, or the duration is up."""
    expected = config.replayed + config.live
    settled_since = None
    while time.monotonic() - t0 < config.duration:
        time.sleep(config.progress_every)
        p = _progress(store)
        live = len(group.running("live-"))
        print(
            f"[{time.monotonic() - t0:5.0f} s] runs {p['runs']}/{expected} "
            f"(ended {p['ended']}, live training {live}) · records stored {p['records']:,} · "
            f"runs warned {p['warned']} · diverged {p['diverged']}",
            flush=True,
        )
        finished = replayer.done.is_set() and live == 0 and p["ended"] >= expected
        settled_since = (settled_since or time.monotonic()) if finished else None
        if settled_since and time.monotonic() - settled_since >= 2 * config.progress_every:
            return  # the detectors have had time to send their last warnings
        if group.failed():
            print(f"foreshock demo: a service failed: {group.failed()}", flush=True)
            return
    print("foreshock demo: duration reached", flush=True)


def _print_leads(store: Path) -> None:
    from foreshock.storage import queries
    from foreshock.storage.commands import lead_report
    from foreshock.storage.reader import open_history
    from foreshock.storage.store import store_exists

    if not store_exists(str(store)):
        print("foreshock demo: nothing was stored")
        return
    with open_history(store) as history:
        rows = queries.lead_table(history)
    cols = [
        "mechanism_step",
        "first_mechanism",
        "symptom_step",
        "divergence_step",
        "mechanism_lead",
        "symptom_lead",
    ]
    print("\nLead time per run (steps; lead = divergence − first warning before it):")
    header = [
        "run",
        "scenario",
        "first mechanism warning",
        "family:role",
        "first symptom warning",
        "divergence",
        "lead: mechanism",
        "lead: symptom",
    ]
    print(format_table(header, [[r["run_id"], r["scenario"], *(r[c] for c in cols)] for r in rows]))
    summary = lead_report(rows)
    print("\nPer scenario (medians):")
    print(
        format_table(
            ["scenario", "runs", "diverged", "lead: mechanism", "lead: symptom"],
            [
                [s, v["runs"], v["diverged"], v["mechanism_lead"], v["symptom_lead"]]
                for s, v in summary.items()
            ],
        )
    )
