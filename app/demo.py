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

import random
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
    recorded_interval,
)
from foreshock.app.services import ServiceGroup, foreshock_command
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


def _replays(plan: list[tuple[str, Any]], speed: float, spread: float) -> list[Replay]:
    """The plan's runs at ``speed`` × their recorded pace, stamped now and labelled as the
    demo's replayed runs, their starts spread at random (the same spread every time) over
    ``spread`` s."""
    rng = random.Random(0)
    return [
        Replay(
            run,
            run_id,
            interval=recorded_interval(run) / speed,
            offset=rng.uniform(0, spread),
            labels={"project": "demo", "source": "replayed"},
            restamp=True,
        )
        for run_id, run in plan
    ]


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

    from foreshock.delivery.kafka_sink import KafkaSink
    from foreshock.transport.broker import EmbeddedBroker
    from foreshock.transport.settings import KafkaSettings

    signal.signal(signal.SIGINT, _interrupt)
    signal.signal(signal.SIGTERM, _interrupt)
    tag = time.strftime("%H%M%S")
    store = config.store or Path("foreshock-demo") / time.strftime("%Y%m%d-%H%M%S")
    store = store.resolve()
    t0 = time.monotonic()
    pipeline = Pipeline(
        KafkaSettings(spool_dir=str(store.parent / f".spool-{store.name}")),
        store=store,
        log_dir=store.parent / f"logs-{store.name}",
        parts={"sink": SINK}
        | {f"detect-{i}": DETECT for i in range(config.workers)}
        | {"dashboard": DASHBOARD},
        metrics=False,
        ports={"dashboard": config.port},
        broker=EmbeddedBroker(),
    )
    with pipeline.start():
        print(
            f"foreshock demo: dashboard at {pipeline.url()}  "
            f"(history: {store}; logs: {pipeline.log_dir})",
            flush=True,
        )
        _start_live(pipeline.group, config, pipeline.settings.bootstrap_servers, tag)
        sink = KafkaSink(pipeline.settings, name=f"demo-{tag}")
        plan = _replay_plan(config.replayed, tag)
        replayer = Replayer(sink, _replays(plan, config.speed, spread=config.duration / 3))
        replayer.start()
        try:
            _watch(pipeline.group, replayer, store, config, t0)
        except KeyboardInterrupt:
            print("\nforeshock demo: interrupted; stopping everything", flush=True)
        finally:
            replayer.stop_event.set()
            sink.close(timeout=10)
        _print_leads(store)
        failed = pipeline.group.failed()
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
