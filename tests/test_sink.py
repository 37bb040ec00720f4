"""The storage sink against the real broker: everything stored once — through duplicates, a
replay from offset 0, a SIGKILL mid-stream, two sinks in one group with one killed and
restarted, a writer that died between two tables' commits, and a store that could not be
written for a while — bad messages kept with their reason, and the history readable (whole
records only) while the sinks write."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time

import pytest
from _kafka import publish_recorded, service_env
from confluent_kafka import Producer

from foreshock.delivery.kafka_sink import KafkaSink
from foreshock.detectors.replay import replay_run
from foreshock.lab.recorded import load_run, shipped_runs
from foreshock.operate.detect_commands import default_config
from foreshock.storage import queries, stream_queries
from foreshock.storage.reader import open_history
from foreshock.storage.rows import BatchBuilder
from foreshock.storage.sink import SecondWriterError, StorageSink
from foreshock.storage.store import DeltaStore, store_exists
from foreshock.transport.topics import ensure_topics

RUNS = ["fa-lowprec-s0", "lr-high-s1", "healthy-s2", "gbs-small-s1"]


def _run(name: str):
    run = load_run(next(p for p in shipped_runs() if p.name.startswith(name + ".")))
    run.start["run_id"] = name
    return run


def _publish(settings, names: list[str]) -> None:
    publish_recorded(settings, names)


def _stored_steps_or_none(root) -> dict[str, int]:
    return _stored_steps(root) if store_exists(str(root)) else {}


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
    events = [
        e.to_message() for name in RUNS[:2] for e in replay_run(_run(name), default_config()).events
    ]
    for event in events + events[:5]:  # five delivered twice
        raw.produce(
            kafka_settings.warnings_topic,
            key=event["run_id"].encode(),
            value=json.dumps(event).encode(),
        )
    raw.flush(10)
    _publish(kafka_settings, RUNS)
    root = tmp_path / "store"
    StorageSink(kafka_settings, root, group_id="sink-a").run(threading.Event(), idle_exit=4)
    assert _stored_steps(root) == _expected_steps(RUNS)
    # a second group would store every record again: refused while the first one writes
    with pytest.raises(SecondWriterError, match="written by sink group 'sink-a'"):
        StorageSink(kafka_settings, root, group_id="sink-b")
    # taken over (the first group stopped), it reads every topic again from offset 0 and
    # stores nothing twice
    again = StorageSink(kafka_settings, root, group_id="sink-b", take_over=True)
    again.run(threading.Event(), idle_exit=4)
    assert again.stats.messages == 0 and _stored_steps(root) == _expected_steps(RUNS)
    with open_history(root) as history:
        assert history.sql("SELECT count(*) AS n FROM warnings").to_pylist()[0]["n"] == len(events)
        kinds = history.sql("SELECT run_id, kind FROM run_events ORDER BY ALL").to_pylist()
        letters = queries.dead_letters(history)
        fleet = {r["run_id"]: r["status"] for r in queries.fleet(history)}
    assert [(k["run_id"], k["kind"]) for k in kinds] == sorted(
        (n, k) for n in RUNS for k in ("end", "start")
    )
    reasons = sorted(d["reason"].split(":")[0] for d in letters)
    assert reasons == ["not JSON", "warning event without 'id'", "warning is not JSON"]
    assert fleet["fa-lowprec-s0"] == "diverged" and fleet["healthy-s2"] == "finished"


def _sink_process(settings, root, group: str = "sink-kill", idle: float = 15) -> subprocess.Popen:
    env = service_env(settings)
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "foreshock.app.cli",
            "sink",
            "--store",
            str(root),
            "--group",
            group,
            "--idle-exit",
            str(idle),
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _exactly_once(root, names: list[str]) -> None:
    """Every record and lifecycle message of ``names`` stored once, with all its values."""
    assert _stored_steps(root) == _expected_steps(names)
    with open_history(root) as history:
        assert stream_queries.duplicate_records(history) == []
        assert stream_queries.value_count_mismatches(history) == []
        assert stream_queries.orphan_values(history) == []
        kinds = history.sql("SELECT run_id, kind FROM run_events ORDER BY ALL").to_pylist()
    assert [(k["run_id"], k["kind"]) for k in kinds] == sorted(
        (n, k) for n in names for k in ("end", "start")
    )


_PARTIAL = (
    "SELECT count(*) AS n FROM steps LEFT JOIN (SELECT run_id, rank, step, count(*) AS c "
    "FROM metric_values GROUP BY ALL) USING (run_id, rank, step) "
    "WHERE coalesce(c, 0) <> n_values"
)


def _read_whole(root) -> int:
    """A reader's poll: how many records it sees; fails if one lacks any of its values."""
    if not store_exists(str(root)):
        return 0
    with open_history(root) as history:
        assert history.sql(_PARTIAL).to_pylist() == [{"n": 0}]
        return history.sql("SELECT count(*) AS n FROM steps").to_pylist()[0]["n"]


