"""Only approved hands steer a run: forged, replayed, future-dated, expired, unsigned,
over-bound and no-op requests sent by a bare Kafka producer (no foreshock code, no key) are
refused by a training loop, each with an ``action`` record saying why, while it trains on;
a signed ``foreshock warnings act`` still reaches it, is applied once and acknowledged, with
the approver (the allowlist's name and key id) in the record. Everything goes through the
embedded broker and the product's runner (:class:`~foreshock.remediation.runner.
Remediation` on a :class:`~foreshock.delivery.kafka_sink.KafkaSink`)."""

from __future__ import annotations

import dataclasses
import json
import threading
import time
import uuid

import pytest
from _kafka import service_env
from test_control_topic import _approver, _cli, _store, _until
from test_notify import _event

from foreshock.transport.approvals import generate_key, sign
from foreshock.transport.control import remedy_request
from foreshock.transport.topics import ensure_topics

RUN = "r-signed"
REFUSED = [
    "unsigned",  # a stop from anyone who can write to the broker
    "unsigned",  # hold-lr x1e-300, sent twice: the rate would be 0
    "unsigned",
    "unknown key",  # signed by a key no allowlist holds
    "bad signature",  # signed, then its lr_scale changed
    "future-dated",  # a stop dated 10 days ahead
    "expired",
    "a no-op: hold-lr at x1 changes nothing",  # signed: it would only resolve the warning
]


def _forged(settings, key) -> list[dict]:
    """What a stray writer sends, in order (see ``REFUSED``)."""
    warning, now = _event(RUN, "h.1.mlp.gate", 40), time.time()
    stranger, _ = generate_key("mallory")
    tampered = sign(remedy_request(warning, "x", "hold-lr", lr_scale=0.5), key)
    return [
        remedy_request(warning, "ana", "stop"),
        remedy_request(warning, "ana", "hold-lr", lr_scale=1e-300),
        remedy_request(warning, "ana", "hold-lr", lr_scale=1e-300),
        sign(remedy_request(warning, "x", "stop"), stranger),
        {**tampered, "lr_scale": 1e-300},
        sign(remedy_request(warning, "x", "stop", now=now + 864_000, lifetime=60), key),
        sign(remedy_request(warning, "x", "stop", now=now, lifetime=0.05), key),
        sign(remedy_request(warning, "x", "hold-lr", lr_scale=1.0), key),
    ]


def _produce(settings, values: list[bytes]) -> None:
    """A bare producer, as any writer with broker access has one."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": settings.bootstrap_servers})
    for value in values:
        producer.produce(settings.control_topic, value=value, key=RUN.encode())
    assert producer.flush(10) == 0


def _control_messages(settings) -> list[bytes]:
    """Every message on the control topic."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    consumer = Consumer(
        {"bootstrap.servers": settings.bootstrap_servers, "group.id": uuid.uuid4().hex}
    )
    parts = range(settings.partitions)
    consumer.assign([TopicPartition(settings.control_topic, p, OFFSET_BEGINNING) for p in parts])
    found, idle = [], time.monotonic()
    while time.monotonic() - idle < 2:
        for raw in consumer.consume(100, 0.5):
            if raw.error() is None:
                found.append(raw.value())
                idle = time.monotonic()
    consumer.close()
    return found


class Loop:
    """The lab's tiny GPT-MoE trained in a thread with the product runner acting on requests."""

    def __init__(self, settings) -> None:
        import torch

        from foreshock.delivery.kafka_sink import KafkaSink
        from foreshock.lab.arch import build
        from foreshock.lab.model import GPTConfig
        from foreshock.producers.monitor import Monitor, MonitorConfig
        from foreshock.remediation.remedy import RemedyPolicy
        from foreshock.remediation.runner import Remediation

        torch.manual_seed(0)
        config = GPTConfig(n_layer=2, n_embd=32, n_head=2, block_size=16, n_experts=4)
        self.lab = build("gpt-moe", config)
        self.optimizer = torch.optim.AdamW(self.lab.model.parameters(), lr=1e-3)
        sink = KafkaSink(settings, close_timeout=5.0, confirm_group=None)
        self.monitor = Monitor(self.lab.model, sink, run_id=RUN, config=MonitorConfig(every=10))
        policy = RemedyPolicy(backoff_steps=1_000_000)  # the third act comes within it
        runner = Remediation.for_monitor(policy, self.monitor, self.optimizer, warnings=None)
        assert runner is not None
        self.runner, self.steps, self.done = runner, [], threading.Event()
        self.thread = threading.Thread(target=self._train)

    def _train(self) -> None:
        import torch

        x = torch.randint(0, 256, (4, 16))
        for step in range(100_000):
            if self.done.is_set() or self.runner.stopped:
                break
            self.runner.before_step(step)
            loss = self.lab.loss(x, x.roll(-1, 1))
            loss.backward()
            self.optimizer.step()
            self.optimizer.zero_grad()
            self.runner.after_step(step, self.monitor.step(step, loss=loss))
            self.steps.append(step)
            time.sleep(0.01)

    def refusals(self) -> list[str]:
        return [a.detail["refused"] for a in self.runner.actions if "refused" in a.detail]

    def close(self) -> None:
        self.done.set()
        self.thread.join(10)
        self.runner.close()
        self.monitor.close()


