"""Service health at ``/metrics`` against the real broker: the sink's and the worker's counters
equal what they processed, a malformed message is counted as a dead letter, and the consumer
lag is reported per partition — exactly, mid-way — and reaches 0 once a service caught up."""

from __future__ import annotations

import socket
import threading
import time
import urllib.request
from collections.abc import Callable

import pytest
from confluent_kafka import OFFSET_INVALID, Consumer, Producer, TopicPartition
from prometheus_client.parser import text_string_to_metric_families

from foreshock.app.cli import build_parser
from foreshock.delivery.kafka_sink import KafkaSink
from foreshock.detectors.replay import replay_run
from foreshock.detectors.worker import DetectorWorker
from foreshock.lab.recorded import load_run, shipped_runs
from foreshock.operate.detect_commands import default_config
from foreshock.storage.sink import StorageSink
from foreshock.telemetry import MetricsPortError, ServiceTelemetry
from foreshock.transport.topics import ensure_topics

RUNS = ["fa-lowprec-s0", "healthy-s2"]

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def _run(name: str):
    run = load_run(next(p for p in shipped_runs() if p.name.startswith(name + ".")))
    run.start["run_id"] = name
    return run


def _publish_with_a_bad_message(settings) -> tuple[int, int]:
    """The recorded RUNS and one malformed message; returns (messages, values) published."""
    ensure_topics(settings)
    raw = Producer({"bootstrap.servers": settings.bootstrap_servers})
    raw.produce(settings.metrics_topic, key=b"bad", value=b'{"kind": "metrics", "seq": 0')
    assert raw.flush(10) == 0
    sink = KafkaSink(settings)
    messages = values = 0
    for name in RUNS:
        run = _run(name)
        for message in (run.start, *run.records, run.end):
            sink.write({**message, "run_id": name})
            messages += 1
            values += len(message.get("values") or ())
    sink.close()
    assert sink.pending() == 0
    return messages, values


def _scrape(port: int) -> Samples:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def _value(samples: Samples, name: str, service: str) -> float | None:
    return samples.get((name, (("service", service),)))


def _lag(samples: Samples) -> dict[tuple[str, int], float]:
    out = {}
    for (name, labels), value in samples.items():
        if name == "foreshock_consumer_lag":
            label = dict(labels)
            out[(label["topic"], int(label["partition"]))] = value
    return out


def _serve_until(service, done: Callable[[Samples], bool], timeout: float = 30.0) -> Samples:
    """Run ``service`` in a thread, scraping its endpoint until ``done``; then stop it."""
    service.telemetry.lag_interval = 0.3
    port = service.telemetry.port
    stop = threading.Event()
    thread = threading.Thread(target=service.run, args=(stop,), daemon=True)
    thread.start()
    deadline, samples = time.monotonic() + timeout, {}
    try:
        while time.monotonic() < deadline:
            samples = _scrape(port)
            if done(samples):
                break
            time.sleep(0.3)
    finally:
        stop.set()
        thread.join(20)
    assert not thread.is_alive()
    with pytest.raises(OSError):  # the endpoint closed with the service: the port is free
        _scrape(port)
    return samples


def _caught_up(settings, samples: Samples) -> bool:
    lag = _lag(samples)
    mine = {(settings.metrics_topic, p) for p in range(settings.partitions)}
    return mine <= lag.keys() and not any(lag.values())


def test_sink_metrics_count_what_it_stored(kafka_settings, tmp_path):
    messages, values = _publish_with_a_bad_message(kafka_settings)
    sink = StorageSink(
        kafka_settings, tmp_path / "store", group_id="sink-tel", max_wait=0.5, metrics_port=0
    )

    def done(s: Samples) -> bool:
        return (
            _value(s, "foreshock_messages_consumed_total", "sink") == messages
            and _value(s, "foreshock_dead_letters_stored_total", "sink") == 1
            and _caught_up(kafka_settings, s)
        )

    s = _serve_until(sink, done)
    assert _value(s, "foreshock_messages_consumed_total", "sink") == messages
    assert sink.stats.messages == messages
    assert _value(s, "foreshock_metric_values_total", "sink") == values == sink.stats.values
    batches = _value(s, "foreshock_batches_written_total", "sink")
    assert batches == sink.stats.batches and batches >= 1
    # the malformed message: sent to the dead-letter topic by the sink, then stored from there
    assert _value(s, "foreshock_dead_letters_total", "sink") == 1
    assert _value(s, "foreshock_dead_letters_stored_total", "sink") == 1
    assert _value(s, "foreshock_duplicates_dropped_total", "sink") == 0
    assert _value(s, "foreshock_write_retries_total", "sink") == 0
    assert _value(s, "foreshock_values_per_second", "sink") > 0
    assert _value(s, "foreshock_warnings_emitted_total", "sink") is None  # the worker's
    # lag per partition of each of the three topics the sink reads, all caught up
    topics = (
        kafka_settings.metrics_topic,
        kafka_settings.warnings_topic,
        kafka_settings.deadletter_topic,
    )
    assert _lag(s) == {(t, p): 0 for t in topics for p in range(kafka_settings.partitions)}


