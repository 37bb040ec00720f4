"""The live detector service against the real broker: same warnings as the offline replay,
and identical warnings after a worker is killed mid-stream and restarted."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from dataclasses import replace

import pytest
from _kafka import publish_recorded, read_warnings, service_env

from foreshock.detectors.calibrate import calibrate, uncalibrated
from foreshock.detectors.config import DetectorConfig
from foreshock.detectors.replay import replay, replay_run
from foreshock.detectors.worker import DetectorWorker
from foreshock.lab.recorded import load_run, shipped_runs
from foreshock.transport.envelope import Consumed
from foreshock.transport.topics import ensure_topics

RUNS = ["fa-lowprec-s0", "lr-high-s0", "healthy-s1", "fa-lowprec-s2"]


@pytest.fixture(scope="module")
def config(tmp_path_factory) -> tuple[DetectorConfig, str]:
    healthy = [p for p in shipped_runs() if p.name.startswith("healthy")]
    calibrated = calibrate(replay(healthy, uncalibrated(DetectorConfig())), DetectorConfig())
    path = tmp_path_factory.mktemp("det") / "config.json"
    calibrated.save(path)
    return calibrated, str(path)


def _publish(settings, names: list[str]) -> None:
    publish_recorded(settings, names)


def _events(warnings: list[dict]) -> set[tuple]:
    return {(w["id"], w["event"], w["family"], w["step"], w["lead_time"]) for w in warnings}


def test_worker_emits_what_the_replay_finds(kafka_settings, config):
    calibrated, _ = config
    _publish(kafka_settings, RUNS)
    worker = DetectorWorker(kafka_settings, calibrated, group_id="det-a")
    worker.run(threading.Event(), idle_exit=4)
    live = read_warnings(kafka_settings)
    offline = set()
    for name in RUNS:
        run = load_run(next(p for p in shipped_runs() if p.name.startswith(name + ".")))
        run.start["run_id"] = name
        report = replay_run(run, calibrated)
        offline |= _events([e.to_message() for e in report.events])
    assert _events(live) == offline
    assert any(w["family"] == "attention-numerics" for w in live)


def _worker(settings, config_path: str, idle_exit: float) -> subprocess.Popen:
    env = service_env(settings)
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "foreshock.app.cli",
            "detect",
            "--detector-config",
            config_path,
            "--group",
            "det-kill",
            "--idle-exit",
            str(idle_exit),
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_worker_killed_mid_stream_resumes_with_identical_warnings(kafka_settings, config):
    calibrated, path = config
    reference = replace(
        kafka_settings,
        metrics_topic=kafka_settings.metrics_topic + ".ref",
        warnings_topic=kafka_settings.warnings_topic + ".ref",
    )
    _publish(reference, RUNS)
    DetectorWorker(reference, calibrated, group_id="det-ref").run(threading.Event(), idle_exit=4)
    expected = _events(read_warnings(reference))
    assert expected

    ensure_topics(kafka_settings)
    _publish(kafka_settings, RUNS[:2])
    first = _worker(kafka_settings, path, idle_exit=120)
    deadline = time.monotonic() + 90
    while not read_warnings(kafka_settings, idle=0.5) and time.monotonic() < deadline:
        time.sleep(0.5)
    first.send_signal(signal.SIGKILL)  # mid-stream: two more runs are still to come
    first.wait(10)
    _publish(kafka_settings, RUNS[2:])
    second = _worker(kafka_settings, path, idle_exit=20)  # > session timeout: the dead
    # member must be evicted and its partitions reassigned before the idle exit
    _, err = second.communicate(timeout=180)
    assert second.returncode == 0, err
    assert _events(read_warnings(kafka_settings)) == expected


def test_two_workers_share_the_partitions_and_skip_bad_messages(kafka_settings, config):
    from confluent_kafka import Producer

    calibrated, _ = config
    ensure_topics(kafka_settings)
    raw = Producer({"bootstrap.servers": kafka_settings.bootstrap_servers})
    raw.produce(kafka_settings.metrics_topic, key=b"bad", value=b'{"kind": "metrics", "seq": 0}')
    raw.flush(10)
    _publish(kafka_settings, RUNS)
    workers = [DetectorWorker(kafka_settings, calibrated, group_id="det-two") for _ in range(2)]
    threads = [threading.Thread(target=w.run, args=(threading.Event(), 8)) for w in workers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert all(w.messages > 0 for w in workers)  # both got partitions
    assert sum(w.consumer.dead_letters for w in workers) == 1
    assert sum(w.messages for w in workers) == sum(
        len(load_run(next(p for p in shipped_runs() if p.name.startswith(n + "."))).records) + 2
        for n in RUNS
    )
    offline = set()
    for name in RUNS:
        run = load_run(next(p for p in shipped_runs() if p.name.startswith(name + ".")))
        run.start["run_id"] = name
        offline |= _events([e.to_message() for e in replay_run(run, calibrated).events])
    assert _events(read_warnings(kafka_settings)) == offline


def test_worker_forgets_a_run_once_every_rank_ended(kafka_settings, config):
    """A worker serving a fleet for weeks keeps only the runs still going."""
    worker = DetectorWorker(kafka_settings, config[0])
    try:
        offset = iter(range(100))

        def feed(run_id: str, rank: int, seq: int, kind: str) -> None:
            message = {"kind": kind, "run_id": run_id, "rank": rank, "seq": seq}
            if kind == "metrics":
                message.update(step=seq * 25, values={"loss": 2.0})
            worker.process(Consumed(message, "foreshock.metrics", 0, next(offset)))

        for rank in (0, 1):
            feed("two-ranks", rank, 0, "start")
            feed("two-ranks", rank, 1, "metrics")
        feed("one-rank", 0, 0, "start")
        feed("one-rank", 0, 1, "end")
        assert set(worker.runs) == {"two-ranks"}
        feed("two-ranks", 0, 2, "end")
        assert set(worker.runs) == {"two-ranks"}  # rank 1 still writes
        feed("two-ranks", 1, 2, "end")
        assert worker.runs == {}
    finally:
        worker.consumer.close()


def test_a_profile_published_while_the_worker_runs_judges_the_runs_that_start_after(
    kafka_settings,
):
    from foreshock.detectors.profiles import LIVE, ProfileConfigs, with_live

    published = [ProfileConfigs({})]

    def reload():
        if isinstance(published[0], Exception):
            raise published[0]
        return published[0]

    worker = DetectorWorker(kafka_settings, published[0], reload=reload, reload_every=0.0)
    try:
        offset = iter(range(100))

        def start(run_id: str) -> str:
            worker.refresh()
            start = {"kind": "start", "run_id": run_id, "rank": 0, "seq": 0}
            worker.process(Consumed(start, "foreshock.metrics", 0, next(offset)))
            return worker.runs[run_id].profile.name

        assert start("before") == "zero-shot"
        published[0] = with_live(DetectorConfig(), ProfileConfigs({}))
        assert start("after") == LIVE
        assert worker.runs["before"].profile.name == "zero-shot"  # a followed run keeps its own
        published[0] = OSError("a half-written profile")
        assert start("broken") == LIVE  # the last good config judges on
    finally:
        worker.consumer.close()
