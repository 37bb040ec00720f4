"""The storage sink against the real broker: everything stored once — through duplicates, a
replay from offset 0 and a SIGKILL mid-stream — bad messages kept with their reason, and the
history readable while the sink writes."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time

from _kafka import publish_recorded, service_env
from confluent_kafka import Producer

from foreshock.detectors.commands import default_config
from foreshock.detectors.replay import replay_run
from foreshock.lab.recorded import load_run, shipped_runs
from foreshock.storage import queries
from foreshock.storage.reader import open_history
from foreshock.storage.sink import StorageSink
from foreshock.transport.topics import ensure_topics

RUNS = ["fa-lowprec-s0", "lr-high-s1", "healthy-s2", "gbs-small-s1"]


def _run(name: str):
    run = load_run(next(p for p in shipped_runs() if p.name.startswith(name + ".")))
    run.start["run_id"] = name
    return run


def _publish(settings, names: list[str]) -> None:
    publish_recorded(settings, names)


def _stored_steps(root) -> dict[str, int]:
    with open_history(root) as history:
        rows = history.sql("SELECT run_id, count(*) AS n FROM steps GROUP BY run_id").to_pylist()
    return {r["run_id"]: r["n"] for r in rows}


def _expected_steps(names: list[str]) -> dict[str, int]:
    return {name: len(_run(name).records) for name in names}


def test_sink_stores_everything_once_and_keeps_bad_messages(kafka_settings, tmp_path):
    ensure_topics(kafka_settings)
    raw = Producer({"bootstrap.servers": kafka_settings.bootstrap_servers})
    raw.produce(kafka_settings.metrics_topic, key=b"bad", value=b'{"kind": "metrics", "seq": 0')
    raw.produce(kafka_settings.warnings_topic, value=b"not json at all")
    raw.produce(
        kafka_settings.warnings_topic,
        value=json.dumps({"schema": "foreshock.warning/1", "event": "opened"}).encode(),
    )
    events = [e.to_message() for name in RUNS[:2]
              for e in replay_run(_run(name), default_config()).events]  # fmt: skip
    for event in events + events[:5]:  # five delivered twice
        raw.produce(kafka_settings.warnings_topic, key=event["run_id"].encode(),
                    value=json.dumps(event).encode())  # fmt: skip
    raw.flush(10)
    _publish(kafka_settings, RUNS)
    root = tmp_path / "store"
    StorageSink(kafka_settings, root, group_id="sink-a").run(threading.Event(), idle_exit=4)
    assert _stored_steps(root) == _expected_steps(RUNS)
    # a second group reads every topic again from offset 0: nothing may be stored twice
    again = StorageSink(kafka_settings, root, group_id="sink-b")
    again.run(threading.Event(), idle_exit=4)
    assert again.stats["messages"] == 0 and _stored_steps(root) == _expected_steps(RUNS)
    with open_history(root) as history:
        assert history.sql("SELECT count(*) AS n FROM warnings").to_pylist()[0]["n"] == len(events)
        kinds = history.sql("SELECT run_id, kind FROM run_events ORDER BY ALL").to_pylist()
        letters = queries.dead_letters(history)
        fleet = {r["run_id"]: r["status"] for r in queries.fleet(history)}
    assert [(k["run_id"], k["kind"]) for k in kinds] == sorted(
        (n, k) for n in RUNS for k in ("end", "start"))  # fmt: skip
    reasons = sorted(d["reason"].split(":")[0] for d in letters)
    assert reasons == ["not JSON", "warning event without 'id'", "warning is not JSON"]
    assert fleet["fa-lowprec-s0"] == "diverged" and fleet["healthy-s2"] == "finished"


def _sink_process(settings, root) -> subprocess.Popen:
    env = service_env(settings)
    return subprocess.Popen(
        [sys.executable, "-m", "foreshock.cli", "sink", "--store", str(root),
         "--group", "sink-kill", "--idle-exit", "15"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip


def test_sink_killed_mid_stream_stores_everything_once_readable_meanwhile(kafka_settings, tmp_path):
    ensure_topics(kafka_settings)
    root = tmp_path / "store"
    _publish(kafka_settings, RUNS[:2])
    first = _sink_process(kafka_settings, root)
    deadline = time.monotonic() + 60
    while not (root / "manifest.json").exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    seen = _stored_steps(root)  # read while the sink holds the store
    assert seen
    first.send_signal(signal.SIGKILL)
    first.wait(10)
    _publish(kafka_settings, RUNS[2:])
    second = _sink_process(kafka_settings, root)
    reads = 0
    while second.poll() is None:  # a reader beside the writing sink, all along
        assert set(_stored_steps(root)) <= set(RUNS)
        reads += 1
        time.sleep(0.2)
    _, err = second.communicate()
    assert second.returncode == 0, err
    assert reads > 5
    assert _stored_steps(root) == _expected_steps(RUNS)
