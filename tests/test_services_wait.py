"""Services started before their broker wait for it: ``detect``, ``sink`` and ``notify`` keep
trying with a bounded backoff and a log line (no traceback, no exit), and start working —
the topics made — once a real broker comes up on their bootstrap address."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from foreshock.transport.broker import EmbeddedBroker, free_port
from foreshock.transport.settings import KafkaSettings
from foreshock.transport.topics import topic_names

SERVICES = {
    "detect": ["detect"],
    "sink": ["sink", "--store", "{tmp}/history"],
    "notify": ["notify", "--webhook", "http://127.0.0.1:9/in"],
}


@pytest.mark.slow
@pytest.mark.parametrize("service", sorted(SERVICES))
def test_a_service_waits_for_a_broker_that_starts_later(tmp_path, service):
    port = free_port("127.0.0.1")
    settings = KafkaSettings(
        bootstrap_servers=f"127.0.0.1:{port}",
        metrics_topic=f"w.{service}.metrics",
        warnings_topic=f"w.{service}.warnings",
        deadletter_topic=f"w.{service}.deadletter",
        control_topic=f"w.{service}.control",
        spool_dir=str(tmp_path / "spool"),
    )
    env = {**os.environ, "FORESHOCK_KAFKA_BOOTSTRAP_SERVERS": settings.bootstrap_servers}
    for name in ("metrics", "warnings", "deadletter", "control"):
        env[f"FORESHOCK_KAFKA_{name.upper()}_TOPIC"] = getattr(settings, f"{name}_topic")
    argv = [part.format(tmp=tmp_path) for part in SERVICES[service]]
    log = (tmp_path / "service.log").open("w")
    process = subprocess.Popen(
        [sys.executable, "-m", "foreshock.app.cli", *argv], env=env, stdout=log, stderr=log
    )
    broker = EmbeddedBroker(port=port)
    try:
        time.sleep(12)  # past a single 10 s probe: the old code had exited by now
        assert process.poll() is None, (tmp_path / "service.log").read_text()
        assert "is not up yet" in (tmp_path / "service.log").read_text()
        broker.start()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not _topics_made(settings):
            time.sleep(0.5)
        assert _topics_made(settings), (tmp_path / "service.log").read_text()
        assert process.poll() is None
    finally:
        process.terminate()
        try:
            process.wait(20)
        except subprocess.TimeoutExpired:
            process.kill()
        broker.stop()
        log.close()
    assert "Traceback" not in (tmp_path / "service.log").read_text()


def _topics_made(settings: KafkaSettings) -> bool:
    from confluent_kafka.admin import AdminClient

    try:
        admin = AdminClient({"bootstrap.servers": settings.bootstrap_servers, "log_level": 0})
        existing = admin.list_topics(timeout=2).topics
    except Exception:
        return False
    return all(name in existing for name in topic_names(settings))
