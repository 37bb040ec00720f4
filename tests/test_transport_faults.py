"""Nothing lost: a broker killed mid-run and restarted, and no broker at all for a whole run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import replace

from _kafka import Collector, has_end, spool_flush, tiny_training

from foreshock.delivery.kafka_sink import KafkaSink
from foreshock.delivery.spool import orphaned_spools
from foreshock.transport.broker import EmbeddedBroker, free_port
from foreshock.transport.settings import KafkaSettings


def _settings(port: int, tmp_path, name: str) -> KafkaSettings:
    return KafkaSettings(
        bootstrap_servers=f"127.0.0.1:{port}",
        metrics_topic=f"{name}.metrics",
        deadletter_topic=f"{name}.dead",
        partitions=2,
        spool_dir=str(tmp_path / "spool"),
    )


def test_broker_killed_mid_run_and_restarted_loses_no_step(tmp_path):
    """Kill -9 Tansu at step 30 of 90 (it forgets every topic and message), restart it at step
    55: every monitoring step arrives, each counted once after dedup."""
    broker = EmbeddedBroker(log_path=tmp_path / "tansu.log").start()
    settings = _settings(broker.port, tmp_path, "restart")
    collector = Collector(settings)
    sink = KafkaSink(settings, probe_interval=0.5)
    events = {}

    def chaos(step: int) -> None:
        if step == 30:
            assert collector.wait_for(lambda m: len(m) >= 25, 60)  # consumed before the crash
            broker.kill()
            events["killed"] = len(collector.messages)
        elif step == 55:
            broker.start()

    try:
        tiny_training(sink, "run-restart", steps=90, every=1, on_step=chaos)
        sink.close(timeout=30)
        assert collector.wait_for(has_end("run-restart"), 90), collector.messages[-3:]
    finally:
        collector.close()
        broker.stop()
    seqs = sorted(m["seq"] for m in collector.messages if m["run_id"] == "run-restart")
    assert seqs == list(range(92))  # start + 90 steps + end, each exactly once
    steps = sorted(m["step"] for m in collector.messages if m["kind"] == "metrics")
    assert steps == list(range(90))
    assert sink.replayed > 0  # what the crashed broker had acknowledged was re-sent
    assert 25 <= events["killed"] < 92


def test_no_broker_for_a_whole_run_spools_everything_then_flush_delivers(tmp_path):
    port = free_port()
    settings = _settings(port, tmp_path, "offline")
    baseline = tiny_training(_Null(), "warm-up", steps=40)
    sink = KafkaSink(settings, probe_interval=0.5)
    started = time.perf_counter()
    seconds = tiny_training(sink, "run-offline", steps=40, every=1)
    sink.close(timeout=2)
    assert time.perf_counter() - started < 20  # not held up by the 15 s delivery timeout
    assert max(seconds) < 1.0 and sum(seconds) < 3 * sum(baseline) + 2.0  # never blocked
    assert sink.delivered == 0 and sink.spooled == 42
    spools = list(orphaned_spools(settings.spool_dir))
    assert len(spools) == 1
    lines = spools[0].path.read_text().splitlines()
    spools[0].close(delete_if_empty=False)
    assert len(lines) == 42

    broker = EmbeddedBroker(port=port, log_path=tmp_path / "tansu.log").start()
    collector = Collector(settings)
    try:
        flush = spool_flush(settings)
        assert flush.returncode == 0, flush.stderr
        assert "42 messages delivered" in flush.stdout
        assert collector.wait_for(has_end("run-offline"), 60)
    finally:
        collector.close()
        broker.stop()
    assert sorted(m["seq"] for m in collector.messages) == list(range(42))
    assert not list((tmp_path / "spool").glob("*.spool"))  # drained spools are removed


class _Null:
    def write(self, record: dict) -> None:
        pass

    def close(self) -> None:
        pass


def _sink_service(settings: KafkaSettings, store, group: str) -> subprocess.Popen:
    from _kafka import service_env

    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "foreshock.app.cli",
            "sink",
            "--store",
            str(store),
            "--group",
            group,
        ],
        env=service_env(settings),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def _stored_seqs(store) -> list[int]:
    from foreshock.storage.reader import open_history
    from foreshock.storage.store import store_exists

    if not store_exists(str(store)):
        return []
    with open_history(store) as history:
        return sorted(
            history.sql("SELECT seq FROM steps UNION ALL SELECT seq FROM run_events")
            .column("seq")
            .to_pylist()
        )


def _wait(done, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not done():
        time.sleep(0.2)
    return done()


def test_producer_gone_before_the_broker_restarts_keeps_what_storage_had_not_confirmed(tmp_path):
    """The embedded broker's worst case: the sink is down when a run ends, and the broker then
    restarts without its data. The producer closed only after keeping the messages the sink's
    group had not committed in its spool; a flush after the restart completes the store."""
    broker = EmbeddedBroker(log_path=tmp_path / "tansu.log").start()
    settings = _settings(broker.port, tmp_path, "confirm")
    store, group = tmp_path / "store", "confirm-sink"
    sink_service = _sink_service(settings, store, group)
    try:
        producer = KafkaSink(settings, probe_interval=0.5, confirm_group=group)
        for step in range(10):
            producer.write(_record("run-confirm", step))
        assert _wait(lambda: len(_stored_seqs(store)) == 11, 60)  # start + 10, stored
        time.sleep(1.5)  # and committed
        sink_service.kill()
        sink_service.wait(10)
        for step in range(10, 20):
            producer.write(_record("run-confirm", step))
        producer.close(timeout=10)
        assert producer.unconfirmed >= 11  # steps 10..19 and the end, all acknowledged
        assert producer.delivered == 22
        broker.kill()  # forgets all 22 messages and the group's offsets
        broker.start()
        sink_service = _sink_service(settings, store, group)
        flush = spool_flush(settings)
        assert flush.returncode == 0, flush.stderr
        assert _wait(lambda: _stored_seqs(store) == list(range(22)), 60), _stored_seqs(store)
    finally:
        sink_service.kill()
        sink_service.wait(10)
        broker.stop()


def _record(run_id: str, step: int) -> dict:
    return {
        "schema": "foreshock.metrics/1",
        "run_id": run_id,
        "step": step,
        "values": {"loss": 2.0 - step / 100},
    }


def test_a_rejected_record_leaves_no_gap_in_its_stream(tmp_path):
    """The wire format refuses a record: its seq is given back, so storage can still prove the
    stream complete (0..last_seq)."""
    sink = KafkaSink(_settings(free_port(), tmp_path, "reject"), probe_interval=60)
    sink.write(_record("run-reject", 0))
    sink.write({**_record("run-reject", 1), "values": {"loss": "not a number"}})
    sink.write(_record("run-reject", 2))
    sink.close(timeout=1)
    spool = next(orphaned_spools(tmp_path / "spool"))
    seqs = [json.loads(json.loads(line)["v"])["seq"] for line in spool.path.read_text().split()]
    spool.close(delete_if_empty=False)
    assert sink.rejected == 1
    assert seqs == [0, 1, 2, 3]  # start, steps 0 and 2, end


def test_spools_adopted_by_a_sink_that_never_connected_are_released_at_close(tmp_path):
    """Two runs in one process, no broker for either: the second sink adopts the first one's
    spool; once both are closed, a flush (another process) can take both."""
    settings = _settings(free_port(), tmp_path, "adopt")
    for run in ("run-a", "run-b"):
        sink = KafkaSink(settings, probe_interval=60)
        sink.write(_record(run, 0))
        sink.close(timeout=1)
    spools = list(orphaned_spools(settings.spool_dir))  # fails to lock a spool still held
    assert len(spools) == 2
    for spool in spools:
        spool.close(delete_if_empty=False)


def test_a_broker_over_its_memory_limit_is_recycled_on_its_port(tmp_path):
    """Tansu keeps every message: above ``max_memory_mb`` it restarts empty on the same port,
    ``on_start`` re-creates the topics, and a producer's later messages still arrive."""
    from foreshock.transport.topics import ensure_topics

    starts = []
    broker = EmbeddedBroker(max_memory_mb=1e6, on_start=starts.append)
    settings = _settings(broker.port, tmp_path, "recycle")
    broker.on_start = lambda bootstrap: (starts.append(bootstrap), ensure_topics(settings))
    with broker:
        assert broker.memory_mb() > 1 and not broker.recycle_if_over()
        pid = broker.process.pid
        broker.max_memory_mb = 1.0  # any Tansu is over 1 MB
        assert broker.recycle_if_over() and broker.recycles == 1
        assert broker.process.pid != pid and len(starts) == 2 and starts[0] == starts[1]
        collector = Collector(settings)
        try:
            sink = KafkaSink(settings)
            tiny_training(sink, "recycled", steps=10, every=1)
            sink.close(timeout=10)
            assert collector.wait_for(has_end("recycled"), 30)
        finally:
            collector.close()


