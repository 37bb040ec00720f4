"""One harness for the demo, the benchmarks and the tests: recorded runs replayed through a
producer's sink, and the whole pipeline brought up on one machine.

Replaying. The demo, the benchmarks and the reliability tests all need a fleet without training
one: the shipped recorded runs (``foreshock.lab.runs``), each under a run id of its own, written
through a real sink at some pace. Two ways:

* :class:`Replay` + :class:`Replayer`: whole runs as recorded (start, every record, end), each at
  its own pace and start offset, interleaved in one thread — the demo's fleet, and one trainer
  per thread in the fault runs (:mod:`benchmarks.pipeline_faults`);
* :func:`paced` + :func:`renumbered` + :func:`finished`: synthetic runs of any length cut from
  recorded records (cycled, steps renumbered, stamped now) — the load benchmarks, whose loops
  (processes, slots, lockstep) are their own.

Bringing up. Each of them also needs the same pipeline — an embedded Tansu (or a broker already
running), the topics, then ``foreshock sink``, ``foreshock detect`` and ``foreshock dashboard``
started through their CLI commands with one environment — and they differ only in which
services, consumer groups, ports and topic names. :class:`Pipeline` is that bring-up, written
once; ``stop()`` (or leaving its ``with`` block) stops every process it started. The services
run as processes, as in production, so nothing here imports them; nothing here trains either,
so the harness is torch-free.
"""

from __future__ import annotations

import contextlib
import heapq
import os
import signal
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from foreshock.app.services import ServiceGroup, foreshock_command
from foreshock.lab.recorded import RecordedRun, load_run, shipped_runs
from foreshock.storage.store import store_exists
from foreshock.transport.broker import EmbeddedBroker, free_port
from foreshock.transport.settings import KafkaSettings, env_variable

__all__ = [
    "DASHBOARD",
    "DETECT",
    "SINK",
    "Pipeline",
    "Replay",
    "Replayer",
    "finished",
    "paced",
    "recorded_interval",
    "recorded_run",
    "recorded_runs",
    "renumbered",
    "scoped",
    "scrape",
    "service_env",
    "stored_totals",
    "wait_healthy",
]


# ---- replaying recorded runs ------------------------------------------------------------------


def recorded_run(key: str | int) -> RecordedRun:
    """A shipped run by name (``"lr-high-s0"``) or by index (cycling over the shipped runs), so
    that callers name runs the way their reports do instead of globbing for files."""
    paths = shipped_runs()
    if isinstance(key, int):
        return load_run(paths[key % len(paths)])
    return load_run(next(p for p in paths if p.name.startswith(key + ".")))


def recorded_runs() -> list[RecordedRun]:
    """Every shipped run, loaded, in file order: the pool a synthetic fleet cycles through."""
    return [load_run(p) for p in shipped_runs()]


def recorded_interval(run: RecordedRun) -> float:
    """Mean seconds between the run's records as recorded (2.5 s when it cannot tell): the pace
    at which a replay looks like the original trainer."""
    times = [r["time"] for r in run.records if "time" in r]
    return (times[-1] - times[0]) / max(1, len(times) - 1) if len(times) > 1 else 2.5


@dataclass
class Replay:
    """One recorded run sent again under ``run_id``: its start, its records, its end.

    ``labels`` are added to the start's (the demo marks its runs ``source=replayed``);
    ``restamp`` stamps each record with the time it is sent — a live-looking run for the
    dashboard — instead of keeping its recorded time. ``interval`` is the seconds between two
    messages, ``offset`` the seconds before the first, from the replayer's start.
    """

    run: RecordedRun
    run_id: str
    interval: float
    offset: float = 0.0
    labels: dict[str, Any] = field(default_factory=dict)
    restamp: bool = False

    def __len__(self) -> int:
        return len(self.run.records) + 2  # start, records, end

    def message(self, j: int) -> dict[str, Any]:
        """The ``j``-th message: 0 the start, 1..len(records) the records, then the end."""
        run = self.run
        if j == 0:
            start = {**run.start, "run_id": self.run_id}
            if self.labels:
                start["labels"] = {**run.start.get("labels", {}), **self.labels}
            return start
        if j <= len(run.records):
            record = {**run.records[j - 1], "run_id": self.run_id}
            if self.restamp:
                record["time"] = time.time()
            return record
        return {**(run.end or {"status": "finished"}), "kind": "end", "run_id": self.run_id}


