"""Nothing lost: a broker killed mid-run and restarted, and no broker at all for a whole run."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from _kafka import Collector, has_end, tiny_training

from foreshock.producers.kafka_sink import KafkaSink
from foreshock.producers.spool import orphaned_spools
from foreshock.transport.broker import EmbeddedBroker, free_port
from foreshock.transport.settings import KafkaSettings


def _settings(port: int, tmp_path, name: str) -> KafkaSettings:
    return KafkaSettings(bootstrap_servers=f"127.0.0.1:{port}", metrics_topic=f"{name}.metrics",
                         deadletter_topic=f"{name}.dead", partitions=2,
                         spool_dir=str(tmp_path / "spool"))  # fmt: skip


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
        env = {**os.environ, "FORESHOCK_KAFKA_BOOTSTRAP_SERVERS": settings.bootstrap_servers,
               "FORESHOCK_KAFKA_METRICS_TOPIC": settings.metrics_topic,
               "FORESHOCK_KAFKA_DEADLETTER_TOPIC": settings.deadletter_topic,
               "FORESHOCK_KAFKA_SPOOL_DIR": settings.spool_dir}  # fmt: skip
        flush = subprocess.run([sys.executable, "-m", "foreshock.cli", "spool", "flush",
                                "--timeout", "60"], env=env, capture_output=True, text=True,
                               timeout=120)  # fmt: skip
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