def test_foreshock_broker_recycles_above_max_memory(tmp_path):
    port = free_port()
    env = {**os.environ, "FORESHOCK_KAFKA_BOOTSTRAP_SERVERS": f"127.0.0.1:{port}"}
    command = [
        sys.executable,
        "-m",
        "foreshock.app.cli",
        "broker",
        "--port",
        str(port),
        "--max-memory-mb",
        "1",
    ]
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, text=True)
    try:
        lines, deadline = [], time.monotonic() + 60
        while time.monotonic() < deadline and not any("recycled" in x for x in lines):
            lines.append(process.stdout.readline())
        assert any("recycled (RSS over 1 MB; recycle 1)" in x for x in lines), lines
        assert sum("topics:" in x for x in lines) >= 2  # the topics are made again
    finally:
        process.terminate()
        assert process.wait(20) == 0


def test_a_gap_after_a_broker_restart_is_not_searched_for_at_the_old_logs_offsets(tmp_path):
    """A restarted Tansu numbers its log from 0 again. A stream with a gap on the new log must
    not be re-read from where it was contiguous on the old one (a seek past the new log's end
    stalled the partition): the missing messages, sent later, still arrive, each once."""
    from confluent_kafka import Producer

    from foreshock.transport.consumer import MetricsConsumer
    from foreshock.transport.topics import ensure_topics
    from foreshock.transport.wire import encode

    broker = EmbeddedBroker(log_path=tmp_path / "tansu.log").start()
    settings = replace(_settings(broker.port, tmp_path, "regap"), partitions=1)
    ensure_topics(settings)
    consumer = MetricsConsumer(settings, group_id="regap", gap_wait=0.2)
    got: list[int] = []

    def send(seqs: range) -> None:
        producer = Producer({"bootstrap.servers": broker.bootstrap})
        for seq in seqs:
            message = {
                "kind": "metrics",
                "schema": "foreshock.metrics/1",
                "run_id": "run-regap",
                "seq": seq,
                "step": seq,
                "values": {"loss": 1.0},
            }
            producer.produce(settings.metrics_topic, key=b"run-regap", value=encode(message))
        assert producer.flush(10) == 0

    def consume_until(count: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and len(got) < count:
            got.extend(c.message["seq"] for c in consumer.poll_batch(500, timeout=0.2))
            consumer.commit()

    try:
        send(range(300))
        consume_until(300, 60)
        broker.stop()
        consume_until(300, 2)  # the consumer notices the broker gone
        broker.start()
        ensure_topics(settings)
        send(range(310, 320))  # offsets 0..9 of the new log: seqs 300..309 missing
        consume_until(310, 30)
        consume_until(311, 3)  # the gap waits out every re-read try
        send(range(300, 310))
        consume_until(320, 30)
    finally:
        consumer.close()
        broker.stop()
    assert sorted(got) == list(range(320))
    assert consumer.rereads == 0  # no seek to where seq 299 was on the old log


def test_a_run_ending_just_after_the_broker_came_back_delivers_at_close(tmp_path):
    """The producer is waiting out its probe back-off when the run ends: closing tries the
    broker once more, so the records reach it instead of staying in the spool."""
    broker = EmbeddedBroker(log_path=tmp_path / "tansu.log").start()
    settings = _settings(broker.port, tmp_path, "lastprobe")
    sink = KafkaSink(settings, probe_interval=30, confirm_group=None)
    collector = Collector(settings)
    try:
        sink.write(_record("run-last", 0))
        assert sink.wait_delivered(30)
        broker.kill()
        for step in range(1, 4):
            sink.write(_record("run-last", step))
        deadline = time.monotonic() + 30
        while sink._sender.online and time.monotonic() < deadline:  # it notices the broker gone
            time.sleep(0.1)
        broker.start()
        sink.close(timeout=10)
        assert sink.pending() == 0
        assert collector.wait_for(has_end("run-last"), 60)
    finally:
        collector.close()
        broker.stop()
    seqs = sorted(m["seq"] for m in collector.messages if m["run_id"] == "run-last")
    assert seqs == list(range(6))  # start, steps 0..3, end