class Replayer(threading.Thread):
    """Writes :class:`Replay` runs to one sink, every message at its due time.

    One thread for many runs (a heap of due times), so a fleet of dozens of trainers costs one
    thread; give each run a replayer of its own for one producer per trainer. ``written`` counts
    the messages sent so far (what a backlog is measured against). With ``close_timeout`` the
    replayer closes the sink when done (``pending``: the bytes it still held); without, the
    caller does (the demo keeps its sink open until the pipeline has stored everything).
    """

    def __init__(
        self,
        sink: Any,
        replays: list[Replay],
        close_timeout: float | None = None,
        name: str = "foreshock-replay",
    ) -> None:
        super().__init__(name=name, daemon=True)
        self.sink, self.replays, self.close_timeout = sink, replays, close_timeout
        self.written = 0
        self.pending = -1
        self.done = threading.Event()
        self.stop_event = threading.Event()

    def run(self) -> None:
        t0 = time.monotonic()
        heap = [(t0 + r.offset, i, 0) for i, r in enumerate(self.replays)]
        heapq.heapify(heap)
        while heap and not self.stop_event.is_set():
            due, i, j = heapq.heappop(heap)
            if self.stop_event.wait(max(0.0, due - time.monotonic())):
                break
            replay = self.replays[i]
            self.sink.write(replay.message(j))
            self.written += 1
            if j + 1 < len(replay):
                heapq.heappush(heap, (due + replay.interval, i, j + 1))
        if self.close_timeout is not None:
            self.sink.close(timeout=self.close_timeout)
            self.pending = self.sink.pending()
        self.done.set()


def paced(
    count: int, rate: float, start: float | None = None, clock: Callable[[], float] = time.monotonic
) -> Iterator[int]:
    """0, 1, … ``count - 1``, each yielded no earlier than ``start + n / rate`` on ``clock``
    (``rate`` 0: at once): a producer that offers a steady load, not one that drifts with the
    time its own writes take."""
    start = clock() if start is None else start
    for n in range(count):
        if rate > 0:
            time.sleep(max(0.0, start + n / rate - clock()))
        yield n


def renumbered(run: RecordedRun, n: int, run_id: str, step: int) -> dict[str, Any]:
    """Record ``n`` of a synthetic run cut from ``run``'s records (cycling): its values as
    recorded, its run id, step and time stamp new — a run of any length, seen as live."""
    record = run.records[n % len(run.records)]
    return {**record, "run_id": run_id, "step": step, "time": time.time()}


def finished(run_id: str) -> dict[str, Any]:
    """The end message of a synthetic run: finished, no divergence (its records are a mix)."""
    return {
        "schema": "foreshock.run/1",
        "kind": "end",
        "run_id": run_id,
        "status": "finished",
        "divergence_step": None,
    }


# ---- bringing up the pipeline ----------------------------------------------------------------
SINK, DETECT, DASHBOARD = "sink", "detect", "dashboard"  # the kinds of service, by command
_ENV_FIELDS = (
    "bootstrap_servers",
    "metrics_topic",
    "warnings_topic",
    "deadletter_topic",
    "control_topic",
    "partitions",
    "spool_dir",
)


def service_env(settings: KafkaSettings, **overrides: str) -> dict[str, str]:
    """The ``FORESHOCK_KAFKA_*`` variables that make a ``foreshock`` child process use
    ``settings``' broker, topics, partitions and spool folder (it cannot see our objects).

    >>> service_env(KafkaSettings(spool_dir="s"))["FORESHOCK_KAFKA_PARTITIONS"]
    '6'
    """
    env = {env_variable(name): str(getattr(settings, name)) for name in _ENV_FIELDS}
    return {**env, **overrides}


def scoped(settings: KafkaSettings, name: str, **changes: object) -> KafkaSettings:
    """``settings`` with topics of their own, ``NAME.metrics``, ``NAME.warnings``,
    ``NAME.dead`` and ``NAME.control``: several cases on one broker, none reading another's
    messages.

    >>> scoped(KafkaSettings(spool_dir="s"), "case1").warnings_topic
    'case1.warnings'
    """
    topics = {
        "metrics_topic": f"{name}.metrics",
        "warnings_topic": f"{name}.warnings",
        "deadletter_topic": f"{name}.dead",
        "control_topic": f"{name}.control",
    }
    return replace(settings, **{**topics, **changes})  # type: ignore[arg-type]