@pytest.mark.slow
def test_only_a_signed_act_steers_the_run_and_every_refusal_is_on_record(
    kafka_settings, tmp_path, monkeypatch, capsys
):
    for name, value in service_env(kafka_settings).items():
        monkeypatch.setenv(name, value)
    ensure_topics(kafka_settings)
    key, key_file, allowlist = _approver(tmp_path)
    warning, other = _event(RUN, "h.1.mlp.gate", 40), _event(RUN, "h.0.mlp.gate", 60)
    store = [*_store(tmp_path, warning, other), "--key", key_file]
    loop = Loop(dataclasses.replace(kafka_settings, approvers=allowlist))
    loop.thread.start()
    try:
        _until(lambda: len(loop.steps) > 3, 20)  # the control thread runs from the first poll
        junk = [b"not json"] * 200 + [b'{"kind": "remedy-request"}'] * 100
        elsewhere = [
            json.dumps(sign(remedy_request(_event(f"r-{i}", "b", 5), "x", "stop"), key)).encode()
            for i in range(50)
        ]
        forged = [json.dumps(r).encode() for r in _forged(kafka_settings, key)]
        time.sleep(0.1)  # the expired one is
        _produce(kafka_settings, [*junk, *elsewhere, *forged])
        assert _until(lambda: len(loop.refusals()) >= len(REFUSED), 30)
        assert loop.refusals() == REFUSED

        argv = ["warnings", "act", warning["id"], "--action", "hold-lr", "--lr-scale", "0.5"]
        assert _cli([*argv, "--wait", "30", *store]) == 0
        answer = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
        assert answer["applied"] and answer["approver"] == {"key_id": key["key_id"], "name": "ana"}
        signed = [
            m for m in _control_messages(kafka_settings) if answer["request_id"].encode() in m
        ]
        _produce(kafka_settings, signed)  # the signed request, replayed byte for byte
        assert _cli([*argv, *store]) == 0  # a second act on the same warning
        argv = ["warnings", "act", other["id"], "--action", "hold-lr", "--lr-scale", "0.5"]
        assert _cli([*argv, *store]) == 0  # another warning, within the backoff
        assert _until(lambda: len(loop.refusals()) >= len(REFUSED) + 3, 30)
        assert loop.refusals()[len(REFUSED) :] == [
            "already taken (a replay)",
            f"warning {warning['id']} was acted on already (act --again to act once more)",
            "over the policy's bounds (max_actions, backoff_steps)",
        ]
        trained = len(loop.steps)
        _until(lambda: len(loop.steps) > trained + 5, 10)  # and it trains on
    finally:
        loop.close()
    applied = [a for a in loop.runner.actions if a.applied]
    assert [(a.kind, a.source, a.approver["name"]) for a in applied] == [
        ("hold-lr", "approved", "ana")
    ]
    assert all(abs(g["lr"] - 0.5e-3) < 1e-12 for g in loop.optimizer.param_groups)
    assert not loop.runner.stopped and len(loop.steps) > trained + 5
    control = loop.monitor.sink._control
    assert (control.other_runs, control.invalid) == (50, 300)


def test_a_held_learning_rate_never_falls_below_its_floor():
    """Two holds at x1e-300 once set the rate to exactly 0 (the run trained on, looking
    healthy): the hold is floored at HOLD_FLOOR of the rate before the first hold."""
    import torch

    from foreshock.remediation.trainer import HOLD_FLOOR, TrainerRemedies

    model = torch.nn.Linear(4, 4)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.2)
    remedies = TrainerRemedies(model, optimizer)
    assert remedies.hold_lr(0.5) == pytest.approx([0.1])
    assert remedies.hold_lr(1e-300) == pytest.approx([HOLD_FLOOR * 0.2])
    assert remedies.hold_lr(1e-300) == pytest.approx([HOLD_FLOOR * 0.2])
    assert optimizer.param_groups[0]["lr"] == pytest.approx(HOLD_FLOOR * 0.2)
    remedies.close()


def test_a_resumed_attempt_refuses_the_requests_its_checkpoint_saw(tmp_path):
    """The ids of the requests handed over travel in the monitoring state of the checkpoint;
    the resumed attempt's control thread refuses them if they come again."""
    from types import SimpleNamespace

    from test_control_topic import _raw

    from foreshock.delivery.control_requests import ControlRequests
    from foreshock.producers.checkpoint_state import load_monitoring_state, monitoring_state
    from foreshock.transport.settings import KafkaSettings

    key, _, allowlist = _approver(tmp_path)
    settings = KafkaSettings(spool_dir="s", approvers=allowlist)
    request = sign(remedy_request(_event(RUN, "b.1", 5), "x", "stop"), key)

    def sink(started: float) -> SimpleNamespace:
        control = ControlRequests(settings, started, lambda: {RUN})
        return SimpleNamespace(
            control=control,
            attempt=None,
            requests_seen=control.seen,
            remember_requests=control.remember,
        )

    first = sink(0.0)
    first.control._take(_raw(request))
    assert "refused" not in first.control._mine()[0]
    state = json.loads(json.dumps(monitoring_state(RUN, first)))  # through the checkpoint
    resumed = sink(0.0)
    assert load_monitoring_state(resumed, state)
    resumed.control._take(_raw(request))
    assert resumed.control._mine()[0]["refused"] == "already taken (a replay)"
