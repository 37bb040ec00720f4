"""Helpers for the transport tests: a consumer thread and a tiny real training run."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from foreshock.transport.consumer import MetricsConsumer
from foreshock.transport.settings import KafkaSettings


class Collector:
    """Consume the metrics topic in a thread into ``messages`` (first-seen only)."""

    def __init__(self, settings: KafkaSettings, group: str = "test") -> None:
        self.consumer = MetricsConsumer(settings, group_id=group)
        self.messages: list[dict[str, Any]] = []
        self.consumed: list[Any] = []  # the same, in their envelopes (transport.envelope)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            batch = self.consumer.poll_batch(500, timeout=0.2)
            self.consumed.extend(batch)
            self.messages.extend(c.message for c in batch)
            if batch:
                self.consumer.commit()

    def wait_for(self, done: Callable[[list[dict[str, Any]]], bool], timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if done(self.messages):
                return True
            time.sleep(0.1)
        return done(self.messages)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(10)
        self.consumer.close()


def has_end(run_id: str) -> Callable[[list[dict[str, Any]]], bool]:
    """True once the end message of ``run_id`` and every seq up to it have arrived."""

    def done(messages: list[dict[str, Any]]) -> bool:
        mine = [m for m in messages if m["run_id"] == run_id]
        ends = [m for m in mine if m["kind"] == "end"]
        return bool(ends) and {m["seq"] for m in mine} >= set(range(ends[0]["last_seq"] + 1))

    return done


def tiny_training(
    sink: Any, run_id: str, steps: int, every: int = 1, on_step: Callable[[int], None] | None = None
) -> list[float]:
    """Train a tiny lab GPT-MoE with the Monitor writing to ``sink``; seconds per step."""
    import torch

    from foreshock.lab.data import ByteBatches, stdlib_bytes
    from foreshock.lab.model import GPT, GPTConfig
    from foreshock.producers.monitor import Monitor, MonitorConfig

    torch.set_num_threads(1)
    torch.manual_seed(0)
    config = GPTConfig(block_size=16, n_layer=1, n_head=2, n_embd=32, n_experts=4)
    model = GPT(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    batches = ByteBatches(stdlib_bytes(200_000), config.block_size, 4, seed=0)
    monitor = Monitor(model, sink, run_id=run_id, config=MonitorConfig(every=every))
    sink.write(
        {"schema": "foreshock.run/1", "kind": "start", "run_id": run_id, "labels": {"test": True}}
    )
    seconds = []
    for step in range(steps):
        tick = time.perf_counter()
        x, y = batches.next()
        _, loss = model(x, y)
        loss.backward()
        optimizer.step()
        monitor.step(step, loss=loss)  # after the update, before the gradients are cleared
        optimizer.zero_grad()
        seconds.append(time.perf_counter() - tick)
        if on_step is not None:
            on_step(step)
    monitor.flush()  # the records still with the spectra worker, before the end
    sink.write({"schema": "foreshock.run/1", "kind": "end", "run_id": run_id, "status": "finished"})
    return seconds


def publish_recorded(settings: KafkaSettings, names: list[str]) -> None:
    """Send shipped lab runs (start, records, end) under their names through a KafkaSink."""
    from foreshock.app.harness import Replay, recorded_run
    from foreshock.delivery.kafka_sink import KafkaSink

    sink = KafkaSink(settings)
    for name in names:
        replay = Replay(recorded_run(name), name, interval=0)
        for j in range(len(replay)):
            sink.write(replay.message(j))
    sink.close()
    assert sink.pending() == 0


def service_env(settings: KafkaSettings) -> dict[str, str]:
    """The environment a `foreshock` subprocess needs to use these settings' topics."""
    import os

    from foreshock.app import harness

    return {**os.environ, **harness.service_env(settings)}


def read_warnings(settings: KafkaSettings, idle: float = 3.0) -> list[dict[str, Any]]:
    """Every event on the warnings topic, from the start, until ``idle`` s bring nothing."""
    import json

    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": settings.bootstrap_servers,
            "group.id": "read-warnings",
            "enable.auto.commit": False,
        }
    )
    consumer.assign(
        [TopicPartition(settings.warnings_topic, p, 0) for p in range(settings.partitions)]
    )
    out, last = [], time.monotonic()
    while time.monotonic() - last < idle:
        message = consumer.poll(0.2)
        if message is not None and not message.error():
            out.append(json.loads(message.value()))
            last = time.monotonic()
    consumer.close()
    return out


def spool_flush(settings: KafkaSettings, timeout: float = 60) -> subprocess.CompletedProcess:
    """``foreshock spool flush`` in its own process, as an operator runs it."""
    return subprocess.run(
        [sys.executable, "-m", "foreshock.app.cli", "spool", "flush", "--timeout", str(timeout)],
        env=service_env(settings),
        capture_output=True,
        text=True,
        timeout=120,
    )
