"""Soak test: a steady fleet for minutes through the whole pipeline — is memory flat?

A bounded run, outside the test suite (``python -m benchmarks.soak``, 600 s; ``--quick``, 60 s).
On the embedded Tansu broker, as separate processes the way they run in production:

* a fleet of replayed runs (recorded lab runs, each its own run id) offered at ``--fraction``
  (default 0.5) of the measured saturation rate — ``sustained_values_per_s`` with one worker in
  ``benchmarks/results/fleet_saturation.json`` — or at ``--values-per-s``. ``--processes``
  producer processes (``KafkaSink`` each) keep N run slots busy, every run writing one record
  (~74 values) per ``1 / --rate`` s; a run lasts ``--run-seconds`` (the first generation is
  staggered), then it ends and a new run id takes its slot — as in a real fleet;
* one ``foreshock detect`` worker, one ``foreshock sink``, and ``foreshock dashboard`` on the
  sink's store. Every ``--page-every`` s the dashboard renders its fleet page and the run page
  over HTTP — Streamlit's agent API (``POST /_stcore/agent/interact``, turned on for this
  process with ``STREAMLIT_SERVER_ENABLE_AGENT_API``) runs the page scripts as a browser
  session would — and answers ``/_stcore/health``.

Every ``--sample-every`` s: the resident memory (VmRSS from ``/proc``, summed over each
service's process group, children included) of broker, detector, sink and dashboard (and the
producers, for information), and the consumer lag the detector and the sink report on their
``/metrics`` (as in ``benchmarks.fleet``), with the backlog beside it (messages written and
not yet consumed by the detector / stored by the sink).

Summary: RSS after the warm-up (one run lifetime, ``--run-seconds``: a run's detector state
grows until it ends, so the fleet's memory is steady only once the first runs have ended and
been replaced; 20 % of the duration when shorter than 300 s) vs at the end of the load,
growth as a fraction and a least-squares slope, flat = growth ≤ ``--flat`` (+20 %; reported,
not enforced); max lag, lag at the end of the load and after draining; lost
values (stored vs offered, exact, after draining); offered vs stored values/s.

Tansu's memory storage keeps every message (no retention), so the broker's RSS grows with the
data offered. The broker is recycled — restarted empty on its port, as ``foreshock broker
--max-memory-mb`` does — once its RSS passes ``--broker-max-mb`` (512; 0: never); its memory
counts as flat when it never passed 1.2 × that limit. Each recycle is a broker restart under
full load, so the lost-values count covers those too.
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing as mp
import os
import shutil
import signal
import tempfile
import threading
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from typing import Any

from foreshock.app.harness import (
    DASHBOARD,
    DETECT,
    SINK,
    Pipeline,
    finished,
    recorded_runs,
    renumbered,
    scoped,
    scrape,
    stored_totals,
    wait_healthy,
)
from foreshock.transport.settings import KafkaSettings

from ._table import emit_json, format_table, median
from .fleet import _finite_max

SATURATION = Path(__file__).parent / "results" / "fleet_saturation.json"
SERVICES = ("broker", "detector", "sink", "dashboard")
LAG_REFRESH_S = 6.0  # > the services' lag_interval (5 s): a lag gauge is up to that stale
SUBTICKS = 10  # a process writes its slots in SUBTICKS groups, spread over 1/rate s

_WRITTEN: Any = None  # a shared counter of messages written, set in each producer process


def _init_producer(counter: Any) -> None:
    global _WRITTEN
    _WRITTEN = counter
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent stops the pool on Ctrl-C


def _count(n: int) -> None:
    with _WRITTEN.get_lock():
        _WRITTEN.value += n


def _produce(args: tuple[list[int], int, dict, dict]) -> dict[str, Any]:
    """One producer process: keep its slots busy until the end of the load, then end them."""
    from foreshock.delivery.kafka_sink import KafkaSink

    slots, n_slots, settings_dict, opts = args
    settings = KafkaSettings(**settings_dict)
    runs = recorded_runs()
    sink = KafkaSink(settings, name=f"soak-{uuid.uuid4().hex[:6]}")
    sink.wait_delivered(30)
    t0, rate, run_s = opts["t0"], opts["rate"], opts["run_seconds"]
    stop_at = t0 + opts["duration"]
    token = opts["token"]
    state: dict[int, dict[str, Any]] = {}  # slot -> {run, id, n, ends}
    values = records = started = ended = 0

    def start(slot: int, gen: int, now: float) -> None:
        nonlocal started
        run = runs[(slot * 7 + gen) % len(runs)]
        run_id = f"soak-{token}-{slot}-{gen}"
        length = run_s * (slot + 1) / n_slots if gen == 0 else run_s  # staggered first ends
        state[slot] = {"run": run, "id": run_id, "gen": gen, "n": 0, "ends": now + length}
        sink.write({**run.start, "run_id": run_id, "time": time.time()})
        started += 1

    def end(slot: int) -> None:
        nonlocal ended
        sink.write(finished(state[slot]["id"]))
        ended += 1

    time.sleep(max(0.0, t0 - time.time()))
    for slot in slots:
        start(slot, 0, t0)
    _count(len(slots))
    tick = 0
    while True:
        due = t0 + tick / (rate * SUBTICKS)
        if due >= stop_at:
            break
        time.sleep(max(0.0, due - time.time()))
        written = 0
        for slot in slots:
            if slot % SUBTICKS != tick % SUBTICKS:
                continue
            s = state[slot]
            if due >= s["ends"]:
                end(slot)
                start(slot, s["gen"] + 1, due)
                written += 2
                s = state[slot]
            record = renumbered(s["run"], s["n"], s["id"], step=s["n"] * 25)
            sink.write(record)
            s["n"] += 1
            values += len(record["values"])
            records += 1
            written += 1
        _count(written)
        tick += 1
    for slot in slots:
        end(slot)
    _count(len(slots))
    sink.close(timeout=120)
    return {
        "values": values,
        "records": records,
        "runs_started": started,
        "runs_ended": ended,
        "pending": sink.pending(),
        "spooled": sink.spooled,
        "rejected": sink.rejected,
    }


# ---- measuring the services ------------------------------------------------------------------
def _vmrss_kb(pid: str) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0  # a zombie has no VmRSS


def _rss_mb(groups: dict[str, int], extra: dict[str, list[int]]) -> dict[str, float | None]:
    """MB resident per name: every process whose group id is ``groups[name]`` (the services run
    in their own sessions, so a wrapper's children count too), or the pids of ``extra``."""
    by_pgid = {pgid: name for name, pgid in groups.items()}
    by_pid = {pid: name for name, pids in extra.items() for pid in pids}
    kb: dict[str, int] = {name: 0 for name in [*groups, *extra]}
    seen: set[str] = set()
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat") as file:
                stat = file.read()
            pgid = int(stat[stat.rindex(")") + 2 :].split()[2])
            name = by_pgid.get(pgid) or by_pid.get(int(entry.name))
            if name is None:
                continue
            kb[name] += _vmrss_kb(entry.name)
            seen.add(name)
        except (OSError, ValueError, IndexError):
            continue  # gone meanwhile
    return {name: round(v / 1024, 1) if name in seen else None for name, v in kb.items()}


def _pipeline(urls: dict[str, str], written: Any, store: Path) -> dict[str, Any]:
    """Consumer lag (each service's own gauge) and backlog: messages written by the producers
    and not yet consumed by the detector, or not yet stored by the sink. The store and the
    services are read before the producers' counter, so a backlog is never understated."""
    stored_messages, stored_values = stored_totals(store)
    detector, sink = scrape(urls["detector"]), scrape(urls["sink"])
    n = written.value
    return {
        "detectors": {"lag": detector[1], "backlog": n - detector[0]},
        "sink": {"lag": sink[1], "backlog": n - stored_messages},
        "stored_values": stored_values,
    }


class PageProbe(threading.Thread):
    """Every ``every`` s: the dashboard's health endpoint, then its fleet page and the run page
    rendered through the agent API (two sessions kept open, like two open browser tabs)."""

    def __init__(self, url: str, every: float) -> None:
        super().__init__(daemon=True)
        self.url, self.every = url, every
        self.sessions: dict[str, str] = {}
        self.renders: dict[str, list[float]] = {"fleet": [], "run": []}
        self.failures: list[str] = []
        self.health_failures = 0
        self.stop = threading.Event()

    def _post(self, body: dict[str, Any], timeout: float = 120) -> dict[str, Any]:
        request = urllib.request.Request(
            f"{self.url}/_stcore/agent/interact",
            data=json.dumps(body).encode(),
            method="POST",
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=timeout) as reply:
            return json.loads(reply.read())

    def render(self, page: str) -> None:
        body: dict[str, Any] = {"page": page} if page != "fleet" else {}
        if page in self.sessions:
            body = {"session_id": self.sessions[page]}
        tick = time.perf_counter()
        try:
            reply = self._post(body)
        except urllib.error.HTTPError as exc:
            self.sessions.pop(page, None)  # unknown/expired session: a new one next time
            self.failures.append(f"{page}: HTTP {exc.code}")
            return
        except (OSError, ValueError) as exc:
            self.failures.append(f"{page}: {exc!r}"[:200])
            return
        self.sessions[page] = reply.get("session_id", "")
        if reply.get("status") not in ("ready", None):
            self.failures.append(f"{page}: status {reply.get('status')}")
        self.renders[page].append(time.perf_counter() - tick)

    def run(self) -> None:
        while True:  # at once (inside the warm-up: the first render loads the page modules)
            try:
                with urllib.request.urlopen(f"{self.url}/_stcore/health", timeout=10):
                    pass
            except OSError:
                self.health_failures += 1
            for page in ("fleet", "run"):
                self.render(page)
            if self.stop.wait(self.every):
                return


# ---- the run ---------------------------------------------------------------------------------
def saturation_rate() -> float:
    """Sustained values/s with one detector worker, from the stored fleet_saturation result."""
    try:
        cases = json.loads(SATURATION.read_text())["result"]["cases"]
        return float(next(c["sustained_values_per_s"] for c in cases if c["workers"] == 1))
    except (OSError, KeyError, StopIteration, ValueError):
        return 92_000.0  # the last measured figure (2-core machine)


def _mean_values_per_record() -> float:
    runs = recorded_runs()
    return sum(sum(len(r["values"]) for r in x.records) / len(x.records) for x in runs) / len(runs)


def _slope_per_min(points: list[tuple[float, float]]) -> float | None:
    if len(points) < 2:
        return None
    mt = sum(t for t, _ in points) / len(points)
    mv = sum(v for _, v in points) / len(points)
    var = sum((t - mt) ** 2 for t, _ in points)
    return None if var == 0 else 60 * sum((t - mt) * (v - mv) for t, v in points) / var


def soak(args: argparse.Namespace) -> dict[str, Any]:
    from foreshock.transport.broker import EmbeddedBroker

    saturation = saturation_rate()
    target = args.values_per_s or args.fraction * saturation
    per_record = _mean_values_per_record()
    n_slots = max(1, round(target / (args.rate * per_record)))
    warmup = (
        args.warmup
        if args.warmup is not None
        else (args.run_seconds if args.duration >= 300 else 0.2 * args.duration)
    )
    print(
        f"soak: {args.duration:.0f} s at {target:,.0f} values/s offered "
        f"({target / saturation:.0%} of the saturation rate {saturation:,.0f}): {n_slots} "
        f"concurrent runs × {args.rate:g} records/s × ~{per_record:.0f} values, each run "
        f"{args.run_seconds:.0f} s; warm-up {warmup:.0f} s",
        flush=True,
    )
    root = Path(tempfile.mkdtemp(prefix="foreshock-soak-"))
    store = root / "history"
    name = f"soak-{uuid.uuid4().hex[:4]}"
    broker = EmbeddedBroker(log_path=root / "broker.log", max_memory_mb=args.broker_max_mb or None)
    pipeline = Pipeline(
        scoped(KafkaSettings(partitions=6), name, spool_dir=str(root / "spool")),
        store=store,
        log_dir=root / "logs",
        parts={"sink": SINK, "detector": DETECT, "dashboard": DASHBOARD},
        groups={SINK: f"{name}-sink", DETECT: f"{name}-det"},
        env={"STREAMLIT_SERVER_ENABLE_AGENT_API": "true"},
        broker=broker,
        recreate_topics=True,  # a recycled broker comes up empty
    )
    samples: list[dict[str, Any]] = []
    try:
        with pipeline.start():
            settings, group = pipeline.settings, pipeline.group
            urls = {k: pipeline.metrics_url(k) for k in ("detector", "sink")}
            groups = {"broker": broker.process.pid}
            groups |= {k: p.pid for k, p in group.processes.items()}
            dash_url = pipeline.url()
            if not wait_healthy(dash_url, 90):
                raise RuntimeError(f"the dashboard did not start; log in {root / 'logs'}")
            time.sleep(8)  # consumer group joins (Tansu holds a JoinGroup for a while)
            probe = PageProbe(dash_url, args.page_every)
            context = mp.get_context("spawn")
            written = context.Value("q", 0)
            procs = max(1, min(args.processes, n_slots))
            chunks = [list(range(k, n_slots, procs)) for k in range(procs)]
            settings_dict = {**settings.__dict__}
            t0 = time.time() + 5  # the producers load the recorded runs meanwhile
            opts = {
                "t0": t0,
                "rate": args.rate,
                "duration": args.duration,
                "run_seconds": args.run_seconds,
                "token": uuid.uuid4().hex[:4],
            }
            with context.Pool(procs, initializer=_init_producer, initargs=(written,)) as pool:
                producer_pids = [p.pid for p in mp.active_children()]
                pending = pool.map_async(
                    _produce, [(c, n_slots, settings_dict, opts) for c in chunks]
                )

                def sample(phase: str) -> dict[str, Any]:
                    groups["broker"] = broker.process.pid
                    row = {
                        "t": round(time.time() - t0, 1),
                        "phase": phase,
                        "rss_mb": _rss_mb(groups, {"producers": producer_pids}),
                        **_pipeline(urls, written, store),
                        "failed": group.failed(),
                    }
                    samples.append(row)
                    return row

                time.sleep(max(0.0, t0 - time.time()))
                probe.start()
                next_sample = t0
                while not pending.ready():
                    if broker.recycle_if_over():
                        print(f"broker recycled ({broker.recycles})", flush=True)
                    if time.time() >= next_sample:
                        row = sample("load")
                        next_sample += args.sample_every
                        print(_progress(row), flush=True)
                    pending.wait(min(1.0, max(0.05, next_sample - time.time())))
                produced = pending.get()
            produce_s = time.time() - t0
            sample("stopped")
            deadline = time.monotonic() + args.drain
            while time.monotonic() < deadline:  # until stored and seen by the detector
                last = _pipeline(urls, written, store)
                if last["sink"]["backlog"] <= 0 and last["detectors"]["backlog"] <= 0:
                    break
                time.sleep(2)
            total_s = time.time() - t0
            probe.stop.set()
            probe.join(150)
            time.sleep(LAG_REFRESH_S)  # the services refresh their lag gauges this often
            final = sample("drained")
            logs = root / "logs"
            tail = {n: _tail(logs / f"{n}.log") for n in final["failed"]}
    finally:
        pipeline.stop()
        if args.keep:
            print(f"kept {root}", flush=True)
        else:
            shutil.rmtree(root, ignore_errors=True)
    return _summary(
        args,
        samples,
        produced,
        probe,
        {
            "saturation_values_per_s": saturation,
            "target_values_per_s": round(target),
            "values_per_record": round(per_record, 1),
            "concurrent_runs": n_slots,
            "warmup_s": warmup,
            "produce_s": produce_s,
            "total_s": total_s,
            "failed_services": final["failed"],
            "failed_logs": tail,
            "broker_max_mb": args.broker_max_mb or None,
            "broker_recycles": broker.recycles,
        },
    )


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def _progress(row: dict[str, Any]) -> str:
    rss = ", ".join(f"{k} {v:.0f}" for k, v in row["rss_mb"].items() if v is not None)
    return (
        f"t={row['t']:6.1f} s  RSS MB: {rss}  lag det {row['detectors']['lag']:.0f} "
        f"sink {row['sink']['lag']:.0f}  stored {row['stored_values']:,} values"
    )


def _summary(
    args: argparse.Namespace,
    samples: list[dict[str, Any]],
    produced: list[dict],
    probe: PageProbe,
    info: dict[str, Any],
) -> dict[str, Any]:
    warmup = info["warmup_s"]
    load = [s for s in samples if s["phase"] == "load"]
    steady = [s for s in load if s["t"] >= warmup] or load[-1:]
    first, last = steady[0], load[-1]
    memory = {}
    for service in (*SERVICES, "producers"):
        start, end = first["rss_mb"].get(service), last["rss_mb"].get(service)
        growth = end / start - 1 if start and end is not None else None
        points = [
            (s["t"], s["rss_mb"][service]) for s in steady if s["rss_mb"].get(service) is not None
        ]
        slope = _slope_per_min(points)
        memory[service] = {
            "rss_start_mb": start,
            "rss_end_mb": end,
            "rss_max_mb": _finite_max(
                [s["rss_mb"][service] for s in load if s["rss_mb"].get(service) is not None]
            ),
            "growth": None if growth is None else round(growth, 4),
            "slope_mb_per_min": None if slope is None else round(slope, 2),
            "flat": None if growth is None or service == "producers" else growth <= args.flat,
        }
    limit = info.get("broker_max_mb")
    if limit and memory["broker"]["rss_max_mb"] is not None:
        memory["broker"]["flat"] = memory["broker"]["rss_max_mb"] <= 1.2 * limit
    offered = sum(p["values"] for p in produced)
    stored = samples[-1]["stored_values"]
    lag = {}
    for key, service in (("detectors", "detector"), ("sink", "sink")):
        series = [s[key]["lag"] for s in samples]
        backlog = [s[key]["backlog"] for s in samples]
        lag[service] = {
            "lag_max": _finite_max(series),
            "lag_end_of_load": last[key]["lag"],
            "lag_drained": samples[-1][key]["lag"],
            "backlog_max": _finite_max(backlog),
            "backlog_end_of_load": last[key]["backlog"],
            "backlog_drained": samples[-1][key]["backlog"],
        }
    span = last["t"] - first["t"]
    steady_rate = (last["stored_values"] - first["stored_values"]) / span if span > 0 else None
    renders = {
        page: {
            "count": len(v),
            "median_s": round(median(v), 2) if v else None,
            "max_s": round(max(v), 2) if v else None,
        }
        for page, v in probe.renders.items()
    }
    return {
        "duration_s": args.duration,
        "quick": args.quick,
        **{k: v for k, v in info.items() if k not in ("produce_s", "total_s")},
        "produce_s": round(info["produce_s"], 1),
        "total_s": round(info["total_s"], 1),
        "runs_started": sum(p["runs_started"] for p in produced),
        "records_offered": sum(p["records"] for p in produced),
        "offered_values": offered,
        "stored_values": stored,
        "lost_values": offered - stored,
        "producer_spooled": sum(p["spooled"] for p in produced),
        "producer_pending_bytes": sum(p["pending"] for p in produced),
        "producer_rejected": sum(p["rejected"] for p in produced),
        "offered_values_per_s": round(offered / info["produce_s"]),
        "stored_values_per_s_steady": None if steady_rate is None else round(steady_rate),
        "stored_values_per_s_overall": round(stored / info["total_s"]),
        "memory": memory,
        "memory_flat_limit": args.flat,
        "memory_flat": all(m["flat"] for s, m in memory.items() if s != "producers"),
        "lag": lag,
        "dashboard": {
            "renders": renders,
            "failures": probe.failures[:10],
            "health_failures": probe.health_failures,
        },
        "series": [
            {
                "t": s["t"],
                "phase": s["phase"],
                "rss_mb": s["rss_mb"],
                "lag": {"detector": s["detectors"]["lag"], "sink": s["sink"]["lag"]},
                "backlog": {"detector": s["detectors"]["backlog"], "sink": s["sink"]["backlog"]},
                "stored_values": s["stored_values"],
            }
            for s in samples
        ],
    }


def _fmt(value: float | None, spec: str = ".0f") -> str:
    return (
        "–"
        if value is None or (isinstance(value, float) and math.isnan(value))
        else (format(value, spec))
    )


def print_tables(r: dict[str, Any]) -> None:
    rows = [
        [
            s["t"],
            s["phase"],
            *(_fmt(s["rss_mb"].get(k)) for k in (*SERVICES, "producers")),
            _fmt(s["lag"]["detector"]),
            _fmt(s["lag"]["sink"]),
            _fmt(s["backlog"]["detector"]),
            _fmt(s["backlog"]["sink"]),
            f"{s['stored_values']:,}",
        ]
        for s in r["series"]
    ]
    print(
        format_table(
            [
                "t s",
                "phase",
                "broker MB",
                "detector MB",
                "sink MB",
                "dashboard MB",
                "producers MB",
                "lag: detector",
                "lag: sink",
                "backlog: detector",
                "backlog: sink",
                "stored values",
            ],
            rows,
        )
    )
    print()
    rows = [
        [
            k,
            _fmt(m["rss_start_mb"], ".1f"),
            _fmt(m["rss_end_mb"], ".1f"),
            _fmt(m["rss_max_mb"], ".1f"),
            "–" if m["growth"] is None else f"{m['growth']:+.1%}",
            _fmt(m["slope_mb_per_min"], "+.2f"),
            {True: "yes", False: "NO", None: "(info)"}[m["flat"]],
        ]
        for k, m in r["memory"].items()
    ]
    print(
        format_table(
            [
                f"service (RSS after {r['warmup_s']:.0f} s warm-up → end of load)",
                "start MB",
                "end MB",
                "max MB",
                "growth",
                "MB/min",
                f"flat (≤ {r['memory_flat_limit']:+.0%})",
            ],
            rows,
        )
    )
    print()
    rows = [
        [
            k,
            _fmt(v["lag_max"]),
            _fmt(v["lag_end_of_load"]),
            _fmt(v["lag_drained"]),
            _fmt(v["backlog_max"]),
            _fmt(v["backlog_end_of_load"]),
            _fmt(v["backlog_drained"]),
        ]
        for k, v in r["lag"].items()
    ]
    print(
        format_table(
            [
                "consumer",
                "max lag",
                "lag at end of load",
                "lag drained",
                "max backlog",
                "backlog at end of load",
                "backlog drained",
            ],
            rows,
        )
    )
    print()
    d = r["dashboard"]["renders"]
    rows = [
        [
            "offered",
            f"{r['offered_values']:,} values, {r['offered_values_per_s']:,}/s "
            f"({r['runs_started']:,} runs, {r['concurrent_runs']} at a time)",
        ],
        [
            "stored",
            f"{r['stored_values']:,} values; steady "
            f"{_fmt(r['stored_values_per_s_steady'], ',.0f')}/s",
        ],
        ["lost values (offered − stored)", f"{r['lost_values']:,}"],
        [
            "producers: spooled / left pending / rejected",
            f"{r['producer_spooled']} / {r['producer_pending_bytes']} B / {r['producer_rejected']}",
        ],
        [
            "dashboard renders (fleet, run): n, median, max",
            f"{d['fleet']['count']}, {_fmt(d['fleet']['median_s'], '.2f')} s, "
            f"{_fmt(d['fleet']['max_s'], '.2f')} s; {d['run']['count']}, "
            f"{_fmt(d['run']['median_s'], '.2f')} s, {_fmt(d['run']['max_s'], '.2f')} s; "
            f"failures {len(r['dashboard']['failures'])}",
        ],
        ["memory flat (all services)", str(r["memory_flat"])],
        ["failed services", str(r["failed_services"] or "none")],
    ]
    print(format_table(["figure", "value"], rows))


def figures(result: dict[str, Any]) -> list[tuple[str, str]]:
    """``benchmarks.readme``'s rows for this result: the load (duration, offered rate and its
    share of saturation, runs) with values lost and stored; per service with a growth figure,
    its RSS from the warm-up to the end of the load (the broker's recycles) and the verdict;
    the consumer lag and the backlog (max / end of load / drained) of the detector and the
    sink; the dashboard renders' medians."""
    lag = result["lag"]
    renders = result["dashboard"]["renders"]
    rows = [
        (
            f"{result['duration_s']:.0f} s at {result['offered_values_per_s']:,} values/s "
            f"offered ({result['offered_values_per_s'] / result['saturation_values_per_s']:.0%} "
            "of saturation), "
            f"{result['runs_started']:,} runs ({result['concurrent_runs']} at a time)",
            f"{result['lost_values']:,} values lost of {result['offered_values']:,}; stored "
            f"{result['stored_values_per_s_steady']:,} values/s in the steady state",
        )
    ]
    for service, m in result["memory"].items():
        if m["growth"] is None:
            continue
        verdict = {True: "flat", False: "not flat", None: "for information"}[m["flat"]]
        rows.append(
            (
                f"RSS {service}, after {result['warmup_s']:.0f} s warm-up → end of load",
                f"{m['rss_start_mb']:.0f} → {m['rss_end_mb']:.0f} MB ({m['growth']:+.0%}, "
                f"{m['slope_mb_per_min']:+.1f} MB/min, max {m['rss_max_mb']:.0f} MB"
                f"{_recycled(result) if service == 'broker' else ''}): {verdict}",
            )
        )
    rows.append(
        (
            "consumer lag max / at end of load / drained (detector; sink)",
            f"{lag['detector']['lag_max']:.0f} / {lag['detector']['lag_end_of_load']:.0f} / "
            f"{lag['detector']['lag_drained']:.0f}; {lag['sink']['lag_max']:.0f} / "
            f"{lag['sink']['lag_end_of_load']:.0f} / {lag['sink']['lag_drained']:.0f} "
            "messages",
        )
    )
    rows.append(
        (
            "backlog: written − consumed (detector); − stored (sink): max / end / drained",
            f"{_backlog(lag['detector'])}; {_backlog(lag['sink'])} messages",
        )
    )
    rows.append(
        (
            "dashboard renders over the agent API (fleet; run page), median",
            f"{renders['fleet']['median_s']} s; {renders['run']['median_s']} s "
            f"({len(result['dashboard']['failures'])} failures)",
        )
    )
    return rows


def _backlog(lag: dict) -> str:
    return (
        f"{lag['backlog_max']:,.0f} / {lag['backlog_end_of_load']:,.0f} / "
        f"{lag['backlog_drained']:,.0f}"
    )


def _recycled(result: dict) -> str:
    if not result.get("broker_max_mb"):
        return ""
    return f"; recycled {result['broker_recycles']}× at {result['broker_max_mb']:.0f} MB"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="60 s; runs of 20 s")
    parser.add_argument("--duration", type=float, default=600.0, help="seconds of load")
    parser.add_argument(
        "--fraction",
        type=float,
        default=0.5,
        help="offered load as a fraction of the saturation rate",
    )
    parser.add_argument("--values-per-s", type=float, help="offered values/s (overrides)")
    parser.add_argument("--rate", type=float, default=1.0, help="records/s per run")
    parser.add_argument("--run-seconds", type=float, default=120.0, help="lifetime of a run")
    parser.add_argument("--processes", type=int, default=2, help="producer processes")
    parser.add_argument("--sample-every", type=float, default=10.0, help="s between samples")
    parser.add_argument("--page-every", type=float, default=30.0, help="s between page loads")
    parser.add_argument("--warmup", type=float, help="s before the start RSS (default above)")
    parser.add_argument("--flat", type=float, default=0.20, help="flat: growth ≤ this")
    parser.add_argument(
        "--broker-max-mb",
        type=float,
        default=512.0,
        help="recycle the broker above this RSS (0: never)",
    )
    parser.add_argument("--drain", type=float, default=180.0, help="s to wait for the tail")
    parser.add_argument("--keep", action="store_true", help="keep the logs and the store")
    args = parser.parse_args()
    if args.quick:
        args.duration, args.run_seconds = 60.0, 20.0
    previous = signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        result = soak(args)
    finally:
        signal.signal(signal.SIGTERM, previous)
    print_tables(result)
    emit_json(result)


def _raise_interrupt(*_: object) -> None:
    raise KeyboardInterrupt  # SIGTERM: unwind through the finally blocks that stop everything


if __name__ == "__main__":
    main()