@dataclass
class Pipeline:
    """Broker (when ``broker`` is given: started, killable, stopped with the pipeline), topics
    and services on 127.0.0.1.

    ``parts`` names each service and its kind (:data:`SINK`, :data:`DETECT`,
    :data:`DASHBOARD`), in start order; the names are the log files' and the ones
    :meth:`kill` and :meth:`start_part` take. ``groups`` gives a kind its consumer group
    (else the service's default); ``metrics`` gives the sink and the detectors a
    ``/metrics`` port, for :func:`scrape`; ``ports`` fixes a service's port (else a free one);
    ``env`` adds to (or overrides) every service's environment.
    """

    settings: KafkaSettings
    store: Path
    log_dir: Path
    parts: dict[str, str] = field(
        default_factory=lambda: {SINK: SINK, DETECT: DETECT, DASHBOARD: DASHBOARD}
    )
    groups: dict[str, str] = field(default_factory=dict)
    metrics: bool = True
    ports: dict[str, int] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    broker: EmbeddedBroker | None = None
    recreate_topics: bool = False  # after every broker start (a recycled broker comes up empty)
    group: ServiceGroup = field(init=False)

    def __post_init__(self) -> None:
        self.group = ServiceGroup({}, self.log_dir)

    def start(self) -> Pipeline:
        """Broker, topics, then every part in order; on any failure, stop what had started."""
        from foreshock.transport.topics import ensure_topics

        try:
            if self.broker is not None:
                self.broker.start()
                self.settings = self.settings.with_bootstrap(self.broker.bootstrap)
            ensure_topics(self.settings)
            if self.broker is not None and self.recreate_topics:
                self.broker.on_start = lambda _bootstrap: ensure_topics(self.settings)
            self.group.env = service_env(self.settings, **self.env)
            for name in self.parts:
                self.start_part(name)
        except BaseException:
            self.stop()
            raise
        return self

    def port(self, name: str) -> int:
        """The port of service ``name``: the one given in ``ports``, else a free one, kept
        across restarts (a scraper keeps its URL)."""
        if name not in self.ports:
            self.ports[name] = free_port()
        return self.ports[name]

    def metrics_url(self, name: str) -> str:
        return f"http://127.0.0.1:{self.port(name)}/metrics"

    def url(self, name: str = DASHBOARD) -> str:
        return f"http://127.0.0.1:{self.port(name)}"

    def command(self, name: str) -> list[str]:
        """The ``foreshock`` command line of service ``name``."""
        kind = self.parts[name]
        args = [kind, "--store", str(self.store)] if kind != DETECT else [kind]
        if kind == DASHBOARD:
            return foreshock_command(*args, "--port", str(self.port(name)))
        if kind in self.groups:
            args += ["--group", self.groups[kind]]
        if self.metrics:
            args += ["--metrics-port", str(self.port(name))]
        return foreshock_command(*args)

    def start_part(self, name: str) -> None:
        """(Re)start service ``name``, or the broker (``"broker"``)."""
        if name == "broker" and self.broker is not None:
            self.broker.start()
        else:
            self.group.start(name, self.command(name))

    def kill(self, name: str) -> None:
        """SIGKILL service ``name`` or the broker: a crash — no clean shutdown, no last commit,
        nothing flushed (the broker loses every topic, message and offset it held)."""
        if name == "broker" and self.broker is not None:
            self.broker.kill()
            return
        process = self.group.processes[name]
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(10)

    def stop(self) -> None:
        """Every service, then the broker; safe to call twice."""
        self.group.stop()
        if self.broker is not None:
            self.broker.stop()

    def __enter__(self) -> Pipeline:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def scrape(url: str) -> tuple[float, float]:
    """(messages consumed, consumer lag summed over partitions) from a service's /metrics;
    NaN for both while it does not answer.

    Lag as the service's own consumer sees it (high watermarks from its fetches): Tansu
    answers a direct watermark query with a wrong end offset, so nothing here asks for one.
    """
    from prometheus_client.parser import text_string_to_metric_families

    try:
        with urllib.request.urlopen(url, timeout=2) as reply:
            text = reply.read().decode()
    except OSError:
        return float("nan"), float("nan")
    consumed = lag = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "foreshock_messages_consumed_total":
                consumed += sample.value
            elif sample.name == "foreshock_consumer_lag":
                lag += sample.value
    return consumed, lag


def wait_healthy(url: str, timeout: float, poll: float = 0.5) -> bool:
    """Whether the dashboard at ``url`` answered its health check within ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"{url}/_stcore/health", timeout=2):
                return True
        except OSError:
            time.sleep(poll)
    return False


def stored_totals(store: Path) -> tuple[int, int]:
    """(messages, metric values) the sink has stored: step rows + run events, and their
    values — what a backlog and a loss are counted against. (0, 0) before the first write."""
    from foreshock.storage.reader import open_history

    if not store_exists(str(store)):
        return 0, 0
    with open_history(store) as history:
        row = history.sql(
            "SELECT (SELECT count(*) FROM steps) + (SELECT count(*) FROM run_events) AS n, "
            "(SELECT coalesce(sum(n_values), 0)::BIGINT FROM steps) AS v"
        ).to_pylist()[0]
    return row["n"], row["v"]