def test_worker_metrics_count_what_it_detected(kafka_settings):
    messages, values = _publish_with_a_bad_message(kafka_settings)
    events = sum(len(replay_run(_run(name), default_config()).events) for name in RUNS)
    assert events
    worker = DetectorWorker(kafka_settings, default_config(), group_id="det-tel", metrics_port=0)

    def done(s: Samples) -> bool:
        return _value(
            s, "foreshock_messages_consumed_total", "detector"
        ) == messages and _caught_up(kafka_settings, s)

    s = _serve_until(worker, done)
    assert _value(s, "foreshock_messages_consumed_total", "detector") == messages
    assert worker.messages == messages
    assert _value(s, "foreshock_metric_values_total", "detector") == values == worker.values
    assert _value(s, "foreshock_warnings_emitted_total", "detector") == events == worker.warnings
    assert _value(s, "foreshock_dead_letters_total", "detector") == 1
    assert _value(s, "foreshock_duplicates_dropped_total", "detector") == 0
    assert _value(s, "foreshock_values_per_second", "detector") > 0
    assert _value(s, "foreshock_batches_written_total", "detector") is None  # the sink's
    assert _lag(s) == {
        (kafka_settings.metrics_topic, p): 0 for p in range(kafka_settings.partitions)
    }


def test_lag_is_what_is_left_per_partition(kafka_settings):
    """Exact lag mid-way: from the position, from the committed offset, and with nothing
    consumed nor committed (from the beginning); a revoked partition's gauge goes away."""
    ensure_topics(kafka_settings)
    topic, sizes = kafka_settings.metrics_topic, {0: 10, 1: 4, 2: 0}
    raw = Producer({"bootstrap.servers": kafka_settings.bootstrap_servers})
    for partition, n in sizes.items():
        for i in range(n):
            raw.produce(topic, value=b"x%d" % i, partition=partition)
    assert raw.flush(10) == 0
    config = {
        "bootstrap.servers": kafka_settings.bootstrap_servers,
        "group.id": "lag-tel",
        "enable.auto.commit": False,
        "auto.offset.reset": "earliest",
    }
    consumer = Consumer(config)
    consumer.assign([TopicPartition(topic, 0, 0)])
    taken, deadline = 0, time.monotonic() + 20
    while taken < 3 and time.monotonic() < deadline:
        for message in consumer.consume(3 - taken, timeout=0.5):
            assert not message.error()
            taken += 1
    assert taken == 3
    consumer.commit(asynchronous=False)  # partition 0 at offset 3
    consumer.assign([TopicPartition(topic, p, OFFSET_INVALID) for p in sizes])
    deadline = time.monotonic() + 20  # fetched in the background: watermarks cached, none read
    while time.monotonic() < deadline and any(
        consumer.get_watermark_offsets(TopicPartition(topic, p), cached=True)[1] < 0 for p in sizes
    ):
        time.sleep(0.1)
    telemetry = ServiceTelemetry("lagtest")
    try:
        telemetry.refresh_lag(consumer, force=True)  # 0: committed; 1, 2: from the beginning
        lag = {
            p: telemetry.sample("foreshock_consumer_lag", topic=topic, partition=str(p))
            for p in sizes
        }
        assert lag == {0: 7, 1: 4, 2: 0}
        taken, deadline = 0, time.monotonic() + 20  # read partition 1 fully: from the position
        while taken < 4 and time.monotonic() < deadline:
            for message in consumer.consume(10, timeout=0.5):
                taken += message.partition() == 1
        telemetry.refresh_lag(consumer, force=True)
        assert telemetry.sample("foreshock_consumer_lag", topic=topic, partition="1") == 0
        consumer.assign([TopicPartition(topic, 0, OFFSET_INVALID)])  # 1 and 2 revoked
        telemetry.refresh_lag(consumer, force=True)
        assert telemetry.sample("foreshock_consumer_lag", topic=topic, partition="1") is None
        assert telemetry.sample("foreshock_consumer_lag", topic=topic, partition="0") is not None
    finally:
        consumer.close()


def test_endpoint_port_in_use_is_a_clear_error_and_freed_on_close():
    first = ServiceTelemetry("a", port=0)
    try:
        assert first.url == f"http://127.0.0.1:{first.port}/metrics"
        with pytest.raises(MetricsPortError, match=f"127.0.0.1:{first.port}"):
            ServiceTelemetry("b", port=first.port)
    finally:
        first.close()
    with socket.socket() as free:  # closed: the port can be bound again
        free.bind(("127.0.0.1", first.port))


def test_cli_metrics_options():
    parser = build_parser()
    for command in ("sink", "detect"):
        args = parser.parse_args([command])
        assert args.metrics_port is None and args.metrics_host == "127.0.0.1"
        args = parser.parse_args([command, "--metrics-port", "9464", "--metrics-host", "0.0.0.0"])
        assert args.metrics_port == 9464 and args.metrics_host == "0.0.0.0"