def test_sink_killed_mid_stream_stores_everything_once_readable_meanwhile(kafka_settings, tmp_path):
    ensure_topics(kafka_settings)
    root = tmp_path / "store"
    _publish(kafka_settings, RUNS[:2])
    first = _sink_process(kafka_settings, root)
    deadline = time.monotonic() + 60
    while not _stored_steps_or_none(root) and time.monotonic() < deadline:
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


def test_two_sinks_one_killed_and_restarted_store_everything_once(kafka_settings, tmp_path):
    """Two sinks in one group share the partitions; one is SIGKILLed mid-stream and restarted
    (its partitions go to the other, then back); a reader polls all along."""
    ensure_topics(kafka_settings)
    root = tmp_path / "store"
    DeltaStore(root)  # the tables exist before the sinks race to create them
    _publish(kafka_settings, RUNS[:2])
    pair = [_sink_process(kafka_settings, root, "sink-pair", idle=12) for _ in range(2)]
    deadline, seen = time.monotonic() + 60, 0
    while seen == 0 and time.monotonic() < deadline:
        seen = _read_whole(root)
        time.sleep(0.1)
    assert seen, "nothing stored within a minute"
    pair[0].send_signal(signal.SIGKILL)
    pair[0].wait(10)
    _publish(kafka_settings, RUNS[2:])
    pair[0] = _sink_process(kafka_settings, root, "sink-pair", idle=12)
    reads = []
    while any(p.poll() is None for p in pair):
        reads.append(_read_whole(root))  # raises if a record is visible without its values
        time.sleep(0.2)
    for p in pair:
        _, err = p.communicate()
        assert p.returncode == 0, err[-3000:]
    assert len(reads) > 5 and reads == sorted(reads)
    _exactly_once(root, RUNS)
    check = subprocess.run(
        [sys.executable, "-m", "foreshock.app.cli", "store", "check", "--store", str(root)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert check.returncode == 0, check.stdout + check.stderr
    assert f"{len(RUNS)} complete" in check.stdout


def test_a_writer_that_died_between_tables_is_completed_not_repeated(kafka_settings, tmp_path):
    """A sink killed after its ``metric_values`` commit and before its ``steps`` commit left
    values without records; the sink that reads the stream again stores only what is missing."""
    ensure_topics(kafka_settings)
    root, run = tmp_path / "store", _run(RUNS[0])
    b = BatchBuilder()
    for seq, record in enumerate(run.records[:10], start=1):
        b.add_metrics({**record, "run_id": RUNS[0], "seq": seq, "attempt": 5}, time.time())
    DeltaStore(root).write({"metric_values": b.take()["metric_values"]})  # steps: never
    with open_history(root) as history:
        assert len(stream_queries.orphan_values(history)) == 10
    producer = KafkaSink(kafka_settings, attempt=5)  # the producer of those records
    producer.write({**run.start, "run_id": RUNS[0]})
    for record in run.records:
        producer.write({**record, "run_id": RUNS[0]})
    producer.write({**run.end, "run_id": RUNS[0]})
    producer.close()
    StorageSink(kafka_settings, root, group_id="sink-orphan").run(threading.Event(), idle_exit=4)
    _exactly_once(root, RUNS[:1])


def test_a_store_unwritable_for_a_while_loses_and_repeats_nothing(kafka_settings, tmp_path):
    """The ``steps`` table's log cannot be written (its folder replaced by a file — root
    ignores permissions) while a live sink holds a batch: the sink retries with backoff and,
    once the log is back, every record is stored exactly once."""
    ensure_topics(kafka_settings)
    root = tmp_path / "store"
    sink = StorageSink(kafka_settings, root, group_id="sink-full")
    stop = threading.Event()
    thread = threading.Thread(target=sink.run, args=(stop,), kwargs={"idle_exit": 6})
    thread.start()
    _publish(kafka_settings, RUNS[:1])
    deadline = time.monotonic() + 60
    while _read_whole(root) < len(_run(RUNS[0]).records) and time.monotonic() < deadline:
        time.sleep(0.2)
    log_dir, away = root / "steps" / "_delta_log", root / "steps" / "_delta_log.away"
    log_dir.rename(away)
    log_dir.write_text("not a folder: every commit to steps fails")
    _publish(kafka_settings, RUNS[1:2])
    deadline = time.monotonic() + 60
    while sink.stats.write_retries < 2 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert sink.stats.write_retries >= 2, "the sink never hit the unwritable table"
    log_dir.unlink()
    away.rename(log_dir)
    thread.join(120)
    assert not thread.is_alive()
    _exactly_once(root, RUNS[:2])


def test_store_check_on_a_seq_of_10_to_the_12_answers_at_once(kafka_settings, tmp_path):
    """A producer bug (or a hostile message) says seq 10¹²: stored as sent, and `foreshock
    store check` names the gap at once (it used to walk range(10¹²): days), exit 1."""
    ensure_topics(kafka_settings)
    raw = Producer({"bootstrap.servers": kafka_settings.bootstrap_servers})
    for seq in (0, 10**12):
        record = {"schema": "foreshock.metrics/1", "kind": "metrics", "run_id": "huge-seq"}
        record.update(seq=seq, step=seq % 7, time=1.0, values={"loss": 2.0})
        raw.produce(kafka_settings.metrics_topic, key=b"huge-seq", value=json.dumps(record))
    raw.flush(10)
    root = tmp_path / "store"
    StorageSink(kafka_settings, root, group_id="sink-huge").run(threading.Event(), idle_exit=4)
    check = subprocess.run(
        [sys.executable, "-m", "foreshock.app.cli", "store", "check", "--store", str(root)],
        capture_output=True,
        text=True,
        timeout=120,
        env=service_env(kafka_settings),
    )
    assert check.returncode in (0, 1), check.stderr[-2000:]
    assert "huge-seq" in check.stdout and "999999999999" in check.stdout


def test_a_sink_waits_for_a_store_away_at_start_and_stops_on_sigterm_while_it_fails(
    kafka_settings, tmp_path
):
    """Started while its store cannot be opened, the sink waits (it used to exit at once)
    and stores everything once it can. A SIGTERM while the store fails under it ends it
    within seconds (it used to retry until SIGKILL); what it had not written, it had not
    committed: the next sink stores it, once."""
    ensure_topics(kafka_settings)
    blocker = tmp_path / "blocker"
    blocker.write_text("a file where the store's parent folder should be")
    root = blocker / "store"
    _publish(kafka_settings, RUNS[:1])
    waiting = _sink_process(kafka_settings, root, group="sink-away", idle=4)
    _wait_for_line(waiting.stderr, "cannot be opened")
    blocker.unlink()  # the store is reachable again
    _, err = waiting.communicate(timeout=180)
    assert waiting.returncode == 0, err[-3000:]
    _exactly_once(root, RUNS[:1])

    log_dir, away = root / "steps" / "_delta_log", root / "steps" / "_delta_log.away"
    log_dir.rename(away)
    log_dir.write_text("not a folder: every commit to steps fails")
    failing = _sink_process(kafka_settings, root, group="sink-away", idle=60)
    _publish(kafka_settings, RUNS[1:2])
    _wait_for_line(failing.stderr, "failed (", "cannot be")  # at start, assigned or writing
    failing.send_signal(signal.SIGTERM)
    failing.communicate(timeout=20)  # within seconds, not at the next SIGKILL
    log_dir.unlink()
    away.rename(log_dir)
    StorageSink(kafka_settings, root, group_id="sink-away").run(threading.Event(), idle_exit=4)
    _exactly_once(root, RUNS[:2])


def _wait_for_line(stream, *texts: str, timeout: float = 120) -> None:
    """Read ``stream`` (a service's stderr) until a line holds one of ``texts``."""
    deadline = time.monotonic() + timeout
    for line in stream:
        if any(text in line for text in texts):
            return
        assert time.monotonic() < deadline, f"none of {texts} within {timeout} s"
    raise AssertionError(f"the service ended without saying any of {texts}")


def test_a_torn_commit_is_named_and_repaired_with_no_record_lost_or_doubled(
    kafka_settings, tmp_path
):
    """A writer died mid-commit on a filesystem without atomic renames: the newest commit of
    ``steps`` is cut in half under a live sink. The sink goes on storing warnings and dead
    letters (it used to stop for every table); `store check` names the file (it used to end in
    a Python and Rust backtrace); `store repair` rewrites the log to the last good version; a
    sink then stores what it held from the broker (its offsets were never committed). Counted
    independently, with deltalake and DuckDB: every record and every warning once."""
    import duckdb
    from deltalake import DeltaTable

    ensure_topics(kafka_settings)
    root = tmp_path / "store"
    stop, sink = threading.Event(), StorageSink(kafka_settings, root, group_id="sink-torn")
    live = threading.Thread(target=sink.run, args=(stop,), daemon=True)
    live.start()
    _publish(kafka_settings, RUNS[:1])
    _wait_for(lambda: _stored_steps_or_none(root) == _expected_steps(RUNS[:1]))
    torn = BatchBuilder()  # the dying writer's batch: run 2's step rows, in the broker too
    for seq, record in enumerate(_run(RUNS[1]).records, start=1):
        torn.add_metrics({**record, "run_id": RUNS[1], "seq": seq}, time.time())
    DeltaStore(root).write({"steps": torn.take()["steps"]})
    newest = max((root / "steps" / "_delta_log").glob("*.json"))
    newest.write_bytes(newest.read_bytes()[: newest.stat().st_size // 2])
    _publish(kafka_settings, RUNS[1:2])
    events = _publish_warnings(kafka_settings, RUNS[1])
    _wait_for(lambda: (_rows(root / "warnings"), _rows(root / "dead_letters")) == (len(events), 1))
    stop.set()
    live.join(60)
    assert not live.is_alive() and sink.stats.write_retries > 0

    def cli(*argv: str) -> subprocess.CompletedProcess:
        command = [sys.executable, "-m", "foreshock.app.cli", "store", *argv, "--store", str(root)]
        return subprocess.run(command, capture_output=True, text=True, timeout=120)

    check = cli("check")
    assert check.returncode == 2 and newest.name in check.stderr and "store repair" in check.stderr
    assert "Traceback" not in check.stderr
    repaired = cli("repair")
    assert repaired.returncode == 0 and newest.name in repaired.stdout, repaired.stderr
    StorageSink(kafka_settings, root, group_id="sink-torn").run(threading.Event(), idle_exit=4)
    _exactly_once(root, RUNS[:2])
    steps = DeltaTable(str(root / "steps")).to_pyarrow_table(columns=["run_id", "rank", "seq"])
    con = duckdb.connect()
    con.register("steps", steps)
    query = "SELECT count(*), count(DISTINCT (run_id, rank, seq)) FROM steps"
    total, distinct = con.execute(query).fetchone()
    assert total == distinct == sum(_expected_steps(RUNS[:2]).values())
    assert (_rows(root / "warnings"), _rows(root / "dead_letters")) == (len(events), 1)
    assert cli("check").returncode == 0


def _wait_for(condition, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "not within the time allowed"
        time.sleep(0.5)


def _publish_warnings(settings, name: str) -> list[dict]:
    """``name``'s replayed warning events and one message that is not JSON, to the broker."""
    raw = Producer({"bootstrap.servers": settings.bootstrap_servers})
    events = [e.to_message() for e in replay_run(_run(name), default_config()).events]
    for event in events:
        raw.produce(settings.warnings_topic, key=name.encode(), value=json.dumps(event).encode())
    raw.produce(settings.warnings_topic, value=b"not json at all")
    raw.flush(10)
    return events


def _rows(table) -> int:
    """Rows of one Delta table, read with deltalake alone (0 before it exists)."""
    from deltalake import DeltaTable

    if not DeltaTable.is_deltatable(str(table)):
        return 0
    return DeltaTable(str(table)).to_pyarrow_table(columns=[]).num_rows
